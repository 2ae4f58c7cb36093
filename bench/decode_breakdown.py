"""Where one video's decode goes: OpenCV's open, grab (FFmpeg decode), retrieve (YUV -> BGR) and
vLLM's BGR -> RGB, timed call by call with one FFmpeg thread (the fast path's setting), beside
vLLM's whole loader (`load_bytes`, plugin not installed) on the same bytes; and the same decode
with the decode overlap's pool preparing each frame beside it (GEMMA4_MEDIA_OVERLAP_THREADS=1),
the pool converting with cv2.cvtColor or with its numpy channel swap: the decode thread's wall
and CPU time, and when the last frame is ready. Needs no vLLM for those.

The decode's floor (`decode_floor`): the same clip through PyAV (another build of FFmpeg), one
thread, CPU time of the calling thread: decoded to yuv420p planes only (what any route that
moves the colour conversion and everything after it off the CPU still pays), and to RGB in one
swscale call, beside OpenCV's calls as vLLM makes them; with whether PyAV's RGB frames equal
OpenCV's byte for byte.

    python bench/decode_breakdown.py --out bench/results/media/cpu-2core-decode-breakdown.json

Clips: the SLO load test's (slo-loadtest's generator, what bench/ttft_gap.py sends), the same
content as H.264 (`slo-loadtest --video-codec h264`) and the textured one of
bench/media_stages.py, 6 frames at 854x480. Median of --reps after 3 warm-ups.
"""

from __future__ import annotations

import argparse
import functools
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


def slo_clip(codec: str = "mpeg4") -> bytes:
    from slo_loadtest.media import write_video

    with tempfile.TemporaryDirectory() as tmp:
        path = write_video(
            Path(tmp) / "v.mp4", 1, frames=6, width=854, height=480, fps=2, seed=0, codec=codec
        )
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


def _thread_ms(fn: Any) -> float:
    t = time.thread_time()
    fn()
    return (time.thread_time() - t) * 1000


def _opencv_rgb(data: bytes) -> list[np.ndarray]:
    cap = cv2.VideoCapture(io.BytesIO(data), cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
    frames = []
    while cap.grab():
        frames.append(cv2.cvtColor(cap.retrieve()[1], cv2.COLOR_BGR2RGB))
    return frames


def _pyav(data: bytes, fmt: str) -> list[np.ndarray]:
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        stream.thread_type, stream.thread_count = "NONE", 1
        return [frame.to_ndarray(format=fmt) for frame in container.decode(stream)]


def decode_floor(data: bytes, reps: int) -> dict[str, Any]:
    """CPU ms (calling thread) of OpenCV's decode + conversions against PyAV's decode alone and
    with one conversion to RGB, interleaved; and whether PyAV's RGB equals OpenCV's."""
    ways = {
        "opencv_grab_retrieve_rgb": lambda: _opencv_rgb(data),
        "pyav_rgb24": lambda: _pyav(data, "rgb24"),
        "pyav_yuv420p_planes": lambda: _pyav(data, "yuv420p"),
    }
    for fn in ways.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(reps):
        for name, fn in ways.items():
            times[name].append(_thread_ms(fn))
    a, b = _opencv_rgb(data), _pyav(data, "rgb24")
    same = len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    return {name: round(statistics.median(t), 2) for name, t in times.items()} | {
        "pyav_rgb_equals_opencv": same
    }


@functools.cache
def overlap_pool(convert: str) -> Any:
    """One overlap pool (one thread) per conversion, kept across repetitions, so no thread
    start-up lands in a timed decode."""
    from gemma4_batched_encoder.media import overlap

    to_rgb = overlap.loader_rgb if convert == "cv2.cvtColor" else overlap.swap_to_rgb
    pool = overlap.FrameOverlap(1, prepare_frame=functools.partial(overlap.prepare, to_rgb=to_rgb))
    pool.learn(overlap.ResizeParams(3, 16, 3, 70))  # bicubic, Gemma 4's video frames
    return pool


def decode_beside_pool(data: bytes, convert: str | None) -> dict[str, float]:
    """The loader's loop (grab, retrieve, BGR -> RGB into one array), with the overlap's pool
    preparing every frame when `convert` names its conversion."""
    from gemma4_batched_encoder.media import overlap

    pool = overlap_pool(convert) if convert is not None else None
    wall, cpu = time.perf_counter(), time.thread_time()
    cap = cv2.VideoCapture(io.BytesIO(data), cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
    if pool is not None:
        cap = overlap.OverlapCapture(cap, pool, lambda: True)
    count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    frames = np.empty((count, int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                       int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), 3), np.uint8)  # fmt: skip
    for i in range(count):
        if not cap.grab():
            break
        ok, frame = cap.retrieve()
        if not ok:
            break
        frames[i] = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
    out = {"decode": (time.perf_counter() - wall) * 1000, "decode_cpu": 0.0}
    out["decode_cpu"] = (time.thread_time() - cpu) * 1000
    if pool is not None:
        pool.drain()
    out["ready"] = (time.perf_counter() - wall) * 1000
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
        ("SLO clip as H.264 (slo-loadtest --video-codec h264), 6 frames 854x480", slo_clip("h264")),
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
        beside: dict[str, Any] = {}
        for _ in range(2):
            for convert in (None, "cv2.cvtColor", "numpy swap"):
                decode_beside_pool(data, convert)
        runs_by = {c: [] for c in ("no pool", "cv2.cvtColor", "numpy swap")}
        for _ in range(args.reps):  # interleaved
            for label in runs_by:
                runs_by[label].append(
                    decode_beside_pool(data, None if label == "no pool" else label)
                )
        for label, rs in runs_by.items():
            beside[label] = {k: round(statistics.median(r[k] for r in rs), 2) for k in rs[0]}
        result["clips"][name]["overlap_pool_beside"] = beside
        print("  decode beside the overlap pool (ms):", beside)
        floor = decode_floor(data, args.reps)
        result["clips"][name]["decode_floor_cpu_ms"] = floor
        print("  decode floor (CPU ms of the thread):", floor)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
