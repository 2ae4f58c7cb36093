"""encode_frames is bit-identical (torch.equal) to the per-item stock tower on CPU."""

from __future__ import annotations

from dataclasses import replace

import g4helpers as H
import pytest
import torch

from gemma4_batched_encoder import Settings, encode_frames
from gemma4_batched_encoder import synthetic as S
from gemma4_batched_encoder.pooling import pool_exact, pool_fast
from gemma4_batched_encoder.reference import serial_per_item, upstream_batched

DTYPES = [torch.float32, torch.bfloat16]

COMPOSITIONS = {
    "one_video": [H.FRAME_480P] * 6,
    "several_videos": [H.FRAME_480P] * 12,
    "480p_720p_mixed": [H.FRAME_480P] * 3 + [H.FRAME_720P] * 3 + [H.FRAME_480P] * 2,
    "frames_without_padding": [H.FRAME_FULL] * 2 + [H.FRAME_480P] * 2,
    "images_mixed_budgets": [H.image(70), H.image(140), H.image(280), H.image(140, 0.5)],
    "images_and_videos": [H.FRAME_480P] * 4 + [H.image(280), H.image(70, 2.0)] + [H.FRAME_720P],
}


@pytest.fixture(scope="module", params=DTYPES, ids=["fp32", "bf16"])
def tower(request):
    return H.tower(request.param)


def assert_identical(out, ref):
    assert len(out) == len(ref)
    for i, (a, b) in enumerate(zip(out, ref, strict=True)):
        assert a.shape == b.shape and a.dtype == b.dtype, (i, a.shape, b.shape)
        assert torch.equal(a, b), (i, (a.float() - b.float()).abs().max().item())


@pytest.mark.parametrize("name", sorted(COMPOSITIONS))
def test_list_input_identical(tower, name):
    dtype = next(tower.parameters()).dtype
    pvs, pps = H.batch(COMPOSITIONS[name], dtype, seed=len(name))
    assert_identical(encode_frames(tower, pvs, pps), serial_per_item(tower, pvs, pps))


def test_stacked_tensor_and_host_token_counts(tower):
    dtype = next(tower.parameters()).dtype
    media = [H.FRAME_480P] * 3 + [H.FRAME_720P] * 3
    pvs, pps = H.batch(media, dtype, seed=7)
    ref = serial_per_item(tower, pvs, pps)
    pv, pp = torch.stack(pvs), torch.stack(pps)
    assert_identical(encode_frames(tower, pv, pp), ref)
    tokens = [m.grid[0] * m.grid[1] // H.K**2 for m in media]
    assert_identical(encode_frames(tower, pv, pp, valid_tokens=tokens), ref)


def test_batched_1xPxD_list_items(tower):
    dtype = next(tower.parameters()).dtype
    pvs, pps = H.batch([H.image(70), H.image(140)], dtype, seed=3)
    out = encode_frames(tower, [p.unsqueeze(0) for p in pvs], [p.unsqueeze(0) for p in pps])
    assert_identical(out, serial_per_item(tower, pvs, pps))


def test_memory_budget_forces_several_passes(tower):
    dtype = next(tower.parameters()).dtype
    pvs, pps = H.batch([H.FRAME_480P] * 5 + [H.image(140)] * 2, dtype, seed=5)
    tight = replace(Settings(), max_batch_bytes=1)  # one item per pass
    out = encode_frames(tower, pvs, pps, settings=tight)
    assert_identical(out, serial_per_item(tower, pvs, pps))


def test_standardize_tower():
    vt = H.tower(torch.bfloat16, seed=4, standardize=True)
    pvs, pps = H.batch([H.FRAME_480P] * 3 + [H.image(140)], torch.bfloat16, seed=9)
    assert_identical(encode_frames(vt, pvs, pps), serial_per_item(vt, pvs, pps))


def test_upstream_style_reference_agrees_on_cpu(tower):
    """The bench's upstream-style path is itself a faithful stock reproduction."""
    dtype = next(tower.parameters()).dtype
    pvs, pps = H.batch(COMPOSITIONS["images_and_videos"], dtype, seed=11)
    assert_identical(upstream_batched(tower, pvs, pps), serial_per_item(tower, pvs, pps))


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_pooler_matches_stock_pooler_per_row(tower, batch_size):
    """pool_exact over a batch == the transformers pooler called on each row alone."""
    dtype = next(tower.parameters()).dtype
    media = ([H.FRAME_480P, H.FRAME_720P, H.FRAME_FULL] * 3)[:batch_size]
    _, pps = H.batch(media, dtype, seed=batch_size)
    pp = torch.stack(pps)
    pad = (pp == -1).all(-1)
    gen = torch.Generator().manual_seed(batch_size)
    shape = (pp.shape[0], pp.shape[1], tower.config.hidden_size)
    hidden = torch.randn(shape, generator=gen).to(dtype)
    length = pp.shape[1] // H.K**2
    with torch.inference_mode():
        got = pool_exact(hidden, pp, pad, length, H.K, tower.pooler.root_hidden_size)
        for i in range(pp.shape[0]):
            want, mask = tower.pooler(
                hidden_states=hidden[i : i + 1],
                pixel_position_ids=pp[i : i + 1],
                padding_positions=pad[i : i + 1],
                output_length=length,
            )
            assert torch.equal(got[i : i + 1], want)
            # the valid bins are a prefix: what lets the plugin slice instead of mask-index
            n = int(mask.sum())
            assert bool(mask[0, :n].all()) and not bool(mask[0, n:].any())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fast_pooler_is_within_two_steps_of_the_stock_pooler(dtype):
    """pool_fast (valid patches, one GEMM in the hidden dtype) against the transformers pooler
    per row: it rounds the bins' sums where the stock pooler rounds their means (and scales by
    one constant): within two steps of the largest value."""
    tower = H.tower(dtype, seed=7)
    _, pps = H.batch([H.FRAME_480P] * 3, dtype, seed=7)
    valid = int((pps[0] != -1).all(-1).sum())
    pp = torch.stack(pps)[:, :valid]
    hidden = torch.randn(pp.shape[0], valid, tower.config.hidden_size).to(dtype)
    length, root = valid // H.K**2, tower.pooler.root_hidden_size
    with torch.inference_mode():
        got = pool_fast(hidden, pp, length, H.K, root)
        no_pad = torch.zeros(1, valid, dtype=torch.bool)
        rows = [tower.pooler(hidden[i : i + 1], pp[i : i + 1], no_pad, length)[0] for i in range(3)]
        want = torch.cat(rows)
        wrong = pool_fast(hidden, pp.flip(-1), length, H.K, root)  # bins of the transposed grid
    assert got.dtype == want.dtype == torch.float32 and got.shape == want.shape
    step = torch.finfo(dtype).eps * want.abs().max()
    assert (got - want).abs().max() <= 2 * step
    assert (wrong - want).abs().max() > 10 * step


def test_fast_mode_close_not_required_identical(tower):
    dtype = next(tower.parameters()).dtype
    pvs, pps = H.batch(COMPOSITIONS["images_and_videos"], dtype, seed=13)
    ref = serial_per_item(tower, pvs, pps)
    out = encode_frames(tower, pvs, pps, mode="fast")
    tol = 1e-4 if dtype == torch.float32 else 0.1
    for a, b in zip(out, ref, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


def _spy_batches(monkeypatch, method: str, source: torch.Tensor | None = None) -> list[bool]:
    """Per pass of ``method`` (``_fast`` or ``_exact``): whether its pixel values are a view of
    ``source`` (no copy)."""
    from gemma4_batched_encoder.encoder import BatchedVisionEncoder

    views: list[bool] = []
    real = getattr(BatchedVisionEncoder, method)

    def spy(self, pv, *rest):
        ptr = None if source is None else source.untyped_storage().data_ptr()
        views.append(pv.untyped_storage().data_ptr() == ptr)
        return real(self, pv, *rest)

    monkeypatch.setattr(BatchedVisionEncoder, method, spy)
    return views


def test_fast_mode_takes_stacked_frames_as_views_with_the_lists_values(tower, monkeypatch):
    # vLLM hands video frames as one [frames, P, D] tensor: fast mode slices its runs of equal
    # valid length instead of stacking copies of them; same values as a list's stacked batch
    dtype = next(tower.parameters()).dtype
    media = [H.FRAME_480P] * 4 + [H.FRAME_720P] * 2 + [H.FRAME_480P] * 2
    pvs, pps = H.batch(media, dtype, seed=17)
    tokens = [int((pp != -1).any(-1).sum()) // 9 for pp in pps]
    from_list = encode_frames(tower, pvs, pps, valid_tokens=tokens, mode="fast")
    pv = torch.stack(pvs)
    views = _spy_batches(monkeypatch, "_fast", pv)
    stacked = encode_frames(tower, pv, torch.stack(pps), valid_tokens=tokens, mode="fast")
    # 480p frames 0-3 and 6-7 are no run (a stack); the 720p frames 4-5 are (a view)
    assert views == [False, True]
    assert_identical(stacked, from_list)


def test_exact_mode_takes_a_stacked_run_as_a_view_bit_identical(tower, monkeypatch):
    # one padded length, one padding class: the whole call is one run of the stacked tensor
    dtype = next(tower.parameters()).dtype
    media = [H.FRAME_480P] * 3 + [H.FRAME_720P] * 3
    pvs, pps = H.batch(media, dtype, seed=19)
    pv = torch.stack(pvs)
    views = _spy_batches(monkeypatch, "_exact", pv)
    assert_identical(encode_frames(tower, pv, torch.stack(pps)), serial_per_item(tower, pvs, pps))
    assert views == [True]
    # a non-contiguous stacked tensor is copied instead: eager kernels may depend on strides
    views.clear()
    wide = torch.cat([pv, pv], dim=-1)[..., : pv.shape[-1]]
    assert not wide.is_contiguous()
    assert_identical(encode_frames(tower, wide, torch.stack(pps)), serial_per_item(tower, pvs, pps))
    assert views == [False]


def test_fast_mode_batches_equal_valid_lengths_of_other_paddings(tower):
    # a 480p frame (630 patches padded) and an image of the same valid grid padded to 1260: one
    # fast batch of their valid prefixes, each close to its own per-item pass
    dtype = next(tower.parameters()).dtype
    media = [H.FRAME_480P, S.Media("image", H.FRAME_480P.grid, 140), H.FRAME_480P]
    pvs, pps = H.batch(media, dtype, seed=23)
    assert pvs[0].shape != pvs[1].shape
    ref = serial_per_item(tower, pvs, pps)
    tol = 1e-4 if dtype == torch.float32 else 0.1
    for a, b in zip(encode_frames(tower, pvs, pps, mode="fast"), ref, strict=True):
        assert a.shape == b.shape
        torch.testing.assert_close(a.float(), b.float(), atol=tol, rtol=tol)


def test_rejects_inconsistent_token_counts(tower):
    dtype = next(tower.parameters()).dtype
    pvs, pps = H.batch([H.FRAME_480P], dtype)
    with pytest.raises(ValueError, match="valid patches"):
        encode_frames(tower, pvs, pps, valid_tokens=[71])


def test_stock_pooler_impl_is_identical_too(tower):
    from gemma4_batched_encoder.chunk import exact_chunk

    dtype = next(tower.parameters()).dtype
    pvs, pps = H.batch([H.FRAME_480P] * 3, dtype, seed=21)
    ref = serial_per_item(tower, pvs, pps)
    with torch.inference_mode():
        got = exact_chunk(tower, torch.stack(pvs), torch.stack(pps), True, pooler="stock")
    assert_identical([got[i, :63] for i in range(3)], ref)


def test_self_check_switches_to_stock_pooler_when_batched_one_drifts(tower, monkeypatch):
    """If transformers' pooler changes, the self-check picks the tower's own pooler per item."""
    from gemma4_batched_encoder import chunk
    from gemma4_batched_encoder.encoder import BatchedVisionEncoder

    real = chunk.pool_exact
    monkeypatch.setattr(chunk, "pool_exact", lambda *a: real(*a) * 1.0001)
    enc = BatchedVisionEncoder(tower, Settings())
    dtype = next(tower.parameters()).dtype
    assert enc.pooler_impl(torch.device("cpu"), dtype) == "stock"
    pvs, pps = H.batch([H.FRAME_480P] * 2 + [H.image(140)], dtype, seed=22)
    assert_identical(enc.encode(pvs, pps), serial_per_item(tower, pvs, pps))


def test_encoder_cached_per_tower_and_freed_with_it(monkeypatch):
    """encode_frames builds one encoder per tower, reuses it, and keeps neither alive once the
    caller drops the tower (a cache keyed by id() kept every tower it ever saw)."""
    import gc
    import weakref

    from gemma4_batched_encoder import encoder as encoder_module

    built: list[weakref.ref] = []

    class Recording(encoder_module.BatchedVisionEncoder):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(weakref.ref(self))

    monkeypatch.setattr(encoder_module, "BatchedVisionEncoder", Recording)
    vt = H.tower(torch.float32, seed=6)
    pvs, pps = H.batch([H.FRAME_480P, H.image(70)], torch.float32, seed=23)
    first = encode_frames(vt, pvs, pps)
    assert_identical(encode_frames(vt, pvs, pps), first)
    assert len(built) == 1, "the second call with the same tower built another encoder"
    tower_ref = weakref.ref(vt)
    del vt, first
    gc.collect()
    assert tower_ref() is None, "the encoder cache keeps a deleted tower alive"
    assert built[0]() is None, "the encoder outlived its tower"
