"""Gemma 4's per-step image ranges without a host sync (``GEMMA4_ENGINE_ASYNC_RANGES``).

Gemma 4 attends bidirectionally within each image or video frame, so in every engine step whose
batch holds a multimodal request vLLM's model runner gathers each request's image-token ranges
and, for Triton attention, turns them into a device tensor. vLLM 0.20 does that with
``torch.tensor(ranges, device=cuda)``: a copy from pageable memory, which waits for the GPU's
stream, i.e. for the previous step's forward, and so undoes async scheduling's overlap of the next
step's CPU work with the GPU (H200, vLLM 0.20.0, 40 video req/s: 13% of the engine core's main
thread in ``compute_mm_prefix_range_tensor``, ninth sitting). vLLM 0.32 copies them with
``async_tensor_h2d`` (pinned, non-blocking) instead. Where the stock function is the blocking one,
this runs the stock function itself on the CPU and copies its tensor that way: the same values,
built by the same code, without the sync.

It also remembers each placeholder's ranges: ``PlaceholderRange.extract_embeds_range`` recomputes
them with small torch ops (diff, nonzero, tolist) for every request in every step (4% of that
main thread), although a placeholder never changes (a frozen dataclass).

Installed where the model is built (the engine core with one GPU, the workers otherwise).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from .log import logger

ENV = "GEMMA4_ENGINE_ASYNC_RANGES"
_PATCHED = "_gemma4_async_ranges"


def async_ranges(stock: Callable[..., torch.Tensor | None]) -> Callable[..., torch.Tensor | None]:
    """``stock(mm_prefix_range, num_seqs, device)``, built on the CPU by ``stock`` and copied to
    ``device`` from pinned memory without waiting (the caching host allocator keeps the pinned
    block until the copy is done)."""

    @functools.wraps(stock)
    def compute(mm_prefix_range: Any, num_seqs: int, device: torch.device) -> torch.Tensor | None:
        cpu = stock(mm_prefix_range, num_seqs, torch.device("cpu"))
        if cpu is None or torch.device(device).type != "cuda":
            return cpu if cpu is None else cpu.to(device)
        return cpu.pin_memory().to(device, non_blocking=True)

    setattr(compute, _PATCHED, True)
    return compute


def blocks_on_copy(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is vLLM 0.20's form: the tensor made on the device straight from a list."""
    if getattr(fn, _PATCHED, False):
        return False  # ours (its source would be the stock one it wraps)
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return False
    return "torch.tensor(" in source and "device=device" in source and "non_blocking" not in source


def remembered_ranges(stock: Callable[[Any], list]) -> Callable[[Any], list]:
    """``PlaceholderRange.extract_embeds_range``, computed once per placeholder (a fresh list
    each call, so a caller that changes it changes nothing here)."""

    @functools.wraps(stock)
    def extract_embeds_range(self: Any) -> list:
        cached = self.__dict__.get(_PATCHED)
        if cached is None:
            cached = tuple(stock(self))
            object.__setattr__(self, _PATCHED, cached)  # frozen dataclass: no normal setattr
        return list(cached)

    setattr(extract_embeds_range, _PATCHED, True)
    return extract_embeds_range


def install(enabled: bool) -> list[str]:
    """Patch what this vLLM has and needs; returns what was patched (logged once)."""
    if not enabled:
        return []
    done = []
    metadata = _attr("vllm.v1.attention.backends.triton_attn", "TritonAttentionMetadata")
    stock = getattr(metadata, "compute_mm_prefix_range_tensor", None)
    if stock is not None and blocks_on_copy(stock):
        metadata.compute_mm_prefix_range_tensor = staticmethod(async_ranges(stock))
        done.append("TritonAttentionMetadata.compute_mm_prefix_range_tensor")
    placeholder = _attr("vllm.multimodal.inputs", "PlaceholderRange")
    extract = getattr(placeholder, "extract_embeds_range", None)
    if extract is not None and not getattr(extract, _PATCHED, False) and _has_dict(placeholder):
        placeholder.extract_embeds_range = remembered_ranges(extract)
        done.append("PlaceholderRange.extract_embeds_range")
    if done:
        logger.info(
            "gemma4_batched_encoder: bidirectional image ranges without a host sync (%s=0 keeps "
            "vLLM's): %s",
            ENV,
            ", ".join(done),
        )
    return done


def _attr(module: str, name: str) -> Any:
    """``module.name``, or None where this vLLM (or platform: no Triton on CPU builds) lacks it."""
    try:
        return getattr(__import__(module, fromlist=[name]), name, None)
    except Exception:
        return None


def _has_dict(cls: type) -> bool:
    return "__slots__" not in cls.__dict__
