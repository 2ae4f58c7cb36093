"""vLLM's OpenCV video decode with FFmpeg's default threads (one per core) vs the media fast path's
`GEMMA4_MEDIA_DECODE_THREADS` (1, 2, 4), and with one FFmpeg thread and OpenCV's own pool at one
thread (`GEMMA4_MEDIA_CV2_THREADS=1`, the fast path's default since the thirtieth sitting; the other
variants keep OpenCV's default pool, one worker per core), side by side in one run on the same
clips: wall time and CPU time (all threads of this process) per video, the frames compared with
np.array_equal.

    .venv/bin/python bench/media_decode.py --out bench/results/media/cpu-2core-decode.json

Each repetition runs every variant once, in turn, so drift in the machine's load hits all alike.
Two regimes, one after the other: `idle` (nothing else running) and `busy` (one spinning process
per core, as on a loaded API server sharing its cores with the engine and other API servers).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import media_stages as ms
from cpu_regimes import print_table, spinning

from gemma4_batched_encoder.media import decode

STOCK = "stock (FFmpeg default)"
SEQUENTIAL = "threads=1, OpenCV pool 1"
CLIPS = (  # frames, width, height, codec
    (6, 854, 480, "mp4v"),
    (6, 1280, 720, "mp4v"),
    (32, 854, 480, "mp4v"),
    (6, 854, 480, "VP90"),
)


def variants() -> dict[str, Callable[[Any, bytes], Any]]:
    mixin = decode.find_mixin()
    if mixin is None:
        raise SystemExit("no OpenCVVideoBackendMixin in this vLLM")
    # vLLM's own open, also where the plugin's media.install() already wrapped it in this process
    stock = inspect.unwrap(mixin.open_video_capture.__func__)
    out: dict[str, Callable[[Any, bytes], Any]] = {STOCK: stock}
    for n in (1, 2, 4):
        out[f"threads={n}"] = lambda cls, data, n=n: decode.open_capture(
            data, cls.get_cv2_video_api(), n
        )
    out[SEQUENTIAL] = out["threads=1"]
    return out


def pool_threads(name: str, default: int) -> int:
    """OpenCV's pool for a variant: one thread for SEQUENTIAL, OpenCV's default for the others."""
    return 1 if name == SEQUENTIAL else default


def measure(loader: Any, mixin: Any, impls: dict[str, Any], reps: int, warmup: int) -> list[dict]:
    import cv2

    default_pool = cv2.getNumThreads()
    rows = []
    for frames, width, height, fourcc in CLIPS:
        data = ms.realistic_mp4(1, frames=frames, width=width, height=height, fourcc=fourcc)
        wall: dict[str, list[float]] = {k: [] for k in impls}
        cpu: dict[str, list[float]] = {k: [] for k in impls}
        decoded: dict[str, np.ndarray] = {}
        for rep in range(warmup + reps):
            for name, fn in impls.items():
                mixin.open_video_capture = classmethod(fn)
                cv2.setNumThreads(pool_threads(name, default_pool))
                t0, c0 = time.perf_counter(), time.process_time()
                out, _ = loader.load_bytes(data, num_frames=32)
                t1, c1 = time.perf_counter(), time.process_time()
                decoded[name] = np.asarray(out)
                if rep >= warmup:
                    wall[name].append(1000 * (t1 - t0))
                    cpu[name].append(1000 * (c1 - c0))
        cv2.setNumThreads(default_pool)
        reference = decoded[STOCK]
        rows.append(
            {
                "clip": f"{frames} frames {width}x{height} {fourcc}",
                "bytes": len(data),
                "identical": all(np.array_equal(reference, v) for v in decoded.values()),
                "wall_ms": {k: statistics.median(v) for k, v in wall.items()},
                "cpu_ms": {k: statistics.median(v) for k, v in cpu.items()},
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--busy", type=int, default=os.cpu_count() or 1, help="spinning processes, busy regime"
    )
    args = parser.parse_args()

    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    loader = VIDEO_LOADER_REGISTRY.load("opencv")
    mixin = decode.find_mixin()
    impls = variants()
    names = list(impls)
    regimes: dict[str, list[dict]] = {}
    try:
        regimes["idle"] = measure(loader, mixin, impls, args.reps, args.warmup)
        with spinning(args.busy):
            regimes["busy"] = measure(loader, mixin, impls, args.reps, args.warmup)
    finally:
        mixin.open_video_capture = classmethod(impls[STOCK])
    for regime, rows in regimes.items():
        print_table(
            f"{regime} ({args.busy} spinning processes)" if regime == "busy" else regime,
            rows,
            names,
        )
    if args.out:
        result = {
            "tool": "bench/media_decode.py",
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cpus": os.cpu_count(),
            "busy_processes": args.busy,
            "machine": platform.processor() or platform.machine(),
            "versions": ms.versions(),
            "reps": args.reps,
            "regimes": regimes,
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if not all(r["identical"] for rows in regimes.values() for r in rows):
        raise SystemExit("frames differ between thread counts")


if __name__ == "__main__":
    main()
