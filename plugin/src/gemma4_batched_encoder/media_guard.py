"""Clear 400s for undecodable videos.

vLLM's OpenCV video loader fails on some non-video payloads with errors that name nothing the
client sent (a PNG sent as video/mp4 gives "Cannot cast ufunc 'subtract' input 0 from
dtype('O')..."). This wraps `VideoMediaIO.load_bytes` in the API-server process so every
decoding failure, and every result that is not a stack of frames, becomes a ValueError saying
what was wrong; vLLM's OpenAI layer turns ValueError into a 400 and keeps serving. The
ValueErrors vLLM's own code raises about the request (a frame over VLLM_MAX_IMAGE_PIXELS, an fps
or frame count out of range, an unknown codec backend) and MemoryError pass through unchanged:
their message is the real reason, and the video may be valid. vLLM's decoders' own failures
("Could not open video stream") are still explained as undecodable.

Patch ledger: vllm/multimodal/media/video.py (0.27+) or vllm/multimodal/video.py (older)
`VideoMediaIO.load_bytes`. Drop once upstream validates decoded frames.
"""

from __future__ import annotations

import functools
import linecache
import logging
from typing import Any

from .vllm_modules import VIDEO_IO_MODULES, first_attr

logger = logging.getLogger(__name__)

_PATCHED_FLAG = "_gemma4_media_guard"


class InvalidVideoError(ValueError):
    """A video payload that cannot be decoded into frames."""


def _describe(data: bytes) -> str:
    head = data[:8]
    kind = (
        "PNG image"
        if head.startswith(b"\x89PNG")
        else ("JPEG image" if head.startswith(b"\xff\xd8") else f"data starting with {head!r}")
    )
    return f"{len(data)} bytes of {kind}"


def _undecodable(data: bytes, exc: Exception) -> InvalidVideoError:
    return InvalidVideoError(
        f"Invalid video: could not decode {_describe(data)} "
        f"({type(exc).__name__}: {exc}); send an mp4, webm or mov video"
    )


def check_frames(frames: Any, data: bytes) -> None:
    """Raise InvalidVideoError unless `frames` is a non-empty [T, H, W, C] uint8 stack."""
    shape = tuple(getattr(frames, "shape", ()))
    dtype = str(getattr(frames, "dtype", type(frames).__name__))
    if len(shape) != 4 or shape[0] < 1 or shape[-1] not in (1, 3, 4) or "uint8" not in dtype:
        raise InvalidVideoError(
            f"Invalid video: decoding {_describe(data)} gave no frames "
            f"(shape {shape}, dtype {dtype}); send an mp4, webm or mov video"
        )


# vLLM's own ValueErrors that say the payload could not be decoded (vllm/multimodal/
# video_decoders/*.py in 0.32, video.py before 0.27): they name nothing that was sent, so they
# keep the clear "could not decode" message.
_DECODER_FAILURES = (
    "could not open video stream",  # OpenCV
    "invalid or unsupported video file",  # PyNvVideoCodec
    "could not determine video",  # PyNvVideoCodec: frame count, dimensions
    "deepstream decode",  # DeepStream: "... failed: ...", "... produced no frames"
)


def vllm_request_error(exc: BaseException) -> bool:
    """A ValueError that vLLM's own code raised on purpose about the request: a limit the payload
    exceeds ("... exceed the maximum of N pixels. Set VLLM_MAX_IMAGE_PIXELS ..."), a bad
    --media-io-kwargs value ("fps must be positive", an unknown codec backend). Its message is the
    real reason, and the video may be fine. Not: vLLM's decoders' failures (``_DECODER_FAILURES``),
    a ValueError from outside vLLM (numpy, OpenCV on a non-video payload), nor one that numpy's C
    code raises in a vLLM line (a frame that does not fit vLLM's buffer): only a ``raise`` there."""
    if not isinstance(exc, ValueError):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next  # the frame that raised
    if tb is None or not tb.tb_frame.f_globals.get("__name__", "").startswith("vllm."):
        return False
    line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
    message = str(exc).lower()
    return line.lstrip().startswith("raise") and not any(f in message for f in _DECODER_FAILURES)


def guard_load_bytes(load_bytes):
    @functools.wraps(load_bytes)
    def wrapper(self, data: bytes, *args: Any, **kwargs: Any):
        try:
            result = load_bytes(self, data, *args, **kwargs)
        except (InvalidVideoError, MemoryError):
            raise
        except ValueError as exc:
            if vllm_request_error(exc):
                raise
            raise _undecodable(data, exc) from exc
        except Exception as exc:  # any decoder failure is the client's payload, not a 500
            raise _undecodable(data, exc) from exc
        media = getattr(result, "media", result)
        frames = media[0] if isinstance(media, tuple) else media
        check_frames(frames, data)
        return result

    setattr(wrapper, _PATCHED_FLAG, True)
    return wrapper


def install() -> bool:
    """Patch vLLM's VideoMediaIO once per process; False if this vLLM has no such class."""
    found = first_attr(VIDEO_IO_MODULES, "VideoMediaIO")
    if found is not None and hasattr(found[1], "load_bytes"):
        name, cls = found
        if not getattr(cls.load_bytes, _PATCHED_FLAG, False):
            cls.load_bytes = guard_load_bytes(cls.load_bytes)
            logger.info("gemma4_batched_encoder: video payload validation installed (%s)", name)
        return True
    logger.warning("gemma4_batched_encoder: no VideoMediaIO found; video validation not installed")
    return False
