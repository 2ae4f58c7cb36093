"""One encoder pass over a shape-uniform batch: patch embedder, encoder, pooler.

These functions only use the tower's own submodules (``patch_embedder``, ``encoder``), so vLLM's
swapped-in linear layers and any quantisation keep working, and they issue no host sync:
the attention mask is built explicitly (transformers would probe ``mask.all()`` to decide whether
to skip it, which syncs) and lengths come from the caller.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal

import torch
import transformers.masking_utils as masking_utils
from torch import nn
from transformers.masking_utils import create_bidirectional_mask

from .pooling import pool_exact, pool_fast

if TYPE_CHECKING:
    from .fast_layers import MergedLayers
    from .fused import FusedLayers

PoolerImpl = Literal["batched", "stock"]

# Older transformers lack this switch; their mask builder then probes `mask.all()` (a sync, and
# no CUDA-graph capture: the graph runner falls back to eager), with the same resulting mask.
_SKIP_KWARG = (
    "allow_is_bidirectional_skip" in inspect.signature(create_bidirectional_mask).parameters
)


def padded_attention_mask(vt: nn.Module, embeds: torch.Tensor, padding: torch.Tensor) -> object:
    kwargs = {"allow_is_bidirectional_skip": False} if _SKIP_KWARG else {}
    return create_bidirectional_mask(
        config=vt.encoder.config, inputs_embeds=embeds, attention_mask=~padding, **kwargs
    )


def _capturing() -> bool:
    """Whether a CUDA stream is capturing now (False where CUDA never started: no driver call)."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


@contextlib.contextmanager
def no_padding_means_no_mask() -> Iterator[None]:
    """While a CUDA stream captures, transformers' mask step treats "no padding mask" as eagerly.

    transformers 5.17 asks ``is_tracing(padding_mask)`` before it skips the mask, and counts stream
    capture as tracing, so inside a capture "no padding" becomes an all-true [B, 1, L, L] mask and
    SDPA records its masked kernel where the eager tower runs the unmasked one: the unfused
    encoder's graphs of unpadded batches were not bit-identical on the H200 (max abs diff 233,
    2026-12-01). 5.19 checks ``padding_mask is not None`` first; this answers ``None`` that way for
    the duration of the capture. A real padding mask, and compiling or JIT tracing, keep
    transformers' answer. Outside a capture nothing is patched."""
    original = getattr(masking_utils, "is_tracing", None)
    if original is None or not _capturing():
        yield
        return

    def is_tracing(tensor: object = None) -> bool:
        if tensor is None and not torch.compiler.is_compiling() and not torch.jit.is_tracing():
            return False
        return original(tensor)

    masking_utils.is_tracing = is_tracing
    try:
        yield
    finally:
        masking_utils.is_tracing = original


def _finish(vt: nn.Module, pooled: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # As Gemma4VisionModel.forward: standardize in fp32, cast to the working dtype.
    if getattr(vt.config, "standardize", False):
        pooled = (pooled - vt.std_bias.float()) * vt.std_scale.float()
    return pooled.to(dtype)


def _encode(
    vt: nn.Module,
    embeds: torch.Tensor,
    mask: object,
    position_ids: torch.Tensor,
    layers: FusedLayers | MergedLayers | None,
) -> torch.Tensor:
    """The encoder's last hidden state: through ``layers`` (compiled) or ``vt.encoder``."""
    if layers is not None:
        return layers.hidden(embeds, mask, position_ids)
    with no_padding_means_no_mask():
        return vt.encoder(
            inputs_embeds=embeds, attention_mask=mask, pixel_position_ids=position_ids
        ).last_hidden_state


def exact_chunk(
    vt: nn.Module,
    pixel_values: torch.Tensor,
    position_ids: torch.Tensor,
    has_padding: bool,
    pooler: PoolerImpl = "batched",
    layers: FusedLayers | MergedLayers | None = None,
) -> torch.Tensor:
    """[B, L, H] pooled soft tokens (padded bins included), bit-identical per item to the tower.

    ``has_padding`` must be the same for every item: the per-item reference attends without a mask
    when an item has no padding patches and with one otherwise. ``pooler='stock'`` calls the
    tower's own pooler per item (used when ``pool_exact`` does not reproduce this transformers).
    ``layers``: run the encoder layers fused (``fused.FusedLayers``) instead of ``vt.encoder``.
    """
    cfg = vt.config
    k = cfg.pooling_kernel_size
    output_length = pixel_values.shape[1] // (k * k)
    padding = (position_ids == -1).all(dim=-1)
    embeds = vt.patch_embedder(pixel_values, position_ids, padding)
    # The mask transformers builds for a padded item (without its `.all()` probe); none otherwise.
    mask = padded_attention_mask(vt, embeds, padding) if has_padding else None
    hidden = _encode(vt, embeds, mask, position_ids, layers)
    if pooler == "stock":
        rows = [
            vt.pooler(
                hidden_states=hidden[i : i + 1],
                pixel_position_ids=position_ids[i : i + 1],
                padding_positions=padding[i : i + 1],
                output_length=output_length,
            )[0].float()
            for i in range(hidden.shape[0])
        ]
        pooled = torch.cat(rows, dim=0)
    else:
        pooled = pool_exact(
            hidden, position_ids, padding, output_length, k, vt.pooler.root_hidden_size
        )
    return _finish(vt, pooled, embeds.dtype)


def fast_chunk(
    vt: nn.Module,
    pixel_values: torch.Tensor,
    position_ids: torch.Tensor,
    layers: FusedLayers | MergedLayers | None = None,
) -> torch.Tensor:
    """[B, L', H] soft tokens from valid patches only (the caller slices off the padding suffix).

    No padding means no attention mask (flash SDPA can run) and fewer tokens; one batched pooler
    GEMM in the hidden dtype (``pool_fast``). Mathematically equal to the exact path; not bitwise.
    ``layers``: the encoder layers compiled (``FusedLayers(vt, exact=False)``) instead of
    ``vt.encoder``; merged layers also embed the patches (``MergedLayers.embed``).
    """
    k = vt.config.pooling_kernel_size
    output_length = pixel_values.shape[1] // (k * k)
    embed = getattr(layers, "embed", None)  # MergedLayers' (no runtime import: a cycle)
    embeds = embed(pixel_values, position_ids) if embed is not None else None
    if embeds is None:
        padding = torch.zeros(position_ids.shape[:2], dtype=torch.bool, device=position_ids.device)
        embeds = vt.patch_embedder(pixel_values, position_ids, padding)
    hidden = _encode(vt, embeds, None, position_ids, layers)
    pooled = pool_fast(hidden, position_ids, output_length, k, vt.pooler.root_hidden_size)
    return _finish(vt, pooled, embeds.dtype)
