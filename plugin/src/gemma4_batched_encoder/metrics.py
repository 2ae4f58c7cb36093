"""The plugin's Prometheus metrics (names and labels: docs/architecture.md).

Created lazily on first use and once per process. They live in the engine-core process; with
PROMETHEUS_MULTIPROC_DIR set (images/entrypoint.sh does) prometheus_client writes them to files
that vLLM's API server aggregates into its /metrics.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

# One ladder of latency bounds (1-2-3-5-7.5 per decade) for every seconds histogram the plugin
# exposes, so dashboards can compare their quantiles bucket for bucket.
SECONDS_LADDER = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
)


_unrecorded = threading.local()  # depth of `unrecorded` blocks on this thread


@contextmanager
def unrecorded() -> Iterator[None]:
    """The plugin's metrics record nothing on this thread inside the block: vLLM's work on dummy
    inputs (each API server's processor warm-up, the engine's start-up profile run), which runs
    the real code but would read as slow served requests in whole-run averages."""
    _unrecorded.depth = getattr(_unrecorded, "depth", 0) + 1
    try:
        yield
    finally:
        _unrecorded.depth -= 1


def recording() -> bool:
    return not getattr(_unrecorded, "depth", 0)


def seconds_buckets(low: float, high: float) -> tuple[float, ...]:
    """The ladder's bounds from ``low`` to ``high`` (both on the ladder), inclusive."""
    return SECONDS_LADDER[SECONDS_LADDER.index(low) : SECONDS_LADDER.index(high) + 1]


# 1 ms .. 1 s: one image's encoder call to a burst of 16 videos on a busy GPU.
ENCODER_SECONDS_BUCKETS = seconds_buckets(0.001, 1.0)
ITEMS_BUCKETS = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass(frozen=True)
class EncoderMetrics:
    info: Any
    calls: Any
    items_per_call: Any
    seconds: Any
    fallbacks: Any
    verify_checks: Any
    verify_mismatches: Any
    fused_layers: Any
    cuda_graphs: Any
    full_graph_refusals: Any
    engine_thread_cpu: Any
    engine_thread_wait: Any


class _NoMetric:
    """Stands in for every metric on a process that must not record (``records_metrics``)."""

    def labels(self, *args: Any, **kwargs: Any) -> _NoMetric:
        return self

    def inc(self, *args: Any) -> None:
        pass

    def observe(self, *args: Any) -> None:
        pass

    def set(self, *args: Any) -> None:
        pass


NO_METRICS = EncoderMetrics(*(_NoMetric() for _ in EncoderMetrics.__dataclass_fields__))

_lock = threading.Lock()
_metrics: EncoderMetrics | None = None


def get_metrics() -> EncoderMetrics:
    global _metrics
    with _lock:
        if _metrics is None:
            from prometheus_client import Counter, Gauge, Histogram

            _metrics = EncoderMetrics(
                info=Gauge(
                    "gemma4_encoder_info",
                    "Gemma 4 vision encoder in force (value 1).",
                    ["mode", "fast_kernels", "cuda_graphs", "vllm_version", "plugin_version"],
                    multiprocess_mode="max",
                ),
                calls=Counter(
                    "gemma4_encoder_calls",
                    "embed_multimodal calls that carried images or video, by encoder path.",
                    ["path"],
                ),
                items_per_call=Histogram(
                    "gemma4_encoder_items_per_call",
                    "Video frames and images per embed_multimodal call.",
                    ["kind"],
                    buckets=ITEMS_BUCKETS,
                ),
                seconds=Histogram(
                    "gemma4_encoder_seconds",
                    "Time in the vision encoder (tower + projection) per embed_multimodal call.",
                    ["path"],
                    buckets=ENCODER_SECONDS_BUCKETS,
                ),
                fallbacks=Counter(
                    "gemma4_encoder_fallbacks",
                    "Plugin errors that fell back to the stock encoder path, by reason.",
                    ["reason"],
                ),
                verify_checks=Counter(
                    "gemma4_encoder_verify_checks",
                    "Shadow verifications of the plugin against the stock path.",
                ),
                verify_mismatches=Counter(
                    "gemma4_encoder_verify_mismatches",
                    "Shadow verifications whose outputs were not bit-identical.",
                ),
                fused_layers=Gauge(
                    "gemma4_encoder_fused_layers",
                    "1 while exact mode runs the inductor-fused encoder layers "
                    "(GEMMA4_ENCODER_FUSED, after its start-up self-check), else 0.",
                    multiprocess_mode="max",
                ),
                cuda_graphs=Gauge(
                    "gemma4_encoder_cuda_graphs",
                    "Encoder CUDA graphs in this process by state: captured, or failed (that "
                    "batch shape runs eagerly from then on; the log says why).",
                    ["state"],
                    multiprocess_mode="max",
                ),
                full_graph_refusals=Counter(
                    "gemma4_engine_full_graph_refusals",
                    "Engine steps kept out of FULL CUDA graphs because a request had more image "
                    "ranges holding query tokens than GEMMA4_ENGINE_GRAPH_RANGES holds.",
                ),
                engine_thread_cpu=Counter(
                    "gemma4_engine_thread_cpu_seconds",
                    "CPU time of the thread that runs the model (one GPU: the engine core's "
                    "step loop); a rate near 1 means the engine is CPU-bound.",
                ),
                engine_thread_wait=Counter(
                    "gemma4_engine_thread_wait_seconds",
                    "Time the thread that runs the model was runnable but waiting for a core.",
                ),
            )
            _metrics.fused_layers.set(0)
            for state in ("captured", "failed"):
                _metrics.cuda_graphs.labels(state=state).set(0)
            # Export the zero series up front so dashboards see them before the first event.
            for path in ("plugin", "stock"):
                _metrics.calls.labels(path=path)
                _metrics.seconds.labels(path=path)
            for kind in ("frame", "image"):
                _metrics.items_per_call.labels(kind=kind)
        return _metrics


_info_labels: dict[str, str] | None = None  # the label set set_info last set to 1


def set_info(
    mode: str,
    cuda_graphs: bool,
    vllm_version: str,
    plugin_version: str,
    fast_kernels: str = "none",
    metrics: EncoderMetrics | None = None,
) -> None:
    """The encoder in force; ``fast_kernels``: fast mode's layers in force
    (``BatchedVisionEncoder.fast_kernels_in_force``), "none" in the other modes. ``metrics``: the
    caller's (``EncoderRuntime.metrics``; default ``get_metrics()``); ``NO_METRICS`` (a process
    that does not record) does nothing, so the recording decision is the caller's alone.

    A replaced label set is set to 0, not removed: ``Gauge.clear()``/``remove()`` do nothing to
    the files of multiprocess mode (vLLM's /metrics), where the old set would stay at 1."""
    global _info_labels
    if metrics is NO_METRICS:
        return
    labels = {
        "mode": mode,
        "fast_kernels": fast_kernels if mode == "fast" else "none",
        "cuda_graphs": "true" if cuda_graphs else "false",
        "vllm_version": vllm_version,
        "plugin_version": plugin_version,
    }
    info = (metrics or get_metrics()).info
    with _lock:
        if _info_labels is not None and _info_labels != labels:
            info.labels(**_info_labels).set(0)
        info.labels(**labels).set(1)
        _info_labels = labels


def records_metrics() -> bool:
    """Whether this process records the encoder's metrics: tensor-parallel rank 0 of the first
    pipeline stage only. Every rank of a TP group runs the same encoder call, and every stage's
    runner dispatches the same step (the graph-range refusals); vLLM runs the encoder on the first
    stage only. Elsewhere counts would be multiplied by the TP or PP size. True where vLLM or its
    model-parallel groups are not there (verify, bench, tests)."""
    try:
        from vllm.distributed import parallel_state
    except ImportError:
        return True
    try:
        if not parallel_state.model_parallel_is_initialized():
            return True
        return (
            parallel_state.get_tensor_model_parallel_rank() == 0
            and parallel_state.get_pp_group().is_first_rank
        )
    except Exception:  # a vLLM without these helpers: record, as before
        return True
