"""cProfile of the media fast path's processor call on one 6-frame 854x480 video, one torch thread.

    .venv/bin/python bench/media_profile.py

Prints the time per video and the 14 most expensive functions (10 calls after 3 warm-ups): where
the remaining milliseconds of the fast path go (see MEDIA.md, "What is left in the fast path").
"""

import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import media_stages as ms

from slo_loadtest.media import write_video


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        mp4 = write_video(Path(tmp) / "v.mp4", 1, frames=6, width=854, height=480, fps=2, seed=1)
        frames = ms.decode_frames(mp4.read_bytes())
    for _ in range(3):
        ms._processor_core(frames, True, 1)
    t0 = time.perf_counter()
    for _ in range(10):
        ms._processor_core(frames, True, 1)
    print(f"fast path, one thread: {(time.perf_counter() - t0) * 100:.1f} ms per video")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(10):
        ms._processor_core(frames, True, 1)
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
