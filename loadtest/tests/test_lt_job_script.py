"""The Job's inline /bin/sh script (k8s.JOB_SCRIPT, line for line the chart's), run for real.

In the pod the script's sh is PID 1, and the kernel drops every signal PID 1 installed no handler
for: SIGTERM from activeDeadlineSeconds or `kubectl delete` would never reach slo-loadtest. The
tests run the script as PID 1 of a new PID namespace (``unshare --user --map-root-user --pid``)
where the kernel allows it, else as a plain process (the traps are exercised either way).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from lt_recording_server import RecordingServer

from slo_loadtest.k8s import JOB_SCRIPT, parse_ready

BIN = Path(sys.executable).parent  # slo-loadtest and python3 of this environment
UNSHARE = ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]


@functools.cache
def _unshare_works() -> bool:
    try:
        p = subprocess.run([*UNSHARE, "sh", "-c", 'test "$$" = 1'], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


def _start(out: Path, env: dict[str, str], *args: str) -> tuple[subprocess.Popen[str], int]:
    """Start the script; returns the process and the pid of the script's sh (to signal)."""
    full = {
        **os.environ,
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        "SLO_LOADTEST_OUT": str(out),
        "KEEP_RESULTS_SECONDS": "600",
        "HOME": str(out.parent),
        **env,
    }
    cmd = ["sh", "-c", JOB_SCRIPT, "slo-loadtest-job", *args]
    pid1 = _unshare_works()
    proc = subprocess.Popen(
        [*UNSHARE, *cmd] if pid1 else cmd,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if not pid1:
        return proc, proc.pid
    # unshare --fork: the script's sh is unshare's only child (PID 1 inside)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 20
    while not children.read_text().split():
        assert time.monotonic() < deadline, "unshare started no child"
        time.sleep(0.05)
    return proc, int(children.read_text().split()[0])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_to_the_job_script_reaches_slo_loadtest(tmp_path: Path) -> None:
    """SIGTERM to the script (PID 1) mid-rate: slo-loadtest is interrupted, writes its partial
    report, the script records exit code 3 and .done and exits at once (no keep-results wait)."""
    out = tmp_path / "results"
    with RecordingServer() as srv:
        proc, sh_pid = _start(
            out,
            {"SLO_LOADTEST_TARGET": srv.url},
            *("--model", srv.model, "--workloads", "text", "--rates", "1,2"),
            *("--duration", "120", "--warmup", "0", "--prompt-tokens", "20"),
            *("--max-workers", "1", "--no-plots"),
        )
        deadline = time.monotonic() + 240
        while not srv.bodies:  # guidellm is sending: the first rate is under way
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout
            time.sleep(0.5)
        os.kill(sh_pid, signal.SIGTERM)
        t0 = time.monotonic()
        log, _ = proc.communicate(timeout=90)
    assert time.monotonic() - t0 < 60, log
    assert proc.returncode == 3, log
    s = json.loads((out / "summary.json").read_text())
    assert s["aborted"]["reason"] == "interrupted during text 1 req/s", s["aborted"]
    assert (out / "exit_code").read_text().strip() == "3"
    assert (out / ".done").exists() and (out / "report.md").exists()
    assert parse_ready(log) == (True, 3)


def test_health_wait_is_bounded_then_the_preflight_reports(tmp_path: Path) -> None:
    """A target that never answers /health: after HEALTH_WAIT_SECONDS the sweep runs anyway and
    its preflight writes the partial report with exit 3, instead of waiting out the deadline."""
    out = tmp_path / "results"
    t0 = time.monotonic()
    proc, _ = _start(
        out,
        {
            "SLO_LOADTEST_TARGET": f"http://127.0.0.1:{_closed_port()}",
            "HEALTH_WAIT_SECONDS": "2",
            "KEEP_RESULTS_SECONDS": "0",
        },
        *("--rates", "1", "--workloads", "text", "--no-plots"),
    )
    log, _ = proc.communicate(timeout=120)
    assert time.monotonic() - t0 < 90, log
    assert "no answer from" in log and "after 2s" in log
    assert proc.returncode == 3, log
    s = json.loads((out / "summary.json").read_text())
    assert s["verdict"] == "incomplete" and "target unreachable" in s["aborted"]["reason"]
    assert (out / "exit_code").read_text().strip() == "3"


def test_sigterm_while_keeping_results_exits_with_the_sweeps_code(tmp_path: Path) -> None:
    """`kubectl delete` during the keep-results wait ends the pod at once with the sweep's code
    (PID 1 would otherwise ignore it until the grace period's SIGKILL)."""
    out = tmp_path / "results"
    proc, sh_pid = _start(
        out,
        {
            "SLO_LOADTEST_TARGET": f"http://127.0.0.1:{_closed_port()}",
            "HEALTH_WAIT_SECONDS": "0",
        },
        *("--rates", "1", "--workloads", "text", "--no-plots"),
    )
    deadline = time.monotonic() + 90
    while not (out / ".done").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(0.5)  # the script is in its keep-results wait
    os.kill(sh_pid, signal.SIGTERM)
    log, _ = proc.communicate(timeout=20)
    assert proc.returncode == 3, log
    assert "keeping them for 600s" in log
