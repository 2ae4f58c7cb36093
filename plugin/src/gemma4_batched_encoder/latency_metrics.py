"""Finer request-latency histograms for vLLM, as a ``vllm.stat_logger_plugins`` plugin.

Why: vLLM's own histograms cannot resolve a 300 ms SLO. ``vllm:e2e_request_latency_seconds``
starts at 0.3 s (every request under the SLO lands in one bucket, so its p95 is meaningless
below 0.3 s), and ``vllm:time_to_first_token_seconds`` jumps from 0.1 to 0.25 s. This logger
records the same observations vLLM records, from the same ``IterationStats`` objects, into
histograms whose buckets resolve 5 ms .. 60 s with boundaries at 0.1, 0.2, 0.25 and 0.3 s:

* ``gemma4_request_time_to_first_token_seconds``: ``IterationStats.time_to_first_tokens_iter``
* ``gemma4_request_e2e_latency_seconds``: ``IterationStats.finished_requests[*].e2e_latency``
* ``gemma4_request_inter_token_latency_seconds``: ``IterationStats.inter_token_latencies_iter``

All three carry the labels vLLM uses on its own ``vllm:*`` series (``model_name`` = served
model name, ``engine`` = data-parallel engine index), so the two families join and compare
1:1: ``gemma4_request_e2e_latency_seconds_count`` equals ``vllm:e2e_request_latency_seconds_count``
less the start-up warm-up's requests (``warmup.REQUEST_TAG`` in their ids), which the SLO
histogram leaves out. TTFT and ITL observations carry no request id, so those two count them.

vLLM 0.32 also accepts ``--custom-histogram-buckets`` (``ObservabilityConfig``), which can
re-bucket vLLM's own families; the plugin is still used because (a) it works on the older
versions the package supports, (b) the ``request_latency`` family is shared by e2e, queue,
prefill, decode and inference time, so re-bucketing it multiplies five series sets, and (c)
dashboards and rules then do not depend on a serve flag being set.

How vLLM runs it (checked against vLLM 0.32, ``vllm/v1/metrics/loggers.py``,
``vllm/v1/engine/async_llm.py``, ``vllm/plugins/__init__.py``):

* ``AsyncLLM.__init__`` calls ``load_stat_logger_plugin_factories()``, which loads the entry
  point group ``vllm.stat_logger_plugins`` **in the API-server process only** and requires
  each entry to be a ``StatLoggerBase`` subclass (else ``TypeError``). Our entry point:
  ``gemma4_latency = gemma4_batched_encoder.latency_metrics:Gemma4LatencyStatLogger``.
* ``StatLoggerManager`` builds an ``AggregateStatLoggerBase`` subclass once, as
  ``cls(vllm_config=..., engine_indexes=[...])``, and calls
  ``record(scheduler_stats, iteration_stats, mm_cache_stats=..., engine_idx=...)`` for every
  batch of engine outputs, ``log()`` every ``--log-stats`` interval and
  ``log_engine_initialized()`` once. A custom logger that is *not* a ``PrometheusStatLogger``
  does not replace vLLM's Prometheus logger; both run.
* Finding a plugin turns stats collection on even with ``--disable-log-stats``.
* Elastic-EP scale-up (``AsyncLLM._scale_elastic_ep``) rebuilds ``StatLoggerManager`` with
  ``custom_stat_loggers=None`` in vLLM 0.32, dropping plugin loggers until restart: a vLLM
  limitation; the families stay registered (module level), they just stop moving.
* ``VLLM_PLUGINS`` (comma list) filters plugins by name: include ``gemma4_latency`` if set.

Where the series appear: the metrics are ordinary ``prometheus_client`` histograms in the
default ``REGISTRY``. vLLM's ``/metrics`` (``get_prometheus_registry()``) serves ``REGISTRY``
when ``PROMETHEUS_MULTIPROC_DIR`` is unset, and a fresh ``CollectorRegistry`` with a
``MultiProcessCollector`` over that directory when it is set (``images/entrypoint.sh`` always
sets it to a fresh directory; vLLM itself sets it for ``--api-server-count > 1``). In that
mode ``prometheus_client`` chooses its mmap-file value class at import time from the same
environment variable, so these histograms are written to the directory and summed over all
API-server processes. Histograms need no ``multiprocess_mode``. The directory must be empty at
start (stale files from a previous run would be summed in).

vLLM versions without the ``vllm.stat_logger_plugins`` group (before it was added, ~0.10):
the entry point is then simply never loaded and nothing breaks. Two real fallbacks exist:

1. in-process use: pass the class yourself, ``AsyncLLM.from_engine_args(args,
   stat_loggers=[Gemma4LatencyStatLogger])`` (the ``stat_loggers`` argument predates the
   plugin group; older versions call each factory per engine as ``cls(vllm_config, idx)``,
   which this class also accepts);
2. ``vllm serve``: call :func:`install_fallback_hook` from a ``vllm.general_plugins``
   ``register()`` function (it runs in every process). It is a no-op when vLLM has the
   plugin group, and otherwise wraps ``AsyncLLM.__init__`` to append this logger to
   ``stat_loggers``. It is idempotent.

Gemma-specific nothing: the class works for any model served by vLLM's v1 engine.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Histogram

from .warmup import REQUEST_TAG as WARMUP_REQUEST_TAG

try:  # vLLM >= 0.10 has the aggregate base; older versions only StatLoggerBase.
    from vllm.v1.metrics.loggers import AggregateStatLoggerBase as _Base
except ImportError:  # pragma: no cover - depends on the installed vLLM
    from vllm.v1.metrics.loggers import StatLoggerBase as _Base  # type: ignore[assignment]

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.metrics.stats import IterationStats, SchedulerStats

logger = logging.getLogger(__name__)

PLUGIN_GROUP = "vllm.stat_logger_plugins"
PLUGIN_NAME = "gemma4_latency"

#: Bucket upper bounds (seconds): 5 ms steps near the SLO, boundaries at 0.1, 0.2, 0.25, 0.3.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06, 0.075,
    0.1, 0.125, 0.15, 0.175, 0.2, 0.225, 0.25, 0.275, 0.3, 0.35, 0.4,
    0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

TTFT_METRIC = "gemma4_request_time_to_first_token_seconds"
E2E_METRIC = "gemma4_request_e2e_latency_seconds"
ITL_METRIC = "gemma4_request_inter_token_latency_seconds"
METRIC_NAMES: tuple[str, ...] = (TTFT_METRIC, E2E_METRIC, ITL_METRIC)
LABEL_NAMES: tuple[str, ...] = ("model_name", "engine")


@dataclass(frozen=True)
class LatencyHistograms:
    """The three histogram families, registered once per registry."""

    ttft: Histogram
    e2e: Histogram
    itl: Histogram


_lock = threading.Lock()
# Keyed by the registry object itself, weakly: an id() key outlives a collected registry, and a
# new registry that reuses its address would get the old, unregistered families (seen in tests).
_families: weakref.WeakKeyDictionary[CollectorRegistry, LatencyHistograms] = (
    weakref.WeakKeyDictionary()
)


def latency_histograms(registry: CollectorRegistry | None = None) -> LatencyHistograms:
    """Return the histogram families for ``registry`` (default ``REGISTRY``), creating them once.

    vLLM may build its stat loggers more than once in one process (elastic EP rebuilds them;
    tests build many), and ``prometheus_client`` refuses to register a name twice, so the
    families live at module level and each logger only takes labelled children.
    """
    reg = REGISTRY if registry is None else registry
    with _lock:
        fam = _families.get(reg)
        if fam is None:
            fam = LatencyHistograms(
                ttft=Histogram(
                    TTFT_METRIC,
                    "Time to first token (arrival to first token), fine buckets around the "
                    "300 ms SLO.",
                    LABEL_NAMES,
                    buckets=LATENCY_BUCKETS,
                    registry=reg,
                ),
                e2e=Histogram(
                    E2E_METRIC,
                    "End-to-end request latency (arrival to finish) in the engine front end, "
                    "fine buckets around the 300 ms SLO.",
                    LABEL_NAMES,
                    buckets=LATENCY_BUCKETS,
                    registry=reg,
                ),
                itl=Histogram(
                    ITL_METRIC,
                    "Inter-token latency between consecutive output batches of a request.",
                    LABEL_NAMES,
                    buckets=LATENCY_BUCKETS,
                    registry=reg,
                ),
            )
            _families[reg] = fam
        return fam


def _served_model_name(vllm_config: Any) -> str:
    model_config = getattr(vllm_config, "model_config", None)
    name = getattr(model_config, "served_model_name", None)
    if isinstance(name, (list, tuple)):  # older versions kept the list
        name = name[0] if name else None
    if not name:
        name = getattr(model_config, "model", None)
    return str(name) if name else "unknown"


def _normalize_engine_indexes(engine_indexes: int | Sequence[int] | None) -> list[int]:
    if engine_indexes is None:
        return [0]
    if isinstance(engine_indexes, int):  # per-engine factory call: cls(vllm_config, idx)
        return [engine_indexes]
    return [int(i) for i in engine_indexes] or [0]


class Gemma4LatencyStatLogger(_Base):
    """vLLM stat logger that records TTFT, ITL and e2e latency into fine-bucket histograms."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        engine_indexes: int | Sequence[int] | None = None,
        *,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.vllm_config = vllm_config
        self.engine_indexes = _normalize_engine_indexes(engine_indexes)
        self.model_name = _served_model_name(vllm_config)
        self._families = latency_histograms(registry)
        self._children: dict[int, tuple[Any, Any, Any]] = {}
        for idx in self.engine_indexes:
            self._children_for(idx)  # create the series up front: 0 counts, not absent

    def _children_for(self, engine_idx: int) -> tuple[Any, Any, Any]:
        children = self._children.get(engine_idx)
        if children is None:
            labels = (self.model_name, str(engine_idx))
            children = (
                self._families.ttft.labels(*labels),
                self._families.e2e.labels(*labels),
                self._families.itl.labels(*labels),
            )
            self._children[engine_idx] = children
        return children

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        """Observe the TTFTs, ITLs and finished-request e2e latencies of one output batch."""
        if isinstance(mm_cache_stats, int) and not isinstance(mm_cache_stats, bool):
            # Older vLLM passed engine_idx as the third positional argument.
            engine_idx = mm_cache_stats
        if iteration_stats is None:
            return
        ttft, e2e, itl = self._children_for(engine_idx)
        _observe_all(ttft, getattr(iteration_stats, "time_to_first_tokens_iter", ()))
        _observe_all(itl, getattr(iteration_stats, "inter_token_latencies_iter", ()))
        for finished in getattr(iteration_stats, "finished_requests", ()):
            latency = getattr(finished, "e2e_latency", None)
            if WARMUP_REQUEST_TAG in (getattr(finished, "request_id", None) or ""):
                continue  # the start-up warm-up's synthetic requests are not users' latency
            if latency is not None and latency >= 0:
                e2e.observe(latency)

    def log(self) -> None:
        """Nothing to print: the histograms are scraped from /metrics."""

    def log_engine_initialized(self) -> None:
        logger.info(
            "gemma4_latency stat logger active: %s for model_name=%r engines=%s",
            ", ".join(METRIC_NAMES),
            self.model_name,
            self.engine_indexes,
        )

    def record_sleep_state(self, *args: Any, **kwargs: Any) -> None:
        """Sleep state is vLLM's own gauge; nothing to record here."""

    def record_admission_rejection(self, reason: str) -> None:
        """Rejected requests never produce latencies; nothing to record."""


def _observe_all(child: Any, values: Iterable[float]) -> None:
    for value in values:
        if value >= 0:
            child.observe(value)


def vllm_has_plugin_group() -> bool:
    """Whether the installed vLLM loads ``vllm.stat_logger_plugins`` entry points."""
    try:
        from vllm.v1.metrics import loggers
    except ImportError:
        return False
    return hasattr(loggers, "load_stat_logger_plugin_factories")


_hook_installed = False


def install_fallback_hook() -> bool:
    """On vLLM without the plugin group, inject this logger into ``AsyncLLM(stat_loggers=...)``.

    Returns True if a hook was installed (now or before), False when it is not needed (the
    installed vLLM loads the entry point itself). Safe to call many times and in any process.
    """
    global _hook_installed
    if vllm_has_plugin_group():
        return False
    if _hook_installed:
        return True
    from vllm.v1.engine import async_llm

    original = async_llm.AsyncLLM.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        loggers = list(kwargs.get("stat_loggers") or [])
        if Gemma4LatencyStatLogger not in loggers:
            loggers.append(Gemma4LatencyStatLogger)
        kwargs["stat_loggers"] = loggers
        original(self, *args, **kwargs)

    async_llm.AsyncLLM.__init__ = __init__  # type: ignore[method-assign]
    _hook_installed = True
    logger.info("vLLM has no %s group: gemma4_latency injected through AsyncLLM", PLUGIN_GROUP)
    return True
