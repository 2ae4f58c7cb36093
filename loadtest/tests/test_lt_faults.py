"""Faults end in a partial report that names the failing rate and a non-zero exit, in bounded
time: a closed port, and a server that dies between two rates (real guidellm runs)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from lt_cli import run_argv
from lt_recording_server import RecordingServer

from slo_loadtest.config import SweepConfig
from slo_loadtest.outputs import write_outputs
from slo_loadtest.summary import build_summary
from slo_loadtest.sweep import Sweep


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the socket goes


def test_unreachable_target_gives_partial_report_and_exit_3(tmp_path: Path) -> None:
    out = tmp_path / "out"
    t0 = time.monotonic()
    proc = subprocess.run(
        run_argv(
            f"http://127.0.0.1:{_closed_port()}",
            "--rates",
            "1,2",
            "--duration",
            "3",
            "--warmup",
            "0",
            "--out",
            str(out),
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert time.monotonic() - t0 < 60
    assert proc.returncode == 3, proc.stderr
    assert "target unreachable" in proc.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["complete"] is False and s["verdict"] == "incomplete"
    assert s["failed_step"]["workload"] == "text" and s["failed_step"]["rate"] == 1
    assert "Connection refused" in s["failed_step"]["message"]
    statuses = {(r["workload"], r["target_rate"]): r["status"] for r in s["results"]}
    assert statuses == {
        ("text", 1): "error",
        ("text", 2): "not_run",
        ("video", 1): "not_run",
        ("video", 2): "not_run",
    }
    md = (out / "report.md").read_text()
    assert "failed at text 1 req/s" in md and "partial" in md
    assert (out / "results.csv").exists()


def test_server_dying_mid_sweep_stops_at_the_failing_rate(tmp_path: Path) -> None:
    srv = RecordingServer().__enter__()
    cfg = SweepConfig(
        target=srv.url,
        model=srv.model,
        workloads=("text",),
        rates=(1.0, 2.0, 3.0),
        duration_s=3,
        warmup_s=0,
        prompt_tokens=20,
        max_workers=1,
        out=tmp_path / "out",
        step_timeout_s=150,
    )

    def log(line: str) -> None:
        if line.startswith("[text 1 req/s]") and ("PASS" in line or "FAIL" in line):
            srv.__exit__(None, None, None)  # the server dies after the first rate

    t0 = time.monotonic()
    outcome = Sweep(cfg, log=log).run()
    assert time.monotonic() - t0 < 400
    by_rate = {r.target_rate: r for r in outcome.results}
    assert by_rate[1.0].status == "ok" and by_rate[1.0].measurement.successful > 0
    assert by_rate[2.0].status in ("error", "timeout")
    assert by_rate[3.0].status == "not_run"
    assert outcome.aborted and outcome.aborted["rate"] == 2.0
    summary = build_summary(
        outcome.results,
        cfg.criteria,
        workloads=cfg.workloads,
        target=cfg.target,
        aborted=outcome.aborted,
    )
    assert summary["failed_step"]["rate"] == 2.0 and not summary["complete"]
    paths = write_outputs(summary, cfg.out)
    assert "failed at text 2 req/s" in paths["markdown"].read_text()


def test_job_entrypoint_reads_env_and_leaves_markers(tmp_path: Path) -> None:
    """`slo-loadtest job` (the container entrypoint): configured by SLO_LOADTEST_* only; prints
    the summary between markers and writes exit_code and .done like the chart's script."""
    import os

    from slo_loadtest.outputs import extract_summary

    env = {
        **os.environ,
        "SLO_LOADTEST_TARGET": f"http://127.0.0.1:{_closed_port()}",
        "SLO_LOADTEST_OUT": str(tmp_path / "results"),
        "SLO_LOADTEST_RATES": "1..3",
        "SLO_LOADTEST_WORKLOADS": "video",
        "SLO_LOADTEST_SLO_MS": "250",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "slo_loadtest.cli", "job"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    summary = extract_summary(proc.stdout)
    assert summary and summary["criteria"]["slo_ms"] == 250
    assert [r["target_rate"] for r in summary["results"]] == [1.0, 2.0, 3.0]
    assert (tmp_path / "results" / "exit_code").read_text().strip() == "3"
    assert (tmp_path / "results" / ".done").exists()


def test_sigterm_mid_rate_kills_guidellm_and_writes_partial_report(tmp_path: Path) -> None:
    """A Job deadline or `kubectl delete` sends SIGTERM: the running guidellm is killed and the
    partial report names the interrupted rate; exit 3, in seconds."""
    import os
    import signal

    out = tmp_path / "out"
    with RecordingServer() as srv:
        proc = subprocess.Popen(
            run_argv(
                srv.url,
                "--model",
                srv.model,
                "--workloads",
                "text",
                "--rates",
                "1,2",
                "--duration",
                "120",
                "--warmup",
                "0",
                "--prompt-tokens",
                "20",
                "--max-workers",
                "1",
                "--out",
                str(out),
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 240
        while not srv.bodies:  # guidellm is sending: the rate is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
    assert time.monotonic() - t0 < 40
    assert proc.returncode == 3, err
    s = json.loads((out / "summary.json").read_text())
    assert s["aborted"]["reason"] == "interrupted during text 1 req/s"
    assert {r["status"] for r in s["results"]} == {"not_run"}
    scenario = str(out / "steps" / "text-r1" / "scenario.json")
    leftovers = subprocess.run(["pgrep", "-f", scenario], capture_output=True, text=True)
    assert not leftovers.stdout.strip(), "guidellm outlived the interrupted sweep"


def _run(target: str, out: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        run_argv(target, "--out", str(out), "--no-plots", *options),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_model_the_server_does_not_serve_stops_the_sweep_naming_the_served_ones(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    with RecordingServer() as srv:
        proc = _run(srv.url, out, "--model", "gemma-typo", "--rates", "1", "--workloads", "text")
        assert not srv.bodies and not srv.plain_bodies  # nothing was sent
    assert proc.returncode == 3, proc.stderr
    reason = json.loads((out / "summary.json").read_text())["aborted"]["reason"]
    assert reason == (
        f"model 'gemma-typo' is not served by {srv.url}; /v1/models lists: {srv.model}"
    )
    assert reason in (out / "report.md").read_text()


class _RefusingHandler(BaseHTTPRequestHandler):
    """Lists a model, refuses every completion 401 the way vLLM does with a wrong API key."""

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(200, b'{"data": [{"id": "m"}]}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._send(401, b'{"error": {"message": "Unauthorized: bad API key"}}')


def test_a_refused_preflight_request_stops_the_sweep_with_the_servers_error(
    tmp_path: Path,
) -> None:
    """One real request before the sweep: the server's own error message ends up in the
    report, and no rate runs."""
    out = tmp_path / "out"
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _RefusingHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        target = f"http://127.0.0.1:{httpd.server_address[1]}"
        proc = _run(target, out, "--rates", "1,2", "--workloads", "text")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert proc.returncode == 3, proc.stderr
    s = json.loads((out / "summary.json").read_text())
    assert "preflight request failed" in s["aborted"]["reason"]
    assert "HTTP 401 Unauthorized: bad API key" in s["aborted"]["reason"]
    assert {r["status"] for r in s["results"]} == {"error", "not_run"}


def test_a_rate_where_every_request_fails_aborts_with_the_errors(tmp_path: Path) -> None:
    """The preflight's text request passes, but the server refuses every video (as vLLM does
    past --limit-mm-per-prompt): the sweep stops after the first rate, exit 3, and the errors
    guidellm recorded are in the summary's reasons and in report.md."""
    out = tmp_path / "out"
    with RecordingServer(reject_media=True) as srv:
        proc = _run(
            srv.url, out, "--workloads", "video,text", "--rates", "1,2", "--duration", "4",
            "--warmup", "0", "--video-frames", "2", "--video-width", "64", "--video-height",
            "48", "--max-workers", "1",
        )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["verdict"] == "incomplete"
    by_rate = {(r["workload"], r["target_rate"]): r for r in s["results"]}
    first = by_rate[("video", 1.0)]
    assert first["measurement"]["successful"] == 0 and first["measurement"]["errored"] > 0
    assert any("400 Bad Request" in why for why in first["reasons"]), first["reasons"]
    assert by_rate[("video", 2.0)]["status"] == "not_run"
    assert by_rate[("text", 1.0)]["status"] == "not_run"
    assert s["aborted"]["rate"] == 1.0
    assert "every request failed at video 1 req/s" in s["aborted"]["reason"]
    assert "400 Bad Request" in s["aborted"]["reason"]
    assert "400 Bad Request" in (out / "report.md").read_text()


def test_sigterm_during_the_preflight_still_writes_the_report(tmp_path: Path) -> None:
    """A target that accepts connections but never answers keeps the preflight waiting; SIGTERM
    then ends it like one mid-rate: partial report, exit 3."""
    import os
    import signal

    out = tmp_path / "out"
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # connections complete in the backlog, nothing is ever read
        proc = subprocess.Popen(
            run_argv(
                f"http://127.0.0.1:{silent.getsockname()[1]}", "--rates", "1", "--out", str(out)
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(3)  # python started, the preflight's GET is waiting (10 s timeout)
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    s = json.loads((out / "summary.json").read_text())
    assert s["aborted"]["reason"] == "interrupted before the first rate"
