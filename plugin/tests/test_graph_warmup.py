"""Exact mode's start-up CUDA-graph warm-up (GEMMA4_ENCODER_WARMUP_TOKENS) and the graph runner's
shared input buffers. CUDA graphs need a GPU: here the warm-up drives a runner that records each
request and runs the pass eagerly on the same inputs (what a capture runs), so what is checked is
which graphs it asks for, with inputs the real pass accepts, under the keys real requests use."""

from __future__ import annotations

import logging
from dataclasses import replace

import g4helpers as H
import pytest
import torch
from torch._dynamo.utils import counters

from gemma4_batched_encoder.cuda_graphs import CudaGraphRunner, bucket_size
from gemma4_batched_encoder.encoder import BatchedVisionEncoder
from gemma4_batched_encoder.settings import Settings
from gemma4_batched_encoder.synthetic import Media, make_batch

CPU = torch.device("cpu")


class RecordingRunner:
    """CudaGraphRunner's interface; records (key, bucket, patches, any padding) and runs fn."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, int, int, bool]] = []
        self.serving = True
        self.serving_seen: set[bool] = set()

    def run(self, key, fn, pixel_values, position_ids):
        self.serving_seen.add(self.serving)
        padded = bool((position_ids == -1).all(dim=-1).any())
        self.calls.append((key, bucket_size(pixel_values.shape[0]), pixel_values.shape[1], padded))
        out = fn(pixel_values, position_ids)
        assert out.shape[0] == pixel_values.shape[0] and torch.isfinite(out).all()
        return out


def encoder(**settings: object) -> tuple[BatchedVisionEncoder, RecordingRunner]:
    base = Settings(fused="off", warmup_tokens=(4,), cuda_graph_max_items=8)
    enc = BatchedVisionEncoder(H.tower(torch.float32, seed=3), replace(base, **settings))
    enc.graphs = RecordingRunner()  # type: ignore[assignment]
    return enc, enc.graphs  # type: ignore[return-value]


def test_warm_up_asks_for_every_bucket_padded_and_not_once(caplog):
    enc, runner = encoder()
    k = enc.vt.config.pooling_kernel_size
    with caplog.at_level(logging.INFO):
        enc._warm_graphs(CPU, torch.float32)
        enc._warm_graphs(CPU, torch.float32)  # once per device and dtype
    assert [(key[1], b, padded) for key, b, _, padded in runner.calls] == [
        (has_padding, b, has_padding) for has_padding in (False, True) for b in (8, 6, 4, 3, 2, 1)
    ]  # largest bucket first, so the runner's shared input buffer is allocated once
    assert {patches for _, _, patches, _ in runner.calls} == {4 * k * k}
    assert "12 encoder CUDA graphs captured at start-up for 4 soft tokens" in caplog.text
    # The warm-up's captures are not "while serving" (no INFO line each); later ones are.
    assert runner.serving_seen == {False} and runner.serving


def test_the_memory_budget_bounds_the_buckets():
    enc, runner = encoder()
    per_item = enc._item_bytes(4 * enc.vt.config.pooling_kernel_size**2, torch.float32)
    enc.settings = replace(enc.settings, max_batch_bytes=5 * per_item)  # passes of <= 5 items
    enc._warm_graphs(CPU, torch.float32)
    assert sorted({b for _, b, _, _ in runner.calls}) == [1, 2, 3, 4, 6]  # 5 items: bucket 6


def test_real_requests_reuse_the_warmed_keys(monkeypatch):
    enc, runner = encoder()
    monkeypatch.setattr(enc, "graphs_active", lambda device: True)  # as on CUDA
    enc._warm_graphs(CPU, torch.float32)
    warmed = {(key, b) for key, b, _, _ in runner.calls}
    runner.calls.clear()
    k = enc.vt.config.pooling_kernel_size
    patch_dim = 3 * enc.vt.config.patch_size**2
    for grid, n in (((k, 2 * k), 5), ((2 * k, 2 * k), 3)):  # padded 5 frames, unpadded 3
        pvs, pps = make_batch([Media("frame", grid, 4)] * n, patch_dim, k, seed=n)
        enc._exact(torch.stack(pvs), torch.stack(pps), has_padding=grid != (2 * k, 2 * k))
    assert [(key[1], b) for key, b, _, _ in runner.calls] == [(True, 6), (False, 3)]
    assert all((key, b) in warmed for key, b, _, _ in runner.calls)


class CaptureEmulatingRunner(RecordingRunner):
    """Runs fn as `CudaGraphRunner._capture` does: once as the warm-up, then again as if a CUDA
    stream were capturing with transformers 5.17's mask step (`g4helpers.emulate_capture_on_5_17`),
    counting what dynamo compiles inside that "capture": on the H200 a compile there failed every
    capture of the fused layers (5.17's capture-time mask for no padding). Also records, per
    captured pass, whether it had padding and whether the fused layers got a mask."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().__init__()
        self.monkeypatch = monkeypatch
        self.compiled_in_capture = 0
        self.masks_in_capture: set[tuple[bool, bool]] = set()  # (has padding, got a mask)

    def run(self, key, fn, pixel_values, position_ids):
        import gemma4_batched_encoder.fused as fused

        warm = super().run(key, fn, pixel_values, position_ids)
        before = counters["stats"]["unique_graphs"]
        build = fused.create_bidirectional_mask
        masks = []
        with self.monkeypatch.context() as m:
            H.emulate_capture_on_5_17(m)
            m.setattr(
                fused,
                "create_bidirectional_mask",
                lambda **kw: masks.append(build(**kw)) or masks[-1],
            )
            out = fn(pixel_values, position_ids)
        self.compiled_in_capture += counters["stats"]["unique_graphs"] - before
        self.masks_in_capture |= {(key[1], mask is not None) for mask in masks}
        assert torch.equal(out, warm)
        return out


def test_fused_warm_up_compiles_nothing_inside_a_capture(monkeypatch, caplog):
    bf16 = torch.bfloat16  # the dtype exact mode's fused layers serve (and self-check) in
    settings = Settings(fused="on", warmup_tokens=(4,), cuda_graph_max_items=8)
    enc = BatchedVisionEncoder(H.tower(bf16, seed=3), settings)
    runner = enc.graphs = CaptureEmulatingRunner(monkeypatch)  # type: ignore[assignment]
    with caplog.at_level(logging.INFO), torch.inference_mode():  # as `encode` calls it
        enc._warm_graphs(CPU, bf16)
    assert enc.fused_active(CPU, bf16)  # the buckets ran the fused layers
    assert "12 encoder CUDA graphs captured at start-up" in caplog.text  # padded and not
    assert runner.compiled_in_capture == 0
    assert runner.masks_in_capture == {(False, False), (True, True)}  # no padding: no mask


def test_no_warm_up_when_off_or_a_failure_only_logs(monkeypatch, caplog):
    enc, runner = encoder(warmup_tokens=())
    enc._warm_graphs(CPU, torch.float32)
    assert runner.calls == []

    enc, runner = encoder()

    def broken(*args):
        raise RuntimeError("capture failed")

    monkeypatch.setattr(runner, "run", broken)
    with caplog.at_level(logging.INFO):
        enc._warm_graphs(CPU, torch.float32)  # does not raise
    assert "warm-up stopped early" in caplog.text
    assert "0 encoder CUDA graphs captured" in caplog.text


@pytest.mark.parametrize(
    ("raw", "want"),
    [(None, (70,)), ("70,280", (70, 280)), (" 280 ", (280,)), ("off", ()), ("", (70,))],
)
def test_setting_parses(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv("GEMMA4_ENCODER_WARMUP_TOKENS", raising=False)
    else:
        monkeypatch.setenv("GEMMA4_ENCODER_WARMUP_TOKENS", raw)
    assert Settings.from_env().warmup_tokens == want


@pytest.mark.parametrize("raw", ["seventy", "0", "70,-1"])
def test_bad_setting_raises_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("GEMMA4_ENCODER_WARMUP_TOKENS", raw)
    with pytest.raises(ValueError, match="GEMMA4_ENCODER_WARMUP_TOKENS"):
        Settings.from_env()


def test_graphs_of_one_shape_share_one_input_buffer():
    runner = CudaGraphRunner(max_items=128)
    pv, pp = torch.zeros(2, 36, 12), torch.zeros(2, 36, 2, dtype=torch.long)
    big_pv, big_pp = runner._static_inputs(("k",), pv, pp, 8)
    small_pv, small_pp = runner._static_inputs(("k",), pv, pp, 4)
    assert big_pv.shape == (8, 36, 12) and small_pv.shape == (4, 36, 12)
    assert small_pv.data_ptr() == big_pv.data_ptr()  # a view: no second buffer
    assert small_pp.data_ptr() == big_pp.data_ptr()
    other_pv, _ = runner._static_inputs(("other",), pv, pp, 4)  # another shape: its own
    assert other_pv.data_ptr() != big_pv.data_ptr()
    bigger_pv, _ = runner._static_inputs(("k",), pv, pp, 16)  # larger: replaces the entry
    assert bigger_pv.shape[0] == 16 and bigger_pv.data_ptr() != big_pv.data_ptr()
    assert runner._static_inputs(("k",), pv, pp, 8)[0].data_ptr() == bigger_pv.data_ptr()
