"""``encode_frames``: the vLLM-independent core of the plugin."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import nn

from .chunk import exact_chunk, fast_chunk
from .cuda_graphs import CudaGraphRunner
from .inputs import Item, PixelInput, build_items, bytes_per_item, chunks, group_items
from .settings import Mode, Settings


def _stack(
    items: list[Item], idx: list[int], attr: str, patches: int | None = None
) -> torch.Tensor:
    rows = [getattr(items[i], attr)[:patches] for i in idx]
    return rows[0].unsqueeze(0) if len(rows) == 1 else torch.stack(rows)


class BatchedVisionEncoder:
    """Batches all images/frames of a call through one Gemma 4 vision tower.

    ``mode='exact'``: per item bit-identical to ``vision_tower(pv[i:i+1], pp[i:i+1])``; on CUDA the
    encoder+pooler pass is replayed from CUDA graphs for bucketed batch sizes when enabled.
    ``mode='fast'``: encodes only valid patches (no attention mask) and pools with one GEMM.
    """

    def __init__(self, vision_tower: nn.Module, settings: Settings | None = None) -> None:
        self.vt = vision_tower
        self.settings = settings or Settings.from_env()
        self.graphs = CudaGraphRunner(self.settings.cuda_graph_max_items)
        self._fast_fn = partial(fast_chunk, self.vt)
        if self.settings.compile_fast:
            self._fast_fn = torch.compile(self._fast_fn, dynamic=False)

    def _item_bytes(self, num_patches: int, dtype: torch.dtype) -> int:
        cfg = self.vt.config
        elem = torch.empty((), dtype=dtype).element_size()
        return bytes_per_item(
            num_patches, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, elem
        )

    def graphs_active(self, device: torch.device) -> bool:
        return self.settings.cuda_graphs and device.type == "cuda"

    @torch.inference_mode()
    def encode(
        self,
        pixel_values: PixelInput,
        pixel_position_ids: PixelInput,
        valid_tokens: Sequence[int] | None = None,
        mode: Mode | None = None,
    ) -> list[torch.Tensor]:
        mode = mode or self.settings.mode
        k = self.vt.config.pooling_kernel_size
        items = build_items(pixel_values, pixel_position_ids, k, valid_tokens)
        if not items:
            return []
        out: list[torch.Tensor | None] = [None] * len(items)
        budget = self.settings.max_batch_bytes
        if mode == "exact":
            for group in group_items(items):
                per_item = self._item_bytes(
                    group.num_patches, items[group.indices[0]].pixel_values.dtype
                )
                for idx in chunks(group.indices, per_item, budget):
                    pv = _stack(items, idx, "pixel_values")
                    pp = _stack(items, idx, "position_ids")
                    fn = partial(exact_chunk, self.vt, has_padding=group.has_padding)
                    pooled = None
                    if self.graphs_active(pv.device):
                        pooled = self.graphs.run(("exact", group.has_padding), fn, pv, pp)
                    if pooled is None:
                        pooled = fn(pv, pp)
                    for j, i in enumerate(idx):
                        out[i] = pooled[j, : items[i].valid_tokens]
        elif mode == "fast":
            by_valid: dict[int, list[int]] = {}
            for i, item in enumerate(items):
                by_valid.setdefault(item.valid_patches, []).append(i)
            for valid, indices in by_valid.items():
                per_item = self._item_bytes(valid, items[indices[0]].pixel_values.dtype)
                for idx in chunks(indices, per_item, budget):
                    # Valid patches are a prefix of each item (the HF processor pads at the end).
                    pv = _stack(items, idx, "pixel_values", valid)
                    pp = _stack(items, idx, "position_ids", valid)
                    pooled = None
                    if self.graphs_active(pv.device):
                        pooled = self.graphs.run(("fast",), self._fast_fn, pv, pp)
                    if pooled is None:
                        pooled = self._fast_fn(pv, pp)
                    for j, i in enumerate(idx):
                        out[i] = pooled[j]
        else:
            raise ValueError(f"unknown mode {mode!r}")
        return out  # type: ignore[return-value]


_ENCODERS: dict[int, BatchedVisionEncoder] = {}


def encode_frames(
    vision_tower: nn.Module,
    pixel_values: PixelInput,
    pixel_position_ids: PixelInput,
    *,
    valid_tokens: Sequence[int] | None = None,
    mode: Mode | None = None,
    settings: Settings | None = None,
) -> list[torch.Tensor]:
    """Soft tokens per image/frame, as ``vision_tower(pv[i:i+1], pp[i:i+1]).last_hidden_state``.

    ``pixel_values``: [B, P, 3*patch^2] or a list of [P_i, ...] / [1, P_i, ...] tensors;
    ``pixel_position_ids`` likewise with (x, y) per patch and (-1, -1) for padding.
    ``valid_tokens`` (soft tokens per item, host ints) avoids the one host transfer needed
    otherwise to count valid patches. The encoder object (and its CUDA graphs) is cached per tower.
    """
    if settings is not None:
        encoder = BatchedVisionEncoder(vision_tower, settings)
    else:
        encoder = _ENCODERS.get(id(vision_tower))
        if encoder is None or encoder.vt is not vision_tower:
            encoder = _ENCODERS[id(vision_tower)] = BatchedVisionEncoder(vision_tower)
    return encoder.encode(pixel_values, pixel_position_ids, valid_tokens, mode)
