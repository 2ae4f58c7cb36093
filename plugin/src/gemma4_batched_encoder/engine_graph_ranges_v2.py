"""The graph-safe image-range buffer (engine_graph_ranges) on vLLM's Model Runner V2: what vLLM
0.32-0.33 build by default on GPUs with Triton, 0.34's only runner, and 0.26's with
``VLLM_USE_V2_MODEL_RUNNER=1``.

V2 builds Gemma 4's range tensor with the same function as V1 (``compute_mm_prefix_range_tensor``,
called by the Triton backend's metadata builder), from its model state's ``prepare_attn``, and
its FULL graphs drop the ranges the same way. Three hooks, all run in the model runner's thread:

- ``DefaultModelState.prepare_attn`` (Gemma 4's model state): the step's query windows by batch
  index, the order of vLLM's range dict, just before the metadata that asks for the tensor.
  Graph capture goes through it too, so FULL graphs are captured reading the buffer.
- ``GPUModelRunner.execute_model`` (V2's): the scheduler's output for the step, read by
- the runner module's ``dispatch_cg_and_sync_dp``: a step in which a request has more than N
  ranges holding its query tokens runs eager (``need_eager``, V2's only way out of graphs; V1
  keeps piecewise graphs on 0.20), and its ranges come from vLLM's compact tensor.

Micro-batches after the first (``ubatch_idx`` > 0, data-parallel dual-batch overlap) get vLLM's
own tensor: the buffer holds one batch's rows.

On an H100 with vLLM 0.26.0's V2 (twenty-fifth sitting), FULL graphs with the buffer gave greedy
outputs and top-5 logprobs identical to eager on text, image and video requests (also with a
width of 2, which sent the video prefills eager); vLLM's own FULL graphs changed every request
with media.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from . import engine_graph_ranges as G
from .log import logger


def _modules() -> tuple[Any, Any] | None:
    """V2's model runner module and its default model state class (vLLM 0.26+)."""
    try:
        import vllm.v1.worker.gpu.model_runner as runner_module
        from vllm.v1.worker.gpu.model_states.default import DefaultModelState
    except Exception:  # (older vLLM, or a CPU build without them)
        return None
    if not hasattr(runner_module, "GPUModelRunner") or not hasattr(
        runner_module, "dispatch_cg_and_sync_dp"
    ):
        return None
    return runner_module, DefaultModelState


def hooks_present() -> bool:
    """Whether this vLLM has the V2 functions the buffer hooks, with the arguments it uses."""
    modules = _modules()
    if modules is None:
        return False
    runner_module, model_state = modules
    try:
        dispatch = inspect.signature(runner_module.dispatch_cg_and_sync_dp).parameters
        execute = inspect.signature(runner_module.GPUModelRunner.execute_model).parameters
        prepare = inspect.signature(model_state.prepare_attn).parameters
    except (TypeError, ValueError):
        return False
    return (
        "need_eager" in dispatch
        and {"scheduler_output", "dummy_run"} <= execute.keys()
        and "input_batch" in prepare
    )


def batch_windows(input_batch: Any) -> tuple[np.ndarray, np.ndarray]:
    """Each request's first query position and query token count in this step, by batch index
    (V2's ``InputBatch``: the scheduler's computed tokens before the step, its scheduled ones)."""
    num_reqs = int(input_batch.num_reqs)
    first = np.array(input_batch.num_computed_tokens_np[:num_reqs], dtype=np.int64)
    count = np.array(input_batch.num_scheduled_tokens[:num_reqs], dtype=np.int64)
    return first, count


def scheduled_windows(scheduler_output: Any) -> dict[str, tuple[int, int]]:
    """The scheduler's (first query position, query token count) of each request in the step."""
    counts: Mapping[str, int] = scheduler_output.num_scheduled_tokens
    windows = {
        new.req_id: (int(new.num_computed_tokens), int(counts[new.req_id]))
        for new in scheduler_output.scheduled_new_reqs
        if new.req_id in counts
    }
    cached = scheduler_output.scheduled_cached_reqs
    for req_id, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=False):
        if req_id in counts:
            windows[req_id] = (int(computed), int(counts[req_id]))
    return windows


class Pending:
    """The step the runner is executing, between its ``execute_model`` and its dispatch."""

    def __init__(self) -> None:
        self.runner: Any = None
        self.scheduler_output: Any = None

    def take(self) -> tuple[Any, Any]:
        runner, output = self.runner, self.scheduler_output
        self.runner = self.scheduler_output = None
        return runner, output


def windowed_prepare_attn(stock: Callable[..., Any], step: G.Step) -> Callable[..., Any]:
    """``ModelState.prepare_attn`` that first tells ``step`` the batch's query windows."""
    signature = inspect.signature(stock)

    @functools.wraps(stock)
    def prepare_attn(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not step.active:
            return stock(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        step.size_for(self)
        try:
            if int(bound.arguments.get("ubatch_idx", 0) or 0) > 0:
                step.new_step(None, None)  # (vLLM's own tensor: the buffer holds one batch)
            else:
                step.new_step(*batch_windows(bound.arguments["input_batch"]))
        except Exception:  # never fail a step over it: vLLM's own tensor then
            logger.warning("gemma4_batched_encoder: query windows not read", exc_info=True)
            step.new_step(None, None)
        return stock(*bound.args, **bound.kwargs)

    setattr(prepare_attn, G._PATCHED, True)
    return prepare_attn


def recorded_execute_model(stock: Callable[..., Any], pending: Pending) -> Callable[..., Any]:
    """V2's ``GPUModelRunner.execute_model`` that leaves the step's scheduler output for the
    dispatch it makes (dummy runs: none, they carry no images)."""
    signature = inspect.signature(stock)

    @functools.wraps(stock)
    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        if not bound.arguments.get("dummy_run", False):
            pending.runner, pending.scheduler_output = self, bound.arguments["scheduler_output"]
        try:
            return stock(*bound.args, **bound.kwargs)
        finally:
            pending.take()

    setattr(execute_model, G._PATCHED, True)
    return execute_model


def guarded_dispatch(
    stock: Callable[..., Any], step: G.Step, pending: Pending
) -> Callable[..., Any]:
    """The runner module's ``dispatch_cg_and_sync_dp`` that sets ``need_eager`` for a step in
    which a request has more ranges holding its query tokens than the buffer has room for."""
    signature = inspect.signature(stock)

    @functools.wraps(stock)
    def dispatch(*args: Any, **kwargs: Any) -> Any:
        runner, scheduler_output = pending.take()
        if scheduler_output is not None and step.active:
            bound = signature.bind(*args, **kwargs)
            try:
                cache = getattr(runner, "encoder_cache", None)
                features = cache.mm_features if cache is not None else {}
                overflow = G.overflows(features, scheduled_windows(scheduler_output), step.width)
            except Exception:  # the safe answer is "no graph"
                logger.warning("gemma4_batched_encoder: range count check failed", exc_info=True)
                overflow = True
            if overflow:
                bound.arguments["need_eager"] = True
                G.refused(step, "need_eager")
                return stock(*bound.args, **bound.kwargs)
        return stock(*args, **kwargs)

    setattr(dispatch, G._PATCHED, True)
    return dispatch


def install(step: G.Step) -> None:
    """Hook V2's model state, runner and dispatch for ``step`` (the caller has checked
    `hooks_present`, patches the range function and installs once)."""
    runner_module, model_state = _modules()  # type: ignore[misc]
    runner = runner_module.GPUModelRunner
    pending = Pending()
    wrappers = (
        windowed_prepare_attn(model_state.prepare_attn, step),
        recorded_execute_model(runner.execute_model, pending),
        guarded_dispatch(runner_module.dispatch_cg_and_sync_dp, step, pending),
    )  # (all built before any is set: a failure leaves vLLM as it was)
    model_state.prepare_attn, runner.execute_model, runner_module.dispatch_cg_and_sync_dp = wrappers
