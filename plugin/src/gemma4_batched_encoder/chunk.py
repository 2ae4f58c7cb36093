"""One encoder pass over a shape-uniform batch: patch embedder, encoder, pooler.

These functions only use the tower's own submodules (``patch_embedder``, ``encoder``), so vLLM's
swapped-in linear layers and any quantisation keep working, and they issue no host sync:
the attention mask is built explicitly (transformers would probe ``mask.all()`` to decide whether
to skip it, which syncs) and lengths come from the caller.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.masking_utils import create_bidirectional_mask

from .pooling import pool_batched, pool_exact


def _finish(vt: nn.Module, pooled: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # As Gemma4VisionModel.forward: standardize in fp32, cast to the working dtype.
    if getattr(vt.config, "standardize", False):
        pooled = (pooled - vt.std_bias.float()) * vt.std_scale.float()
    return pooled.to(dtype)


def exact_chunk(
    vt: nn.Module, pixel_values: torch.Tensor, position_ids: torch.Tensor, has_padding: bool
) -> torch.Tensor:
    """[B, L, H] pooled soft tokens (padded bins included), bit-identical per item to the tower.

    ``has_padding`` must be the same for every item: the per-item reference attends without a mask
    when an item has no padding patches and with one otherwise.
    """
    cfg = vt.config
    k = cfg.pooling_kernel_size
    output_length = pixel_values.shape[1] // (k * k)
    padding = (position_ids == -1).all(dim=-1)
    embeds = vt.patch_embedder(pixel_values, position_ids, padding)
    mask = None
    if has_padding:
        # The mask transformers would build for a padded item, without its `.all()` probe.
        mask = create_bidirectional_mask(
            config=vt.encoder.config,
            inputs_embeds=embeds,
            attention_mask=~padding,
            allow_is_bidirectional_skip=False,
        )
    hidden = vt.encoder(
        inputs_embeds=embeds, attention_mask=mask, pixel_position_ids=position_ids
    ).last_hidden_state
    pooled = pool_exact(hidden, position_ids, padding, output_length, k, vt.pooler.root_hidden_size)
    return _finish(vt, pooled, embeds.dtype)


def fast_chunk(
    vt: nn.Module, pixel_values: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor:
    """[B, L', H] soft tokens from valid patches only (the caller slices off the padding suffix).

    No padding means no attention mask (flash SDPA can run) and fewer tokens; one batched pooler
    GEMM. Mathematically equal to the exact path; not bitwise.
    """
    k = vt.config.pooling_kernel_size
    output_length = pixel_values.shape[1] // (k * k)
    padding = torch.zeros(position_ids.shape[:2], dtype=torch.bool, device=position_ids.device)
    embeds = vt.patch_embedder(pixel_values, position_ids, padding)
    hidden = vt.encoder(
        inputs_embeds=embeds, attention_mask=None, pixel_position_ids=position_ids
    ).last_hidden_state
    pooled = pool_batched(hidden, position_ids, None, output_length, k, vt.pooler.root_hidden_size)
    return _finish(vt, pooled, embeds.dtype)
