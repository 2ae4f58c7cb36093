"""vLLM's frame-count cross-check beside the frame decode instead of before it (issue 8).

vLLM 0.27+ (`OpenCVVideoBackendMixin.get_video_metadata` in
vllm/multimodal/video_decoders/opencv.py) cross-checks the header's frame count with an
end-of-stream seek before it samples frames: OpenCV's FFmpeg backend decodes from the last
keyframe to the end to get there, which for a short clip is the whole video, and the frames are
then decoded a second time. For the SLO's clip (6 frames, 854x480) on a 2-core CPU the seek took
6.3 ms of vLLM's 13.5 ms decode (bench/media_count_check.py).

With the media fast path on, `decode_opencv` runs that same check on a second capture of the same
bytes in a worker thread while the frames are read with the header's count (OpenCV releases the
GIL in both). The check's answer decides: when it keeps the header's count (every file whose
header is right) the frames already read are exactly what vLLM reads after its seek back to frame
0, so the result is vLLM's; when it corrects the count (a header that overstates the frames, e.g.
an mp4 edit list), or anything raises, vLLM's own `decode_opencv` runs again from the start and
its result (or error) is returned. Same frames, metadata and indices; CPU time unchanged plus one
capture open (~0.5 ms); wall time about the longer of the two.

Most videos need no check at all: where the mp4's sample table vouches for the header's count
(`mp4_plain`: one video track, constant frame duration, no edit that hides frames, nothing
truncated) and the decode itself read every frame up to the last one the table lists (the seek
would land there), the check cannot correct, so it is not run, and the clip costs one decode of
CPU instead of two (the SLO's clip: every frame is sampled). Otherwise it runs as above. The
outcomes are counted (`gemma4_media_frame_count_check_total{outcome}`). A clip whose header
counts at most one frame goes to vLLM's own decode, uncounted: there, the check's seek back to
frame 0 leaves OpenCV with no frame to read (stock vLLM answers a one-frame mp4 with 0 frames),
which a decode without the seek would not reproduce.

Captures are never `release()`d explicitly, as vLLM does not: with OpenCV 5.0's Python-stream
captures, an explicit release in one thread while another thread decodes crashed the process
(segfault, reproduced here); dropping the last reference, as vLLM's own 8 media threads do, did
not.

Two layouts of vLLM's code are mirrored. 0.32 runs the check on the decode's own capture
(`get_video_metadata(cap)`, which seeks it to the end and back to frame 0). 0.33 and 0.34 (the
image's vLLM is 0.33) run it on a capture of their own (`get_video_metadata(data)`) and count the
frames of a header without a count (streamed WebM/MKV) by demuxing; such a clip goes to vLLM's own
decode here, as do one-frame clips.

Patch ledger: the module attribute `decode_opencv` of vllm/multimodal/video_decoders/opencv.py
(`decode_video` looks it up by name at each call), only where its body and the metadata check
are the ones this mirrors (vLLM 0.32-0.34; absent before 0.27, where there is no check to move).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import mp4_plain, stages

logger = logging.getLogger("vllm.gemma4_batched_encoder.media")

MODULE = "vllm.multimodal.video_decoders.opencv"
_PATCHED = "_gemma4_count_check"
# What decode_opencv does, in order (compared without whitespace), and the seek this moves off
# its path. {capture}: what the metadata check is handed, the decode's capture (0.32) or the
# bytes, which it opens itself (0.33-0.34).
_DECODE_STEPS = (
    "OpenCVVideoBackendMixin.open_video_capture(data)",
    "check_frame_pixel_limit(",
    "loader_cls._prepare_source(OpenCVVideoBackendMixin.get_video_metadata({capture}))",
    "loader_cls.compute_frames_index_to_sample(",
    "loader_cls.read_frames(",
)
_CHECK_SEEK = "cv2.CAP_PROP_POS_AVI_RATIO"
LAYOUTS = ("cap", "data")
# As many as vLLM's media threads (VLLM_MEDIA_LOADING_THREAD_COUNT, 8): one check per video
# being decoded.
_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gemma4-count-check")


def header_source(module: Any, cap: Any) -> Any:
    """The header's metadata, as vLLM's check leaves it when it does not correct the count."""
    cv2 = module.cv2
    total = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    fps = cap.get(cv2.CAP_PROP_FPS)
    return module.VideoSourceMetadata(
        total_frames_num=total,
        original_fps=fps,
        duration=total / fps if fps > 0 else 0,
    )


def checked_source(mixin: Any, data: bytes) -> Any:
    """vLLM's own metadata, end-of-stream check included, from a capture of its own."""
    if _layout(mixin.get_video_metadata) == "data":
        return mixin.get_video_metadata(data)  # 0.33+: opens its own capture
    return mixin.get_video_metadata(mixin.open_video_capture(data))


@functools.cache  # checked_source asks for every video; the answer is fixed per vLLM
def _layout(get_video_metadata: Callable[..., Any]) -> str:
    """'data' where vLLM's check takes the bytes (0.33+), 'cap' where it takes a capture."""
    params = list(inspect.signature(get_video_metadata).parameters)
    return "data" if params[-1:] == ["data"] else "cap"


def _squeezed(source: str) -> str:
    return "".join(source.split())


def recognised(decode_source: str, check_source: str) -> str | None:
    """The layout whose decode steps and check this mirrors, or None (code not written against)."""
    if _CHECK_SEEK not in check_source:
        return None
    body = _squeezed(decode_source)
    for layout in LAYOUTS:
        if all(_squeezed(step.format(capture=layout)) in body for step in _DECODE_STEPS):
            return layout
    return None


def _overlapped(module: Any, loader_cls: Any, data: bytes, target: Any, sampling_kwargs: dict,
                frame_recovery: bool) -> tuple[Any, ...] | None:  # fmt: skip
    """vLLM's decode with the check on another capture, or without it where the container and
    the decode itself show it cannot correct (`mp4_plain`); None when vLLM's own must run."""
    mixin = module.OpenCVVideoBackendMixin
    cv2 = module.cv2
    cap = mixin.open_video_capture(data)
    module.check_frame_pixel_limit(
        int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
    )
    header = header_source(module, cap)
    if header.total_frames_num <= 1:
        # 0.32: vLLM's check seeks this capture to the end and back to frame 0, after which
        # OpenCV reads no frame of a one-frame clip: only vLLM's own decode gives its (empty)
        # result. 0.33+: a header without a count is counted by demuxing, vLLM's own way too.
        return None
    plain = not frame_recovery and mp4_plain.frame_count(data) == header.total_frames_num > 0
    checked = None if plain else _pool.submit(checked_source, mixin, data)
    source = loader_cls._prepare_source(header)
    frame_idx = loader_cls.compute_frames_index_to_sample(
        source=source, target=target, **sampling_kwargs
    )
    frames, valid = loader_cls.read_frames(
        cap, frame_idx, total_frames_num=source.total_frames_num, frame_recovery=frame_recovery
    )
    if plain and decoded_to_the_end(frame_idx, valid, header.total_frames_num):
        stages.count_check("skipped")
        return frames, source, frame_idx, valid
    result = checked.result() if checked is not None else checked_source(mixin, data)
    if loader_cls._prepare_source(result) != source:
        stages.count_check("corrected")
        return None  # the check corrected the header: vLLM samples over its count
    stages.count_check("beside")
    return frames, source, frame_idx, valid


def decoded_to_the_end(frame_idx: list[int], valid: list[int], total: int) -> bool:
    """Every sampled frame was read, the container's last among them: the decoder presented
    every frame the sample table lists, so a seek to the end lands on the last one."""
    return bool(frame_idx) and max(frame_idx) == total - 1 and len(valid) == len(set(frame_idx))


def install(enabled: Callable[[], bool]) -> bool:
    """Move vLLM's count check beside the decode; False where nothing was patched."""
    try:
        module = importlib.import_module(MODULE)
    except ImportError:
        return False  # vLLM before 0.27: no check
    original = getattr(module, "decode_opencv", None)
    mixin = getattr(module, "OpenCVVideoBackendMixin", None)
    if original is None or mixin is None:
        return False
    if getattr(original, _PATCHED, False):
        return True
    try:
        decode_source = inspect.getsource(original)
        check_source = inspect.getsource(mixin.get_video_metadata)
    except (OSError, TypeError):
        return False
    layout = recognised(decode_source, check_source)
    if layout is None or layout != _layout(mixin.get_video_metadata):
        logger.info(
            "gemma4 media: vLLM's OpenCV decode differs from 0.32-0.34; count check kept first"
        )
        return False

    def decode_opencv(loader_cls: Any, data: bytes, target: Any, sampling_kwargs: dict, *,
                      frame_recovery: bool = False) -> Any:  # fmt: skip
        if enabled():
            try:
                result = _overlapped(
                    module, loader_cls, data, target, sampling_kwargs, frame_recovery
                )
            except Exception:  # bad input: vLLM's own decode raises its own error
                result = None
            if result is not None:
                return result
        return original(loader_cls, data, target, sampling_kwargs, frame_recovery=frame_recovery)

    setattr(decode_opencv, _PATCHED, True)
    decode_opencv.__wrapped__ = original  # type: ignore[attr-defined]
    module.decode_opencv = decode_opencv
    return True
