"""What the API server would save by handing the engine resized frames instead of patches
(issue 8; bench/MEDIA.md, "Resize on the GPU with stock's bytes").

    python bench/frame_rows.py [--reps 30] [--out results.json]

With `GEMMA4_MEDIA_UINT8=on` the fast processor stacks a video's frames, resizes them and
patchifies them into zero-padded uint8 rows of [max_patches, 768]. A resized frame's bytes fit
the same row, so the patchify could move to the engine. This times, in CPU time on one torch
thread (as the processor runs) with the plugin's own functions, on the SLO clip's shape
(6 frames 854x480, 70 soft tokens): the stack, the resize, the patchify into rows, and the
alternative, the resized frames' bytes copied into the same rows. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torchvision.transforms import InterpolationMode

from gemma4_batched_encoder.media.fast_processor import (
    ResizeParams,
    patchify_rescale_into,
    resize_batch,
    resize_target,
)

PARAMS = ResizeParams(
    InterpolationMode.BICUBIC, patch_size=16, pooling_kernel_size=3, max_soft_tokens=70
)


def _cpu_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.process_time()
        fn()
        times.append((time.process_time() - start) * 1e3)
    return float(np.median(times))


def measure(frames: int, height: int, width: int, reps: int) -> dict:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    video = [
        torch.from_numpy(rng.integers(0, 256, (3, height, width), dtype=np.uint8))
        for _ in range(frames)
    ]
    target = resize_target(height, width, PARAMS)
    max_patches = PARAMS.max_soft_tokens * PARAMS.pooling_kernel_size**2
    rows = np.zeros((frames, max_patches, 3 * PARAMS.patch_size**2), np.uint8)

    def stack() -> np.ndarray:
        return np.stack([f.numpy() for f in video])

    resized = resize_batch(stack(), target, PARAMS)
    frame_bytes = resized[0].size
    flat = rows.reshape(frames, -1)
    if frame_bytes > flat.shape[1]:
        raise SystemExit(
            f"a resized frame ({frame_bytes} B) does not fit its row ({flat.shape[1]} B)"
        )

    def copy_frames() -> None:
        flat[:, :frame_bytes] = resized.reshape(frames, -1)

    batch = stack()
    times = {
        "stack": _cpu_ms(stack, reps),
        "resize": _cpu_ms(lambda: resize_batch(batch, target, PARAMS), reps),
        "patchify_into_rows": _cpu_ms(
            lambda: patchify_rescale_into(resized, PARAMS.patch_size, None, rows, range(frames)),
            reps,
        ),
        "frame_bytes_into_rows": _cpu_ms(copy_frames, reps),
    }
    return {
        "video": {"frames": frames, "height": height, "width": width, "target": list(target)},
        "row_bytes": int(flat.shape[1]),
        "frame_bytes": int(frame_bytes),
        "reps": reps,
        "cpu_ms_median": times,
        "saved_ms": times["patchify_into_rows"] - times["frame_bytes_into_rows"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = {
        "tool": "bench/frame_rows.py",
        "torch": torch.__version__,
        **measure(6, 480, 854, args.reps),
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
