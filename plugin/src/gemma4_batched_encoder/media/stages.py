"""Per-stage media preprocessing timing: `gemma4_media_preprocess_seconds{stage}`.

The histogram is created lazily, once per process, in the process where a stage runs (the API
server for everything measured here). With PROMETHEUS_MULTIPROC_DIR set (images/entrypoint.sh
sets it) every process's samples appear on vLLM's /metrics.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

METRIC_NAME = "gemma4_media_preprocess_seconds"
# 0.5 ms .. 2 s: a 480p frame's resize is ~1 ms, a burst of videos in one API server ~1 s.
BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
)

# Stage names (the `stage` label). Keep in sync with bench/MEDIA.md.
BASE64 = "base64_decode"  # data URL payload -> bytes (VideoMediaIO/ImageMediaIO.load_base64)
VIDEO_DECODE = "video_decode"  # mp4 bytes -> sampled RGB frames (vLLM's OpenCV loader)
IMAGE_PROCESSOR = "image_processor"  # Gemma 4 image processor: resize, rescale, patchify, pad
MM_PROCESSOR = "mm_processor"  # vLLM's whole Gemma 4 multimodal processor call (HF + tokens)

_lock = threading.Lock()
_histogram: Any = None


def histogram() -> Any:
    """The process's histogram, created on first use (prometheus_client forbids duplicates)."""
    global _histogram
    with _lock:
        if _histogram is None:
            from prometheus_client import Histogram

            _histogram = Histogram(
                METRIC_NAME,
                "Gemma 4 media preprocessing time per stage (seconds).",
                ["stage"],
                buckets=BUCKETS,
            )
        return _histogram


def observe(stage: str, seconds: float) -> None:
    with contextlib.suppress(Exception):  # metrics must never fail a request
        histogram().labels(stage=stage).observe(seconds)


@contextmanager
def timed(stage: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        observe(stage, time.perf_counter() - start)
