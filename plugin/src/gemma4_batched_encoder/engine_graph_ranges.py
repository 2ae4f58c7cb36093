"""Gemma 4's image ranges in a graph-safe buffer, so FULL CUDA graphs keep them
(``GEMMA4_ENGINE_GRAPH_RANGES=N``, N ranges per request and step; 0/off: vLLM's own).

Gemma 4 attends bidirectionally inside each image or video frame. vLLM 0.20 passes those ranges
to its Triton attention kernel as a tensor built afresh each step, and no tensor at all when the
step has none. A FULL CUDA graph (``cudagraph_mode: FULL``, which captures mixed prefill-decode
batches whole) is captured on dummy batches without images, so it bakes in the kernel without
ranges and replays it for steps with images: image tokens then attend causally only. On the H200
FULL graphs served 40 video req/s at p95 201 ms where the default graphs gave 760 ms, because the
language model's launches bound the engine, but with that error (eleventh sitting, section 3).

Here the kernel always gets the same tensor: rows of one persistent device buffer of N ranges a
request, zero-padded (the kernel skips a range whose start is not below its end, vLLM's own
padding), filled each step by an asynchronous copy on the step's stream, so a captured graph
reads the current step's ranges. Only ranges that hold one of the request's query tokens in this
step are kept: a range without a query token changes no mask entry (the kernel ORs "query and key
in the same range" into the causal mask), so a decoding request needs none and a prefill chunk
only its own frames. A step in which some request still has more than N such ranges is kept out
of FULL graphs (vLLM's own switch for cascade attention, which leaves piecewise graphs or eager)
and gets vLLM's compact tensor, as without this patch.

Costs: every attention launch runs the kernel's range branch (N loads a tile, and no
sliding-window tile pruning: vLLM 0.20 skips it whenever ranges are passed), so one kernel
variant serves all steps (it also removes the per-range-count recompiles). Not measured on a GPU
yet; opt-in. vLLM versions without 0.20's hooks in the model runner
(``_set_mm_prefix_range_for_metadata``, ``_determine_batch_execution_and_padding`` taking
``use_cascade_attn``; vLLM 0.32 moved the ranges into the attention builders) are left as they
are, with a warning.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from .log import logger

ENV = "GEMMA4_ENGINE_GRAPH_RANGES"
_PATCHED = "_gemma4_graph_ranges"
_BUFFER = "_gemma4_graph_ranges_buffer"
_STEP = "_gemma4_graph_ranges_step"

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
    """The persistent buffer of one model runner (allocated once: graphs keep its address)."""

    def __init__(self, rows: int, width: int, device: torch.device) -> None:
        self.width = width
        self.buffer = torch.zeros((rows, width, 2), dtype=torch.int32, device=device)

    def view(self, ranges: Ranges, num_seqs: int) -> torch.Tensor | None:
        """Rows ``[:num_seqs]`` holding ``ranges``; None when they do not fit."""
        if num_seqs > self.buffer.shape[0] or widest(ranges) > self.width:
            return None
        host = pack(ranges, num_seqs, self.width)
        rows = self.buffer[:num_seqs]
        if rows.is_cuda:
            # A fresh pinned block each step: the caching host allocator holds it until the copy
            # has run, so the next step cannot overwrite what this one still copies.
            rows.copy_(host.pin_memory(), non_blocking=True)
        else:
            rows.copy_(host)
        return rows


def guarded_dispatch(stock: Callable[..., Any], width: int) -> Callable[..., Any]:
    """``GPUModelRunner._determine_batch_execution_and_padding`` that refuses FULL graphs for a
    step in which a request has more than ``width`` ranges holding its query tokens (counted
    before vLLM's sliding-window skip, so never fewer than the kernel would get)."""
    signature = inspect.signature(stock)

    @functools.wraps(stock)
    def dispatch(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        try:
            windows = _windows(self, bound.arguments)
            overflow = _overflows(self, windows, width)
        except Exception:  # never fail a step over the check: the safe answer is "no FULL"
            logger.warning("gemma4_batched_encoder: range count check failed", exc_info=True)
            windows, overflow = None, True
        # (the metadata of this step, built next, takes the same windows and answer)
        setattr(self, _STEP, (windows, overflow))
        if overflow:
            bound.arguments["use_cascade_attn"] = True  # vLLM: no FULL graph for this step
        return stock(*bound.args, **bound.kwargs)

    setattr(dispatch, _PATCHED, True)
    return dispatch


def _windows(runner: Any, arguments: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Each request's first query position and query token count in this step, by index."""
    num_reqs = int(arguments["num_reqs"])
    computed = np.array(runner.input_batch.num_computed_tokens_cpu[:num_reqs], dtype=np.int64)
    scheduled = np.array(arguments["num_scheduled_tokens_np"][:num_reqs], dtype=np.int64)
    return computed, scheduled


def _overflows(runner: Any, windows: tuple[np.ndarray, np.ndarray], width: int) -> bool:
    first, count = windows
    batch = runner.input_batch
    for req_id in batch.req_ids[: len(first)]:
        index = batch.req_id_to_index[req_id]
        ranges = [
            r
            for feature in runner.requests[req_id].mm_features
            for r in feature.mm_position.extract_embeds_range()
        ]
        if len(ranges_in_window(ranges, int(first[index]), int(count[index]))) > width:
            return True
    return False


def graph_safe_metadata(stock: Callable[..., Any], width: int) -> Callable[..., Any]:
    """``GPUModelRunner._set_mm_prefix_range_for_metadata`` writing the step's ranges into the
    persistent buffer and giving every Triton metadata object its rows."""

    @functools.wraps(stock)
    def set_ranges(self: Any, attn_metadata: Any, req_doc_ranges: Ranges) -> None:
        metadata = _metadata_objects(attn_metadata)
        triton = [m for m in metadata if hasattr(m, "mm_prefix_range_tensor")]
        windows, overflow = getattr(self, _STEP, (None, True))
        if not triton or overflow or windows is None:
            return stock(self, attn_metadata, req_doc_ranges)
        seq_lens = triton[0].seq_lens
        state: GraphRanges | None = getattr(self, _BUFFER, None)
        if state is None:
            rows = max(int(self.max_num_reqs), int(self.max_num_tokens), seq_lens.shape[0])
            state = GraphRanges(rows, width, seq_lens.device)
            setattr(self, _BUFFER, state)
        rows = state.view(step_ranges(req_doc_ranges, *windows), seq_lens.shape[0])
        if rows is None:  # (cannot happen after the dispatch check; vLLM's tensor then)
            return stock(self, attn_metadata, req_doc_ranges)
        for m in metadata:
            m.mm_prefix_range = req_doc_ranges  # (other backends' form, vLLM's own values)
            if hasattr(m, "mm_prefix_range_tensor"):
                m.mm_prefix_range_tensor = rows
        return None

    setattr(set_ranges, _PATCHED, True)
    return set_ranges


def _metadata_objects(attn_metadata: Any) -> list[Any]:
    if isinstance(attn_metadata, list):
        return [m for ub in attn_metadata for m in ub.values()]
    return list(attn_metadata.values())


def install(width: int) -> bool:
    """Patch vLLM's model runner where it has 0.20's hooks; ``width`` 0 does nothing."""
    if width <= 0:
        return False
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        return False
    setter = getattr(GPUModelRunner, "_set_mm_prefix_range_for_metadata", None)
    dispatch = getattr(GPUModelRunner, "_determine_batch_execution_and_padding", None)
    if setter is None or dispatch is None or not refuses_full_for_cascade(dispatch):
        logger.warning(
            "gemma4_batched_encoder: %s=%d has no effect on this vLLM (its model runner lacks "
            "0.20's range and FULL-graph hooks); vLLM's image ranges are kept",
            ENV,
            width,
        )
        return False
    if getattr(setter, _PATCHED, False):
        return True
    GPUModelRunner._set_mm_prefix_range_for_metadata = graph_safe_metadata(setter, width)
    GPUModelRunner._determine_batch_execution_and_padding = guarded_dispatch(dispatch, width)
    logger.info(
        "gemma4_batched_encoder: image ranges in a graph-safe buffer, %d a request (%s); FULL "
        "CUDA graphs keep Gemma 4's bidirectional image attention",
        width,
        ENV,
    )
    return True


def refuses_full_for_cascade(dispatch: Callable[..., Any]) -> bool:
    """Whether ``use_cascade_attn=True`` keeps a step out of FULL graphs in this vLLM (0.20:
    ``disable_full=use_cascade_attn or ...``; vLLM 0.32 still takes the argument but ignores it,
    which would let a step whose ranges do not fit replay a FULL graph)."""
    try:
        source = inspect.getsource(dispatch)
    except (OSError, TypeError):
        return False
    return "use_cascade_attn" in inspect.signature(dispatch).parameters and (
        "disable_full=use_cascade_attn" in source.replace(" ", "")
    )
