"""Gemma 4's image ranges in a graph-safe buffer, so FULL CUDA graphs keep them
(``GEMMA4_ENGINE_GRAPH_RANGES=N``, N ranges per request and step; 0/off: vLLM's own).

Gemma 4 attends bidirectionally inside each image or video frame. vLLM (0.20 through 0.32 at
least) passes those ranges to its Triton attention kernel as a tensor built afresh each step
(``compute_mm_prefix_range_tensor``), and no tensor at all when the step has none. A FULL CUDA
graph (``cudagraph_mode: FULL``, which captures mixed prefill-decode batches whole) is captured on
dummy batches without images, so it bakes in their (empty) ranges and replays them for steps
with images: image tokens then attend causally only. On the H200 (vLLM 0.20.0) FULL graphs served
40 video req/s at p95 201 ms where the default graphs gave 760 ms, because the language model's
launches bound the engine, but with that error (eleventh sitting, section 3).

Here ``compute_mm_prefix_range_tensor`` always answers with the same tensor: rows of one
persistent device buffer of N ranges a request, zero-padded (the kernel skips a range whose start
is not below its end, vLLM's own padding), filled each step by an asynchronous copy on the step's
stream, so a captured graph reads the current step's ranges. Only ranges that hold one of the
request's query tokens in this step are kept: a range without a query token changes no mask entry
(the kernel ORs "query and key in the same range" into the causal mask), so a decoding request
needs none and a prefill chunk only its own frames. The query windows come from the model
runner's dispatch of the same step (``_determine_batch_execution_and_padding``, which vLLM calls
just before it builds the step's attention metadata, in the same thread). A step in which some
request still has more than N such ranges is kept out of FULL graphs there (0.20:
``use_cascade_attn``, so piecewise graphs stay; 0.32 ignores that flag: ``force_eager``) and gets
vLLM's compact tensor, as without this patch.

Costs: every attention launch runs the kernel's range branch (N loads a tile, and no
sliding-window tile pruning: vLLM skips it whenever ranges are passed), so one kernel variant
serves all steps (which also removes the per-range-count recompiles). On the H200 (vLLM 0.20.0,
twelfth sitting) FULL graphs with the buffer served 40 / 55 video req/s at p95 185 / 294 ms:
the branch's cost did not show. Default ``auto``: on exactly when ``cudagraph_mode`` is FULL
(``resolve_width``). A vLLM without these hooks is left as it is, with a warning.

Model runners: the hooks above are V1's (``vllm.v1.worker.gpu_model_runner``). vLLM 0.32 and
0.33 run every model on Model Runner V2 by default on GPUs with Triton
(``VllmConfig.use_v2_model_runner``; 0.26 only its default architectures, not Gemma 4; 0.34 has no
V1 left). V2 builds the same range tensor and its FULL graphs drop the ranges the same way, but
never calls V1's dispatch: there the buffer reads its windows from V2's model state and keeps
overflowing steps out of graphs through V2's dispatch (engine_graph_ranges_v2.py).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .log import logger
from .metrics import get_metrics, records_metrics
from .settings import GRAPH_RANGES_ON as AUTO_WIDTH

ENV = "GEMMA4_ENGINE_GRAPH_RANGES"
_PATCHED = "_gemma4_graph_ranges"
# The installed buffer's step (one model runner a process), for watch_resolution to retire.
_STEP: Step | None = None

Ranges = Mapping[int, Sequence[tuple[int, int]]]


def ranges_in_window(
    ranges: Sequence[tuple[int, int]], first: int, count: int
) -> list[tuple[int, int]]:
    """The ranges (inclusive ``(start, end)`` positions) holding one of the query positions
    ``first .. first + count - 1``, in their order."""
    last = first + count - 1
    return [r for r in ranges if count > 0 and r[1] >= first and r[0] <= last]


def step_ranges(ranges: Ranges, first: np.ndarray, count: np.ndarray) -> dict[int, list]:
    """Each request's ranges that matter in this step (``first``/``count``: its first query
    position and number of query tokens, by request index)."""
    return {
        i: ranges_in_window(rs, int(first[i]), int(count[i]))
        for i, rs in ranges.items()
        if i < len(first)
    }


def widest(ranges: Ranges) -> int:
    return max((len(rs) for rs in ranges.values()), default=0)


def pack(ranges: Ranges, rows: int, width: int) -> torch.Tensor:
    """``(rows, width, 2)`` int32 on the CPU: request i's ranges in row i, zeros elsewhere."""
    out = np.zeros((rows, width, 2), dtype=np.int32)
    for i, rs in ranges.items():
        if rs and i < rows:
            out[i, : len(rs)] = rs
    return torch.from_numpy(out)


class GraphRanges:
    """The persistent buffer of one process (allocated once: graphs keep its address)."""

    def __init__(self, rows: int, width: int, device: torch.device) -> None:
        self.width = width
        self.buffer = torch.zeros((rows, width, 2), dtype=torch.int32, device=device)
        self.used = 0  # rows the last step wrote

    def view(self, ranges: Ranges, num_seqs: int) -> torch.Tensor | None:
        """Rows ``[:num_seqs]`` holding ``ranges``, every row after them zero (a kernel that
        reads past ``num_seqs``, e.g. for padded requests, finds no stale ranges); None when they
        do not fit."""
        if num_seqs > self.buffer.shape[0] or widest(ranges) > self.width:
            return None
        written = max(num_seqs, self.used)
        host = pack(ranges, written, self.width)
        if self.buffer.is_cuda:
            # A fresh pinned block each step: the caching host allocator holds it until the copy
            # has run, so the next step cannot overwrite what this one still copies.
            self.buffer[:written].copy_(host.pin_memory(), non_blocking=True)
        else:
            self.buffer[:written].copy_(host)
        self.used = num_seqs
        return self.buffer[:num_seqs]


class Step:
    """What the runner's dispatch learnt about the step it is dispatching, for the range tensor
    that vLLM builds next for the same step (same thread: the model runner's)."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.rows = 0  # the buffer's rows: the runner's largest batch, set at its first dispatch
        self.first: np.ndarray | None = None  # each request's first query position, by index
        self.count: np.ndarray | None = None  # and its number of query tokens
        self.buffer: GraphRanges | None = None  # one model runner, one device: one buffer
        # this step's answer, for vLLM's further calls with the same ranges (0.32 builds the
        # tensor once per attention group): (ranges object, num_seqs, rows)
        self.answer: tuple[object, int, torch.Tensor] | None = None
        self.refused = False  # a step was kept out of FULL graphs (logged once)
        # False once vLLM has narrowed the FULL mode (watch_resolution): no step is replayed from
        # a FULL graph then, so every hook leaves the step to vLLM's own code
        self.active = True

    def size_for(self, owner: Any) -> None:
        """The buffer's rows from the runner's (or model state's) largest batch, once: a FULL
        graph pads requests up to its token count, so the larger of the two limits."""
        if not self.rows:
            self.rows = max(int(owner.max_num_reqs), int(owner.max_num_tokens))

    def new_step(self, first: np.ndarray | None, count: np.ndarray | None) -> None:
        self.first, self.count, self.answer = first, count, None

    def ranges_tensor(
        self,
        fallback: Callable[..., torch.Tensor | None],
        ranges: Ranges | None,
        num_seqs: int,
        device: torch.device,
    ) -> torch.Tensor | None:
        """``compute_mm_prefix_range_tensor``'s answer: the buffer's rows, or ``fallback``'s
        tensor where the step's ranges do not fit (a step the dispatch kept out of FULL graphs)."""
        if not self.active or ranges is None or self.first is None or self.count is None:
            return fallback(ranges, num_seqs, device)
        if self.answer is not None and self.answer[0] is ranges and self.answer[1] == num_seqs:
            return self.answer[2]  # (already copied for this step)
        kept = step_ranges(ranges, self.first, self.count)
        if len(kept) < len(ranges):  # a request the dispatch did not see: keep vLLM's
            return fallback(ranges, num_seqs, device)
        if self.buffer is None:
            self.buffer = GraphRanges(max(self.rows, num_seqs), self.width, torch.device(device))
        rows = self.buffer.view(kept, num_seqs)
        if rows is None:
            return fallback(ranges, num_seqs, device)
        self.answer = (ranges, num_seqs, rows)
        return rows


def graph_safe_compute(
    stock: Callable[..., torch.Tensor | None], step: Step
) -> Callable[..., torch.Tensor | None]:
    """vLLM's ``compute_mm_prefix_range_tensor(mm_prefix_range, num_seqs, device)``, answered
    from the persistent buffer (``stock`` where it cannot be)."""

    @functools.wraps(stock)
    def compute(mm_prefix_range: Ranges | None, num_seqs: int, device: torch.device) -> Any:
        return step.ranges_tensor(stock, mm_prefix_range, num_seqs, device)

    setattr(compute, _PATCHED, True)
    return compute


def guarded_dispatch(stock: Callable[..., Any], step: Step, refuse: str) -> Callable[..., Any]:
    """``GPUModelRunner._determine_batch_execution_and_padding`` that records the step's query
    windows and, for a step in which a request has more than ``step.width`` ranges holding its
    query tokens (counted before vLLM's sliding-window skip, so never fewer than vLLM passes),
    sets ``refuse`` (the argument with which this vLLM keeps a step out of FULL graphs)."""
    signature = inspect.signature(stock)

    @functools.wraps(stock)
    def dispatch(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not step.active:
            return stock(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        step.size_for(self)
        try:
            first, count = _windows(self, bound.arguments)
            step.new_step(first, count)
            overflow = _overflows(self, first, count, step.width)
        except Exception:  # never fail a step over the check: the safe answer is "no FULL"
            logger.warning("gemma4_batched_encoder: range count check failed", exc_info=True)
            step.new_step(None, None)  # (and vLLM's own tensor for this step)
            overflow = True
        if overflow:
            bound.arguments[refuse] = True
            refused(step, refuse)
        return stock(*bound.args, **bound.kwargs)

    setattr(dispatch, _PATCHED, True)
    return dispatch


def refused(step: Step, how: str) -> None:
    """A step kept out of FULL graphs (``how``: the dispatch argument that did it): counted on
    /metrics, logged once."""
    _count_refusal()
    if not step.refused:
        step.refused = True
        logger.info(
            "gemma4_batched_encoder: a step with more than %d image ranges for one request kept "
            "out of FULL CUDA graphs (%s; logged once; %s sets the width)",
            step.width,
            how,
            ENV,
        )


def _count_refusal() -> None:
    try:
        if records_metrics():  # every TP rank and PP stage refuses the same step: count once
            get_metrics().full_graph_refusals.inc()
    except Exception:  # metrics never fail a step
        logger.debug("gemma4_batched_encoder: refusal not counted", exc_info=True)


def _windows(runner: Any, arguments: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Each request's first query position and query token count in this step, by index."""
    num_reqs = int(arguments["num_reqs"])
    computed = np.array(runner.input_batch.num_computed_tokens_cpu[:num_reqs], dtype=np.int64)
    scheduled = np.array(arguments["num_scheduled_tokens_np"][:num_reqs], dtype=np.int64)
    return computed, scheduled


def overflows(
    features: Mapping[str, Iterable[Any]], windows: Mapping[str, tuple[int, int]], width: int
) -> bool:
    """Whether a request has more than ``width`` ranges holding one of its query tokens
    (``windows``: its first query position and query token count; every feature counted, before
    vLLM's modality and sliding-window filters: never fewer than vLLM passes)."""
    for req_id, (first, count) in windows.items():
        if count <= width:
            # disjoint ranges of >= 1 token each: a window of `count` tokens meets at most
            # `count` of them (every decoding request, without looking at its features)
            continue
        ranges = [
            r
            for feature in features.get(req_id, ())
            for r in feature.mm_position.extract_embeds_range()
        ]
        if len(ranges_in_window(ranges, first, count)) > width:
            return True
    return False


def _overflows(runner: Any, first: np.ndarray, count: np.ndarray, width: int) -> bool:
    """`overflows` for V1's runner (its persistent batch and requests)."""
    batch = runner.input_batch
    windows = {}
    for req_id in batch.req_ids[: len(first)]:
        index = batch.req_id_to_index[req_id]
        windows[req_id] = (int(first[index]), int(count[index]))
    wide = {r: runner.requests[r].mm_features for r, (_, n) in windows.items() if n > width}
    return overflows(wide, windows, width)


def full_refusal(dispatch: Callable[..., Any]) -> str | None:
    """The argument with which this vLLM's dispatch keeps a step out of FULL graphs:
    ``use_cascade_attn`` where it is honoured (0.20: ``disable_full=use_cascade_attn or ...``,
    piecewise graphs stay), else ``force_eager`` (0.32 keeps ``use_cascade_attn`` in the
    signature but ignores it); None where neither is there."""
    try:
        source = inspect.getsource(dispatch).replace(" ", "")
        params = inspect.signature(dispatch).parameters
    except (OSError, TypeError, ValueError):
        return None
    if "use_cascade_attn" in params and "disable_full=use_cascade_attn" in source:
        return "use_cascade_attn"
    if "force_eager" in params and "force_eager" in source.split(")->", 1)[-1]:
        return "force_eager"
    return None


def _range_function() -> tuple[Any, str] | None:
    """Where this vLLM keeps ``compute_mm_prefix_range_tensor`` for its Triton backend: the
    metadata class (0.20-0.26) or the backend module's imported name (0.32)."""
    try:
        import vllm.v1.attention.backends.triton_attn as triton_attn
    except Exception:  # (no Triton on CPU builds of some versions)
        return None
    metadata = getattr(triton_attn, "TritonAttentionMetadata", None)
    if metadata is not None and "compute_mm_prefix_range_tensor" in vars(metadata):
        return metadata, "compute_mm_prefix_range_tensor"
    if hasattr(triton_attn, "compute_mm_prefix_range_tensor"):
        return triton_attn, "compute_mm_prefix_range_tensor"
    return None


def _mixed_mode_name(mode: Any) -> str | None:
    """A CUDAGraphMode's mode for mixed prefill-decode batches, by name (None: not a mode)."""
    mixed = getattr(mode, "mixed_mode", None)
    return getattr(mixed(), "name", None) if callable(mixed) else None


def full_mixed_graphs(vllm_config: Any) -> bool:
    """Whether this vLLM config asks for mixed prefill-decode batches in FULL CUDA graphs
    (``cudagraph_mode`` FULL; FULL_AND_PIECEWISE and FULL_DECODE_ONLY graph only uniform decode
    batches whole, whose query tokens are never image tokens). vLLM may still narrow it to what
    its attention backends support (``watch_resolution``)."""
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    return _mixed_mode_name(mode) == "FULL"


def resolve_width(setting: int | None, vllm_config: Any) -> int:
    """The buffer width to install: the setting, or for ``auto`` (None) AUTO_WIDTH exactly when
    FULL graphs capture mixed batches. Warns when FULL graphs run with the buffer switched off."""
    full = full_mixed_graphs(vllm_config)
    if setting is None:
        if full:
            logger.info(
                "gemma4_batched_encoder: cudagraph_mode FULL asks for mixed prefill-decode "
                "batches captured whole: image ranges go through the graph-safe buffer "
                "(%s=auto -> %d)",
                ENV,
                AUTO_WIDTH,
            )
        return AUTO_WIDTH if full else 0
    if full and setting == 0:
        logger.warning(
            "gemma4_batched_encoder: cudagraph_mode FULL with %s=0: vLLM replays FULL graphs "
            "captured without Gemma 4's image ranges, so image and video tokens lose their "
            "bidirectional attention in graphed steps (outputs differ); unset %s (auto) to keep it",
            ENV,
            ENV,
        )
    return setting


def _has_v1_runner() -> bool:
    return importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None


def runs_model_runner_v2(vllm_config: Any) -> bool:
    """Whether this engine's GPU worker builds Model Runner V2 (vLLM decides it from the config
    and ``VLLM_USE_V2_MODEL_RUNNER``). A vLLM without that property has one runner: V1 where
    V1's module exists (0.20), V2 where it does not (0.34). A config whose property raises counts
    as V2 where this vLLM has V2's hooks."""
    try:
        has_v1 = _has_v1_runner()
    except (ImportError, ValueError):
        has_v1 = False
    if not has_v1:
        return True
    if vllm_config is None or not hasattr(type(vllm_config), "use_v2_model_runner"):
        return False
    try:
        return bool(vllm_config.use_v2_model_runner)
    except Exception:
        logger.debug("gemma4_batched_encoder: use_v2_model_runner raised", exc_info=True)
        from . import engine_graph_ranges_v2

        return engine_graph_ranges_v2.hooks_present()


def _v1_hooks() -> tuple[Any, Any, str] | None:
    """V1's runner class, its dispatch and the argument that keeps a step out of FULL graphs."""
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        return None
    dispatch = getattr(GPUModelRunner, "_determine_batch_execution_and_padding", None)
    refuse = full_refusal(dispatch) if dispatch is not None else None
    return (GPUModelRunner, dispatch, refuse) if refuse is not None else None


def install(width: int, vllm_config: Any = None) -> bool:
    """Patch vLLM's range tensor and the model runner the engine builds (V1's dispatch, or V2's
    model state, step and dispatch); ``width`` 0 does nothing."""
    if width <= 0:
        return False
    from . import engine_graph_ranges_v2

    v2 = runs_model_runner_v2(vllm_config)
    v1 = None if v2 else _v1_hooks()
    ready = engine_graph_ranges_v2.hooks_present() if v2 else v1 is not None
    where = _range_function()
    if not ready or where is None:
        logger.warning(
            "gemma4_batched_encoder: %s=%d has no effect on this vLLM (no Triton range tensor "
            "or no way to keep a step out of FULL graphs on its Model Runner %s); vLLM's own "
            "range tensor is used",
            ENV,
            width,
            "V2" if v2 else "V1",
        )
        return False
    owner, name = where
    current = vars(owner)[name] if isinstance(owner, type) else getattr(owner, name)
    function = current.__func__ if isinstance(current, staticmethod) else current
    if getattr(function, _PATCHED, False):
        return True
    global _STEP
    step = _STEP = Step(width)
    patched = graph_safe_compute(function, step)  # (every wrapper built before any is set)
    if v2:
        engine_graph_ranges_v2.install(step)
        refuse = "need_eager"
    else:
        runner, dispatch, refuse = v1  # type: ignore[misc]
        runner._determine_batch_execution_and_padding = guarded_dispatch(dispatch, step, refuse)
    setattr(owner, name, staticmethod(patched) if isinstance(owner, type) else patched)
    logger.info(
        "gemma4_batched_encoder: image ranges in a graph-safe buffer, %d a request (%s; Model "
        "Runner %s; steps that do not fit: %s); FULL CUDA graphs keep Gemma 4's bidirectional "
        "image attention",
        width,
        ENV,
        "V2" if v2 else "V1",
        refuse,
    )
    return True


def watch_resolution() -> bool:
    """Warn once when vLLM, checking the attention backends it picked, narrows a requested FULL
    mode to one that graphs no mixed prefill-decode step (``resolve_cudagraph_mode_and_sizes``,
    vLLM 0.32+), and switch the installed buffer off: it has no graph to serve, and its per-step
    range check would only keep steps out of vLLM's other graphs. A FULL profile buys nothing
    there: vLLM 0.33 on Hopper picks TRITON_FLASH_ATTN for Gemma 4, whose graphs cover
    single-token decodes only, and turns FULL into FULL_AND_PIECEWISE (torch.compile) or
    FULL_DECODE_ONLY (twenty-seventh sitting)."""
    try:
        from vllm.config.compilation import CompilationConfig
    except ImportError:
        return False
    resolve = getattr(CompilationConfig, "resolve_cudagraph_mode_and_sizes", None)
    if resolve is None:
        return False
    if getattr(resolve, _PATCHED, False):
        return True
    warned = False

    @functools.wraps(resolve)
    def resolved(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal warned
        requested = _mixed_mode_name(getattr(self, "cudagraph_mode", None))
        mode = resolve(self, *args, **kwargs)
        if requested != "FULL" or _mixed_mode_name(mode) == "FULL":
            return mode
        if _STEP is not None:
            _STEP.active = False
        if not warned:
            warned = True
            support = kwargs.get("min_cg_support", args[0] if args else None)
            backend = kwargs.get("min_cg_attn_backend", args[1] if len(args) > 1 else None)
            logger.warning(
                "gemma4_batched_encoder: vLLM runs cudagraph_mode %s, not the FULL requested: "
                "its attention backend %s supports CUDA graphs for %s only, so no step with "
                "image tokens is replayed from a FULL graph and the graph-safe image-range "
                "buffer (%s) is idle: switched off, vLLM's own range tensor and graph dispatch "
                "serve every step; FULL graphs of mixed batches need a backend with full "
                "support (vLLM 0.33 on Hopper: --attention-backend TRITON_ATTN)",
                getattr(mode, "name", mode),
                backend,
                getattr(support, "name", support),
                ENV,
            )
        return mode

    setattr(resolved, _PATCHED, True)
    CompilationConfig.resolve_cudagraph_mode_and_sizes = resolved  # type: ignore[method-assign]
    return True


def apply(setting: int | None, vllm_config: Any) -> bool:
    """`resolve_width` then `install`. Where FULL graphs capture mixed batches and the buffer
    cannot be installed (a vLLM without the hooks, or the patch raised), an error in the log says
    what that costs: vLLM then replays graphs captured without Gemma 4's image ranges."""
    width = resolve_width(setting, vllm_config)
    if full_mixed_graphs(vllm_config):
        watch_resolution()
    try:
        installed = install(width, vllm_config)
    except Exception:
        logger.warning("gemma4_batched_encoder: %s not applied", ENV, exc_info=True)
        installed = False
    if width > 0 and not installed and full_mixed_graphs(vllm_config):
        logger.error(
            "gemma4_batched_encoder: cudagraph_mode FULL, but the graph-safe image-range buffer "
            "could not be installed on this vLLM: FULL graphs replay without Gemma 4's image "
            "ranges, so image and video tokens lose their bidirectional attention in graphed "
            "steps (outputs differ); use cudagraph_mode FULL_AND_PIECEWISE (vLLM's default)"
        )
    return installed
