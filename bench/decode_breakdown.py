"""Where one video's decode goes: OpenCV's open, grab (FFmpeg decode), retrieve (YUV -> BGR) and
vLLM's BGR -> RGB, timed call by call with one FFmpeg thread (the fast path's setting), beside
vLLM's whole loader (`load_bytes`, plugin not installed) on the same bytes.

    python bench/decode_breakdown.py --out bench/results/media/cpu-2core-decode-breakdown.json

Clips: the SLO load test's (slo-loadtest's generator, what bench/ttft_gap.py sends) and the
textured one of bench/media_stages.py, 6 frames at 854x480. Median of --reps after 3 warm-ups.
"""

from __future__ import annotations

import argparse
import io
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
import media_stages as ms


def slo_clip() -> bytes:
    from slo_loadtest.media import write_video

    with tempfile.TemporaryDirectory() as tmp:
        path = write_video(Path(tmp) / "v.mp4", 1, frames=6, width=854, height=480, fps=2, seed=0)
        return path.read_bytes()


def calls(data: bytes) -> dict[str, float]:
    """ms spent in each OpenCV call for one decode of every frame."""
    out = dict.fromkeys(("open", "grab", "retrieve", "bgr_to_rgb"), 0.0)
    t = time.perf_counter()
    cap = cv2.VideoCapture(io.BytesIO(data), cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
    out["open"] = time.perf_counter() - t
    frames = []
    while True:
        t = time.perf_counter()
        ok = cap.grab()
        out["grab"] += time.perf_counter() - t
        if not ok:
            break
        t = time.perf_counter()
        ok, frame = cap.retrieve()
        out["retrieve"] += time.perf_counter() - t
        t = time.perf_counter()
        frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
        out["bgr_to_rgb"] += time.perf_counter() - t
    out = {k: v * 1000 for k, v in out.items()}
    out["total"] = sum(out.values())
    out["frames"] = len(frames)
    return out


def vllm_loader() -> Any:
    try:
        from vllm.multimodal.video import VIDEO_LOADER_REGISTRY
    except ImportError:
        return None
    return VIDEO_LOADER_REGISTRY.load("opencv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    loader = vllm_loader()
    result: dict[str, Any] = {
        "command": "bench/decode_breakdown.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, OpenCV {cv2.__version__}",
        "clips": {},
    }
    for name, data in (
        ("SLO clip (slo-loadtest), 6 frames 854x480", slo_clip()),
        ("textured (media_stages), 6 frames 854x480", ms.realistic_mp4(0, 6, 854, 480)),
    ):
        for _ in range(3):
            calls(data)
        runs = [calls(data) for _ in range(args.reps)]
        row = {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
        if loader is not None:
            times = []
            for i in range(args.reps + 3):
                t = time.perf_counter()
                frames, _ = loader.load_bytes(data, num_frames=32)
                if i >= 3:
                    times.append((time.perf_counter() - t) * 1000)
            row["vllm_load_bytes"] = round(statistics.median(times), 2)
            row["vllm_frames_shape"] = list(np.asarray(frames).shape)
        result["clips"][name] = row | {"bytes": len(data)}
        print(name, row)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
