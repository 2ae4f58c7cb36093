"""OpenCV's own thread pool on this host: a clip decoded as vLLM's OpenCV loader decodes it with the
plugin's media fast path (one FFmpeg thread; grab, retrieve and `cv2.cvtColor` BGR -> RGB per
frame), with the pool at OpenCV's default (one worker per core) and at one thread
(`GEMMA4_MEDIA_CV2_THREADS=1`), interleaved rep by rep: wall time and CPU time of the whole
process a video, and whether the frames are identical. Needs only OpenCV and numpy, so it runs on
a GPU host without vLLM (bench/MEDIA.md, "OpenCV's thread pool").

    python bench/cv2_pool.py --clip slo.mp4 [--clip slo-h264.mp4] [--reps 30] [--busy 8] \
        [--out results.json]

`--busy N` repeats the measurement with N spinning processes beside it (an API server sharing its
cores with the engine and the other API servers). Without `--clip`, the SLO clip is generated
with slo-loadtest (MPEG-4 Part 2 and H.264).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from cpu_regimes import print_table, spinning


def decode(data_path: str) -> np.ndarray:
    """Every frame, as vLLM's loader reads them with the plugin's one FFmpeg thread."""
    cap = cv2.VideoCapture(data_path, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
    if not cap.isOpened():
        raise ValueError(f"could not open {data_path}")
    frames = []
    while cap.grab():
        ok, frame = cap.retrieve()
        if not ok:
            break
        frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
    cap.release()
    return np.stack(frames)


def measure(clips: list[Path], reps: int, warmup: int, default_pool: int) -> list[dict[str, Any]]:
    variants = {f"OpenCV default ({default_pool} threads)": default_pool, "one thread": 1}
    rows = []
    for clip in clips:
        wall: dict[str, list[float]] = {k: [] for k in variants}
        cpu: dict[str, list[float]] = {k: [] for k in variants}
        frames: dict[str, np.ndarray] = {}
        for rep in range(warmup + reps):
            for name, threads in variants.items():
                cv2.setNumThreads(threads)
                t0, c0 = time.perf_counter(), time.process_time()
                frames[name] = decode(str(clip))
                t1, c1 = time.perf_counter(), time.process_time()
                if rep >= warmup:
                    wall[name].append((t1 - t0) * 1e3)
                    cpu[name].append((c1 - c0) * 1e3)
        cv2.setNumThreads(default_pool)
        first, *rest = frames.values()
        rows.append(
            {
                "clip": clip.name,
                "frames": int(first.shape[0]),
                "identical": all(np.array_equal(first, f) for f in rest),
                "wall_ms": {k: round(statistics.median(v), 3) for k, v in wall.items()},
                "cpu_ms": {k: round(statistics.median(v), 3) for k, v in cpu.items()},
            }
        )
    return rows


def slo_clips(tmp: Path) -> list[Path]:
    """The SLO clip (slo-loadtest's generator, as decode_breakdown.py makes it) in both codecs."""
    from decode_breakdown import slo_clip

    paths = []
    for codec in ("mpeg4", "h264"):
        paths.append(tmp / f"slo-{codec}.mp4")
        paths[-1].write_bytes(slo_clip(codec))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clip", type=Path, action="append", default=[])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="spinning processes, busy regime")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    default_pool = cv2.getNumThreads()
    with tempfile.TemporaryDirectory() as tmp:
        clips = args.clip or slo_clips(Path(tmp))
        regimes = {"idle": measure(clips, args.reps, args.warmup, default_pool)}
        if args.busy > 0:
            with spinning(args.busy):
                regimes[f"busy ({args.busy} spinning processes)"] = measure(
                    clips, args.reps, args.warmup, default_pool
                )
    for regime, rows in regimes.items():
        print_table(
            regime,
            rows,
            list(rows[0]["wall_ms"]),
            label=lambda r: f"{r['clip']} ({r['frames']} frames)",
        )
    if args.out:
        result = {
            "tool": "bench/cv2_pool.py",
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cpus": os.cpu_count(),
            "machine": platform.processor() or platform.machine(),
            "opencv": cv2.__version__,
            "python": sys.version.split()[0],
            "reps": args.reps,
            "regimes": regimes,
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    if not all(r["identical"] for rows in regimes.values() for r in rows):
        raise SystemExit("frames differ between pool sizes")


if __name__ == "__main__":
    main()
