"""engine_mm_ranges: Gemma 4's per-step image ranges without a host sync, same values.

vLLM 0.20's blocking function is reproduced verbatim in vllm020.py (this machine runs vLLM
0.32, which already copies asynchronously and is left alone); the wrapper must give exactly its
tensors."""

from __future__ import annotations

import random

import pytest
import torch
from vllm.multimodal.inputs import PlaceholderRange
from vllm020 import Metadata020

import gemma4_batched_encoder.engine_mm_ranges as R


def _random_ranges(rng: random.Random) -> tuple[dict[int, list[tuple[int, int]]], int]:
    num_seqs = rng.randint(1, 12)
    ranges: dict[int, list[tuple[int, int]]] = {}
    for i in range(num_seqs):
        if rng.random() < 0.3:
            continue  # a text request: absent
        start, spans = rng.randint(0, 50), []
        for _ in range(rng.randint(0, 7)):  # 0: present but empty
            end = start + rng.randint(0, 300)
            spans.append((start, end))
            start = end + rng.randint(1, 40)
        ranges[i] = spans
    return ranges, num_seqs


def test_the_async_copy_gives_the_stock_tensors():
    stock = Metadata020.compute_mm_prefix_range_tensor
    fast = R.async_ranges(stock)
    cpu = torch.device("cpu")
    rng = random.Random(0)
    cases = [(None, 3), ({}, 2), ({0: [], 1: [(0, 0)]}, 2), ({1: [(5, 9)]}, 3)]
    cases += [_random_ranges(rng) for _ in range(200)]
    non_trivial = 0
    for ranges, num_seqs in cases:
        want, got = stock(ranges, num_seqs, cpu), fast(ranges, num_seqs, cpu)
        if want is None:
            assert got is None
            continue
        non_trivial += 1
        assert got.dtype == want.dtype == torch.int32
        assert got.shape == want.shape and torch.equal(got, want)
    assert non_trivial > 150


def test_only_the_blocking_form_is_recognised():
    from vllm.v1.attention.backends.utils import compute_mm_prefix_range_tensor as v032

    assert R.blocks_on_copy(Metadata020.compute_mm_prefix_range_tensor)
    assert not R.blocks_on_copy(v032)  # 0.32: async_tensor_h2d already
    assert not R.blocks_on_copy(R.async_ranges(Metadata020.compute_mm_prefix_range_tensor))
    assert not R.blocks_on_copy(len)  # no Python source


def test_install_patches_the_blocking_form_once_and_can_be_switched_off(monkeypatch):
    import vllm.v1.attention.backends.triton_attn as triton_attn

    class Metadata(Metadata020):
        pass

    monkeypatch.setattr(triton_attn, "TritonAttentionMetadata", Metadata, raising=False)
    monkeypatch.setattr(
        PlaceholderRange, "extract_embeds_range", PlaceholderRange.extract_embeds_range
    )
    assert R.install(False) == []
    assert not getattr(Metadata.compute_mm_prefix_range_tensor, R._PATCHED, False)
    assert R.install(True) == [
        "TritonAttentionMetadata.compute_mm_prefix_range_tensor",
        "PlaceholderRange.extract_embeds_range",
    ]
    assert getattr(Metadata.compute_mm_prefix_range_tensor, R._PATCHED)
    assert R.install(True) == []  # once
    got = Metadata.compute_mm_prefix_range_tensor({0: [(1, 4)]}, 2, torch.device("cpu"))
    assert torch.equal(got, torch.tensor([[[1, 4]], [[0, 0]]], dtype=torch.int32))


def test_vllm_0_32_keeps_its_own_function(monkeypatch):
    import vllm.v1.attention.backends.triton_attn as triton_attn

    monkeypatch.setattr(
        PlaceholderRange, "extract_embeds_range", PlaceholderRange.extract_embeds_range
    )
    before = vars(triton_attn.TritonAttentionMetadata).copy()
    assert R.install(True) == ["PlaceholderRange.extract_embeds_range"]
    assert vars(triton_attn.TritonAttentionMetadata) == before


def test_placeholder_ranges_are_computed_once_with_the_stock_values(monkeypatch):
    stock = PlaceholderRange.extract_embeds_range
    monkeypatch.setattr(PlaceholderRange, "extract_embeds_range", R.remembered_ranges(stock))
    rng = random.Random(1)
    placeholders = [PlaceholderRange(offset=7, length=4)]  # no is_embed: the whole range
    for _ in range(50):
        n = rng.randint(1, 80)
        mask = torch.tensor([rng.random() < 0.7 for _ in range(n)])
        placeholders.append(PlaceholderRange(offset=rng.randint(0, 500), length=n, is_embed=mask))
    want = [stock(p) for p in placeholders]
    assert [p.extract_embeds_range() for p in placeholders] == want
    with monkeypatch.context() as m:  # the second time, no torch op runs
        m.setattr(torch, "nonzero", lambda *a, **k: pytest.fail("recomputed"))
        again = [p.extract_embeds_range() for p in placeholders]
    assert again == want
    again[1].append((0, 0))  # a caller's list is its own
    assert placeholders[1].extract_embeds_range() == want[1]
    twin = PlaceholderRange(offset=7, length=4)
    assert twin == placeholders[0] and repr(twin) == repr(placeholders[0])  # fields untouched
