"""vLLM's OpenCV video decode with its frame-count check first (stock) vs beside the decode vs
not run where the mp4's sample table and the decode vouch for the header (`media.count_check`,
`media.mp4_plain`), side by side in one run on the same clips: wall and CPU time per video (all
threads of this process), the check's own cost (vLLM's `get_video_metadata` alone), and the
frames compared with np.array_equal.

    .venv/bin/python bench/media_count_check.py --out bench/results/media/cpu-2core-count-check.json
    # the image's vLLM 0.33.0 (its loader runs the check on a capture of its own), `make vllm033`:
    PYTHONPATH=.cache/vllm-0.33.0:.cache/vllm-0.34.0 .venv/bin/python bench/media_count_check.py

Each repetition runs both variants once, in turn, so drift in the machine's load hits both alike.
Both run with the fast path on (decode threads as it sets them, `GEMMA4_MEDIA_DECODE_THREADS`,
default 1); "check first" calls vLLM's own `decode_opencv`, so only the check's place differs.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import media_stages as ms

from gemma4_batched_encoder import media
from gemma4_batched_encoder.media import count_check, mp4_plain

CLIPS = (  # frames, width, height, codec
    (6, 854, 480, "mp4v"),
    (6, 1280, 720, "mp4v"),
    (32, 854, 480, "mp4v"),
    (6, 854, 480, "VP90"),
)
VARIANTS = ("check first (vLLM)", "check beside the decode", "check skipped where plain")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY
    from vllm.multimodal.video_decoders import opencv

    if not media.install() or not getattr(opencv.decode_opencv, "_gemma4_count_check", False):
        raise SystemExit("this vLLM has no frame-count check to move (before 0.27?)")
    loader = VIDEO_LOADER_REGISTRY.load("opencv")
    mixin = opencv.OpenCVVideoBackendMixin
    patched = opencv.decode_opencv
    decoders = dict(zip(VARIANTS, (patched.__wrapped__, patched, patched), strict=True))
    vouch = mp4_plain.frame_count
    vouches = dict(zip(VARIANTS, (vouch, lambda _data: None, vouch), strict=True))
    media.set_fast_path(True)
    rows = []
    for frames, width, height, fourcc in CLIPS:
        data = ms.realistic_mp4(1, frames=frames, width=width, height=height, fourcc=fourcc)
        wall: dict[str, list[float]] = {k: [] for k in VARIANTS}
        cpu: dict[str, list[float]] = {k: [] for k in VARIANTS}
        check: list[float] = []
        decoded: dict[str, np.ndarray] = {}
        for rep in range(args.warmup + args.reps):
            for name, decoder in decoders.items():
                opencv.decode_opencv = decoder
                mp4_plain.frame_count = vouches[name]
                t0, c0 = time.perf_counter(), time.process_time()
                out, _ = loader.load_bytes(data, num_frames=32)
                t1, c1 = time.perf_counter(), time.process_time()
                decoded[name] = np.asarray(out)
                if rep >= args.warmup:
                    wall[name].append(1000 * (t1 - t0))
                    cpu[name].append(1000 * (c1 - c0))
            t0 = time.perf_counter()
            count_check.checked_source(mixin, data)  # as this vLLM calls it (0.32 / 0.33+)
            if rep >= args.warmup:
                check.append(1000 * (time.perf_counter() - t0))
        stock = decoded[VARIANTS[0]]
        rows.append(
            {
                "clip": f"{frames} frames {width}x{height} {fourcc}",
                "identical": all(np.array_equal(stock, decoded[k]) for k in VARIANTS[1:]),
                "check_alone_ms": statistics.median(check),
                **{f"{k} wall_ms": statistics.median(v) for k, v in wall.items()},
                **{f"{k} cpu_ms": statistics.median(v) for k, v in cpu.items()},
            }
        )
    opencv.decode_opencv = patched
    mp4_plain.frame_count = vouch
    media.set_fast_path(media.fast_path_requested())
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "vllm": importlib.metadata.version("vllm"),
        "reps": args.reps,
        "rows": rows,
    }
    names = list(VARIANTS)
    print(f"{'clip':28s} {'check alone':>11s} " + " ".join(f"{n + ' wall/cpu':>34s}" for n in names)
          + "  identical")  # fmt: skip
    for r in rows:
        cells = " ".join(f"{r[f'{n} wall_ms']:>20.1f} / {r[f'{n} cpu_ms']:>6.1f} ms" for n in names)
        print(f"{r['clip']:28s} {r['check_alone_ms']:>8.1f} ms {cells}  {r['identical']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
