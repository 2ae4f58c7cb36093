"""The video branch's per-video processor call, answered by the image processor alone (issue 8).

vLLM's Gemma 4 video branch (0.20 through 0.33) calls the whole `Gemma4Processor` once per video
with a dummy prompt `"\\t<|image|>" * frames` and keeps only `pixel_values` and
`image_position_ids`: expanding that prompt, tokenising it and checking its tokens is thrown-away
work, ~4-5 ms a video on one core here (bench/MEDIA.md). With the fast path on, a call of exactly
that shape whose images are the branch's array frames (`frames.ArrayFrame`, which only that
branch makes) goes straight to the image processor, with the kwargs the processor merges for its
own image call (`ProcessorMixin._merge_kwargs`).

Self-check: the first such call for each processor class and kwargs runs both and keeps the short
path only if `pixel_values` and `image_position_ids` are `torch.equal` (same dtype) to the full
call's; otherwise that combination stays on the full call, with one warning.

Patch ledger: transformers `Gemma4Processor.__call__` (inherited from `ProcessorMixin` in 5.19).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from .frames import ArrayFrame

logger = logging.getLogger("vllm.gemma4_batched_encoder.media")

_PATCHED = "_gemma4_frame_call"
KEPT = ("pixel_values", "image_position_ids")  # what vLLM's video branch reads from the call

_INPUTS = ("images", "text", "videos", "audio")
# (processor class, kwargs) -> short path equals the full call. Written once per key; a race
# only runs one self-check twice.
_verdicts: dict[str, bool] = {}


def _options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's processor options: everything but its inputs."""
    return {k: v for k, v in kwargs.items() if k not in _INPUTS}


def is_frame_call(processor: Any, args: tuple, kwargs: dict[str, Any]) -> bool:
    """vLLM's per-video call: keywords only, array frames, and the dummy prompt for them."""
    if args or kwargs.get("videos") is not None or kwargs.get("audio") is not None:
        return False
    images, text = kwargs.get("images"), kwargs.get("text")
    if not isinstance(images, list) or not images or not isinstance(text, str):
        return False
    if not all(type(image) is ArrayFrame and image._pil_size for image in images):
        return False
    token = getattr(processor, "image_token", None)
    return bool(token) and text == ("\t" + token) * len(images)


def image_only(processor: Any, kwargs: dict[str, Any]) -> Any:
    """The image processor's outputs that the video branch reads, as the full call returns them."""
    from transformers.feature_extraction_utils import BatchFeature

    tokenizer = getattr(processor, "tokenizer", None)
    merged = processor._merge_kwargs(
        processor.valid_processor_kwargs,
        tokenizer_init_kwargs=tokenizer.init_kwargs if tokenizer is not None else {},
        **_options(kwargs),
    )
    images = processor.image_processor.fetch_images(kwargs["images"])
    out = processor.image_processor(images, **merged["images_kwargs"])
    data = {key: out[key] for key in KEPT}
    return BatchFeature(data, tensor_type=merged["text_kwargs"].get("return_tensors"))


def same_outputs(full: Any, short: Any) -> bool:
    import torch

    for key in KEPT:
        a, b = full.get(key), short.get(key)
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or not torch.equal(a, b):
            return False
    return True


def _verdict_key(processor: Any, kwargs: dict[str, Any]) -> str:
    options = sorted(_options(kwargs).items(), key=lambda kv: kv[0])
    return f"{type(processor).__qualname__}:{options!r}"


def make_call(original: Callable[..., Any], enabled: Callable[[], bool]) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not enabled() or not is_frame_call(self, args, kwargs):
            return original(self, *args, **kwargs)
        key = _verdict_key(self, kwargs)
        verdict = _verdicts.get(key)
        if verdict is None:
            full = original(self, *args, **kwargs)
            try:
                ok = same_outputs(full, image_only(self, kwargs))
            except Exception:
                logger.warning("gemma4 media: image-only frame call failed", exc_info=True)
                ok = False
            _verdicts[key] = ok
            if not ok:
                logger.warning(
                    "gemma4 media: image-only frame call differs from the full processor call "
                    "here; full call kept"
                )
            return full
        return image_only(self, kwargs) if verdict else original(self, *args, **kwargs)

    return call


def install(enabled: Callable[[], bool]) -> bool:
    """Wrap `Gemma4Processor.__call__`; False where transformers lacks what the short path uses."""
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor

    current = Gemma4Processor.__call__
    if getattr(current, _PATCHED, False):
        return True
    if not hasattr(Gemma4Processor, "_merge_kwargs") or not hasattr(
        Gemma4Processor, "valid_processor_kwargs"
    ):
        return False
    wrapper = functools.wraps(current)(make_call(current, enabled))
    setattr(wrapper, _PATCHED, True)
    Gemma4Processor.__call__ = wrapper
    return True
