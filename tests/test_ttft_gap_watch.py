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
