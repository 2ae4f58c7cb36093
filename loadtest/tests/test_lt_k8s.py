"""`slo-loadtest k8s` against the real kubernetes client, its HTTP layer pointed at a fake API
server (tests/fake_kube_api.py): no Kubernetes control plane can run on these machines."""

from __future__ import annotations

import json
import shutil
import subprocess
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
            [
                "k8s",
                "start",
                "-n",
                NS,
                "--api-server",
                api.url,
                "--release",
                "g4",
                "--image",
                "i",
                "--set",
                "novalue",
            ],
        )
        assert r.exit_code == 2 and "--set" in r.output
        r = runner.invoke(
            cli,
            [
                "k8s",
                "start",
                "-n",
                NS,
                "--api-server",
                api.url,
                "--release",
                "g4",
                "--image",
                "i",
                "--target",
                "ftp://x",
            ],
        )
        assert r.exit_code == 2 and "--target" in r.output
        assert not api.jobs


def test_start_forwards_and_checks_the_extra_body() -> None:
    """`k8s start --extra-body` (or `--set extra_body=`) becomes SLO_LOADTEST_EXTRA_BODY, the
    variable `run` reads in the pod; a bad one fails here with exit 2, not later in the pod."""
    base = ["k8s", "start", "--release", "g4", "--image", "i", "--dry-run"]
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
    r = CliRunner().invoke(cli, ["k8s", "start", "--release", "g4", "--image", "i", flag])
    assert r.exit_code == 0
    assert json.loads(r.output)["kind"] == "Job"


def test_start_health_wait_becomes_the_scripts_bound() -> None:
    base = ["k8s", "start", "--release", "g4", "--image", "i", "--dry-run"]
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

    start = ["k8s", "start", "--release", "g4", "--image", "i"]
    runner = CliRunner(env={"KUBERNETES_SERVICE_HOST": None})
    r = runner.invoke(cli, [*start, "--kubeconfig", str(tmp_path / "none")])
    _one_error_line(r, 2, "no usable Kubernetes configuration")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    r = runner.invoke(cli, ["k8s", "status", "--api-server", f"http://127.0.0.1:{closed}"])
    _one_error_line(r, 3, "cannot reach the Kubernetes API server")
    with FakeKubeAPI(namespaces={NS}) as api:
        r = runner.invoke(cli, [*start, "--api-server", api.url, "-n", "nope"])
        _one_error_line(r, 2, "namespace 'nope' not found")
        args = [*start, "--api-server", api.url, "-n", NS, "--name", "lt-1"]
        assert runner.invoke(cli, args).exit_code == 0
        r = runner.invoke(cli, args)
        _one_error_line(r, 2, 'jobs.batch "lt-1" already exists')


def test_set_keys_are_checked_and_flag_spellings_accepted() -> None:
    """--set takes only settings the pod's `slo-loadtest run` reads (a typo would be an env
    var nothing reads); `run`'s flag names are aliases; target/out/api_key are refused."""
    from slo_loadtest.cli import run

    base = ["k8s", "start", "--release", "g4", "--image", "i", "--dry-run"]
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
