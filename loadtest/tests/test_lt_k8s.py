"""`slo-loadtest k8s` against the real kubernetes client, its HTTP layer pointed at a fake API
server (tests/fake_kube_api.py): no Kubernetes control plane can run on these machines."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from lt_fake_kube_api import FakeKubeAPI

from slo_loadtest.cli import cli
from slo_loadtest.config import Criteria
from slo_loadtest.exit_codes import EXIT_USAGE
from slo_loadtest.guidellm_adapter import load_report
from slo_loadtest.k8s import (
    JOB_SCRIPT,
    JobOptions,
    LoadTestJobs,
    api_client,
    job_name,
    loadtest_job,
    parse_ready,
)
from slo_loadtest.outputs import summary_block
from slo_loadtest.summary import build_summary
from slo_loadtest.validation import parse_extra_body
from slo_loadtest.verdict import RateResult

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gemma4-serving"
FIXTURES = Path(__file__).parent / "fixtures"
NS = "gemma"
START = ["k8s", "start", "--release", "g4", "--image", "i"]  # the flags every start test needs


def _start_on(api: Any, *more: str) -> list[str]:
    """`k8s start` against the fake API server's namespace NS, plus more flags."""
    return [*START, "-n", NS, "--api-server", api.url, *more]


def _summary() -> dict:
    m = load_report(FIXTURES / "text-1rps.json").measurements[0]
    r = RateResult(workload="text", target_rate=m.target_rate, measurement=m)
    lenient = Criteria(slo_ms=600_000, min_achieved_ratio=0, max_dispatch_delay_ms=1e6)
    return build_summary(
        [r],
        lenient,
        workloads=["text"],
        target="http://svc",
        model="gemma4-tiny",
        guidellm_version="0.8.1",
    )


def _job_log(rc: int = 0) -> str:
    return (
        "slo-loadtest job: waiting for http://svc/health\n"
        "[text 1 req/s] PASS ...\n"
        + summary_block(_summary())
        + f"slo-loadtest job: results ready in /results (exit code {rc}); keeping them "
        "for 900s\n"
    )


def test_job_manifest_is_a_valid_batch_v1_job() -> None:
    m = loadtest_job(
        JobOptions(
            release="g4",
            namespace=NS,
            image="reg/gemma4-loadtest:1",
            settings={"rates": "1..20", "slo_ms": "300"},
            args=("--x",),
        )
    )
    assert m["metadata"]["name"].startswith("g4-gemma4-serving-loadtest-cli-")
    assert len(m["metadata"]["name"]) <= 63
    pod = m["spec"]["template"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "loadtest"
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["SLO_LOADTEST_TARGET"] == "http://g4-gemma4-serving.gemma.svc:8000"
    assert env["SLO_LOADTEST_RATES"] == "1..20" and env["SLO_LOADTEST_SLO_MS"] == "300"
    assert env["SLO_LOADTEST_OUT"] == "/results"
    assert c["command"][:2] == ["/bin/sh", "-c"] and c["args"] == ["--x"]
    # the kubernetes client's own model accepts it
    client = api_client(server="http://127.0.0.1:1")
    from kubernetes.client import V1Job

    obj = client._ApiClient__deserialize(m, V1Job)
    assert obj.spec.backoff_limit == 0 and obj.spec.template.spec.containers[0].name == "loadtest"
    assert len(job_name("x" * 80, "20260101000000")) <= 63


def _helm() -> str:
    found = shutil.which("helm") or str(REPO / ".tools" / "bin" / "helm")
    assert Path(found).exists(), "helm is needed: scripts/install-tools.sh"
    return found


def test_job_matches_the_charts_load_test_job() -> None:
    """The Job we create and the chart's standalone Job run the same pod."""
    assert (CHART / "templates" / "_loadtest.tpl").exists()
    out = subprocess.run(
        [
            _helm(),
            "template",
            "g4",
            str(CHART),
            "-n",
            NS,
            "--set",
            "loadtest.job.enabled=true",
            "--show-only",
            "templates/loadtest-job.yaml",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    chart_job = yaml.safe_load(out)
    ours = loadtest_job(
        JobOptions(release="g4", namespace=NS, image="img", settings={"workloads": "text,video"})
    )
    cpod, opod = chart_job["spec"]["template"]["spec"], ours["spec"]["template"]["spec"]
    cc, oc = cpod["containers"][0], opod["containers"][0]
    assert cc["name"] == oc["name"] == "loadtest"
    assert cc["command"] == oc["command"], "the Job script drifted from the chart's"
    assert cc["command"][2] == JOB_SCRIPT
    assert cc["securityContext"] == oc["securityContext"]
    assert cpod["securityContext"] == opod["securityContext"]
    assert cpod["restartPolicy"] == opod["restartPolicy"] == "Never"
    assert chart_job["spec"]["backoffLimit"] == ours["spec"]["backoffLimit"] == 0
    cenv = {e["name"]: e.get("value") for e in cc["env"]}
    oenv = {e["name"]: e.get("value") for e in oc["env"]}
    for key in ("SLO_LOADTEST_TARGET", "SLO_LOADTEST_OUT", "HOME", "MPLCONFIGDIR"):
        assert cenv[key] == oenv[key], key
    assert {m["mountPath"] for m in cc["volumeMounts"]} == {
        m["mountPath"] for m in oc["volumeMounts"]
    }
    clabels = chart_job["spec"]["template"]["metadata"]["labels"]
    olabels = ours["spec"]["template"]["metadata"]["labels"]
    for key in (
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/component",
    ):
        assert clabels[key] == olabels[key], key


def test_parse_ready() -> None:
    assert parse_ready("x\nslo-loadtest job: results ready in /results (exit code 1); k") == (
        True,
        1,
    )
    assert parse_ready("still running") == (False, None)


def test_start_status_logs_fetch_through_the_client(tmp_path: Path) -> None:
    with FakeKubeAPI() as api:
        runner = CliRunner()
        base = ["k8s"]
        conn = ["-n", NS, "--api-server", api.url]
        res = runner.invoke(
            cli,
            [
                *base,
                "start",
                *conn,
                "--release",
                "g4",
                "--image",
                "img:1",
                "--set",
                "rates=1,2",
                "--set",
                "duration_s=5",
            ],
        )
        assert res.exit_code == 0, res.output
        assert ("POST", f"/apis/batch/v1/namespaces/{NS}/jobs") in api.requests
        (key,) = api.jobs
        name = key[1]
        assert name in res.output
        env = {
            e["name"]: e["value"]
            for e in api.jobs[key]["spec"]["template"]["spec"]["containers"][0]["env"]
            if "value" in e
        }
        assert env["SLO_LOADTEST_RATES"] == "1,2" and env["SLO_LOADTEST_DURATION_S"] == "5"

        def status() -> dict:
            r = runner.invoke(cli, [*base, "status", *conn])  # newest Job by default
            assert r.exit_code == 0, r.output
            return json.loads(r.output)

        assert status()["phase"] == "pending"
        api.set_pod(NS, name, "Running", "slo-loadtest job: waiting for http://svc/health\n")
        assert status()["phase"] == "running"

        # fetch before the summary exists: a clear error, no output
        r = runner.invoke(
            cli, [*base, "fetch", *conn, "--job", name, "--out", str(tmp_path / "early")]
        )
        assert r.exit_code == 3 and "no summary" in r.output

        # logs: follow the stream while the pod writes, until it ends
        def finish() -> None:
            time.sleep(0.5)
            api.set_pod(NS, name, "Running", _job_log(0))
            time.sleep(0.3)
            api.set_pod(NS, name, "Succeeded")
            api.finish_job(NS, name, ok=True)

        t = threading.Thread(target=finish)
        t.start()
        r = runner.invoke(cli, [*base, "logs", *conn, "--job", name])
        t.join()
        assert r.exit_code == 0, r.output
        assert "results ready" in r.output and "SUMMARY JSON BEGIN" in r.output
        assert any("follow=true" in p for _, p in api.requests)

        st = status()
        assert st["phase"] == "succeeded" and st["exit_code"] == 0

        out = tmp_path / "fetched"
        r = runner.invoke(cli, [*base, "fetch", *conn, "--out", str(out)])
        assert r.exit_code == 0, r.output
        summary = json.loads((out / "summary.json").read_text())
        assert summary["schema_version"] == 1 and summary["verdict"] == "pass"
        assert summary["source"].startswith(f"k8s job/{name}")
        assert (out / "report.md").exists() and (out / "results.csv").exists()
        assert (out / "latency-vs-rate.png").stat().st_size > 1000


def test_start_wait_fetches_when_results_are_ready(tmp_path: Path) -> None:
    with FakeKubeAPI() as api:
        jobs = LoadTestJobs(api_client(server=api.url), NS)
        manifest = loadtest_job(JobOptions(release="g4", namespace=NS, image="img"))
        name = jobs.start(manifest)

        def later() -> None:
            time.sleep(0.5)
            api.set_pod(NS, name, "Running", _job_log(1))  # the pod stays up: no Job condition

        threading.Thread(target=later).start()
        s = jobs.wait(name, timeout_s=20, poll_s=0.1)
        assert s.phase == "results-ready" and s.exit_code == 1


def test_missing_job_and_bad_flags() -> None:
    with FakeKubeAPI() as api:
        runner = CliRunner()
        r = runner.invoke(
            cli, ["k8s", "status", "-n", NS, "--api-server", api.url, "--job", "nope"]
        )
        assert r.exit_code == 2 and '"missing"' in r.output  # 1 means "the SLO failed"
        r = runner.invoke(cli, ["k8s", "status", "-n", NS, "--api-server", api.url])
        assert r.exit_code == 2 and "no load-test Job" in r.output
        r = runner.invoke(
            cli,
            _start_on(api, "--set", "novalue"),
        )
        assert r.exit_code == 2 and "--set" in r.output
        r = runner.invoke(
            cli,
            _start_on(api, "--target", "ftp://x"),
        )
        assert r.exit_code == 2 and "--target" in r.output
        assert not api.jobs


def test_start_forwards_and_checks_the_extra_body() -> None:
    """`k8s start --extra-body` (or `--set extra_body=`) becomes SLO_LOADTEST_EXTRA_BODY, the
    variable `run` reads in the pod; a bad one fails here with exit 2, not later in the pod."""
    base = [*START, "--dry-run"]
    for extra in (
        ["--extra-body", '{"skip_special_tokens": false}'],
        ["--set", 'extra_body={"skip_special_tokens":false}'],
    ):
        r = CliRunner().invoke(cli, [*base, *extra])
        assert r.exit_code == 0, r.output
        (container,) = json.loads(r.output)["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        # what the pod's `slo-loadtest run` makes of that variable
        assert parse_extra_body(env["SLO_LOADTEST_EXTRA_BODY"]) == {"skip_special_tokens": False}
    r = CliRunner().invoke(cli, base)
    assert r.exit_code == 0 and "SLO_LOADTEST_EXTRA_BODY" not in r.output
    for extra, flag, message in (
        (["--extra-body", "{oops"], "--extra-body", "is not valid JSON"),
        (["--extra-body", '{"model": "x"}'], "--extra-body", "cannot be overridden"),
        (["--set", "extra_body=[1]"], "--set extra_body", "must be a JSON object"),
        (
            ["--extra-body", "{}", "--set", "extra_body={}"],
            "--extra-body",
            "give the extra body once",
        ),
    ):
        r = CliRunner().invoke(cli, [*base, *extra])
        assert r.exit_code == 2 and flag in r.output and message in r.output, r.output


@pytest.mark.parametrize("flag", ["--dry-run"])
def test_start_dry_run_prints_manifest(flag: str) -> None:
    r = CliRunner().invoke(cli, [*START, flag])
    assert r.exit_code == 0
    assert json.loads(r.output)["kind"] == "Job"


def test_start_health_wait_becomes_the_scripts_bound() -> None:
    base = [*START, "--dry-run"]
    r = CliRunner().invoke(cli, [*base, "--health-wait", "60"])
    assert r.exit_code == 0, r.output
    (c,) = json.loads(r.output)["spec"]["template"]["spec"]["containers"]
    assert {"name": "HEALTH_WAIT_SECONDS", "value": "60"} in c["env"]
    assert "HEALTH_WAIT_SECONDS" in c["command"][2]
    r = CliRunner().invoke(cli, base)  # unset: the script's default applies
    (c,) = json.loads(r.output)["spec"]["template"]["spec"]["containers"]
    assert "HEALTH_WAIT_SECONDS" not in {e["name"] for e in c["env"]}


def _one_error_line(r: Any, code: int, text: str) -> None:
    """A clear 'Error: ...' line and the exit code, no traceback."""
    assert r.exit_code == code, (r.exit_code, r.output, r.exception)
    assert r.output.startswith("Error: ") and text in r.output, r.output
    assert "Traceback" not in r.output and r.output.count("\n") == 1, r.output


def test_client_errors_are_one_line_with_their_own_exit_code(tmp_path: Path) -> None:
    """No kubeconfig and a refused request exit 2, an unreachable API server 3; never 1, which
    means "the SLO failed"."""
    import socket

    runner = CliRunner(env={"KUBERNETES_SERVICE_HOST": None})
    r = runner.invoke(cli, [*START, "--kubeconfig", str(tmp_path / "none")])
    _one_error_line(r, 2, "no usable Kubernetes configuration")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    r = runner.invoke(cli, ["k8s", "status", "--api-server", f"http://127.0.0.1:{closed}"])
    _one_error_line(r, 3, "cannot reach the Kubernetes API server")
    with FakeKubeAPI(namespaces={NS}) as api:
        r = runner.invoke(cli, [*START, "--api-server", api.url, "-n", "nope"])
        _one_error_line(r, 2, "namespace 'nope' not found")
        args = _start_on(api, "--name", "lt-1")
        assert runner.invoke(cli, args).exit_code == 0
        r = runner.invoke(cli, args)
        _one_error_line(r, 2, 'jobs.batch "lt-1" already exists')


def test_set_keys_are_checked_and_flag_spellings_accepted() -> None:
    """--set takes only settings the pod's `slo-loadtest run` reads (a typo would be an env
    var nothing reads); `run`'s flag names are aliases; target/out/api_key are refused."""
    from slo_loadtest.cli import run

    base = [*START, "--dry-run"]
    r = CliRunner().invoke(
        cli,
        [*base, "--set", "duration=10", "--set", "--video-frames=4", "--set", "SLO_MS=250",
         "--set", "unique-media=false"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    (c,) = json.loads(r.output)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["SLO_LOADTEST_DURATION_S"] == "10" and env["SLO_LOADTEST_VIDEO_FRAMES"] == "4"
    assert env["SLO_LOADTEST_SLO_MS"] == "250" and env["SLO_LOADTEST_UNIQUE_MEDIA"] == "false"
    read = {p.envvar for p in run.params if p.envvar}
    assert {n for n in env if n.startswith("SLO_LOADTEST_")} - {"SLO_LOADTEST_OUT"} <= read
    for bad, message in (
        ("durations=10", "unknown setting 'durations'"),
        ("reuse_media=true", "unknown setting"),  # a negative flag is no alias
        ("target=http://x", "use --target"),
        ("api_key=secret", "use --api-key-secret"),
    ):
        r = CliRunner().invoke(cli, [*base, "--set", bad])
        assert r.exit_code == 2 and message in r.output, r.output
    r = CliRunner().invoke(cli, [*base, "--set", "durations=10"])
    assert "duration_s" in r.output and "video_frames" in r.output  # the valid ones are listed


def _chart_pod(*sets: str) -> dict:
    out = subprocess.run(
        [_helm(), "template", "g4", str(CHART), "-n", NS, "--set", "loadtest.job.enabled=true",
         "--show-only", "templates/loadtest-job.yaml", *sets],
        check=True, capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    return yaml.safe_load(out)["spec"]["template"]["spec"]


POD_OPTIONS = [
    "--image-pull-secret", "regcred", "--image-pull-secret", "mirror.pull",
    "--service-account", "loadtest-runner",
    "--node-selector", "node-pool=cpu", "--node-selector", "kubernetes.io/arch=amd64",
    "--toleration", "dedicated=loadtest:NoSchedule", "--toleration", "spot:NoExecute",
    "--toleration", '{"key": "maint", "operator": "Exists", "effect": "NoExecute", '
    '"tolerationSeconds": 60}',
]  # fmt: skip


def test_start_sets_resources_pull_secrets_account_and_scheduling() -> None:
    """The pod is not BestEffort (requests and a memory limit, the chart's defaults unless
    overridden); pull secrets, service account, node selector and tolerations reach the Job the
    API server receives, through the real client."""
    with FakeKubeAPI() as api:
        base = _start_on(api)
        r = CliRunner().invoke(cli, [*base, "--name", "plain"])
        assert r.exit_code == 0, r.output
        pod = api.jobs[(NS, "plain")]["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"] == {
            "requests": {"cpu": "4", "memory": "4Gi"},
            "limits": {"memory": "8Gi"},
        }
        assert not {"imagePullSecrets", "nodeSelector", "tolerations", "serviceAccountName"} & set(
            pod
        )
        r = CliRunner().invoke(
            cli,
            [*base, "--name", "full", "--cpu", "1500m", "--memory", "1Gi", "--cpu-limit", "2",
             *POD_OPTIONS],
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        pod = api.jobs[(NS, "full")]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {
        "requests": {"cpu": "1500m", "memory": "1Gi"},
        "limits": {"memory": "2Gi", "cpu": "2"},  # the memory limit follows the request: 2x
    }
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror.pull"}]
    assert pod["serviceAccountName"] == "loadtest-runner"
    assert pod["nodeSelector"] == {"node-pool": "cpu", "kubernetes.io/arch": "amd64"}
    assert pod["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "loadtest", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Exists", "effect": "NoExecute"},
        {"key": "maint", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
    ]
    # the client's own model reads every field back
    from kubernetes.client import V1Job

    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"},
           "spec": {"template": {"spec": pod}}}  # fmt: skip
    spec = api_client(server="http://127.0.0.1:1")._ApiClient__deserialize(job, V1Job).spec
    tol = spec.template.spec.tolerations[2]
    assert (tol.key, tol.toleration_seconds) == ("maint", 60)
    assert spec.template.spec.containers[0].resources.limits == {"memory": "2Gi", "cpu": "2"}


def test_pod_options_match_the_charts_values() -> None:
    """Default resources are the chart's loadtest.resources; the scheduling options render as
    the chart renders imagePullSecrets, loadtest.nodeSelector and loadtest.tolerations."""
    chart = _chart_pod(
        "--set", "imagePullSecrets[0]=regcred", "--set", "loadtest.nodeSelector.node-pool=cpu",
        "--set", "loadtest.tolerations[0].key=dedicated",
        "--set", "loadtest.tolerations[0].operator=Equal",
        "--set-string", "loadtest.tolerations[0].value=loadtest",
        "--set", "loadtest.tolerations[0].effect=NoSchedule",
    )  # fmt: skip
    r = CliRunner().invoke(
        cli,
        [*START, "--dry-run",
         "--image-pull-secret", "regcred", "--node-selector", "node-pool=cpu",
         "--toleration", "dedicated=loadtest:NoSchedule"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    ours = json.loads(r.output)["spec"]["template"]["spec"]
    assert ours["containers"][0]["resources"] == chart["containers"][0]["resources"]
    for key in ("imagePullSecrets", "nodeSelector", "tolerations"):
        assert ours[key] == chart[key], key


@pytest.mark.parametrize(
    "args, message",
    [
        (["--cpu", "lots"], "--cpu 'lots' is not a Kubernetes quantity"),
        (["--cpu", "0"], "--cpu '0' must be above 0"),
        (["--cpu", "2Gi"], "CPU is in cores or millicores"),
        (["--memory", "4"], "--memory '4' is below 64Mi (a bare number is bytes)"),
        (["--memory", "8Gi", "--memory-limit", "4Gi"], "is below the memory request '8Gi'"),
        (["--cpu", "2", "--cpu-limit", "1"], "--cpu-limit '1' is below the CPU request '2'"),
        # the API server's quantity grammar, stricter than the kubernetes client's parse_quantity
        # (which takes Python's Decimal syntax and the suffix K)
        (["--memory", "1_024Mi"], "--memory '1_024Mi' is not a Kubernetes quantity"),
        (["--memory", "100000K"], "--memory '100000K' is not a Kubernetes quantity"),
        (["--memory", "inf"], "--memory 'inf' is not a Kubernetes quantity"),
        (["--memory", "Infinity"], "--memory 'Infinity' is not a Kubernetes quantity"),
        (["--cpu", "inf"], "--cpu 'inf' is not a Kubernetes quantity"),
        (["--cpu", "NaN"], "--cpu 'NaN' is not a Kubernetes quantity"),
        (["--cpu", "\uff12"], "--cpu '\uff12' is not a Kubernetes quantity"),  # not ASCII
        (["--cpu-limit", "1_0"], "--cpu-limit '1_0' is not a Kubernetes quantity"),
        (["--memory-limit", "8GB"], "--memory-limit '8GB' is not a Kubernetes quantity"),
        (["--memory", "-4Gi"], "--memory '-4Gi' must be above 0"),
        (["--cpu", "-500m"], "--cpu '-500m' must be above 0"),
        # grammatical, but beyond Python's Decimal (an ArithmeticError, not a ValueError)
        (["--memory", "1e99999999"], "--memory '1e99999999' is out of range"),
        (["--cpu", "1", "--cpu-limit", "1e99999999"], "--cpu-limit '1e99999999' is out of range"),
        (["--image-pull-secret", "Reg_Cred"], "--image-pull-secret: 'Reg_Cred' is not a valid"),
        (["--service-account", "-sa"], "--service-account: '-sa' is not a valid ServiceAccount"),
        (["--node-selector", "pool"], "--node-selector: 'pool' is not KEY=VALUE"),
        (["--node-selector", "a b=c"], "'a b' is not a valid label key"),
        (["--node-selector", "p=x", "--node-selector", "p=y"], "'p' given twice"),
        (["--toleration", "gpu=true:NoScheduel"], "effect must be one of NoSchedule,"),
        (["--toleration", "=true:NoSchedule"], "a value needs a key"),
        (["--toleration", '{"key": "k", "operator": "In"}'], "operator must be Exists or Equal"),
        (["--toleration", '{"key": "k", "operator": "Exists", "value": "v"}'], "takes no value"),
        (["--toleration", '{"key": "k", "tolerationSeconds": 5}'], "with effect NoExecute"),
        (["--toleration", '{"key": "k", "seconds": 5}'], "unknown field(s) seconds"),
        (["--toleration", "{oops"], "is not valid JSON"),
    ],
)
def test_bad_pod_options_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    with FakeKubeAPI() as api:
        r = CliRunner().invoke(
            cli,
            _start_on(api, *args),
        )
        _one_error_line(r, 2, message)
        assert not api.jobs  # refused before anything was created


def test_quantities_in_the_api_servers_grammar_pass_unchanged() -> None:
    """Every form the API server takes (sign, leading or trailing point, exponent, decimal and
    binary SI) reaches the manifest as typed."""
    from slo_loadtest.k8s import container_resources

    for cpu in ("+4", ".5", "4.", "1e1", "1E-1", "250m", "1k"):
        assert container_resources(cpu=cpu)["requests"]["cpu"] == cpu
    r = container_resources(memory="1e9", memory_limit="+2.5G")
    assert r["requests"]["memory"] == "1e9" and r["limits"]["memory"] == "+2.5G"
    assert container_resources(memory="100000k")["limits"]["memory"] == "200000000"


def test_an_arithmetic_error_in_the_resource_checks_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decimal and int arithmetic raise ArithmeticError (OverflowError, decimal.Overflow), not
    ValueError: still one Error line and exit 2, not a traceback."""
    from slo_loadtest import k8s as kj

    def overflow(*_: Any) -> Any:
        raise OverflowError("cannot convert Infinity to integer")

    monkeypatch.setattr(kj, "container_resources", overflow)
    with FakeKubeAPI() as api:
        r = CliRunner().invoke(
            cli,
            _start_on(api, "--memory", "8Gi"),
        )
        _one_error_line(r, 2, "--cpu/--memory: a value out of range (OverflowError)")
        assert not api.jobs


def test_status_says_why_the_pod_is_pending_or_failed(tmp_path: Path) -> None:
    """Not just "pending": the container's waiting reason (image pull, a missing Secret) or the
    scheduler's Unschedulable condition, with the message; a failed pod's termination reason.
    `start --wait` and `logs` report the same."""
    with FakeKubeAPI() as api:
        runner = CliRunner()
        conn = ["-n", NS, "--api-server", api.url]

        def status(job: str) -> dict:
            r = runner.invoke(cli, ["k8s", "status", *conn, "--job", job])
            assert r.exit_code == 0, r.output
            return json.loads(r.output)

        jobs = LoadTestJobs(api_client(server=api.url), NS)
        name = jobs.start(loadtest_job(JobOptions(release="g4", namespace=NS, image="img:1")))
        st = status(name)
        assert (st["phase"], st["reason"], st["message"]) == ("pending", "", "")
        cases = [
            ("ImagePullBackOff", 'Back-off pulling image "img:1"'),
            ("ErrImagePull", 'failed to pull image "img:1": 401 Unauthorized'),
            ("CreateContainerConfigError", 'secret "vllm-api-key" not found'),
        ]
        for reason, message in cases:
            api.set_waiting(NS, name, reason, message)
            st = status(name)
            assert st["phase"] == "pending" and st["reason"] == reason, st
            assert st["message"] == f"container loadtest: {message}", st
        api.set_waiting(NS, name, "ContainerCreating", "")  # progress, not a problem
        assert status(name)["reason"] == ""
        unschedulable = "0/3 nodes are available: 3 Insufficient cpu. preemption: 0/3 nodes"
        api.set_unschedulable(NS, name, unschedulable)
        st = status(name)
        assert (st["phase"], st["reason"], st["message"]) == (
            "pending",
            "Unschedulable",
            unschedulable,
        )
        r = runner.invoke(cli, ["k8s", "logs", *conn, "--job", name, "--wait-pod", "0.1"])
        _one_error_line(r, 3, f"(phase Pending; Unschedulable: {unschedulable})")

        # --wait reports the reason while it waits, and when it gives up
        r = runner.invoke(
            cli,
            ["k8s", "start", *conn, "--release", "g4", "--image", "img:2", "--name", "w",
             "--wait", "--timeout", "0.1", "--out", str(tmp_path / "w")],
        )  # fmt: skip
        assert r.exit_code == 3, r.output
        assert "job/w: pending" in r.output and "still pending after" in r.output
        api.set_waiting(NS, "w", "ImagePullBackOff", 'Back-off pulling image "img:2"')
        r = runner.invoke(cli, ["k8s", "fetch", *conn, "--job", "w", "--wait", "0.1",
                                "--out", str(tmp_path / "w")])  # fmt: skip
        assert r.exit_code == 3, r.output
        why = 'pending (ImagePullBackOff: container loadtest: Back-off pulling image "img:2")'
        assert f"job/w: {why}" in r.output and f"still {why} after" in r.output
        assert jobs.wait("w", timeout_s=0).describe() == why

        # a pod killed for memory: the Job says "backoff limit", the pod says why
        api.set_terminated(NS, name, "OOMKilled", 137)
        api.finish_job(NS, name, ok=False)
        st = status(name)
        assert st["phase"] == "failed" and st["reason"] == "OOMKilled", st
        assert "container loadtest exited with code 137 (OOMKilled)" in st["message"]


def test_local_commands_need_no_kubernetes_client() -> None:
    """A local sweep on a host installed --no-deps without the kubernetes client (the twenty-third
    GPU sitting's wheelhouse) still starts; a `k8s` command that talks to a cluster says what is
    missing in one line instead of a traceback."""
    code = (
        "import sys; sys.modules['kubernetes'] = None\n"  # `import kubernetes` now raises
        "from slo_loadtest.cli import cli\n"
        "argv = sys.argv[1:]\n"
        "cli.main(argv, prog_name='slo-loadtest')\n"
    )

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-c", code, *argv]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    for argv, shown in ((["run", "--help"], "--target"), (["k8s", "start", "--help"], "--cpu")):
        proc = run(*argv)
        assert proc.returncode == 0, proc.stderr
        assert shown in proc.stdout
    proc = run("k8s", "status", "--api-server", "http://127.0.0.1:9")
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "the kubernetes Python client is not installed" in proc.stderr
