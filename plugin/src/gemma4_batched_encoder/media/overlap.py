"""Each decoded video frame is resized and patchified while the next one decodes (issue 8).

A video request's frames are decoded (vLLM's OpenCV loader) and only then processed (Gemma 4's
image processor: resize, patchify, rescale), in two vLLM stages one after the other: on the H200
host 12.7 + 7.0 ms for the SLO's 6-frame clip, all of it in the request's time to first token.

With `GEMMA4_MEDIA_OVERLAP_THREADS` = N > 0 and the fast path on, the capture vLLM decodes from
(`decode.install` wraps it) hands every frame it retrieves to a pool of N threads, which converts
it to RGB with the loader's own call (`cv2.cvtColor`), then resizes and patchifies it with the
fast processor's own functions (`fast_processor.resize_batch`, `patchify`). When the processor
later gets a frame, it looks the prepared one up by a sample of its pixels, checks that the whole
frame is byte for byte the one prepared and that the resize target and parameters are the ones it
would use, and takes the prepared uint8 patches instead of computing them. Anything else (a frame
never prepared, one that differs, another budget, a failed worker) is computed as before. So the
tensors are the same whatever happens here, and what the processor still waits for is about one
frame's work after the decode ends.

The resize parameters are learnt from the processor's first call with vLLM's video budget (70
soft tokens a frame; `learn`): until then, nothing is prepared. Prepared frames wait for the
processor at most until MAX_FRAMES newer ones have been prepared in this process (oldest dropped:
a request that failed between decode and processor leaves nothing behind for long).

`gemma4_media_overlap_frames_total{result}` counts, per processor lookup, `prepared` (taken) and
`missed` (computed in the processor), so a dashboard shows whether the overlap is doing its job.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import torch

from .env import thread_count
from .stages import labelled_counter

ENV_OVERLAP_THREADS = "GEMMA4_MEDIA_OVERLAP_THREADS"
VIDEO_SOFT_TOKENS = 70  # vLLM's Gemma 4: _VIDEO_MAX_SOFT_TOKENS, 0.20 through 0.33
MAX_FRAMES = 64  # prepared frames kept per process: 10 six-frame videos, ~110 MB at 480p
METRIC_NAME = "gemma4_media_overlap_frames"  # a counter: exposed with _total
_SAMPLE_GRID = 16  # the lookup key: a 16 x 16 grid of pixels (and the shape)


def overlap_threads() -> int:
    """`GEMMA4_MEDIA_OVERLAP_THREADS`: threads preparing decoded frames (default 0: off)."""
    return thread_count(ENV_OVERLAP_THREADS, default=0)


class ResizeParams(NamedTuple):
    """What the processor's resize and patchify depend on, besides the frame."""

    resample: Any
    patch_size: int
    pooling_kernel_size: int
    max_soft_tokens: int


class Prepared(NamedTuple):
    rgb: np.ndarray  # [H, W, 3] uint8: the frame as vLLM's loader stores it
    params: ResizeParams
    target: tuple[int, int]  # (height, width) after the resize
    patches: np.ndarray  # [n, p * p * 3] uint8


def _grid(shape: tuple[int, ...]) -> tuple[int, int]:
    return max(1, shape[0] // _SAMPLE_GRID), max(1, shape[1] // _SAMPLE_GRID)


def rgb_key(rgb: np.ndarray) -> tuple[Any, ...]:
    """Lookup key of an RGB [H, W, 3] frame (any strides)."""
    sy, sx = _grid(rgb.shape)
    return (rgb.shape, rgb[::sy, ::sx].tobytes())


def bgr_key(bgr: np.ndarray) -> tuple[Any, ...]:
    """`rgb_key` of `cv2.cvtColor(bgr, COLOR_BGR2RGB)`, which only swaps channels."""
    sy, sx = _grid(bgr.shape)
    return (bgr.shape, bgr[::sy, ::sx, ::-1].tobytes())


def is_bgr_frame(frame: Any) -> bool:
    return (
        isinstance(frame, np.ndarray)
        and frame.dtype == np.uint8
        and frame.ndim == 3
        and frame.shape[2] == 3
        and frame.shape[0] > 0
        and frame.shape[1] > 0
    )


def hwc_view(image: torch.Tensor) -> np.ndarray | None:
    """The [H, W, 3] array behind a processor input (a uint8 [3, H, W] CPU tensor), or None."""
    if image.ndim != 3 or image.shape[0] != 3 or image.dtype != torch.uint8:
        return None
    return image.permute(1, 2, 0).numpy()


class FrameOverlap:
    """The per-process pool and the prepared frames waiting for the processor."""

    def __init__(
        self,
        threads: int,
        max_frames: int = MAX_FRAMES,
        prepare_frame: Callable[[np.ndarray, ResizeParams], Prepared] | None = None,
    ) -> None:
        self.threads = threads
        self.max_frames = max_frames
        self._prepare_frame = prepare_frame  # None: the module's `prepare`, looked up per frame
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._params: ResizeParams | None = None
        # key -> futures of frames with that key, in the order prepared; _order: every waiting
        # future with its key, oldest first (for the MAX_FRAMES bound)
        self._waiting: dict[tuple[Any, ...], list[Future[Prepared]]] = {}
        self._order: OrderedDict[Future[Prepared], tuple[Any, ...]] = OrderedDict()

    @property
    def params(self) -> ResizeParams | None:
        return self._params

    def learn(self, params: ResizeParams) -> None:
        """The processor's parameters for video frames (called by the fast processor)."""
        if params.max_soft_tokens == VIDEO_SOFT_TOKENS and params != self._params:
            self._params = params

    def drain(self) -> None:
        """Wait until every waiting frame is prepared (benchmarks)."""
        with self._lock:
            futures = list(self._order)
        for future in futures:
            with contextlib.suppress(Exception):
                future.result()

    def waiting(self) -> int:
        with self._lock:
            return len(self._order)

    def submit(self, bgr: Any) -> None:
        """Prepare a frame vLLM's loader just retrieved (BGR, as OpenCV gives it)."""
        params = self._params
        if params is None or not is_bgr_frame(bgr):
            return
        key = bgr_key(bgr)
        future = self._executor().submit(self._prepare_frame or prepare, bgr, params)
        with self._lock:
            self._waiting.setdefault(key, []).append(future)
            self._order[future] = key
            while len(self._order) > self.max_frames:
                old, old_key = self._order.popitem(last=False)
                self._forget(old, old_key)
                old.cancel()

    def take(self, image: torch.Tensor, params: ResizeParams, target: tuple[int, int]) -> Any:
        """The prepared patches of this processor input, or None (then the caller computes)."""
        rgb = hwc_view(image)
        if rgb is None:
            count("missed")
            return None
        key = rgb_key(rgb)
        with self._lock:
            candidates = list(self._waiting.get(key, ()))
        for future in candidates:
            try:
                prepared = future.result()
            except Exception:  # a failed or cancelled worker: computed by the caller
                prepared = None
            if prepared is not None and not np.array_equal(prepared.rgb, rgb):
                continue  # another frame with the same sample (a still scene): left for it
            with self._lock:
                self._forget(future, key)
            if prepared is not None and prepared.params == params and prepared.target == target:
                count("prepared")
                return prepared.patches
        count("missed")
        return None

    def _forget(self, future: Future[Prepared], key: tuple[Any, ...]) -> None:
        """Drop one waiting future (lock held)."""
        self._order.pop(future, None)
        futures = self._waiting.get(key)
        if futures is not None:
            with contextlib.suppress(ValueError):
                futures.remove(future)
            if not futures:
                del self._waiting[key]

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            with self._lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        self.threads, "gemma4-overlap", initializer=_one_torch_thread
                    )
        return self._pool


def _one_torch_thread() -> None:
    """Each pool thread runs torch on one intra-op thread, as the processor call does
    (GEMMA4_MEDIA_TORCH_THREADS; torch keeps the count per thread), set once, not per frame."""
    torch.set_num_threads(1)


def loader_rgb(bgr: np.ndarray) -> np.ndarray:
    """What vLLM's loader stores for a retrieved frame: the same OpenCV call."""
    import cv2

    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def swap_to_rgb(bgr: np.ndarray) -> np.ndarray:
    """The same bytes by a numpy channel swap, off OpenCV's shared thread pool (a strided copy:
    slower, bench/decode_breakdown.py compares both)."""
    return np.ascontiguousarray(bgr[..., ::-1])


def prepare(
    bgr: np.ndarray,
    params: ResizeParams,
    to_rgb: Callable[[np.ndarray], np.ndarray] = loader_rgb,
) -> Prepared:
    """On a pool thread: what vLLM's loader and the fast processor would make of this frame
    (`to_rgb`: the conversion; bench/decode_breakdown.py compares both)."""
    from .fast_processor import patchify, resize_batch, resize_target

    rgb = to_rgb(bgr)
    height, width = rgb.shape[:2]
    target = resize_target(height, width, params)
    # As the processor stacks its [3, H, W] views: one contiguous planar batch
    batch = np.stack([rgb.transpose(2, 0, 1)])
    resized = resize_batch(batch, target if target != (height, width) else None, params)
    return Prepared(rgb, params, target, patchify(resized, params.patch_size)[0])


class OverlapCapture:
    """vLLM's `cv2.VideoCapture`, handing each retrieved frame to the pool as well (vLLM's
    loops, 0.20-0.33, grab and retrieve; a `read()` goes to OpenCV untouched)."""

    def __init__(self, cap: Any, overlap: FrameOverlap, enabled: Callable[[], bool]) -> None:
        self._cap = cap
        self._overlap = overlap
        self._enabled = enabled

    def retrieve(self, *args: Any, **kwargs: Any) -> Any:
        ok, frame = self._cap.retrieve(*args, **kwargs)
        if ok and not args and not kwargs and self._enabled():
            self._overlap.submit(frame)  # a new array per call (tested): safe to share
        return ok, frame

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cap, name)


_overlap: FrameOverlap | None = None
_instances: dict[int, FrameOverlap] = {}  # by thread count: switching back keeps pool and params


def active() -> FrameOverlap | None:
    """This process's overlap, if `install` turned it on."""
    return _overlap


def install(threads: int) -> FrameOverlap | None:
    """Turn the overlap on in this process with `threads` workers (0: off)."""
    global _overlap
    if threads <= 0:
        return None
    if threads not in _instances:
        _instances[threads] = FrameOverlap(threads)
    _overlap = _instances[threads]
    return _overlap


def uninstall(forget: bool = False) -> None:
    """Turn it off again (tests and benchmarks); `forget`: drop the pools and what they
    prepared, so the next `install` starts afresh."""
    global _overlap
    _overlap = None
    if forget:
        _instances.clear()


def wrap_capture(cap: Any) -> Any:
    """vLLM's capture, wrapped while an overlap is on (`decode.install` calls it on every open)."""
    frames = _overlap
    if frames is None:
        return cap
    from . import fast_path_enabled

    return OverlapCapture(cap, frames, lambda: _overlap is frames and fast_path_enabled())


count = labelled_counter(
    METRIC_NAME,
    "Gemma 4 video frames the image processor took prepared by the decode overlap (prepared) or "
    "computed itself (missed).",
    "result",
)
