"""The paths the plugin is compared with: per-item stock tower (vLLM 0.20-0.22) and upstream
batched encoder + per-item pooler with boolean-mask indexing (vLLM 0.23+)."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn


@torch.inference_mode()
def serial_per_item(
    vt: nn.Module, pvs: list[torch.Tensor], pps: list[torch.Tensor]
) -> list[torch.Tensor]:
    """``vt(pv[i:i+1], pp[i:i+1]).last_hidden_state`` per item: the definition of correct."""
    return [
        vt(pv.unsqueeze(0), pp.unsqueeze(0)).last_hidden_state
        for pv, pp in zip(pvs, pps, strict=True)
    ]


def encoded_buckets(
    vt: nn.Module, pvs: list[torch.Tensor], pps: list[torch.Tensor]
) -> Iterator[tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]]:
    """vLLM >= 0.23's encoder pass: items grouped by patch count, one encoder call a group.
    Yields (item indices, position ids, padding mask, encoder output) per group."""
    buckets: dict[int, list[int]] = {}
    for i, pv in enumerate(pvs):
        buckets.setdefault(pv.shape[0], []).append(i)
    for idx in buckets.values():
        pv = torch.stack([pvs[i] for i in idx])
        pp = torch.stack([pps[i] for i in idx])
        pad = (pp == -1).all(dim=-1)
        embeds = vt.patch_embedder(pv, pp, pad)
        hidden = vt.encoder(
            inputs_embeds=embeds, attention_mask=~pad, pixel_position_ids=pp
        ).last_hidden_state
        yield idx, pp, pad, hidden


@torch.inference_mode()
def upstream_batched(
    vt: nn.Module, pvs: list[torch.Tensor], pps: list[torch.Tensor]
) -> list[torch.Tensor]:
    """vLLM >= 0.23 style: encoder batched per patch-count bucket, pooler + mask index per item."""
    k2 = vt.config.pooling_kernel_size**2
    out: list[torch.Tensor | None] = [None] * len(pvs)
    for idx, pp, pad, hidden in encoded_buckets(vt, pvs, pps):
        for j, i in enumerate(idx):
            pooled, mask = vt.pooler(
                hidden_states=hidden[j : j + 1],
                pixel_position_ids=pp[j : j + 1],
                padding_positions=pad[j : j + 1],
                output_length=pp.shape[1] // k2,
            )
            valid = pooled[mask]
            if getattr(vt.config, "standardize", False):
                valid = (valid - vt.std_bias.float()) * vt.std_scale.float()
            out[i] = valid.to(hidden.dtype)
    return out  # type: ignore[return-value]
