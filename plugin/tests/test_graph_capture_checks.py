"""What a CUDA-graph capture may record differently from the eager pass, and the runner's check.

No capture can run on this CPU, so both halves are reproduced: transformers 5.17's mask step
while a stream captures (it counts capture as tracing and builds an all-true mask for "no
padding": SDPA's masked kernel, not the eager unmasked one; unfused graphs of unpadded frames on
the H200, max abs diff 233, 2026-12-01), and a graph whose replay differs from its warm-up."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import g4helpers as H
import pytest
import torch
import transformers.masking_utils as masking

import gemma4_batched_encoder.chunk as chunk
from gemma4_batched_encoder.cuda_graphs import CudaGraphRunner, _Captured
from gemma4_batched_encoder.encoder import BatchedVisionEncoder
from gemma4_batched_encoder.settings import Settings
from gemma4_batched_encoder.synthetic import Media, make_batch


@pytest.fixture
def capturing_517(monkeypatch):
    H.emulate_capture_on_5_17(monkeypatch)
    return monkeypatch


def _sdpa_masks(monkeypatch) -> list[object]:
    """Record the attn_mask every SDPA call of the encoder receives."""
    seen: list[object] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("attn_mask", args[3] if len(args) > 3 else None))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return seen


def _unpadded_frames(tower, n: int = 3):
    k = tower.config.pooling_kernel_size
    patch_dim = 3 * tower.config.patch_size**2
    pvs, pps = make_batch([Media("frame", (2 * k, 2 * k), 4)] * n, patch_dim, k, seed=n)
    return torch.stack(pvs), torch.stack(pps)


def test_the_emulated_capture_reproduces_5_17s_mask(capturing_517):
    # The emulation itself: during the "capture", no padding gives a mask (5.17's bug)...
    tower = H.tower(torch.float32, seed=1)
    args = {"config": tower.encoder.config, "inputs_embeds": torch.zeros(2, 4, 8)}
    assert masking.create_bidirectional_mask(**args, attention_mask=None) is not None
    # ...and chunk.py's guard makes it none again, as eagerly.
    with chunk.no_padding_means_no_mask():
        assert masking.create_bidirectional_mask(**args, attention_mask=None) is None
        padding = torch.ones(2, 4, dtype=torch.bool)
        padding[0, -1] = False
        assert masking.create_bidirectional_mask(**args, attention_mask=padding) is not None
    assert masking.create_bidirectional_mask(**args, attention_mask=None) is not None  # restored


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_unfused_passes_of_unpadded_frames_attend_without_a_mask_inside_a_capture(
    capturing_517, mode
):
    tower = H.tower(torch.float32, seed=2)
    enc = BatchedVisionEncoder(tower, Settings(mode=mode, fused="off", cuda_graphs=False))
    pv, pp = _unpadded_frames(tower)
    with capturing_517.context() as m:  # eagerly first: the reference
        m.setattr(chunk, "_capturing", lambda: False)
        m.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        eager = enc.encode(list(pv), list(pp))
    masks = _sdpa_masks(capturing_517)
    captured = enc.encode(list(pv), list(pp))
    assert masks and all(mask is None for mask in masks)  # SDPA's eager (unmasked) kernel
    assert all(torch.equal(a, b) for a, b in zip(captured, eager, strict=True))


def test_without_the_guard_the_capture_would_record_a_masked_attention(capturing_517):
    # The test above can fail: with the guard a no-op, 5.17's mask reaches SDPA.
    import contextlib

    capturing_517.setattr(chunk, "no_padding_means_no_mask", contextlib.nullcontext)
    tower = H.tower(torch.float32, seed=2)
    enc = BatchedVisionEncoder(tower, Settings(fused="off", cuda_graphs=False))
    pv, pp = _unpadded_frames(tower)
    masks = _sdpa_masks(capturing_517)
    enc.encode(list(pv), list(pp))
    assert masks and all(isinstance(mask, torch.Tensor) for mask in masks)


@dataclass
class _ReplayGraph:
    """Stands in for torch.cuda.CUDAGraph: a replay recomputes the pass from the static inputs
    into the static output, plus `drift` (what a capture that recorded other kernels gives)."""

    fn: object
    pixel_values: torch.Tensor
    position_ids: torch.Tensor
    output: torch.Tensor
    drift: float

    def replay(self) -> None:
        self.output.copy_(self.fn(self.pixel_values, self.position_ids) + self.drift)


class _CpuRunner(CudaGraphRunner):
    """The runner's own logic on CPU tensors, with `_capture` standing in for the CUDA part."""

    def __init__(self, drift: float) -> None:
        super().__init__(max_items=8)
        self.drift = drift
        self.captures = 0

    @staticmethod
    def _can_capture(pixel_values: torch.Tensor) -> bool:
        return True

    def _capture(self, fn, pixel_values, position_ids, size, shape_key):
        self.captures += 1
        pv, pp = self._static_inputs(shape_key, pixel_values, position_ids, size)
        reps = [min(i, pixel_values.shape[0] - 1) for i in range(size)]
        pv.copy_(pixel_values[reps])
        pp.copy_(position_ids[reps])
        eager = fn(pv, pp)
        graph = _ReplayGraph(fn, pv, pp, torch.empty_like(eager), self.drift)
        return _Captured(graph, pv, pp, graph.output), eager  # type: ignore[arg-type]


def _double(pv: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
    return pv * 2


def test_a_graph_that_replays_its_eager_values_is_kept():
    runner = _CpuRunner(drift=0.0)
    pv, pp = torch.randn(3, 4, 2), torch.zeros(3, 4, 2, dtype=torch.long)
    assert torch.equal(runner.run(("k",), _double, pv, pp), pv * 2)
    assert torch.equal(runner.run(("k",), _double, pv + 1, pp), (pv + 1) * 2)  # a replay
    assert (runner.num_graphs, runner.num_failed, runner.captures) == (1, 0, 1)


def test_a_graph_that_replays_other_values_is_dropped_and_the_key_runs_eagerly(caplog):
    runner = _CpuRunner(drift=2.0**-20)  # far below one bf16 ulp: any difference counts
    pv, pp = torch.randn(3, 4, 2), torch.zeros(3, 4, 2, dtype=torch.long)
    with caplog.at_level(logging.WARNING):
        assert runner.run(("k",), _double, pv, pp) is None  # the caller runs it eagerly
    assert "replays other values than its eager pass" in caplog.text
    assert runner.run(("k",), _double, pv, pp) is None  # not captured again
    assert (runner.num_graphs, runner.num_failed, runner.captures) == (0, 1, 1)
    assert runner.run(("other",), _double, pv, pp) is None  # other keys still try
    assert runner.captures == 2
    # Fast mode promises no bits: its graphs are kept without the check.
    assert runner.run(("fast",), _double, pv, pp, check_bits=False) is not None
    assert (runner.num_graphs, runner.captures) == (1, 3)


def test_a_capture_while_serving_is_logged_with_its_key(caplog):
    runner = _CpuRunner(drift=0.0)
    pv, pp = torch.randn(3, 4, 2), torch.zeros(3, 4, 2, dtype=torch.long)
    runner.serving = False  # as during the start-up warm-up
    with caplog.at_level(logging.INFO):
        runner.run(("warm",), _double, pv, pp)
        assert "captured while serving" not in caplog.text
        runner.serving = True
        runner.run(("late",), _double, pv, pp)
        runner.run(("late",), _double, pv, pp)  # a replay: no second line
    assert caplog.text.count("CUDA graph captured while serving for ('late',") == 1
