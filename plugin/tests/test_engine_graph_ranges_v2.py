"""engine_graph_ranges on vLLM's Model Runner V2 (engine_graph_ranges_v2.py): the buffer fed from
V2's model state and kept out of graphs through V2's dispatch.

V2 runs only on GPUs, so a step runs on a runner and model state that do what V2's do in its
order (execute_model -> dispatch_cg_and_sync_dp -> prepare_attn -> the Triton builder's range
tensor), standing where vLLM keeps them, around vLLM's own pieces: its dispatch function, input
batch, encoder cache, range dict and range tensor, multimodal features. The same file runs on
vLLM 0.32 (this machine's) and on 0.33's and 0.34's code (test_vllm_overlays.py), whose
signatures differ."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from typing import Any

import numpy as np
import pytest
import torch
from g4helpers import resolve_cudagraph_mode

import gemma4_batched_encoder.engine_graph_ranges as G
import gemma4_batched_encoder.engine_graph_ranges_v2 as V2


def video(offset: int, frames: int, tokens: int, gap: int = 2) -> Any:
    """vLLM's feature of a video whose frames are `tokens` soft tokens apart by `gap` text
    tokens (timestamps): one range a frame."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    mask = ([True] * tokens + [False] * gap) * frames
    position = PlaceholderRange(offset=offset, length=len(mask), is_embed=torch.tensor(mask))
    return MultiModalFeatureSpec(
        data=None, modality="video", identifier=f"v{offset}", mm_position=position
    )


class GraphManager:
    """A CUDA-graph manager with FULL graphs for every size, padded to 8 requests."""

    def dispatch(self, num_reqs: int, num_tokens: int, *args: Any, **kwargs: Any) -> Any:
        from vllm.config.compilation import CUDAGraphMode
        from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor

        return BatchExecutionDescriptor(
            cg_mode=CUDAGraphMode.FULL, num_tokens=num_tokens, num_reqs=8
        )


class ModelState:
    """V2's DefaultModelState.prepare_attn, the part about ranges: vLLM's range dict for the
    batch, then the range tensor as the Triton builder asks for it, for two attention groups."""

    max_num_reqs = 8
    max_num_tokens = 64

    def __init__(self, encoder_cache: Any) -> None:
        self.encoder_cache = encoder_cache

    def prepare_attn(
        self,
        input_batch: Any,
        cudagraph_mode: Any,
        block_tables: Any = None,
        slot_mappings: Any = None,
        attn_groups: Any = None,
        kv_cache_config: Any = None,
        for_capture: bool = False,
        ubatch_idx: int = 0,
    ) -> dict[str, Any]:
        import vllm.v1.attention.backends.triton_attn as triton_attn
        from vllm.config.compilation import CUDAGraphMode
        from vllm.v1.worker.gpu.model_states import default

        padded = cudagraph_mode == CUDAGraphMode.FULL
        num_reqs = input_batch.num_reqs_after_padding if padded else input_batch.num_reqs
        compute_ranges = default.compute_mm_prefix_ranges
        if "req_ids" in inspect.signature(compute_ranges).parameters:  # 0.26-0.32
            ranges = compute_ranges(
                req_ids=input_batch.req_ids, mm_features=self.encoder_cache.mm_features
            )
        else:  # 0.33-0.34
            features = self.encoder_cache.mm_features
            ranges = compute_ranges([features.get(r, ()) for r in input_batch.req_ids])
        return {
            group: triton_attn.compute_mm_prefix_range_tensor(ranges, num_reqs, torch.device("cpu"))
            for group in ("full", "sliding")
        }


class Runner:
    """V2's GPUModelRunner.execute_model, the parts before the forward: vLLM's dispatch (looked
    up in its module at call time, as V2's global), then the input batch and its metadata."""

    def __init__(self, features: dict[str, list[Any]]) -> None:
        from vllm.v1.worker.gpu.mm.encoder_cache import EncoderCache
        from vllm.v1.worker.gpu.model_states import default

        self.encoder_cache = EncoderCache()
        for req_id, feats in features.items():
            self.encoder_cache.add_request(req_id, feats)
        # (resolved from vLLM's module, as its init_model_state does)
        self.model_state = default.DefaultModelState(self.encoder_cache)
        self.cudagraph_manager = GraphManager()
        self.modes: list[str] = []

    def execute_model(
        self,
        scheduler_output: Any,
        intermediate_tensors: Any = None,
        dummy_run: bool = False,
        skip_attn_for_dummy_run: bool = False,
        is_profile: bool = False,
    ) -> dict[str, Any]:
        import vllm.v1.worker.gpu.model_runner as runner_module
        from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

        counts = scheduler_output.num_scheduled_tokens
        num_reqs, num_tokens = len(counts), sum(counts.values())
        batch_desc, _ = runner_module.dispatch_cg_and_sync_dp(
            self.cudagraph_manager, num_reqs, num_tokens, None, 1, 0, need_eager=is_profile
        )
        self.modes.append(batch_desc.cg_mode.name)
        buffers = InputBuffers(max_num_reqs=8, max_num_tokens=64, device=torch.device("cpu"))
        batch = InputBatch.make_dummy(num_reqs, num_tokens, buffers)
        computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        req_ids = list(counts)
        batch = dataclasses.replace(
            batch,
            req_ids=req_ids,
            num_reqs_after_padding=batch_desc.num_reqs or num_reqs,
            num_scheduled_tokens=np.array([counts[r] for r in req_ids], dtype=np.int32),
            num_computed_tokens_np=np.array([computed[r] for r in req_ids], dtype=np.int32),
        )
        return self.model_state.prepare_attn(batch, batch_desc.cg_mode)


def scheduler_output(new: dict[str, tuple[int, int]], cached: dict[str, tuple[int, int]]) -> Any:
    """vLLM's SchedulerOutput fields the hooks read: request -> (computed tokens, scheduled)."""
    from types import SimpleNamespace

    from vllm.v1.core.sched.output import CachedRequestData

    cached_data = CachedRequestData.make_empty()
    cached_data.req_ids = list(cached)
    cached_data.num_computed_tokens = [c for c, _ in cached.values()]
    return SimpleNamespace(
        num_scheduled_tokens={r: n for r, (_, n) in {**new, **cached}.items()},
        scheduled_new_reqs=[
            SimpleNamespace(req_id=r, num_computed_tokens=c) for r, (c, _) in new.items()
        ],
        scheduled_cached_reqs=cached_data,
    )


@pytest.fixture
def v2(monkeypatch: pytest.MonkeyPatch) -> type[Runner]:
    """The V2-shaped runner and model state where vLLM keeps them, vLLM's own dispatch and range
    tensor, patched by `install` on a V2 engine (monkeypatch puts vLLM's own back afterwards)."""
    import vllm.utils.torch_utils as torch_utils
    import vllm.v1.attention.backends.triton_attn as triton_attn
    import vllm.v1.worker.gpu.model_runner as runner_module
    import vllm.v1.worker.gpu.model_states.default as default

    # vLLM 0.34's range tensor is a pinned host-to-device copy; pinning needs a GPU driver (its
    # CUDA build runs here on the CPU; 0.32's CPU build never pins)
    monkeypatch.setattr(torch_utils, "PIN_MEMORY", False, raising=False)

    class R(Runner):
        pass

    class S(ModelState):
        pass

    monkeypatch.setattr(runner_module, "GPUModelRunner", R)
    monkeypatch.setattr(default, "DefaultModelState", S)
    monkeypatch.setattr(
        runner_module, "dispatch_cg_and_sync_dp", runner_module.dispatch_cg_and_sync_dp
    )
    monkeypatch.setattr(
        triton_attn, "compute_mm_prefix_range_tensor", triton_attn.compute_mm_prefix_range_tensor
    )
    monkeypatch.setattr(G, "runs_model_runner_v2", lambda config: True)
    assert G.install(2) is True
    return R


def test_vllms_v2_functions_have_what_the_hooks_use() -> None:
    """The hooks bind these by name: a rename upstream turns the buffer off with a warning."""
    assert V2.hooks_present()


def test_v2_steps_read_the_buffer_in_full_graphs(v2: type[Runner]) -> None:
    # a video of 4 frames (positions 10.., 8 tokens a frame, 2 apart) and a chat decoding
    runner = v2({"video": [video(10, 4, 8)], "chat": [video(3, 1, 4)]})
    frames = runner.encoder_cache.mm_features["video"][0].mm_position.extract_embeds_range()
    assert frames == [(10, 17), (20, 27), (30, 37), (40, 47)]
    # the video's chunk 18..31 (14 tokens) meets two frames: fits a width of 2
    first = runner.execute_model(scheduler_output({"video": (18, 14)}, {"chat": (30, 1)}))
    assert runner.modes == ["FULL"]
    tensor = first["full"]
    assert tensor is first["sliding"]  # one copy for every attention group
    assert tensor.shape == (8, 2, 2)  # padded rows, as FULL graphs replay them
    assert tensor.tolist()[:2] == [[[20, 27], [30, 37]], [[0, 0], [0, 0]]]
    assert not tensor[2:].any()
    # the next step: the video's last chunk, 32..47, two frames again; the same buffer
    second = runner.execute_model(scheduler_output({}, {"video": (32, 16), "chat": (31, 1)}))
    assert second["full"].data_ptr() == tensor.data_ptr()
    assert second["full"].tolist()[0] == [[30, 37], [40, 47]]
    assert runner.modes == ["FULL", "FULL"]


def test_v2_step_with_more_ranges_than_the_width_runs_eager(
    v2: type[Runner], caplog: pytest.LogCaptureFixture
) -> None:
    from gemma4_batched_encoder.metrics import get_metrics

    refusals = get_metrics().full_graph_refusals
    before = refusals._value.get()
    runner = v2({"video": [video(10, 4, 8)]})
    with caplog.at_level(logging.INFO):
        metadata = runner.execute_model(scheduler_output({"video": (0, 50)}, {}))
    assert runner.modes == ["NONE"]  # vLLM's dispatch made it eager: need_eager
    assert refusals._value.get() == before + 1
    assert "kept out of FULL CUDA graphs (need_eager" in caplog.text
    # unpadded, vLLM's own compact tensor with every frame
    assert metadata["full"].tolist() == [[[10, 17], [20, 27], [30, 37], [40, 47]]]
    # the refusal lasts one step
    runner.execute_model(scheduler_output({}, {"video": (50, 1)}))
    assert runner.modes == ["NONE", "FULL"]


@pytest.mark.usefixtures("vllms_own_resolution")
def test_v2_a_narrowed_full_mode_leaves_every_step_to_vllm(v2: type[Runner]) -> None:
    """Once vLLM has narrowed FULL (0.33 on Hopper: no mixed step is graphed), the step that ran
    eager above keeps vLLM's dispatch, and gets vLLM's own compact tensor."""
    assert G.watch_resolution() is True
    narrowed = resolve_cudagraph_mode("FULL", "UNIFORM_SINGLE_TOKEN_DECODE", "TritonFlashAttn")
    assert narrowed == "FULL_DECODE_ONLY"
    frames = [[10, 17], [20, 27], [30, 37], [40, 47]]
    runner = v2({"video": [video(10, 4, 8)]})
    metadata = runner.execute_model(scheduler_output({"video": (0, 50)}, {}))
    assert runner.modes == ["FULL"]  # no need_eager
    assert metadata["full"].tolist()[0] == frames and not metadata["full"][1:].any()
    # a chunk that fits the buffer's width of 2 gets vLLM's tensor too: every frame, no buffer rows
    fitting = runner.execute_model(scheduler_output({}, {"video": (18, 14)}))["full"]
    assert fitting.shape[1:] == (4, 2) and fitting.tolist()[0] == frames


def test_v2_graph_capture_reads_the_buffer(v2: type[Runner]) -> None:
    """Capture builds metadata on dummy batches (no images) straight through prepare_attn: the
    graphs must be captured on the buffer's rows, not on vLLM's None for 'no ranges'."""
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    runner = v2({})
    buffers = InputBuffers(max_num_reqs=8, max_num_tokens=64, device=torch.device("cpu"))
    dummy = dataclasses.replace(InputBatch.make_dummy(4, 4, buffers), num_reqs_after_padding=4)
    captured = runner.model_state.prepare_attn(dummy, CUDAGraphMode.FULL)["full"]
    assert captured is not None and captured.shape == (4, 2, 2) and not captured.any()
    # a real step afterwards writes the same address the graph was captured on
    runner.encoder_cache.add_request("video", [video(0, 2, 4)])
    step = runner.execute_model(scheduler_output({"video": (0, 12)}, {}))
    assert step["full"].data_ptr() == captured.data_ptr()


def test_v2_later_microbatches_get_vllms_tensor(v2: type[Runner]) -> None:
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    runner = v2({"video": [video(0, 3, 4)]})
    buffers = InputBuffers(max_num_reqs=8, max_num_tokens=64, device=torch.device("cpu"))
    batch = dataclasses.replace(
        InputBatch.make_dummy(1, 12, buffers),
        req_ids=["video"],
        num_scheduled_tokens=np.array([12], dtype=np.int32),
    )
    state = runner.model_state
    first = state.prepare_attn(batch, CUDAGraphMode.NONE, ubatch_idx=0)["full"]
    later = state.prepare_attn(batch, CUDAGraphMode.NONE, ubatch_idx=1)["full"]
    assert first.shape == (1, 2, 2) and first.tolist() == [[[0, 3], [6, 9]]]  # buffer, width 2
    assert later.tolist() == [[[0, 3], [6, 9], [12, 15]]]  # vLLM's own
    assert later.data_ptr() != first.data_ptr()


def test_dummy_runs_are_not_checked(v2: type[Runner]) -> None:
    runner = v2({"video": [video(10, 4, 8)]})
    runner.execute_model(scheduler_output({"video": (0, 50)}, {}), dummy_run=True)
    assert runner.modes == ["FULL"]


def test_a_failing_check_runs_the_step_eager(
    v2: type[Runner], monkeypatch: pytest.MonkeyPatch
) -> None:
    def changed_upstream(scheduler_output: Any) -> None:
        raise AttributeError("num_computed_tokens")

    monkeypatch.setattr(V2, "scheduled_windows", changed_upstream)
    runner = v2({"video": [video(10, 4, 8)]})
    runner.execute_model(scheduler_output({"video": (40, 1)}, {}))  # (a decode: FULL otherwise)
    assert runner.modes == ["NONE"]


def test_install_on_v2_patches_vllms_own_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.v1.attention.backends.triton_attn as triton_attn
    import vllm.v1.worker.gpu.model_runner as runner_module
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    originals = {
        (DefaultModelState, "prepare_attn"): DefaultModelState.prepare_attn,
        (runner_module.GPUModelRunner, "execute_model"): runner_module.GPUModelRunner.execute_model,
        (runner_module, "dispatch_cg_and_sync_dp"): runner_module.dispatch_cg_and_sync_dp,
        (triton_attn, "compute_mm_prefix_range_tensor"): triton_attn.compute_mm_prefix_range_tensor,
    }
    for (owner, name), value in originals.items():
        monkeypatch.setattr(owner, name, value)
    monkeypatch.setattr(G, "runs_model_runner_v2", lambda config: True)
    assert G.install(4) is True
    for (owner, name), value in originals.items():
        patched = getattr(owner, name)
        assert patched is not value and getattr(patched, G._PATCHED), name
        assert patched.__wrapped__ is value  # functools.wraps: vLLM's own underneath
    assert G.install(4) is True  # idempotent
    assert (
        DefaultModelState.prepare_attn.__wrapped__ is originals[(DefaultModelState, "prepare_attn")]
    )


def test_a_vllm_without_v1_runs_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM 0.34 has no V1 module and no `use_v2_model_runner`: V2 whatever the config says."""
    from types import SimpleNamespace

    monkeypatch.setattr(G, "_has_v1_runner", lambda: False)
    assert G.runs_model_runner_v2(None) is True
    assert G.runs_model_runner_v2(SimpleNamespace()) is True
