"""bench/cv2_pool.py, the next GPU sitting's first measurement, on this machine: it decodes the
SLO clips as the fast path does, at OpenCV's default pool and at one thread, restores the pool,
and writes what the sitting reads (the figures are the benchmark's, not asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import cv2_pool

SCRIPT = Path(cv2_pool.__file__)


def test_both_pool_sizes_decode_the_slo_clips_identically(tmp_path: Path) -> None:
    out = tmp_path / "pool.json"
    run = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--reps",
            "2",
            "--warmup",
            "0",
            "--busy",
            "1",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert list(result["regimes"]) == ["idle", "busy (1 spinning processes)"]
    for rows in result["regimes"].values():
        assert [r["clip"] for r in rows] == ["slo-mpeg4.mp4", "slo-h264.mp4"]
        for row in rows:
            assert row["frames"] == 6 and row["identical"] is True
            assert len(row["wall_ms"]) == 2 and "one thread" in row["cpu_ms"]
            assert all(v > 0 for v in row["cpu_ms"].values())
    assert "| slo-mpeg4.mp4 (6 frames) |" in run.stdout


def test_a_clip_that_does_not_open_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(b"not a video")
    with pytest.raises(ValueError, match="could not open"):
        cv2_pool.decode(str(bad))
