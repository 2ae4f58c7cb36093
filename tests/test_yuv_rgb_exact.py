"""bench/yuv_rgb_exact.py: swscale's yuv420p -> BGR conversion (the stock video loader's)
reproduced with integer tensor ops, checked against OpenCV on real clips."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_the_conversion_equals_opencvs_frames_on_every_case() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "yuv_rgb_exact.py"), "--frames", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["identical"]
    codecs = {c["codec"] for c in report["cases"]}
    assert codecs == {"mpeg4", "h264"}
    assert all(c["frames"] == 2 and c["max_abs_diff"] == 0 for c in report["cases"])


@pytest.mark.parametrize("change", ["luma coefficient - 1", "rounded multiply-high"])
def test_another_arithmetic_is_caught(monkeypatch, change: str) -> None:
    # (a chroma coefficient off by one can give the same bytes: u' and v' are multiples of 8)
    sys.path.insert(0, str(BENCH))
    try:
        import yuv_rgb_exact as m
    finally:
        sys.path.remove(str(BENCH))
    if change == "luma coefficient - 1":
        monkeypatch.setattr(m, "Y_COEFF", m.Y_COEFF - 1)
    else:
        monkeypatch.setattr(m, "_mulhi", lambda a, c: (a * c + (1 << 15)) >> 16)
    monkeypatch.setattr(sys, "argv", ["yuv_rgb_exact.py", "--frames", "1"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        m.main()
    assert exit_info.value.code == 1
    report = json.loads(out.getvalue())
    assert not report["identical"]
    assert max(c["max_abs_diff"] for c in report["cases"]) >= 1
