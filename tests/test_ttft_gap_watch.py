"""bench/ttft_gap.py's compile watch: files that appear in a watched cache between two marks are
charged to the phase that just ended, with the kernels' names; quiet phases are left out."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ttft_gap


def test_new_cache_files_are_charged_to_the_phase_they_appeared_in(tmp_path):
    triton, inductor, absent = tmp_path / "triton", tmp_path / "inductor", tmp_path / "absent"
    (triton / "old").mkdir(parents=True)
    (triton / "old" / "kernel_at_start.cubin").write_bytes(b"x")
    watch = ttft_gap.CompileWatch([triton, inductor, absent])

    watch.mark("warm-up")  # nothing new
    (triton / "h1").mkdir()
    for name in ("_kernel_unified_attention_2d.cubin", "_kernel_unified_attention_2d.json"):
        (triton / "h1" / name).write_bytes(b"x")
    watch.mark("8 videos at once, first burst")
    inductor.mkdir()
    (inductor / "ab").mkdir()
    (inductor / "ab" / "cab12.py").write_text("# generated")
    watch.mark("16 videos at once, second burst")
    watch.mark("after")  # nothing new again

    assert watch.phases == {
        "8 videos at once, first burst": {
            "new_files": 2,
            "kernels": ["_kernel_unified_attention_2d"],
        },
        "16 videos at once, second burst": {"new_files": 1, "kernels": ["cab12"]},
    }


def test_slow_requests_are_checked_against_their_process_firsts():
    """The probe's summary line: of the requests 20 ms above their sequence's median, how many
    were the first of their kind in the process that took them; unplaced ones are not counted."""
    took = [
        {"pid": 1, "requests_before": 5, "videos_before": 0},  # slow, a first video in 1
        {"pid": 1, "requests_before": 6, "videos_before": 1},
        {"pid": 2, "requests_before": 0, "videos_before": 0},  # slow, first of both kinds in 2
        None,  # slow but not placed
        {"pid": 2, "requests_before": 1, "videos_before": 1},
        {"pid": 1, "requests_before": 7, "videos_before": 2},
        {"pid": 2, "requests_before": 2, "videos_before": 2},
    ]
    at_start = {"1": {"requests": 5, "videos": 0}, "3": {"requests": 2, "videos": 2}}
    results = {
        "processes_at_start": at_start,
        "text_ttft_ms": {"all": [20, 21, 22, 20, 90, 21, 20]},  # the fifth: not a first
        "text_processes": took,
        "video_ttft_ms": {"all": [150, 60, 140, 130, 61, 60, 62]},
        "video_processes": took,
    }
    line = ttft_gap.first_in_process_summary(results)
    assert line.startswith("processes before the probe: 2 had served requests, 1 videos;")
    assert "text: 1 slow, of which 0 of 1 placed were their process's first text" in line
    assert "video: 3 slow, of which 2 of 2 placed were their process's first video" in line
    assert line.endswith("(taken by 2 processes)")
