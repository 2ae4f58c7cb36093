"""FFmpeg decode threads and OpenCV's own thread pool for vLLM's OpenCV video loader (issue 8).

vLLM opens every request's video with `cv2.VideoCapture(BytesIO(data), api, [])`, so FFmpeg
starts its default number of decode threads (one per core, up to 16) for each video, in every API
server at once. Measured on 2 cores (bench/media_decode.py, bench/MEDIA.md): for the SLO's clip
(6 frames, 854x480) one thread was as fast idle and 9% faster with the cores busy, with 8-13%
less CPU; 720p and 32-frame clips took up to 16% longer. So the default is 1, for a loaded
server of short clips; 0 gives FFmpeg's default back (longer or larger videos, idle cores).
FFmpeg's decoders are exact whatever the thread count: the frames are the same (tested with
vLLM's loader, mp4v and VP9).

OpenCV's own pool is another matter: vLLM's loader converts every frame with `cv2.cvtColor`,
which OpenCV splits over one worker per core, and the workers spin between calls. With one FFmpeg
thread a 6-frame 854x480 clip cost 20.4 ms of CPU for 9.1 ms of wall on a 16-core H200 host
(fourth sitting) and 17.6 for 7.8 (thirtieth): about 10 ms of CPU beyond the wall time a video,
in every API server at once (with one thread, CPU equalled wall on 2 cores; not yet measured on
16). `GEMMA4_MEDIA_CV2_THREADS` (default 1: OpenCV runs its functions sequentially;
0 leaves OpenCV's default) sets the pool when the media fast path is installed on; it is
process-wide (`cv2.setNumThreads`), so it is not undone when the fast path is switched off later.
A per-pixel channel swap gives the same bytes on any thread count (tested).

`GEMMA4_MEDIA_DECODE_THREADS` (default 1; 0 leaves OpenCV's default) applies while the media fast
path is on; the same patched open hands each capture to the decode overlap when that is on
(`overlap.py`, `GEMMA4_MEDIA_OVERLAP_THREADS`).
Patch ledger: `OpenCVVideoBackendMixin.open_video_capture`
(vllm/multimodal/video_decoders/opencv.py on 0.32+, vllm/multimodal/video.py on 0.20-0.31); only
when its source is the one-line open this replaces, so a changed upstream is left alone.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from io import BytesIO
from typing import Any

from ..vllm_modules import OPENCV_MODULES, first_attr
from .env import thread_count

logger = logging.getLogger("vllm.gemma4_batched_encoder.media")

ENV_DECODE_THREADS = "GEMMA4_MEDIA_DECODE_THREADS"
ENV_CV2_THREADS = "GEMMA4_MEDIA_CV2_THREADS"
# What upstream's open_video_capture does (0.20 through 0.32): open with no parameters.
_UPSTREAM_OPEN = "cv2.VideoCapture(BytesIO(data), backend, [])"
_PATCHED = "_gemma4_decode_threads"


def decode_threads() -> int:
    """`GEMMA4_MEDIA_DECODE_THREADS`: FFmpeg threads per video (default 1, 0 = OpenCV's)."""
    return thread_count(ENV_DECODE_THREADS)


def cv2_threads() -> int:
    """`GEMMA4_MEDIA_CV2_THREADS`: OpenCV's thread pool (default 1, 0 = OpenCV's: one per core)."""
    return thread_count(ENV_CV2_THREADS)


def set_cv2_threads(threads: int) -> bool:
    """`cv2.setNumThreads(threads)` for this process (threads > 0); False where left alone."""
    if threads <= 0:
        return False
    import cv2

    cv2.setNumThreads(threads)
    return True


def find_mixin() -> Any | None:
    found = first_attr(OPENCV_MODULES, "OpenCVVideoBackendMixin")
    return found[1] if found else None


def open_capture(data: bytes, api: Any, threads: int) -> Any:
    """vLLM's open, with FFmpeg's thread count set (0: OpenCV's default, as upstream)."""
    import cv2

    params = [cv2.CAP_PROP_N_THREADS, threads] if threads > 0 else []
    cap = cv2.VideoCapture(BytesIO(data), api, params)
    if not cap.isOpened():
        raise ValueError("Could not open video stream")  # upstream's message, unchanged
    return cap


def install(
    enabled: Callable[[], bool],
    threads: int,
    wrap: Callable[[Any], Any] | None = None,
    *,
    force: bool = False,
) -> bool:
    """Set the decode threads of vLLM's OpenCV loader (threads > 0) and pass each capture it
    opens through `wrap` (the decode overlap's `overlap.wrap_capture`); patched when threads > 0
    or `force`. False where nothing was patched."""
    if threads <= 0 and not force:
        return False
    mixin = find_mixin()
    if mixin is None:
        return False
    current = inspect.getattr_static(mixin, "open_video_capture", None)
    if not isinstance(current, classmethod):
        return False
    original = current.__func__
    if getattr(original, _PATCHED, False):
        return True
    try:
        source = inspect.getsource(original)
    except (OSError, TypeError):
        source = ""
    if _UPSTREAM_OPEN not in source:
        logger.info("gemma4 media: vLLM's video open differs from 0.20-0.32; decode threads kept")
        return False

    def open_video_capture(cls: Any, data: bytes) -> Any:
        if not enabled():
            return original(cls, data)
        cap = open_capture(data, cls.get_cv2_video_api(), threads)
        return cap if wrap is None else wrap(cap)

    setattr(open_video_capture, _PATCHED, True)
    open_video_capture.__wrapped__ = original  # type: ignore[attr-defined]
    mixin.open_video_capture = classmethod(open_video_capture)
    return True
