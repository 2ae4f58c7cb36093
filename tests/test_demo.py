"""`make demo` (local/demo.py) runs the whole stack and fails loudly when a part of it did not."""

from __future__ import annotations

import json
import math
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import demo

REPO = Path(__file__).resolve().parents[1]


def test_demo_fails_when_prometheus_saw_no_encoder_calls(tmp_path: Path) -> None:
    report = tmp_path / "report.md"
    report.write_text("# report\n")
    seen = {"requests served": 5.0, "encoder calls": math.nan, "share of requests <= 300 ms": 1}
    assert demo.demo_problems(seen, report, 0) == [
        "Prometheus saw no encoder calls (the scrape or the plugin is not working)"
    ]


def test_demo_counts_a_missed_slo_as_a_verdict_but_a_crashed_load_test_as_a_failure(
    tmp_path: Path,
) -> None:
    seen = {"requests served": 5.0, "encoder calls": 2.0, "share of requests <= 300 ms": 0.5}
    report = tmp_path / "report.md"
    assert demo.demo_problems(seen, report, 1) == [f"no report at {report}"]
    report.write_text("# report\n")
    assert demo.demo_problems(seen, report, 1) == []
    assert demo.demo_problems(seen, report, 2) == ["the load test exited with 2"]


@pytest.mark.e2e
@pytest.mark.slow
def test_demo_runs_the_whole_stack_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    args = ["--out", str(out), "--rates", "1", "--seconds", "4"]
    proc = subprocess.run(
        [sys.executable, str(REPO / "local" / "demo.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for step in ("[1/4]", "[2/4]", "[3/4]", "[4/4]"):
        assert step in proc.stdout
    for kind in ("text", "image", "video"):
        assert f"  {kind:5s} 200  prompt" in proc.stdout
    report = (out / "loadtest" / "report.md").read_text()
    assert "## Per rate" in report
    summary = json.loads((out / "loadtest" / "summary.json").read_text())
    assert set(summary["workloads"]) == {"text", "video"}
    # it stopped what it started: nothing answers on vLLM's or Prometheus's port any more
    ports = re.search(
        r"vLLM http://127.0.0.1:(\d+)\S* .*Prometheus http://127.0.0.1:(\d+)", proc.stdout
    )
    assert ports, proc.stdout[:2000]
    for port in ports.groups():
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", int(port)), 2):
            pass
