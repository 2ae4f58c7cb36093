"""The load-test Job in a cluster, through the kubernetes Python client.

``loadtest_job()`` is the one place the Job is defined. It mirrors the chart's load-test Job
(charts/gemma4-serving/templates/_loadtest.tpl, contract in charts/gemma4-serving/README.md):
same container name (``loadtest``), labels (``app.kubernetes.io/component: loadtest``), command
script (wait at most ``HEALTH_WAIT_SECONDS`` for ``$SLO_LOADTEST_TARGET/health``, ``slo-loadtest
run --target ... --out /results "$@"`` in the background with SIGTERM forwarded, write
``/results/exit_code`` and ``/results/.done``, log "results ready", keep the pod up
``KEEP_RESULTS_SECONDS`` unless terminated), security context and ``SLO_LOADTEST_*``
environment.

Where the Job leaves its results: under ``/results`` in the pod (an emptyDir, or the chart's
results claim), and — because ``slo-loadtest run`` prints its summary JSON between markers when it
runs inside Kubernetes — in the pod's log. ``fetch`` reads the log, so it needs no exec rights
and works after the pod has finished, for as long as the pod object exists; it writes the
summary and redraws the CSV, Markdown and plots locally. The raw guidellm reports stay in
``/results`` (``kubectl cp <pod>:/results ./results`` while the pod is kept up).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from slo_loadtest.k8s_defaults import DEFAULT_CPU, DEFAULT_MEMORY

CHART_NAME = "gemma4-serving"
CONTAINER = "loadtest"
COMPONENT_LABEL = "app.kubernetes.io/component"
READY_LINE = "slo-loadtest job: results ready in"

JOB_SCRIPT = """\
set -u
# sh is PID 1 in the pod: the kernel drops every signal PID 1 has no handler for, so SIGTERM
# (activeDeadlineSeconds, kubectl delete) reaches slo-loadtest only through these traps.
trap 'exit 143' TERM INT
wait_s="${HEALTH_WAIT_SECONDS:-900}"
echo "slo-loadtest job: waiting up to ${wait_s}s for $SLO_LOADTEST_TARGET/health"
start=$(date +%s)
until python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/health", timeout=5)' "$SLO_LOADTEST_TARGET" 2>/dev/null; do
  if [ $(($(date +%s) - start)) -ge "$wait_s" ]; then
    # a wrong target must not burn the whole deadline: the sweep's preflight reports it (exit 3)
    echo "slo-loadtest job: no answer from $SLO_LOADTEST_TARGET/health after ${wait_s}s; running the sweep anyway"
    break
  fi
  sleep 5
done
mkdir -p "$SLO_LOADTEST_OUT"
rm -f "$SLO_LOADTEST_OUT/.done"
term=0
slo-loadtest run --target "$SLO_LOADTEST_TARGET" --out "$SLO_LOADTEST_OUT" "$@" &
pid=$!
trap 'term=1; kill -TERM "$pid" 2>/dev/null' TERM INT
wait "$pid"
rc=$?
# a trapped signal ends `wait` early: wait on until slo-loadtest has written its partial report
while kill -0 "$pid" 2>/dev/null; do
  wait "$pid"
  rc=$?
done
echo "$rc" > "$SLO_LOADTEST_OUT/exit_code"
touch "$SLO_LOADTEST_OUT/.done"
if [ "$term" = 1 ]; then
  echo "slo-loadtest job: results ready in $SLO_LOADTEST_OUT (exit code $rc); terminated, not keeping them"
  exit "$rc"
fi
echo "slo-loadtest job: results ready in $SLO_LOADTEST_OUT (exit code $rc); keeping them for ${KEEP_RESULTS_SECONDS}s"
sleep "$KEEP_RESULTS_SECONDS" &
spid=$!
trap 'kill "$spid" 2>/dev/null; exit "$rc"' TERM INT
wait "$spid"
exit "$rc"
"""  # noqa: E501 - the chart's script, line for line


def fullname(release: str) -> str:
    name = release if CHART_NAME in release else f"{release}-{CHART_NAME}"
    return name[:63].rstrip("-")


def service_url(release: str, namespace: str, port: int = 8000) -> str:
    return f"http://{fullname(release)}.{namespace}.svc:{port}"


def job_name(release: str, stamp: str | None = None) -> str:
    stamp = stamp or dt.datetime.now(dt.UTC).strftime("%Y%m%d%H%M%S")
    suffix = f"-loadtest-cli-{stamp}"
    return fullname(release)[: 63 - len(suffix)].rstrip("-") + suffix


@dataclass
class JobOptions:
    release: str
    namespace: str
    image: str
    target: str = ""
    settings: Mapping[str, str] | None = None
    args: tuple[str, ...] = ()
    active_deadline_s: int = 3600
    keep_results_s: int = 900
    # None: the script's default (900 s, long enough for a cold vLLM start)
    health_wait_s: int | None = None
    ttl_s: int = 86400
    results_claim: str = ""
    api_key_secret: str = ""
    api_key_key: str = "VLLM_API_KEY"
    service_account: str = ""
    name: str = ""
    image_pull_secrets: tuple[str, ...] = ()
    node_selector: Mapping[str, str] | None = None
    tolerations: tuple[Mapping[str, Any], ...] = ()
    # None: DEFAULT_RESOURCES (the chart's loadtest.resources)
    resources: Mapping[str, Any] | None = None


TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_BINARY_SUFFIX = re.compile(r"[KMGTPE]i$")
# The API server's quantity grammar (apimachinery resource.Quantity): ASCII digits, one optional
# point, then a binary-SI suffix, a decimal-SI one (k, not K) or an exponent. The kubernetes
# client's parse_quantity is looser (Python's Decimal syntax: 1_024, inf, NaN, other scripts'
# digits; the suffix K), so a value it takes can still be refused by the API server.
_QUANTITY_MAX = 2**63 - 1  # the API server caps a quantity there
_QUANTITY = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?")


def check_name(value: str, what: str) -> str:
    """A Kubernetes object name (DNS-1123 subdomain): Secrets, ServiceAccounts."""
    if len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a valid {what} name (lower-case letters, digits, '-' and '.', "
            "starting and ending with a letter or digit, at most 253 characters)"
        )
    return value


def _check_label_key(key: str) -> str:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise ValueError(
            f"{key!r}: the prefix before '/' must be a DNS subdomain, e.g. example.com"
        )
    if len(name) > 63 or not _LABEL_NAME.fullmatch(name):
        raise ValueError(
            f"{key!r} is not a valid label key (letters, digits, '-', '_', '.', at most 63 "
            "characters, optionally prefixed by a DNS subdomain and '/')"
        )
    return key


def _check_label_value(key: str, value: str) -> str:
    if value and (len(value) > 63 or not _LABEL_NAME.fullmatch(value)):
        raise ValueError(
            f"{value!r} (for {key!r}) is not a valid label value (letters, digits, '-', '_', '.', "
            "at most 63 characters, starting and ending with a letter or digit)"
        )
    return value


def parse_node_selector(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """KEY=VALUE items, e.g. ``node-pool=cpu`` or ``kubernetes.io/arch=amd64``."""
    out: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"{item!r} is not KEY=VALUE, e.g. kubernetes.io/arch=amd64")
        _check_label_value(key, value)
        if _check_label_key(key) in out:
            raise ValueError(f"{key!r} given twice")
        out[key] = value
    return out


def parse_toleration(text: str) -> dict[str, Any]:
    """``key[=value][:effect]`` as in ``kubectl taint`` (no value: operator Exists; ``:effect``
    alone tolerates every taint of that effect), or a JSON toleration object."""
    text = text.strip()
    if text.startswith("{"):
        try:
            tol = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not valid JSON ({exc})") from None
        if not isinstance(tol, dict):
            raise ValueError(f"{text!r} is not a JSON object")
        allowed = {"key", "operator", "value", "effect", "tolerationSeconds"}
        unknown = sorted(set(tol) - allowed)
        if unknown:
            raise ValueError(
                f"unknown field(s) {', '.join(unknown)}; a toleration has "
                + ", ".join(sorted(allowed))
            )
        if not all(isinstance(tol.get(k, ""), str) for k in ("key", "operator", "value", "effect")):
            raise ValueError(f"{text!r}: key, operator, value and effect must be strings")
    else:
        rest, colon, effect = text.rpartition(":") if ":" in text else (text, "", "")
        key, eq, value = rest.partition("=")
        if eq and not key:
            raise ValueError(f"{text!r}: a value needs a key (KEY=VALUE:EFFECT)")
        if not key and not colon:
            raise ValueError(
                f"{text!r} is empty; give KEY[=VALUE][:EFFECT], e.g. gpu=true:NoSchedule"
            )
        tol = {
            "key": key,
            "operator": "Equal" if eq else "Exists",
            "value": value,
            "effect": effect,
        }
    op = tol.get("operator") or ("Equal" if tol.get("value") else "Exists")
    if op not in ("Exists", "Equal"):
        raise ValueError(f"{text!r}: operator must be Exists or Equal, not {op!r}")
    if op == "Exists" and tol.get("value"):
        raise ValueError(f"{text!r}: operator Exists takes no value")
    if not tol.get("key") and op != "Exists":
        raise ValueError(f"{text!r}: an empty key needs operator Exists")
    if tol.get("key"):
        _check_label_key(tol["key"])
    if tol.get("value"):
        _check_label_value(tol["key"], tol["value"])
    effect = tol.get("effect") or ""
    if effect and effect not in TOLERATION_EFFECTS:
        raise ValueError(
            f"{text!r}: effect must be one of {', '.join(TOLERATION_EFFECTS)} (or none: every "
            f"effect), not {effect!r}"
        )
    seconds = tol.get("tolerationSeconds")
    if seconds is not None and (
        not isinstance(seconds, int) or isinstance(seconds, bool) or effect != "NoExecute"
    ):
        raise ValueError(f"{text!r}: tolerationSeconds must be an integer, with effect NoExecute")
    out = {"key": tol.get("key") or None, "operator": op, "value": tol.get("value") or None}
    out |= {"effect": effect or None, "tolerationSeconds": seconds}
    return {k: v for k, v in out.items() if v is not None}


def _quantity(value: str, what: str) -> Any:
    from kubernetes.utils.quantity import parse_quantity

    if not _QUANTITY.fullmatch(value.strip()):
        raise ValueError(f"{what} {value!r} is not a Kubernetes quantity (e.g. 4, 500m, 4Gi)")
    try:
        q = parse_quantity(value.strip())
    except ValueError:
        raise ValueError(
            f"{what} {value!r} is not a Kubernetes quantity (e.g. 4, 500m, 4Gi)"
        ) from None
    except ArithmeticError:  # decimal arithmetic on an odd value: refused, not a traceback
        raise ValueError(f"{what} {value!r} is out of range") from None
    if q <= 0:
        raise ValueError(f"{what} {value!r} must be above 0")
    if q > _QUANTITY_MAX:
        # the API server would silently cap it; no node has it, and twice a huge memory request
        # (the default limit) overflows Python's Decimal
        raise ValueError(f"{what} {value!r} is out of range (a quantity is at most 2^63-1)")
    return q


def _format_bytes(n: Any) -> str:
    n = int(n)
    for suffix, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def container_resources(
    cpu: str = DEFAULT_CPU,
    memory: str = DEFAULT_MEMORY,
    memory_limit: str | None = None,
    cpu_limit: str | None = None,
) -> dict[str, Any]:
    """requests.cpu/memory, limits.memory (default: twice the request, as the chart's 4Gi/8Gi)
    and an optional limits.cpu; raises ValueError for a bad or inconsistent value."""
    cpu_q = _quantity(cpu, "--cpu")
    if _BINARY_SUFFIX.search(cpu.strip()):
        raise ValueError(f"--cpu {cpu!r}: CPU is in cores or millicores (4, 500m), not bytes")
    mem_q = _quantity(memory, "--memory")
    if mem_q < 64 * 2**20:
        # a bare number is bytes: "4" asks for 4 bytes; nothing runs in that
        raise ValueError(
            f"--memory {memory!r} is below 64Mi (a bare number is bytes); e.g. 4Gi or 512Mi"
        )
    requests = {"cpu": cpu.strip(), "memory": memory.strip()}
    if memory_limit is None:
        limits = {"memory": _format_bytes(2 * mem_q)}
    else:
        if _quantity(memory_limit, "--memory-limit") < mem_q:
            raise ValueError(
                f"--memory-limit {memory_limit!r} is below the memory request {memory!r}"
            )
        limits = {"memory": memory_limit.strip()}
    if cpu_limit is not None:
        if _quantity(cpu_limit, "--cpu-limit") < cpu_q:
            raise ValueError(f"--cpu-limit {cpu_limit!r} is below the CPU request {cpu!r}")
        limits["cpu"] = cpu_limit.strip()
    return {"requests": requests, "limits": limits}


DEFAULT_RESOURCES = container_resources()


def labels(release: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": CHART_NAME,
        "app.kubernetes.io/instance": release,
        COMPONENT_LABEL: "loadtest",
        "app.kubernetes.io/part-of": CHART_NAME,
        "app.kubernetes.io/managed-by": "slo-loadtest",
    }


def loadtest_job(o: JobOptions) -> dict[str, Any]:
    """The Job manifest (a plain dict, as the API takes it)."""
    target = o.target or service_url(o.release, o.namespace)
    env: list[dict[str, Any]] = [
        {"name": "SLO_LOADTEST_TARGET", "value": target},
        {"name": "SLO_LOADTEST_OUT", "value": "/results"},
        # the Pushgateway group of this release (a push to the Pushgateway replaces only it)
        {
            "name": "SLO_LOADTEST_PUSH_RELEASE",
            "value": (o.settings or {}).get("push_release") or f"{o.namespace}/{o.release}",
        },
        {"name": "KEEP_RESULTS_SECONDS", "value": str(o.keep_results_s)},
        *(
            [{"name": "HEALTH_WAIT_SECONDS", "value": str(o.health_wait_s)}]
            if o.health_wait_s is not None
            else []
        ),
        {"name": "HOME", "value": "/tmp"},
        {"name": "MPLCONFIGDIR", "value": "/tmp/matplotlib"},
    ]
    for key, val in sorted((o.settings or {}).items()):
        if key.upper() in ("TARGET", "OUT", "PUSH_RELEASE"):
            continue
        env.append({"name": f"SLO_LOADTEST_{key.upper()}", "value": str(val)})
    if o.api_key_secret:
        env.append(
            {
                "name": "SLO_LOADTEST_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": o.api_key_secret, "key": o.api_key_key}},
            }
        )
    results_volume: dict[str, Any] = (
        {"name": "results", "persistentVolumeClaim": {"claimName": o.results_claim}}
        if o.results_claim
        else {"name": "results", "emptyDir": {}}
    )
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": CONTAINER,
                "image": o.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/sh", "-c", JOB_SCRIPT, "slo-loadtest-job"],
                "args": [str(a) for a in o.args],
                "env": env,
                "securityContext": {
                    "runAsNonRoot": True,
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": "results", "mountPath": "/results"},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
                "resources": dict(o.resources or DEFAULT_RESOURCES),
            }
        ],
        "volumes": [results_volume, {"name": "tmp", "emptyDir": {}}],
    }
    if o.service_account:
        pod_spec["serviceAccountName"] = o.service_account
    if o.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in o.image_pull_secrets]
    if o.node_selector:
        pod_spec["nodeSelector"] = dict(o.node_selector)
    if o.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in o.tolerations]
    lab = labels(o.release)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": o.name or job_name(o.release),
            "namespace": o.namespace,
            "labels": lab,
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": o.active_deadline_s,
            "ttlSecondsAfterFinished": o.ttl_s,
            "template": {"metadata": {"labels": lab}, "spec": pod_spec},
        },
    }


# ---------------------------------------------------------------------------------------------


@dataclass
class JobStatus:
    name: str
    phase: str  # pending | running | results-ready | succeeded | failed | missing
    pod: str = ""
    pod_phase: str = ""
    exit_code: int | None = None
    message: str = ""
    # why the pod is stuck or ended (ImagePullBackOff, Unschedulable, OOMKilled, ...), from the pod
    reason: str = ""

    def describe(self) -> str:
        """``pending (ImagePullBackOff: Back-off pulling image ...)``: the phase and its reason."""
        why = ": ".join(x for x in (self.reason, self.message if self.reason else "") if x)
        return f"{self.phase} ({why})" if why else self.phase


def pod_problem(pod: Any) -> tuple[str, str]:
    """(reason, message) of what keeps a pod from running or ended it: an Unschedulable
    condition, a container waiting (ImagePullBackOff, ErrImagePull, CreateContainerConfigError,
    ...), or a terminated container (OOMKilled, Error). ('', '') when there is none."""
    st = pod.status if pod is not None else None
    if st is None:
        return "", ""
    for cond in st.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False":
            return cond.reason or "Unschedulable", cond.message or ""
    statuses = [*(st.init_container_statuses or []), *(st.container_statuses or [])]
    for cs in statuses:
        waiting = cs.state.waiting if cs.state else None
        # ContainerCreating/PodInitializing are progress, not a problem
        if waiting and waiting.reason not in (None, "ContainerCreating", "PodInitializing"):
            return waiting.reason, f"container {cs.name}: {waiting.message or waiting.reason}"
    for cs in statuses:
        term = cs.state.terminated if cs.state else None
        if term and term.exit_code:
            why = term.reason or "Error"
            return why, f"container {cs.name} exited with code {term.exit_code} ({why})"
    return "", ""


class LoadTestJobs:
    def __init__(self, api_client: client.ApiClient, namespace: str) -> None:
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace

    def start(self, manifest: Mapping[str, Any]) -> str:
        job = self.batch.create_namespaced_job(self.namespace, body=dict(manifest))
        return str(job.metadata.name)

    def latest(self, release: str = "") -> str:
        """The newest load-test Job (by creation time), optionally of one release."""
        selector = f"{COMPONENT_LABEL}=loadtest"
        if release:
            selector += f",app.kubernetes.io/instance={release}"
        jobs = self.batch.list_namespaced_job(self.namespace, label_selector=selector).items
        if not jobs:
            raise LookupError(f"no load-test Job in namespace {self.namespace} ({selector})")
        jobs.sort(key=lambda j: j.metadata.creation_timestamp or dt.datetime.min)
        return str(jobs[-1].metadata.name)

    def pod(self, name: str) -> Any | None:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector=f"job-name={name}"
        ).items
        if not pods:
            return None
        pods.sort(key=lambda p: p.metadata.creation_timestamp or dt.datetime.min)
        return pods[-1]

    def log(self, pod: str) -> str:
        return str(self.core.read_namespaced_pod_log(pod, self.namespace, container=CONTAINER))

    def status(self, name: str) -> JobStatus:
        try:
            job = self.batch.read_namespaced_job(name, self.namespace)
        except client.ApiException as exc:
            if exc.status == 404:
                return JobStatus(name, "missing", message="no such Job")
            raise
        st = job.status
        pod = self.pod(name)
        pod_name = pod.metadata.name if pod else ""
        pod_phase = (pod.status.phase or "") if pod and pod.status else ""
        exit_code = None
        ready = False
        if pod_name and pod_phase in ("Running", "Succeeded", "Failed"):
            text = self.log(pod_name)
            ready, exit_code = parse_ready(text)
        reason, detail = pod_problem(pod)
        for cond in (st.conditions or []) if st else []:
            if cond.status == "True" and cond.type in ("Complete", "Failed"):
                phase = "succeeded" if cond.type == "Complete" else "failed"
                message = cond.message or cond.reason or ""
                if phase == "failed":
                    # the Job says "deadline exceeded" or "backoff limit"; the pod says why
                    message = "; ".join(x for x in (message, detail) if x)
                    reason = reason or cond.reason or ""
                return JobStatus(
                    name, phase, pod_name, pod_phase, exit_code, message,
                    reason if phase == "failed" else "",
                )  # fmt: skip
        if ready:
            return JobStatus(name, "results-ready", pod_name, pod_phase, exit_code)
        if st and (st.active or 0) > 0 and pod_phase == "Running":
            return JobStatus(name, "running", pod_name, pod_phase)
        return JobStatus(name, "pending", pod_name, pod_phase, message=detail, reason=reason)

    def wait(
        self,
        name: str,
        timeout_s: float,
        poll_s: float = 5.0,
        on_change: Callable[[JobStatus], None] | None = None,
    ) -> JobStatus:
        deadline = time.monotonic() + timeout_s
        last = ""
        while True:
            s = self.status(name)
            # a new reason (ErrImagePull -> ImagePullBackOff) is news too
            if on_change and s.describe() != last:
                on_change(s)
                last = s.describe()
            if s.phase in ("results-ready", "succeeded", "failed", "missing"):
                return s
            if time.monotonic() >= deadline:
                return s
            time.sleep(poll_s)

    def stream_log(self, name: str, wait_s: float = 300.0, poll_s: float = 2.0) -> Iterator[str]:
        """Follow the Job pod's log until the container ends."""
        deadline = time.monotonic() + wait_s
        while True:
            pod = self.pod(name)
            phase = (pod.status.phase or "") if pod and pod.status else ""
            if phase in ("Running", "Succeeded", "Failed"):
                break
            if time.monotonic() >= deadline:
                reason, detail = pod_problem(pod)
                raise TimeoutError(
                    f"the pod of Job {name} did not start within {wait_s:.0f} s "
                    f"(phase {phase or 'none'}" + (f"; {reason}: {detail})" if reason else ")")
                )
            time.sleep(poll_s)
        resp = self.core.read_namespaced_pod_log(
            pod.metadata.name,
            self.namespace,
            container=CONTAINER,
            follow=True,
            _preload_content=False,
        )
        try:
            for chunk in resp.stream(4096):
                yield chunk.decode(errors="replace")
        finally:
            resp.release_conn()


def parse_ready(log_text: str) -> tuple[bool, int | None]:
    """(results ready, exit code) from the Job's log."""
    idx = log_text.rfind(READY_LINE)
    if idx < 0:
        return False, None
    tail = log_text[idx:].split("\n", 1)[0]
    code = None
    if "(exit code " in tail:
        try:
            code = int(tail.split("(exit code ", 1)[1].split(")", 1)[0])
        except ValueError:
            code = None
    return True, code


def api_client(
    kubeconfig: str | None = None,
    context: str | None = None,
    server: str | None = None,
    token: str | None = None,
) -> client.ApiClient:
    """An ApiClient from an explicit API server URL (e.g. `kubectl proxy`), the in-cluster
    service account, or a kubeconfig (in that order of preference)."""
    from kubernetes import config as kconfig

    if server:
        cfg = client.Configuration()
        cfg.host = server.rstrip("/")
        if token:
            cfg.api_key = {"authorization": f"Bearer {token}"}
        return client.ApiClient(cfg)
    try:
        return kconfig.new_client_from_config(config_file=kubeconfig, context=context)
    except kconfig.ConfigException:
        # in a pod, the service account; elsewhere the kubeconfig's error is the one that helps
        # (the in-cluster one would only say "Service host/port is not set")
        if kubeconfig or context or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise
        kconfig.load_incluster_config()
        return client.ApiClient()
