"""A video's multimodal cache key as vLLM 0.20-0.26 computes it (blake3 of the decoded frames)
vs from its container bytes (media/source_key.py), side by side in one run on the same decoded
clips, with vLLM's real OpenCV loader and MultiModalHasher, interleaved per repetition. The keyed
time includes the digest of the bytes taken at load time.

    .venv/bin/python bench/media_source_key.py --out bench/results/media/cpu-2core-source-key.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import media_stages as ms

CLIPS = ((6, 854, 480), (6, 1280, 720), (16, 854, 480))


class VideoIO:
    """What VideoMediaIO.load_bytes of vLLM 0.20-0.26 reads: loader, frame count, options."""

    def __init__(self) -> None:
        from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

        self.num_frames = 32
        self.kwargs: dict = {}
        self.video_loader = VIDEO_LOADER_REGISTRY.load("opencv")

    def load_bytes(self, data: bytes) -> tuple:
        return self.video_loader.load_bytes(data, num_frames=self.num_frames, **self.kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from vllm.multimodal.hasher import MultiModalHasher

    from gemma4_batched_encoder.media import source_key

    keyed_hasher = source_key.keyed_hasher(MultiModalHasher)

    # vLLM 0.32 takes the algorithm first; 0.26 reads it from the environment.
    takes_algorithm = "algorithm" in inspect.signature(MultiModalHasher.hash_kwargs).parameters
    lead = ("blake3",) if takes_algorithm else ()
    io = VideoIO()
    rows = []
    for frames, width, height in CLIPS:
        data = ms.realistic_mp4(0, frames, width, height)
        video = io.load_bytes(data)
        times: dict[str, list[float]] = {"frames (stock)": [], "container bytes": []}
        keys = set()
        for rep in range(args.reps + 3):
            start = time.perf_counter()
            MultiModalHasher.hash_kwargs(*lead, model_id="m", video=video)
            stock = (time.perf_counter() - start) * 1000
            start = time.perf_counter()
            source_key.remember(video[0], source_key.source_digest(io, data))
            keys.add(keyed_hasher.hash_kwargs(*lead, model_id="m", video=video))
            keyed = (time.perf_counter() - start) * 1000
            if rep >= 3:
                times["frames (stock)"].append(stock)
                times["container bytes"].append(keyed)
        assert len(keys) == 1, "the keyed hash must be stable"
        rows.append(
            {
                "clip": f"{frames} frames {width}x{height} mp4v",
                "mp4_bytes": len(data),
                "frame_bytes": int(video[0].nbytes),
                "median_ms": {k: statistics.median(v) for k, v in times.items()},
            }
        )
    print("| clip | mp4 | frames | key from frames (stock) | key from bytes | saved |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        m = r["median_ms"]
        print(
            f"| {r['clip']} | {r['mp4_bytes'] / 1e3:.0f} kB | {r['frame_bytes'] / 1e6:.1f} MB "
            f"| {m['frames (stock)']:.2f} ms | {m['container bytes']:.3f} ms "
            f"| {m['frames (stock)'] - m['container bytes']:.2f} ms |"
        )
    if args.out:
        result = {"command": " ".join(sys.argv), "reps": args.reps, "rows": rows}
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
