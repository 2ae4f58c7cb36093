"""``encode_frames``: the vLLM-independent core of the plugin."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import torch
from torch import nn

from .chunk import PoolerImpl, exact_chunk, fast_chunk
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
        self._poolers: dict[tuple[torch.device, torch.dtype], PoolerImpl] = {}
        self._fast_fn = partial(fast_chunk, self.vt)
        if self.settings.compile_fast:
            self._fast_fn = torch.compile(self._fast_fn, dynamic=False)

    def _item_bytes(self, num_patches: int, dtype: torch.dtype) -> int:
        cfg = self.vt.config
        elem = torch.empty((), dtype=dtype).element_size()
        return bytes_per_item(
            num_patches, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, elem
        )

    def pooler_impl(self, device: torch.device, dtype: torch.dtype) -> PoolerImpl:
        """Self-check, once per device and dtype, that the batched pooler reproduces this
        transformers version's tower on a tiny batch; else use the tower's pooler per item."""
        key = (device, dtype)
        impl = self._poolers.get(key)
        if impl is None:
            impl = self._poolers[key] = _calibrate(self.vt, device, dtype)
        return impl

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
                    impl = self.pooler_impl(pv.device, pv.dtype)
                    fn = partial(exact_chunk, self.vt, has_padding=group.has_padding, pooler=impl)
                    pooled = None
                    if self.graphs_active(pv.device):
                        pooled = self.graphs.run(("exact", group.has_padding, impl), fn, pv, pp)
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


def _calibrate(vt: nn.Module, device: torch.device, dtype: torch.dtype) -> PoolerImpl:
    from .reference import serial_per_item

    k = vt.config.pooling_kernel_size
    patch_dim = 3 * vt.config.patch_size**2
    gen = torch.Generator().manual_seed(0)
    length = 4  # soft tokens per item: a padded 1x2-bin item and a full 2x2-bin one
    pvs, pps = [], []
    for h, w in ((k, 2 * k), (2 * k, 2 * k)):
        pv = torch.zeros(length * k * k, patch_dim)
        pv[: h * w] = torch.rand(h * w, patch_dim, generator=gen)
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        pp = torch.full((length * k * k, 2), -1, dtype=torch.long)
        pp[: h * w] = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)
        pvs.append(pv.to(device, dtype))
        pps.append(pp.to(device))
    ref = serial_per_item(vt, pvs, pps)
    for impl in ("batched", "stock"):
        for i, has_padding in ((0, True), (1, False)):
            got = exact_chunk(vt, pvs[i][None], pps[i][None], has_padding, impl)
            if not torch.equal(got[0, : ref[i].shape[0]], ref[i]):
                break
        else:
            return impl  # type: ignore[return-value]
    raise RuntimeError(
        "gemma4_batched_encoder: exact mode cannot reproduce this transformers version's "
        "Gemma4VisionModel (self-check failed); use the stock path"
    )


# Cached on the tower (a cycle gc frees): a WeakKeyDictionary value holding .vt pins its key.
_ENCODER_ATTR = "_gemma4_batched_encoder"


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
        encoder = getattr(vision_tower, _ENCODER_ATTR, None)
        if encoder is None:
            encoder = BatchedVisionEncoder(vision_tower)
            setattr(vision_tower, _ENCODER_ATTR, encoder)
    return encoder.encode(pixel_values, pixel_position_ids, valid_tokens, mode)
