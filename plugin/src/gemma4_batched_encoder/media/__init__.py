"""Media fast path and per-stage preprocessing metrics for Gemma 4 (issue 8).

`install()` is meant to be called from the plugin's `register()`, which vLLM runs in every process.
Request media (base64, video decode, the Gemma 4 multimodal processor) is handled only in the
API-server ("frontend") processes, so only there does it patch anything:
- `Gemma4ImageProcessor._preprocess` (transformers) -> the fast path in `fast_processor`, whose
  tensors are `torch.equal` to stock (video frames go through this image processor too);
  `GEMMA4_MEDIA_FAST_PATH=0` keeps the stock code; a self-check at install time compares both on
  a small input and leaves the stock code in force on any difference;
- with the fast path on, vLLM's Gemma 4 multimodal processor call runs with torch limited to
  `GEMMA4_MEDIA_TORCH_THREADS` (default 1; 0 leaves torch alone) intra-op threads, scoped to the
  calling thread and restored after: its small memory-bound torch ops (cast to the model dtype,
  cat, the resize) stall in OpenMP barriers when the cores are shared with the engine and other
  API servers (bench/MEDIA.md); none of them change values with the thread count;
- with the fast path on, vLLM's Gemma 4 video branch hands decoded frames to the processor as
  arrays instead of PIL images (`frames`: same tensors, no PIL round trip);
- with the fast path on, vLLM's per-video processor call with a dummy prompt is answered by the
  image processor alone (`frame_call`: same tensors, self-checked on first use);
- with the fast path on and `GEMMA4_MEDIA_FRAME_THREADS` > 1 (default 1), the image processor
  splits a call's frames of one size across that many threads (`fast_processor`: same tensors,
  lower latency per video, same CPU time);
- with the fast path on, vLLM's OpenCV loader decodes each video with
  `GEMMA4_MEDIA_DECODE_THREADS` (default 1) FFmpeg threads instead of one per core (`decode`:
  same frames, less time and CPU);
- with the fast path on at install, OpenCV's own thread pool, which splits the loader's colour
  conversion over one spinning worker per core, is set to `GEMMA4_MEDIA_CV2_THREADS` (default 1;
  `decode`: same frames; the pool cost ~10 ms of CPU beyond the wall time a video on 16-core
  hosts, with one thread CPU equals wall on 2 cores);
- with the fast path on, on vLLM before 0.27, a video's cache key is hashed from its container
  bytes instead of its decoded frames (`source_key`: same tensors, 1-2 ms less per video);
- with the fast path on, on vLLM 0.27+, the OpenCV loader's frame-count check (an end-of-stream
  seek that decodes a short clip once more) runs on a second capture beside the frame decode
  (`count_check`: same frames and metadata, less decode wall time, same CPU time);
- with the fast path on and `GEMMA4_MEDIA_OVERLAP_THREADS` > 0 (default 0), each frame vLLM's
  OpenCV loader retrieves is resized and patchified on that many threads while the next one
  decodes, and the image processor takes the prepared patches after checking the frame is
  byte for byte the same (`overlap`: same tensors; served on one H200 it made the time to
  first token longer, bench/MEDIA.md);
- with the fast path and `GEMMA4_MEDIA_UINT8=on` (default off), pixel values leave as the uint8
  patches and the plugin's model class rescales them on the device with stock's arithmetic
  (`..pixels`: same tensors reach the encoder, a quarter of the bytes to serialise and copy);
  where this install cannot take them (`pixels.handoff_blocker`), one warning and float32;
- timing wrappers that record `gemma4_media_preprocess_seconds{stage}` (see `stages`).
Engine-core and worker processes are left untouched (they see no request media; their processor
only builds fixed dummy inputs for memory profiling).

Patch ledger (vLLM 0.32 / transformers 5.19): transformers `Gemma4ImageProcessor._preprocess`;
vLLM `VideoMediaIO.load_bytes` / `.load_base64` (vllm/multimodal/media/video.py, or
vllm/multimodal/video.py before 0.27) and
`Gemma4MultiModalProcessor._apply_hf_processor_main` (vllm/model_executor/models/gemma4_mm.py),
the last three for timing only; `gemma4_mm.PILImage` (see `frames`);
`OpenCVVideoBackendMixin.open_video_capture` (see `decode`; its captures wrapped, see
`overlap`); transformers
`Gemma4Processor.__call__` (see `frame_call`); vLLM `MultiModalHasher.serialize_item` and
`VideoMediaIO.load_bytes` before 0.27 (see `source_key`); `video_decoders.opencv.decode_opencv`
(see `count_check`).
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..metrics import unrecorded
from ..vllm_modules import PROCESSOR_MODULES, VIDEO_IO_MODULES, first_attr
from . import count_check, decode, frame_call, frames, overlap, source_key, stages
from .env import ENV_UINT8, switch, thread_count, uint8_requested

# Under `vllm.` so vLLM's handler prints it (see ../log.py).
logger = logging.getLogger("vllm.gemma4_batched_encoder.media")

ENV_FAST_PATH = "GEMMA4_MEDIA_FAST_PATH"
ENV_TORCH_THREADS = "GEMMA4_MEDIA_TORCH_THREADS"
ENV_FRAME_THREADS = "GEMMA4_MEDIA_FRAME_THREADS"
_PATCHED = "_gemma4_media_patched"
_ENGINE_PROCESS_PREFIXES = ("EngineCore", "VllmWorker", "Worker")

_lock = threading.Lock()
_installed = False
_fast_enabled = False
_uint8_enabled = False
_local = threading.local()


def fast_path_requested() -> bool:
    """`GEMMA4_MEDIA_FAST_PATH`: 1 (default) or 0."""
    return switch(ENV_FAST_PATH, True)


def media_frame_threads() -> int:
    """`GEMMA4_MEDIA_FRAME_THREADS`: threads one processor call splits its frames across
    (default 1, i.e. off; 0 counts as 1)."""
    return max(1, thread_count(ENV_FRAME_THREADS))


def media_torch_threads() -> int:
    """`GEMMA4_MEDIA_TORCH_THREADS`: torch threads for media processing (default 1, 0 = as is)."""
    return thread_count(ENV_TORCH_THREADS)


@contextmanager
def limited_torch_threads(threads: int) -> Iterator[None]:
    """torch intra-op threads for this thread only, restored after (0: leave as is).

    torch keeps the OpenMP thread count per calling thread (omp_set_num_threads), so this does
    not change what other threads, e.g. an in-process engine, use.
    """
    import torch

    before = torch.get_num_threads()
    if threads <= 0 or threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def fast_path_enabled() -> bool:
    return _fast_enabled


def set_fast_path(enabled: bool) -> None:
    """Switch the installed fast path on or off in this process (benchmarks, tests)."""
    global _fast_enabled
    _fast_enabled = enabled


def uint8_enabled() -> bool:
    return _uint8_enabled


def set_uint8(enabled: bool) -> None:
    """Switch the uint8 hand-off on or off in this process (tests)."""
    global _uint8_enabled
    _uint8_enabled = enabled


def _uint8_handoff() -> bool:
    """`GEMMA4_MEDIA_UINT8` as it can be honoured here; one warning when it cannot."""
    if not uint8_requested():
        return False
    if not _fast_enabled:
        logger.warning("gemma4 media: %s=on needs the fast path; float32 kept", ENV_UINT8)
        return False
    from ..pixels import handoff_blocker

    blocker = handoff_blocker()
    if blocker is not None:
        logger.warning("gemma4 media: %s=on but %s; float32 pixel values kept", ENV_UINT8, blocker)
        return False
    return True


def process_role() -> str:
    """'engine' in vLLM's engine-core and worker processes, else 'frontend'."""
    name = multiprocessing.current_process().name
    return "engine" if name.startswith(_ENGINE_PROCESS_PREFIXES) else "frontend"


def install() -> bool:
    """Patch this process once; True if the media patches are in force here."""
    global _installed, _fast_enabled, _uint8_enabled
    with _lock:
        if _installed:
            return True
        if process_role() != "frontend":
            return False
        # Each patch on its own: one that fails (a changed upstream) leaves the others working.
        # Frame threads first, so that the image processor's self-check covers them.
        from . import fast_processor

        fast_processor.set_frame_threads(media_frame_threads())
        fast_ok = _guarded("image processor not patched", _patch_image_processor, False)
        _fast_enabled = fast_ok and fast_path_requested()
        _uint8_enabled = _guarded("uint8 hand-off off", _uint8_handoff, False)
        _guarded("stage timers not installed", _patch_vllm_timing, None)
        array_frames = _guarded(
            "video frames stay PIL images", lambda: frames.install(fast_path_enabled), False
        )
        short_call = _guarded(
            "video frame call kept whole", lambda: frame_call.install(fast_path_enabled), False
        )
        keyed = _guarded(
            "videos keyed by their frames", lambda: source_key.install(fast_path_enabled), False
        )
        count_beside = _guarded(
            "count check kept first", lambda: count_check.install(fast_path_enabled), False
        )
        threads = decode.decode_threads()
        overlapping = _guarded(
            "decode overlap off", lambda: overlap.install(overlap.overlap_threads()), None
        )
        decode_patched = _guarded(
            "decode threads not set",
            lambda: decode.install(
                fast_path_enabled, threads, overlap.wrap_capture, force=overlapping is not None
            ),
            False,
        )
        if not decode_patched:
            overlap.uninstall()  # no capture would feed it
        cv2_threads = decode.cv2_threads()
        cv2_set = _fast_enabled and _guarded(
            "OpenCV threads kept", lambda: decode.set_cv2_threads(cv2_threads), False
        )
        _installed = True
        logger.info(
            "gemma4 media: installed (fast path %s, video frames as arrays %s, "
            "video decode threads %s, OpenCV threads %s, frame threads %s, "
            "frame call via image processor %s, "
            "video cache keys from bytes %s, frame-count check beside the decode %s, "
            "decode overlap threads %s, uint8 pixel values %s)",
            "on" if _fast_enabled else "off",
            "on" if array_frames and _fast_enabled else "off",
            threads if decode_patched and _fast_enabled else "as vLLM",
            cv2_threads if cv2_set else "as OpenCV",
            fast_processor.frame_threads() if _fast_enabled else 1,
            "on" if short_call and array_frames and _fast_enabled else "off",
            "on" if keyed and _fast_enabled else "off",
            "on" if count_beside and _fast_enabled else "off",
            overlapping.threads if overlapping and decode_patched and _fast_enabled else "off",
            "on" if _uint8_enabled else "off",
        )
        return True


def _guarded(what: str, patch: Callable[[], Any], failed: Any) -> Any:
    """Run one patch; on an exception log `what` with the traceback and return `failed`."""
    try:
        return patch()
    except Exception:
        logger.warning("gemma4 media: %s", what, exc_info=True)
        return failed


def _patch_image_processor() -> bool:
    """Wrap `_preprocess` (fast path + timing); False if the self-check fails."""
    from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor

    from .fast_processor import make_fast_preprocess, self_check

    current = Gemma4ImageProcessor._preprocess
    if getattr(current, _PATCHED, False):
        return True
    fast = make_fast_preprocess(current, fast_path_enabled, uint8_enabled)
    ok = self_check(current)  # the fast path forced on: `fast` is still off here
    if not ok:
        logger.warning("gemma4 media: fast path differs from stock here; stock code kept")

    @functools.wraps(current)
    def timed_preprocess(self: Any, *args: Any, **kwargs: Any) -> Any:
        with stages.timed(stages.IMAGE_PROCESSOR):
            return (fast if ok else current)(self, *args, **kwargs)

    setattr(timed_preprocess, _PATCHED, True)
    Gemma4ImageProcessor._preprocess = timed_preprocess
    return ok


def _wrap(cls: Any, name: str, make: Any) -> None:
    original = getattr(cls, name, None)
    if original is None or getattr(original, _PATCHED, False):
        return
    wrapper = functools.wraps(original)(make(original))
    setattr(wrapper, _PATCHED, True)
    setattr(cls, name, wrapper)


def timed_load_bytes(original: Any) -> Any:
    """`VideoMediaIO.load_bytes` recording `video_decode` (arguments passed through as given)."""

    def load_bytes(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = stages.ThreadClock.now()
        try:
            return original(self, *args, **kwargs)
        finally:
            elapsed = stages.observe_since(stages.VIDEO_DECODE, start)
            _local.decode_seconds = getattr(_local, "decode_seconds", 0.0) + elapsed

    return load_bytes


def timed_load_base64(original: Any) -> Any:
    """`VideoMediaIO.load_base64` recording `base64_decode`: its time minus load_bytes'."""

    def load_base64(self: Any, *args: Any, **kwargs: Any) -> Any:
        media_type = args[0] if args else kwargs.get("media_type", "")
        _local.decode_seconds = 0.0
        start = time.perf_counter()
        result = original(self, *args, **kwargs)
        total = time.perf_counter() - start
        if str(media_type).lower() != "video/jpeg":  # jpeg frame lists decode images instead
            stages.observe(stages.BASE64, max(0.0, total - _local.decode_seconds))
        return result

    return load_base64


def timed_processor_main(original: Any, threads: int) -> Any:
    """`_apply_hf_processor_main` recording `mm_processor`, torch threads limited (fast path).

    Signature-agnostic on purpose: vLLM 0.26 inherits this method from BaseMultiModalProcessor
    with `prompt` first (seen on an H200 run: naming `mm_items` here turned every request into
    "got multiple values for argument 'prompt'").
    """

    def _apply_hf_processor_main(self: Any, *args: Any, **kwargs: Any) -> Any:
        with (
            stages.timed(stages.MM_PROCESSOR),
            limited_torch_threads(threads if fast_path_enabled() else 0),
        ):
            return original(self, *args, **kwargs)

    return _apply_hf_processor_main


def untimed_dummy_inputs(original: Any) -> Any:
    """`get_dummy_mm_inputs` (vLLM's start-up warm-up and profiling) with no stage recorded."""

    def get_dummy_mm_inputs(self: Any, *args: Any, **kwargs: Any) -> Any:
        with unrecorded():
            return original(self, *args, **kwargs)

    return get_dummy_mm_inputs


def _patch_vllm_timing() -> None:
    """Stage timers around vLLM's video loading and Gemma 4 multimodal processor; none around
    its dummy inputs."""
    threads = media_torch_threads()
    found = first_attr(PROCESSOR_MODULES, "BaseMultiModalProcessor")
    if found is not None and hasattr(found[1], "get_dummy_mm_inputs"):
        _wrap(found[1], "get_dummy_mm_inputs", untimed_dummy_inputs)
    else:
        logger.info("gemma4 media: no get_dummy_mm_inputs found; warm-up calls are timed too")
    found = first_attr(VIDEO_IO_MODULES, "VideoMediaIO")
    if found is not None:
        _wrap(found[1], "load_bytes", timed_load_bytes)
        _wrap(found[1], "load_base64", timed_load_base64)
    else:
        logger.info("gemma4 media: no VideoMediaIO found; video stages not timed")
    try:
        from vllm.model_executor.models.gemma4_mm import Gemma4MultiModalProcessor
    except ImportError:
        logger.info("gemma4 media: no Gemma4MultiModalProcessor; mm_processor not timed")
        return
    _wrap(
        Gemma4MultiModalProcessor,
        "_apply_hf_processor_main",
        lambda original: timed_processor_main(original, threads),
    )
