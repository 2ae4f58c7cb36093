"""engine_graph_ranges: Gemma 4's image ranges in a graph-safe buffer (GEMMA4_ENGINE_GRAPH_RANGES).

The kernel-level claim (the buffer's rows give vLLM's Triton attention the same output as vLLM's
own per-step tensor) runs vLLM's kernel under the Triton interpreter (graph_ranges_kernel_check.py).
The patch points differ by version: vLLM 0.20 builds the range tensor in the model runner
(`TritonAttentionMetadata.compute_mm_prefix_range_tensor`, called by
`_set_mm_prefix_range_for_metadata`) and refuses FULL graphs on `use_cascade_attn`; vLLM 0.32
(this machine) builds it in the Triton backend's builder and refuses them only on `force_eager`.
0.20's side runs on a runner that carries its two functions verbatim; 0.32's on the installed
vLLM's own module and dispatch."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from g4helpers import resolve_cudagraph_mode
from vllm020 import Metadata020

import gemma4_batched_encoder.engine_graph_ranges as G
from gemma4_batched_encoder.settings import Settings

# apply() with FULL wraps vLLM's class method for the process: each test starts from vLLM's own
pytestmark = pytest.mark.usefixtures("vllms_own_resolution")

HERE = Path(__file__).parent


def test_vllm_kernel_gives_the_same_attention_from_the_buffer() -> None:
    proc = subprocess.run(
        [sys.executable, str(HERE / "graph_ranges_kernel_check.py")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # the prefill chunk keeps the frames its queries touch; the decoding request keeps none
    assert result["kept"] == {"0": [[25, 34], [40, 49], [55, 70]], "1": [], "2": []}
    assert result["one_address"]  # every step's rows at one address: what a graph replays
    for window in ("window0", "window16"):  # full attention and sliding-window layers
        assert result[window] == {
            "buffer_equals_vllm": True,
            "ranges_matter": True,  # (the check would see a lost range)
            "dropping_a_range_changes_output": True,
            "text_zero_rows_equal_none": True,  # text-only steps: zero rows = no ranges
            # decode-only steps run vLLM's split-softmax kernel: no rows = vLLM's = none
            "decode_3d_buffer_equals_vllm": True,
            "decode_3d_buffer_equals_none": True,
        }


def test_ranges_in_window_keeps_those_holding_a_query_token() -> None:
    ranges = [(2, 10), (25, 34), (40, 49), (55, 70)]
    assert G.ranges_in_window(ranges, 20, 40) == [(25, 34), (40, 49), (55, 70)]
    assert G.ranges_in_window(ranges, 10, 1) == [(2, 10)]  # inclusive end
    assert G.ranges_in_window(ranges, 11, 14) == []  # 11..24: between frames
    assert G.ranges_in_window(ranges, 71, 1) == []  # decoding after the last frame
    assert G.ranges_in_window(ranges, 0, 0) == []  # nothing scheduled


def test_buffer_rows_keep_their_address_and_refuse_what_does_not_fit() -> None:
    state = G.GraphRanges(rows=4, width=2, device=torch.device("cpu"))
    a = state.view({0: [(1, 5), (8, 9)], 2: [(3, 4)]}, 3)
    assert a is not None
    assert a.tolist() == [[[1, 5], [8, 9]], [[0, 0], [0, 0]], [[3, 4], [0, 0]]]
    b = state.view({1: [(6, 7)]}, 2)
    assert b is not None and b.data_ptr() == a.data_ptr()
    assert b.tolist() == [[[0, 0], [0, 0]], [[6, 7], [0, 0]]]  # last step's rows cleared
    assert not state.buffer[2:].any()  # and the rows past this step's (padded requests' reads)
    assert state.view({0: [(1, 2), (3, 4), (5, 6)]}, 1) is None  # wider than the buffer
    assert state.view({}, 5) is None  # more requests than rows


def test_one_fill_per_step_for_every_attention_group() -> None:
    """vLLM 0.32 asks once per attention group with the step's one ranges dict: one copy."""
    step = G.Step(width=2)
    stock_calls: list[int] = []

    def stock(ranges: Any, num_seqs: int, device: Any) -> None:
        stock_calls.append(num_seqs)

    step.new_step(np.array([0, 9]), np.array([8, 1]))
    ranges = {0: [(1, 4)], 1: [(2, 3)]}
    a = step.ranges_tensor(stock, ranges, 2, "cpu")
    step.buffer.buffer.fill_(7)  # type: ignore[union-attr]  (a second fill would undo this)
    assert step.ranges_tensor(stock, ranges, 2, "cpu") is a and a.eq(7).all()
    step.new_step(np.array([0, 9]), np.array([8, 1]))  # the next step fills again
    assert step.ranges_tensor(stock, ranges, 2, "cpu").tolist() == [
        [[1, 4], [0, 0]],
        [[0, 0], [0, 0]],
    ]
    assert stock_calls == []


def test_overflow_check_skips_windows_no_wider_than_the_buffer() -> None:
    """A window of n tokens meets at most n disjoint ranges: decoding requests are not read."""
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=["a", "b"], req_id_to_index={"a": 0, "b": 1}),
        requests={},  # any look at a request's features would raise KeyError
    )
    assert not G._overflows(runner, np.array([50, 70]), np.array([1, 2]), width=2)
    with pytest.raises(KeyError):
        G._overflows(runner, np.array([50, 70]), np.array([3, 1]), width=2)


class Placeholder:
    def __init__(self, ranges: list[tuple[int, int]]) -> None:
        self._ranges = ranges

    def extract_embeds_range(self) -> list[tuple[int, int]]:
        return list(self._ranges)


class TritonMetadata020(Metadata020):
    """vLLM 0.20.0's TritonAttentionMetadata: the fields the runner's range code touches."""

    def __init__(self, num_seqs: int) -> None:
        self.seq_lens = torch.zeros(num_seqs, dtype=torch.int32)
        self.mm_prefix_range: Any = None
        self.mm_prefix_range_tensor: Any = None


class Runner020:
    """The parts of vLLM 0.20.0's GPUModelRunner the patch touches."""

    max_num_reqs = 4
    max_num_tokens = 8

    def __init__(self, requests: dict[str, tuple[int, int, list[tuple[int, int]]]]) -> None:
        ids = list(requests)
        self.requests = {
            rid: SimpleNamespace(mm_features=[SimpleNamespace(mm_position=Placeholder(rs))])
            for rid, (_, _, rs) in requests.items()
        }
        self.input_batch = SimpleNamespace(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            num_computed_tokens_cpu=np.array([requests[r][0] for r in ids] + [0] * 4),
        )
        self.scheduled = np.array([requests[r][1] for r in ids])
        self.dispatched: list[bool] = []

    def _determine_batch_execution_and_padding(
        self,
        num_tokens: int,
        num_reqs: int,
        num_scheduled_tokens_np: np.ndarray,
        max_num_scheduled_tokens: int,
        use_cascade_attn: bool,
        allow_microbatching: bool = True,
        force_eager: bool = False,
    ) -> bool:
        # vLLM 0.20.0 (gpu_model_runner.py:3608): its dispatch refuses FULL graphs on this flag
        #   cudagraph_mode, batch_descriptor = dispatch_cudagraph(
        #       num_tokens_padded, disable_full=use_cascade_attn or has_encoder_output
        #   )
        self.dispatched.append(use_cascade_attn)
        return use_cascade_attn

    def _set_mm_prefix_range_for_metadata(
        self, attn_metadata: Any, req_doc_ranges: dict[int, list[tuple[int, int]]]
    ) -> None:
        # vLLM 0.20.0, vllm/v1/worker/gpu_model_runner.py:6418-6456 (docstring dropped)
        from vllm.v1.attention.backends.triton_attn import (
            TritonAttentionMetadata,
        )

        # Get all metadata objects from either list or dict structure
        metadata_list = []
        if isinstance(attn_metadata, list):
            for ub_metadata in attn_metadata:
                metadata_list.extend(ub_metadata.values())
        else:
            metadata_list.extend(attn_metadata.values())
        # Set mm_prefix_range for all metadata and compute tensor once
        shared_tensor = None
        for metadata in metadata_list:
            metadata.mm_prefix_range = req_doc_ranges  # type: ignore[attr-defined]

            # Only compute tensor for TritonAttentionMetadata
            if isinstance(metadata, TritonAttentionMetadata):
                if shared_tensor is None:
                    shared_tensor = TritonAttentionMetadata.compute_mm_prefix_range_tensor(
                        req_doc_ranges,
                        metadata.seq_lens.shape[0],  # type: ignore[attr-defined]
                        metadata.seq_lens.device,  # type: ignore[attr-defined]
                    )
                metadata.mm_prefix_range_tensor = shared_tensor

    def step(self) -> dict[str, TritonMetadata020]:
        """One engine step as vLLM 0.20 orders it: dispatch, then the metadata's ranges."""
        import vllm.v1.attention.backends.triton_attn as triton_attn

        n = len(self.input_batch.req_ids)
        self._determine_batch_execution_and_padding(
            int(self.scheduled.sum()), n, self.scheduled, int(self.scheduled.max()), False
        )
        metadata_class = triton_attn.TritonAttentionMetadata  # (the fixture's 0.20 stand-in)
        metadata = {"layer.0": metadata_class(n), "layer.1": metadata_class(n)}
        doc = {
            i: self.requests[r].mm_features[0].mm_position.extract_embeds_range()
            for i, r in enumerate(self.input_batch.req_ids)
        }
        self._set_mm_prefix_range_for_metadata(metadata, doc)
        return metadata


@pytest.fixture
def vllm020(monkeypatch: pytest.MonkeyPatch) -> type[Runner020]:
    """A 0.20-shaped runner and metadata class standing where vLLM keeps them (the runner's
    verbatim code imports the metadata class from there), patched by `install` (monkeypatch puts
    vLLM's own back afterwards)."""
    import vllm.v1.attention.backends.triton_attn as triton_attn
    import vllm.v1.worker.gpu_model_runner as runner_module

    class Runner(Runner020):
        pass

    class Metadata(TritonMetadata020):
        pass

    Metadata.compute_mm_prefix_range_tensor = staticmethod(  # type: ignore[method-assign]
        TritonMetadata020.compute_mm_prefix_range_tensor
    )
    monkeypatch.setattr(runner_module, "GPUModelRunner", Runner)
    monkeypatch.setattr(triton_attn, "TritonAttentionMetadata", Metadata)
    assert G.install(2) is True
    return Runner


def test_020_steps_use_the_buffer_and_full_graphs_stay_allowed(vllm020: type[Runner020]) -> None:
    runner = vllm020({"video": (20, 40, [(2, 10), (25, 34), (40, 49)]), "chat": (44, 1, [(5, 15)])})
    first = runner.step()
    assert runner.dispatched == [False]  # FULL graphs allowed
    tensor = first["layer.0"].mm_prefix_range_tensor
    assert tensor is first["layer.1"].mm_prefix_range_tensor  # one tensor for every layer
    assert tensor.tolist() == [[[25, 34], [40, 49]], [[0, 0], [0, 0]]]
    assert first["layer.0"].mm_prefix_range[1] == [(5, 15)]  # vLLM's dict, as it was
    runner.input_batch.num_computed_tokens_cpu[0] = 60  # next step: the video decodes too
    runner.scheduled = np.array([1, 1])
    second = runner.step()["layer.0"].mm_prefix_range_tensor
    assert second.data_ptr() == tensor.data_ptr() and not second.any()
    assert G.install(2) is True  # idempotent: still one wrapper
    third = runner.step()["layer.0"].mm_prefix_range_tensor
    assert third.data_ptr() == tensor.data_ptr() and runner.dispatched == [False] * 3


def test_020_step_with_more_ranges_than_the_width_stays_out_of_full_graphs(
    vllm020: type[Runner020],
) -> None:
    runner = vllm020({"video": (0, 60, [(2, 10), (25, 34), (40, 49)])})
    metadata = runner.step()
    assert runner.dispatched == [True]  # vLLM 0.20's switch that refuses FULL graphs
    # and the step gets vLLM's own compact tensor, every range
    assert metadata["layer.0"].mm_prefix_range_tensor.tolist() == [[[2, 10], [25, 34], [40, 49]]]


def test_020_a_narrowed_full_mode_leaves_every_step_to_vllm(vllm020: type[Runner020]) -> None:
    """Once vLLM has narrowed FULL (no mixed step is graphed), the buffer and its refusal are off:
    the step that overflowed above keeps vLLM's graphs, and every step gets vLLM's own tensor."""
    assert G.watch_resolution() is True
    narrowed = resolve_cudagraph_mode("FULL", "UNIFORM_SINGLE_TOKEN_DECODE", "TritonFlashAttn")
    assert narrowed == "FULL_DECODE_ONLY"
    runner = vllm020({"video": (0, 60, [(2, 10), (25, 34), (40, 49)]), "chat": (44, 1, [(5, 15)])})
    metadata = runner.step()
    assert runner.dispatched == [False]  # not refused
    assert metadata["layer.0"].mm_prefix_range_tensor.tolist() == [
        [[2, 10], [25, 34], [40, 49]],
        [[5, 15], [0, 0], [0, 0]],
    ]  # vLLM's compact tensor, every range of each request, no padded buffer rows


def test_032_patches_the_backends_range_function_and_refuses_full_by_force_eager(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM 0.32 keeps `use_cascade_attn` in the dispatch's signature but ignores it."""
    import vllm.v1.attention.backends.triton_attn as triton_attn
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    dispatch = GPUModelRunner._determine_batch_execution_and_padding
    stock = triton_attn.compute_mm_prefix_range_tensor
    assert G.full_refusal(dispatch) == "force_eager"
    monkeypatch.setattr(GPUModelRunner, "_determine_batch_execution_and_padding", dispatch)
    monkeypatch.setattr(triton_attn, "compute_mm_prefix_range_tensor", stock)
    assert G.install(4) is True
    compute = triton_attn.compute_mm_prefix_range_tensor
    assert compute is not stock and getattr(compute, G._PATCHED)
    # before any dispatch (no windows known): vLLM's own function answers
    ranges = {0: [(3, 9)], 1: []}
    assert torch.equal(compute(ranges, 2, torch.device("cpu")), stock(ranges, 2, "cpu"))


def test_install_leaves_a_vllm_without_the_hooks_alone(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import vllm.v1.attention.backends.triton_attn as triton_attn

    monkeypatch.delattr(triton_attn, "compute_mm_prefix_range_tensor")
    with caplog.at_level(logging.WARNING):
        assert G.install(16) is False
    assert "has no effect on this vLLM" in caplog.text
    assert G.install(0) is False


@pytest.mark.parametrize("broken", ["no hooks", "patch raises"])
def test_full_graphs_without_the_buffer_are_an_error_in_the_log(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, broken: str
) -> None:
    if broken == "no hooks":
        import vllm.v1.attention.backends.triton_attn as triton_attn

        monkeypatch.delattr(triton_attn, "compute_mm_prefix_range_tensor")
    else:
        monkeypatch.setattr(G, "graph_safe_compute", _raise)
    with caplog.at_level(logging.WARNING):
        assert G.apply(None, _config("FULL")) is False
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "lose their bidirectional attention" in errors[0].getMessage()
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    # nothing half-installed: the runner's dispatch is vLLM's own
    assert not getattr(GPUModelRunner._determine_batch_execution_and_padding, G._PATCHED, False)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert G.apply(None, _config("FULL_AND_PIECEWISE")) is False  # nothing to install
    assert not caplog.records


def _raise(*args: object) -> None:
    raise RuntimeError("changed upstream")


def _narrowing_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [m for r in caplog.records if "vLLM runs cudagraph_mode" in (m := r.getMessage())]


def test_full_narrowed_by_vllms_attention_backend_is_a_warning_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # vLLM 0.33 on Hopper: TRITON_FLASH_ATTN graphs single-token decodes only (twenty-seventh
    # sitting); the buffer then has no FULL mixed step to serve
    from vllm.config.compilation import CompilationConfig

    assert G.watch_resolution() is True
    assert G.watch_resolution() is True
    wrapper = CompilationConfig.resolve_cudagraph_mode_and_sizes
    assert not getattr(wrapper.__wrapped__, G._PATCHED, False)  # wrapped once, not twice
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            narrowed = resolve_cudagraph_mode(
                "FULL", "UNIFORM_SINGLE_TOKEN_DECODE", "TritonFlashAttentionBackend"
            )
            assert narrowed == "FULL_DECODE_ONLY"
    (warning,) = _narrowing_warnings(caplog)  # once a process
    for part in (
        "FULL_DECODE_ONLY, not the FULL requested",
        "TritonFlashAttentionBackend",
        "UNIFORM_SINGLE_TOKEN_DECODE",
        "GEMMA4_ENGINE_GRAPH_RANGES) is idle",
        "--attention-backend TRITON_ATTN",
    ):
        assert part in warning


@pytest.mark.parametrize(
    ("requested", "support"),
    [
        ("FULL", "ALWAYS"),  # vLLM keeps FULL: the buffer serves every mixed step
        ("FULL_AND_PIECEWISE", "UNIFORM_SINGLE_TOKEN_DECODE"),  # nothing FULL was asked for
    ],
)
def test_no_warning_where_vllm_keeps_what_was_asked_for(
    caplog: pytest.LogCaptureFixture, requested: str, support: str
) -> None:
    assert G.watch_resolution() is True
    with caplog.at_level(logging.WARNING):
        resolved = resolve_cudagraph_mode(requested, support, "TritonAttentionBackend")
    assert resolved == requested
    assert _narrowing_warnings(caplog) == []


def test_apply_watches_vllms_resolution_only_when_full_is_asked_for() -> None:
    from vllm.config.compilation import CompilationConfig

    # (width 0: nothing else is installed, so the runner's hooks stay vLLM's for later tests)
    G.apply(0, _config("FULL_AND_PIECEWISE"))
    assert not getattr(CompilationConfig.resolve_cudagraph_mode_and_sizes, G._PATCHED, False)
    G.apply(0, _config("FULL"))
    assert getattr(CompilationConfig.resolve_cudagraph_mode_and_sizes, G._PATCHED, False)


@pytest.mark.parametrize(
    ("raw", "width"),
    [("on", 16), ("1", 16), ("8", 8), ("off", 0), ("0", 0), ("auto", None), ("", None)],
)
def test_setting(monkeypatch: pytest.MonkeyPatch, raw: str, width: int | None) -> None:
    monkeypatch.setenv("GEMMA4_ENGINE_GRAPH_RANGES", raw)
    assert Settings.from_env().engine_graph_ranges == width


def test_setting_defaults_to_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMMA4_ENGINE_GRAPH_RANGES", raising=False)
    assert Settings.from_env().engine_graph_ranges is None


def _config(mode: str) -> SimpleNamespace:
    from vllm.config import CompilationConfig  # vLLM's own config and mode enum

    return SimpleNamespace(compilation_config=CompilationConfig(cudagraph_mode=mode))


@pytest.mark.parametrize(
    ("mode", "width"),
    [
        ("FULL", 16),  # mixed prefill-decode batches captured whole: ranges through the buffer
        ("FULL_AND_PIECEWISE", 0),  # whole graphs only for uniform decode (no image queries)
        ("FULL_DECODE_ONLY", 0),
        ("PIECEWISE", 0),
        ("NONE", 0),
    ],
)
def test_auto_turns_the_buffer_on_exactly_for_full_mixed_graphs(mode: str, width: int) -> None:
    assert G.resolve_width(None, _config(mode)) == width


def test_an_explicit_width_wins_and_full_without_the_buffer_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert G.resolve_width(8, _config("FULL")) == 8
        assert G.resolve_width(0, _config("PIECEWISE")) == 0
        assert "lose their bidirectional attention" not in caplog.text
        assert G.resolve_width(0, _config("FULL")) == 0
    assert "cudagraph_mode FULL with GEMMA4_ENGINE_GRAPH_RANGES=0" in caplog.text
    # a config without a compilation config (or an unknown mode object): nothing to decide on
    assert G.resolve_width(None, SimpleNamespace()) == 0


def test_setting_refuses_nonsense(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMMA4_ENGINE_GRAPH_RANGES", "wide")
    with pytest.raises(ValueError, match="GEMMA4_ENGINE_GRAPH_RANGES"):
        Settings.from_env()


def _vllm_config(mode: str) -> Any:
    """vLLM's own VllmConfig: its `use_v2_model_runner` decides which runner the GPU worker
    builds (0.32-0.33: V2 by default wherever Triton runs; VLLM_USE_V2_MODEL_RUNNER overrides)."""
    from vllm.config import CompilationConfig, VllmConfig

    config = VllmConfig()
    # (set after construction: on this CPU platform vLLM's own checks turn CUDA graphs off)
    config.compilation_config = CompilationConfig(cudagraph_mode=mode)
    assert G.full_mixed_graphs(config) == (mode == "FULL")
    return config


def test_the_engines_model_runner_decides_which_hooks(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM 0.32-0.33 build V1 or V2 from the same config by VLLM_USE_V2_MODEL_RUNNER: V1's
    dispatch is never called on V2 (and V2's hooks never on V1), so each gets its own hooks
    (V2's: test_engine_graph_ranges_v2.py), and FULL graphs keep the ranges on both."""
    import vllm.v1.attention.backends.triton_attn as triton_attn
    import vllm.v1.worker.gpu.model_runner as v2_runner
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    patched = {
        "V1 dispatch": (GPUModelRunner, "_determine_batch_execution_and_padding"),
        "V2 model state": (DefaultModelState, "prepare_attn"),
        "V2 runner": (v2_runner.GPUModelRunner, "execute_model"),
        "V2 dispatch": (v2_runner, "dispatch_cg_and_sync_dp"),
    }

    def fresh() -> None:  # vLLM's own functions back, as in a new worker process
        for owner, name in [*patched.values(), (triton_attn, "compute_mm_prefix_range_tensor")]:
            monkeypatch.setattr(owner, name, getattr(owner, name))

    def hooked() -> set[str]:
        return {k for k, (o, n) in patched.items() if getattr(getattr(o, n), G._PATCHED, False)}

    fresh()
    config = _vllm_config("FULL")
    cases = [
        ("1", "V2", {"V2 model state", "V2 runner", "V2 dispatch"}),
        ("0", "V1", {"V1 dispatch"}),
    ]
    for env, runner, hooks in cases:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", env)
        assert G.runs_model_runner_v2(config) is (runner == "V2")
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert G.apply(None, config) is True
        assert hooked() == hooks
        assert getattr(triton_attn.compute_mm_prefix_range_tensor, G._PATCHED)
        assert f"Model Runner {runner}" in caplog.text
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        monkeypatch.undo()
        fresh()


def test_runner_v2_is_read_from_the_config_only_where_it_has_the_property() -> None:
    class Raises:
        @property
        def use_v2_model_runner(self) -> bool:
            raise RuntimeError("changed upstream")

    assert G.runs_model_runner_v2(None) is False
    assert G.runs_model_runner_v2(_config("FULL")) is False  # vLLM 0.20: V1 only
    assert G.runs_model_runner_v2(SimpleNamespace(use_v2_model_runner=True)) is False
    assert G.runs_model_runner_v2(Raises()) is True  # unknown: not shown to run V1
