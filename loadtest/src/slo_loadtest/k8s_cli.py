"""``slo-loadtest k8s start|status|logs|fetch``."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from slo_loadtest.config import env_var
from slo_loadtest.exit_codes import EXIT_INCOMPLETE, EXIT_USAGE
from slo_loadtest.k8s_defaults import DEFAULT_CPU, DEFAULT_MEMORY


class K8sUsageError(click.ClickException):
    """No usable kubeconfig, or the API server refused the request: one 'Error: ...' line."""

    exit_code = EXIT_USAGE


class K8sUnavailable(click.ClickException):
    """The API server cannot be reached, or the results are not there (yet)."""

    exit_code = EXIT_INCOMPLETE


def _api_message(exc: Any) -> str:
    """The message of a Kubernetes Status body, else the HTTP reason."""
    try:
        body = json.loads(exc.body or "")
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])
    except (TypeError, ValueError):
        pass
    return f"{exc.status} {exc.reason}"


def _translate(exc: Exception, namespace: str) -> click.ClickException | None:
    """A kubernetes/urllib3 exception as one clear line with its exit code (None: not ours)."""
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == "kubernetes":
        # an install without dependencies (an air-gapped --no-deps one) that left it out
        return K8sUsageError(
            "the kubernetes Python client is not installed (pip install 'kubernetes>=29'); "
            "local commands such as `slo-loadtest run` do not need it"
        )
    try:
        from kubernetes.client import ApiException
        from kubernetes.config import ConfigException
        from urllib3.exceptions import HTTPError as Urllib3Error
    except ImportError:
        return None

    if isinstance(exc, ConfigException):
        return K8sUsageError(
            f"no usable Kubernetes configuration ({exc}); give --kubeconfig/--context, set "
            "KUBECONFIG, or talk to an API server directly with --api-server"
        )
    if isinstance(exc, Urllib3Error):  # MaxRetryError after connection refused, DNS, TLS, ...
        return K8sUnavailable(
            f"cannot reach the Kubernetes API server: {getattr(exc, 'reason', None) or exc}"
        )
    if isinstance(exc, ApiException):
        msg = _api_message(exc)
        if exc.status == 404 and f'namespaces "{namespace}" not found' in msg:
            return K8sUsageError(f"namespace {namespace!r} not found")
        if exc.status == 409:
            return K8sUsageError(f"{msg} (namespace {namespace!r})")
        if exc.status is not None and 400 <= exc.status < 500:
            return K8sUsageError(f"the API server refused the request ({exc.status}): {msg}")
        return K8sUnavailable(f"the API server failed ({exc.status}): {msg}")
    return None


class _K8sGroup(click.Group):
    """Turns client exceptions of every subcommand into one 'Error: ...' line and an exit
    code that cannot be mistaken for an SLO verdict (slo_loadtest.exit_codes)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit):  # Exit: --help, ctx.exit()
            raise
        except Exception as exc:
            err = _translate(exc, str(ctx.meta.get(_NS_KEY, "")))
            if err is None:
                raise
            raise err from None


_NS_KEY = "slo_loadtest.k8s.namespace"  # set by _jobs() for the error messages


_conn = [
    click.option(
        "--namespace",
        "-n",
        default="default",
        show_default=True,
        envvar=env_var("k8s_namespace"),
        show_envvar=True,
    ),
    click.option(
        "--kubeconfig",
        default=None,
        envvar="KUBECONFIG",
        help="Kubeconfig file (default: ~/.kube/config, else in-cluster).",
    ),
    click.option("--context", default=None, help="Kubeconfig context."),
    click.option(
        "--api-server",
        default=None,
        envvar=env_var("k8s_api_server"),
        help="API server URL to talk to directly, e.g. http://127.0.0.1:8001 from "
        "`kubectl proxy` (overrides the kubeconfig).",
    ),
    click.option(
        "--token", default=None, envvar=env_var("k8s_token"), help="Bearer token for --api-server."
    ),
]


def conn(fn: Any) -> Any:
    for opt in reversed(_conn):
        fn = opt(fn)
    return fn


def _jobs(
    namespace: str,
    kubeconfig: str | None,
    context: str | None,
    api_server: str | None,
    token: str | None,
) -> Any:
    from slo_loadtest.k8s import LoadTestJobs, api_client

    click.get_current_context().meta[_NS_KEY] = namespace
    return LoadTestJobs(api_client(kubeconfig, context, api_server, token), namespace)


def _name(jobs: Any, job: str | None, release: str) -> str:
    if job:
        return job
    try:
        return str(jobs.latest(release))
    except LookupError as exc:
        raise K8sUsageError(str(exc)) from None


# set by the Job itself, or not to be put in plain text into the manifest
_NOT_SETTABLE = {
    "target": "use --target",
    "out": "the Job writes to /results",
    "api_key": "use --api-key-secret (a Secret, not plain text in the Job)",
}


# The Job spec is readable by whoever may read Jobs, `--dry-run` prints it, and the pod script
# echoes the target into the pod log (which `fetch` and `logs` read): credentials go through a
# Secret (--api-key-secret) or not at all.
_IN_A_SECRET = (
    "would be plain text in the Job spec (and the target in the pod log); put the server's key in "
    "a Secret and use --api-key-secret NAME"
)


def _refuse_plain_credentials(
    target: str, settings: Mapping[str, str], args: tuple[str, ...]
) -> None:
    from slo_loadtest.credentials import has_userinfo

    if has_userinfo(target):
        raise click.BadParameter(f"credentials in the URL {_IN_A_SECRET}", param_hint="'--target'")
    if has_userinfo(settings.get("pushgateway", "")):
        raise click.BadParameter(
            "credentials in the Pushgateway URL would be plain text in the Job spec",
            param_hint="'--set pushgateway'",
        )
    for arg in args:
        if arg.split("=", 1)[0] == "--api-key":
            raise click.BadParameter(f"--api-key {_IN_A_SECRET}", param_hint="'--arg'")
        if has_userinfo(arg):
            raise click.BadParameter(f"credentials in a URL {_IN_A_SECRET}", param_hint="'--arg'")


def setting_keys() -> dict[str, str]:
    """Every spelling --set accepts -> the setting (SLO_LOADTEST_<SETTING>) that the pod's
    `slo-loadtest run` reads: the setting itself, and its flag without dashes (`duration` and
    `--duration` for duration_s). A flag's negative spelling (--reuse-media) is no alias."""
    from slo_loadtest.cli import run

    keys: dict[str, str] = {}
    for p in run.params:
        prefix = env_var("")
        if not isinstance(p.envvar, str) or not p.envvar.startswith(prefix):
            continue
        name = p.envvar.removeprefix(prefix).lower()
        keys[name] = name
        for opt in p.opts:
            keys.setdefault(opt.lstrip("-").replace("-", "_").lower(), name)
    return keys


def _kv(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    known = setting_keys()
    out = {}
    for v in values:
        if "=" not in v:
            raise click.BadParameter(f"{v!r} is not KEY=VALUE", ctx=ctx, param=param)
        k, _, val = v.partition("=")
        key = k.strip().lstrip("-").replace("-", "_").lower()
        if key in _NOT_SETTABLE:
            raise click.BadParameter(f"{k!r}: {_NOT_SETTABLE[key]}", ctx=ctx, param=param)
        if key not in known:
            # an unknown key would become a variable nothing reads, and the sweep would run
            # with the default silently
            valid = sorted(set(known.values()) - set(_NOT_SETTABLE))
            raise click.BadParameter(
                f"unknown setting {k!r}; valid settings (or their run flags, e.g. duration for "
                f"duration_s): {', '.join(valid)}",
                ctx=ctx,
                param=param,
            )
        out[known[key]] = val
    return out


@click.group(cls=_K8sGroup)
def k8s() -> None:
    """Run the load test as a Kubernetes Job (the chart's load-test Job) and fetch its report."""


@k8s.command()
@conn
@click.option("--release", required=True, help="Helm release of the gemma4-serving chart.")
@click.option("--image", required=True, help="Load-test image (images/Dockerfile.loadtest).")
@click.option(
    "--target",
    default="",
    help="Server URL (default: the chart's Service, "
    "http://<release>-gemma4-serving.<namespace>.svc:8000).",
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    callback=_kv,
    metavar="KEY=VALUE",
    help="Sweep setting, becomes SLO_LOADTEST_<KEY> (e.g. --set rates=1..20 "
    "--set duration_s=30; `run`'s flag names work too: --set duration=30). Unknown keys are "
    "refused. Repeatable.",
)
@click.option(
    "--extra-body",
    default="",
    metavar="JSON",
    help="JSON object merged into every request body (becomes SLO_LOADTEST_EXTRA_BODY, as "
    """`run --extra-body`), e.g. '{"skip_special_tokens": false}' for a dummy-weight model.""",
)
@click.option(
    "--arg",
    "args",
    multiple=True,
    help="Extra argument after `run --target ... --out /results`. Repeatable.",
)
@click.option("--active-deadline", type=click.IntRange(min=60), default=3600, show_default=True)
@click.option(
    "--keep-results",
    type=click.IntRange(min=0),
    default=900,
    show_default=True,
    help="Seconds the pod stays up after the sweep so /results can be copied.",
)
@click.option(
    "--health-wait",
    type=click.IntRange(min=0),
    default=None,
    help="Seconds the pod waits for the target's /health before it runs the sweep anyway (whose "
    "preflight then reports an unreachable target, exit 3) [default: 900].",
)
@click.option("--results-claim", default="", help="PVC for /results (default: an emptyDir).")
@click.option("--api-key-secret", default="", help="Secret holding the server's API key.")
@click.option(
    "--cpu",
    default=DEFAULT_CPU,
    show_default=True,
    help="CPU request of the pod (cores or millicores, e.g. 4, 500m). guidellm's workers and the "
    "media generation need several cores: a starved client falls behind (inconclusive rates).",
)
@click.option(
    "--memory",
    default=DEFAULT_MEMORY,
    show_default=True,
    help="Memory request (e.g. 4Gi, 512Mi; a bare number is bytes).",
)
@click.option(
    "--memory-limit",
    default=None,
    help="Memory limit [default: twice --memory, the chart's 4Gi/8Gi].",
)
@click.option(
    "--cpu-limit",
    default=None,
    help="CPU limit [default: none; throttling would make the client fall behind].",
)
@click.option(
    "--image-pull-secret",
    "image_pull_secrets",
    multiple=True,
    metavar="NAME",
    help="Secret for pulling --image from a private registry. Repeatable.",
)
@click.option(
    "--service-account",
    default="",
    help="ServiceAccount of the pod (default: the namespace's default; its token is not mounted).",
)
@click.option(
    "--node-selector",
    "node_selector",
    multiple=True,
    metavar="KEY=VALUE",
    help="Run on nodes with this label, e.g. node-pool=cpu. Repeatable.",
)
@click.option(
    "--toleration",
    "tolerations",
    multiple=True,
    metavar="KEY[=VALUE][:EFFECT]|JSON",
    help="Tolerate a taint: as in `kubectl taint` (gpu=true:NoSchedule; no value: any value; "
    'no effect: every effect) or a JSON toleration ({"key": "k", "operator": "Exists", '
    '"effect": "NoExecute", "tolerationSeconds": 60}). Repeatable.',
)
@click.option("--wait/--no-wait", default=False, help="Wait for the results, then fetch them.")
@click.option(
    "--timeout", type=float, default=3600.0, show_default=True, help="How long --wait waits (s)."
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="With --wait: fetch into this directory.",
)
@click.option(
    "--name",
    "job_name",
    default="",
    help="Job name (default: <release>-...-loadtest-cli-<UTC time>).",
)
@click.option("--dry-run", is_flag=True, help="Print the Job manifest (JSON) and exit.")
def start(
    namespace: str,
    kubeconfig: str | None,
    context: str | None,
    api_server: str | None,
    token: str | None,
    release: str,
    image: str,
    target: str,
    settings: dict[str, str],
    extra_body: str,
    args: tuple[str, ...],
    active_deadline: int,
    keep_results: int,
    health_wait: int | None,
    results_claim: str,
    api_key_secret: str,
    cpu: str,
    memory: str,
    memory_limit: str | None,
    cpu_limit: str | None,
    image_pull_secrets: tuple[str, ...],
    service_account: str,
    node_selector: tuple[str, ...],
    tolerations: tuple[str, ...],
    wait: bool,
    timeout: float,
    out: Path | None,
    job_name: str,
    dry_run: bool,
) -> None:
    """Create the load-test Job."""
    from slo_loadtest.k8s import JobOptions, loadtest_job
    from slo_loadtest.validation import check_target, parse_extra_body

    pod = _pod_options(
        cpu, memory, memory_limit, cpu_limit, image_pull_secrets, service_account,
        node_selector, tolerations,
    )  # fmt: skip

    if target:
        try:
            target = check_target(target)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--target'") from None
    _refuse_plain_credentials(target, settings, args)
    # the extra body is checked here, not first in the pod: a typo fails now, with exit 2
    if extra_body.strip() and "extra_body" in settings:
        raise click.BadParameter(
            "give the extra body once: --extra-body or --set extra_body=...",
            param_hint="'--extra-body'",
        )
    given, hint = (
        (extra_body, "'--extra-body'")
        if extra_body.strip()
        else (settings.get("extra_body"), "'--set extra_body'")
    )
    if given is not None:
        try:
            body = parse_extra_body(given)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=hint) from None
        settings = {k: v for k, v in settings.items() if k != "extra_body"}
        if body:
            settings["extra_body"] = json.dumps(body, separators=(",", ":"))
    manifest = loadtest_job(
        JobOptions(
            release=release,
            namespace=namespace,
            image=image,
            target=target,
            settings=settings,
            args=args,
            active_deadline_s=active_deadline,
            keep_results_s=keep_results,
            health_wait_s=health_wait,
            name=job_name,
            results_claim=results_claim,
            api_key_secret=api_key_secret,
            **pod,
        )
    )
    if dry_run:
        click.echo(json.dumps(manifest, indent=2))
        return
    jobs = _jobs(namespace, kubeconfig, context, api_server, token)
    name = jobs.start(manifest)
    click.echo(f"job/{name} created in namespace {namespace}")
    if wait:
        sys.exit(_wait_and_fetch(jobs, name, timeout, out or Path(f"results-{name}")))


def _pod_options(
    cpu: str,
    memory: str,
    memory_limit: str | None,
    cpu_limit: str | None,
    image_pull_secrets: tuple[str, ...],
    service_account: str,
    node_selector: tuple[str, ...],
    tolerations: tuple[str, ...],
) -> dict[str, Any]:
    """JobOptions' pod fields, checked here: a typo fails now with one line and exit 2, not as
    a pod that never schedules or a Job the API server refuses."""
    from slo_loadtest import k8s as kj

    def checked(flag: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except ValueError as exc:
            msg = str(exc)
            # the resource checks name their own flag (--memory-limit, ...)
            raise K8sUsageError(msg if msg.startswith("--") else f"{flag}: {msg}") from None
        except ArithmeticError as exc:  # Decimal/int arithmetic on a huge or odd quantity
            raise K8sUsageError(f"{flag}: a value out of range ({type(exc).__name__})") from None

    return {
        "resources": checked(
            "--cpu/--memory", kj.container_resources, cpu, memory, memory_limit, cpu_limit
        ),
        "image_pull_secrets": tuple(
            checked("--image-pull-secret", kj.check_name, n, "Secret") for n in image_pull_secrets
        ),
        "service_account": service_account
        and checked("--service-account", kj.check_name, service_account, "ServiceAccount"),
        "node_selector": checked("--node-selector", kj.parse_node_selector, node_selector),
        "tolerations": tuple(checked("--toleration", kj.parse_toleration, t) for t in tolerations),
    }


def _wait_and_fetch(jobs: Any, name: str, timeout: float, out: Path) -> int:
    s = jobs.wait(
        name, timeout, on_change=lambda s: click.echo(f"job/{name}: {s.describe()}", err=True)
    )
    if s.phase not in ("results-ready", "succeeded", "failed"):
        click.echo(f"job/{name}: still {s.describe()} after {timeout:.0f} s", err=True)
        return EXIT_INCOMPLETE
    return _fetch(jobs, name, out)


@k8s.command()
@conn
@click.option("--job", default=None, help="Job name (default: the newest load-test Job).")
@click.option("--release", default="", help="Only Jobs of this release (with no --job).")
def status(
    namespace: str,
    kubeconfig: str | None,
    context: str | None,
    api_server: str | None,
    token: str | None,
    job: str | None,
    release: str,
) -> None:
    """Show a load-test Job's state: pending, running, results-ready, succeeded, failed."""
    jobs = _jobs(namespace, kubeconfig, context, api_server, token)
    name = _name(jobs, job, release)
    s = jobs.status(name)
    click.echo(
        json.dumps(
            {
                "job": s.name,
                "phase": s.phase,
                "pod": s.pod,
                "pod_phase": s.pod_phase,
                "exit_code": s.exit_code,
                # e.g. ImagePullBackOff, Unschedulable, OOMKilled: why it is pending or failed
                "reason": s.reason,
                "message": s.message,
            }
        )
    )
    if s.phase == "missing":
        sys.exit(EXIT_USAGE)  # not 1: that is "the SLO failed"


@k8s.command()
@conn
@click.option("--job", default=None, help="Job name (default: the newest load-test Job).")
@click.option("--release", default="")
@click.option(
    "--wait-pod",
    type=float,
    default=300.0,
    show_default=True,
    help="How long to wait for the pod to start (s).",
)
def logs(
    namespace: str,
    kubeconfig: str | None,
    context: str | None,
    api_server: str | None,
    token: str | None,
    job: str | None,
    release: str,
    wait_pod: float,
) -> None:
    """Stream the Job pod's log until it ends."""
    jobs = _jobs(namespace, kubeconfig, context, api_server, token)
    name = _name(jobs, job, release)
    try:
        for chunk in jobs.stream_log(name, wait_s=wait_pod):
            click.echo(chunk, nl=False)
    except TimeoutError as exc:
        raise K8sUnavailable(str(exc)) from None


@k8s.command()
@conn
@click.option("--job", default=None, help="Job name (default: the newest load-test Job).")
@click.option("--release", default="")
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Directory for summary.json, results.csv, report.md, plots (default: results-<job>).",
)
@click.option(
    "--wait",
    "wait_s",
    type=float,
    default=0.0,
    help="Wait up to this many seconds for the results first.",
)
def fetch(
    namespace: str,
    kubeconfig: str | None,
    context: str | None,
    api_server: str | None,
    token: str | None,
    job: str | None,
    release: str,
    out: Path | None,
    wait_s: float,
) -> None:
    """Fetch the Job's report: the summary from the pod log, redrawn into --out."""
    jobs = _jobs(namespace, kubeconfig, context, api_server, token)
    name = _name(jobs, job, release)
    out = out or Path(f"results-{name}")
    if wait_s > 0:
        sys.exit(_wait_and_fetch(jobs, name, wait_s, out))
    sys.exit(_fetch(jobs, name, out))


def _fetch(jobs: Any, name: str, out: Path) -> int:
    from slo_loadtest.cli import exit_code
    from slo_loadtest.outputs import extract_summary, write_outputs

    pod = jobs.pod(name)
    if pod is None:
        raise K8sUnavailable(f"job/{name} has no pod (yet)")
    summary = extract_summary(jobs.log(pod.metadata.name))
    if summary is None:
        raise K8sUnavailable(
            f"no summary in the log of pod {pod.metadata.name} yet (the sweep is still running, "
            "or it was started without --print-summary outside Kubernetes)"
        )
    summary["source"] = f"k8s job/{name} pod/{pod.metadata.name}"
    paths = write_outputs(summary, out)
    click.echo(f"fetched job/{name}: verdict {summary['verdict'].upper()} -> {paths['markdown']}")
    return exit_code(summary)
