"""The media fast path's processor call on one 6-frame 854x480 video, one torch thread: PIL frames
(what vLLM hands over without the plugin) vs array frames (media/frames.py), interleaved in one
run, outputs compared with torch.equal, then a cProfile of the array-frame variant.

    .venv/bin/python bench/media_profile.py

Where the remaining milliseconds go: bench/MEDIA.md, "What is left in the fast path".
"""

import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
import media_stages as ms

from gemma4_batched_encoder.media import frames as array_frames
from slo_loadtest.media import write_video


def main() -> None:
    torch.set_num_threads(1)
    assert array_frames.patch_processor()
    with tempfile.TemporaryDirectory() as tmp:
        mp4 = write_video(Path(tmp) / "v.mp4", 1, frames=6, width=854, height=480, fps=2, seed=1)
        video = ms.decode_frames(mp4.read_bytes())
    processor = ms.image_processor(True)
    variants = {"pil_frames": Image.fromarray, "array_frames": array_frames.as_frame}

    def run(name: str) -> dict:
        images = [variants[name](video[i]) for i in range(video.shape[0])]
        return processor(images=images, max_soft_tokens=70, return_tensors="pt")

    times: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(23):
        for name in variants if rep % 2 else reversed(list(variants)):
            t0 = time.perf_counter()
            run(name)
            if rep >= 3:
                times[name].append((time.perf_counter() - t0) * 1000)
    a, b = run("pil_frames"), run("array_frames")
    equal = all(torch.equal(a[k], b[k]) for k in a)
    medians = {name: statistics.median(v) for name, v in times.items()}
    print(
        "fast processor, one thread, one video (median of 20): "
        + ", ".join(f"{name} {ms_:.1f} ms" for name, ms_ in medians.items())
        + f"; outputs torch.equal: {equal}"
    )
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(10):
        run("array_frames")
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    sys.exit(0 if equal else 1)


if __name__ == "__main__":
    main()
