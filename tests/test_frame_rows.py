"""bench/frame_rows.py: the resized frame fits the uint8 row its patches travel in today, for
every soft-token budget and frame shape, so a patchify on the engine needs no new tensor shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from torchvision.transforms import InterpolationMode

from gemma4_batched_encoder.media.fast_processor import ResizeParams, resize_target

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.parametrize("budget", [70, 140, 280, 560, 1120])
@pytest.mark.parametrize(
    "size", [(480, 854), (720, 1280), (1080, 1920), (900, 320), (64, 2000), (17, 23)]
)
def test_a_resized_frame_fits_its_row(budget: int, size: tuple[int, int]) -> None:
    params = ResizeParams(InterpolationMode.BICUBIC, 16, 3, budget)
    height, width = resize_target(*size, params)
    row_bytes = budget * 3**2 * 3 * 16**2  # max_patches x (16 x 16 x 3)
    assert height % 16 == 0 and width % 16 == 0
    assert height * width * 3 <= row_bytes


def test_the_cli_times_both_hand_offs() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH / "frame_rows.py"), "--reps", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(proc.stdout)
    assert report["video"]["target"] == [288, 528]
    assert report["frame_bytes"] == 288 * 528 * 3 <= report["row_bytes"] == 630 * 768
    assert set(report["cpu_ms_median"]) == {
        "stack",
        "resize",
        "patchify_into_rows",
        "frame_bytes_into_rows",
    }
