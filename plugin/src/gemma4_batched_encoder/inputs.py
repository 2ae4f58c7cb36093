"""Normalising padded image/frame inputs and grouping them into shape-uniform batches.

Items are grouped by (padded patch count, has padding): the per-item reference runs attention
without a mask when an item has no padding (transformers skips an all-true mask) and with one
otherwise, and a different padded length changes kernel shapes. Keeping both properties equal
inside a batch is what keeps the batched encoder bit-identical to the per-item one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

PixelInput = torch.Tensor | Sequence[torch.Tensor]


class Item(NamedTuple):
    # A tuple, not a dataclass: built once per frame on every call (96 for 16 videos), where a
    # frozen dataclass costs twice the construction time.
    pixel_values: torch.Tensor  # [P, D]
    position_ids: torch.Tensor  # [P, 2]
    valid_patches: int
    pooling_k2: int

    @property
    def num_patches(self) -> int:
        return int(self.pixel_values.shape[0])

    @property
    def has_padding(self) -> bool:
        return self.valid_patches < self.num_patches

    @property
    def output_length(self) -> int:
        return self.num_patches // self.pooling_k2

    @property
    def valid_tokens(self) -> int:
        return self.valid_patches // self.pooling_k2


@dataclass
class Group:
    num_patches: int
    has_padding: bool
    indices: list[int]


def _as_2d(t: torch.Tensor, name: str, last: int | None = None) -> torch.Tensor:
    if t.dim() == 3 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 2 or (last is not None and t.shape[-1] != last):
        raise ValueError(f"{name}: expected [P, D] or [1, P, D] per item, got {tuple(t.shape)}")
    return t


def split_items(
    pixel_values: PixelInput, position_ids: PixelInput
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Return per-item ([P, D], [P, 2]) views of a stacked tensor or a list of tensors."""
    if isinstance(pixel_values, torch.Tensor):
        if pixel_values.dim() != 3:
            raise ValueError(f"pixel_values: expected [B, P, D], got {tuple(pixel_values.shape)}")
        pvs = list(pixel_values.unbind(0))
    else:
        pvs = [_as_2d(t, "pixel_values") for t in pixel_values]
    if isinstance(position_ids, torch.Tensor) and position_ids.dim() == 3:
        pps = list(position_ids.unbind(0))
    else:
        pps = [_as_2d(t, "pixel_position_ids", last=2) for t in position_ids]
    if len(pvs) != len(pps):
        raise ValueError(f"{len(pvs)} pixel_values items but {len(pps)} position id items")
    for i, (pv, pp) in enumerate(zip(pvs, pps, strict=True)):
        if pv.shape[0] != pp.shape[0]:
            raise ValueError(f"item {i}: {pv.shape[0]} patches but {pp.shape[0]} position ids")
    return list(zip(pvs, pps, strict=True))


def count_valid_patches(position_ids: list[torch.Tensor]) -> list[int]:
    """Valid (non-padding) patches per item: one host transfer for the whole call.

    Only used when the caller has no host-side token counts (vLLM passes them for video frames).
    """
    if not position_ids:
        return []
    counts = torch.stack([(pp != -1).any(dim=-1).sum() for pp in position_ids])
    return [int(c) for c in counts.tolist()]


def build_items(
    pixel_values: PixelInput,
    position_ids: PixelInput,
    pooling_kernel_size: int,
    valid_tokens: Sequence[int] | None = None,
) -> list[Item]:
    pairs = split_items(pixel_values, position_ids)
    k2 = pooling_kernel_size**2
    if valid_tokens is not None:
        if len(valid_tokens) != len(pairs):
            raise ValueError(f"{len(valid_tokens)} token counts for {len(pairs)} items")
        valid = [int(n) * k2 for n in valid_tokens]
    else:
        valid = count_valid_patches([pp for _, pp in pairs])
    # Every patch count checked as plain ints (a stacked tensor has one); no per-item tensor calls.
    if isinstance(pixel_values, torch.Tensor):
        patches = [int(pixel_values.shape[1])] * len(pairs)
    else:
        patches = [int(pv.shape[0]) for pv, _ in pairs]
    for i, (p, n) in enumerate(zip(patches, valid, strict=True)):
        if p % k2:
            raise ValueError(f"item {i}: {p} patches is not a multiple of {k2}")
        if n % k2 or n > p or n <= 0:
            raise ValueError(f"item {i}: {n} valid patches cannot pool to whole {k2}-patch bins")
    return [Item(pv, pp, n, k2) for (pv, pp), n in zip(pairs, valid, strict=True)]


def group_items(items: list[Item]) -> list[Group]:
    groups: dict[tuple[int, bool], Group] = {}
    for i, item in enumerate(items):
        key = (item.num_patches, item.has_padding)
        groups.setdefault(key, Group(item.num_patches, item.has_padding, [])).indices.append(i)
    return list(groups.values())


def bytes_per_item(num_patches: int, hidden: int, intermediate: int, heads: int, elem: int) -> int:
    """Rough peak activation bytes of one item in one encoder pass.

    Residual stream and q/k/v/o (~8 x hidden), the MLP (3 x intermediate), the fp32 rotary tables,
    the boolean attention mask and, when SDPA falls back to the math kernel, fp32 scores.
    """
    p = num_patches
    return p * (8 * hidden + 3 * intermediate) * elem + p * hidden * 16 + p * p * (1 + 4 * heads)


def chunks(indices: list[int], per_item: int, budget: int) -> list[list[int]]:
    size = max(1, budget // max(1, per_item))
    return [indices[i : i + size] for i in range(0, len(indices), size)]
