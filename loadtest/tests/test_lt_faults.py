"""Faults end in a partial report that names the failing rate and a non-zero exit, in bounded
time: a closed port, and a server that dies between two rates (real guidellm runs)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
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
