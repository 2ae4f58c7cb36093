"""Tests of the gemma4_latency stat-logger plugin (gemma4_batched_encoder.latency_metrics).

Unit tests drive real vLLM ``IterationStats`` through vLLM's own update methods (the ones the
output processor calls) and read the histograms back from a private registry. The e2e test
sends real requests to the shared local vLLM (root conftest ``vllm_server``) and compares the
plugin's histograms with vLLM's own on /metrics.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from vllm.v1.engine import EngineCoreOutput, FinishReason
from vllm.v1.metrics import loggers as vllm_loggers
from vllm.v1.metrics.stats import (
    FinishedRequestStats,
    IterationStats,
    LoRARequestStates,
    RequestStateStats,
)

from gemma4_batched_encoder import latency_metrics as lm
from gemma4_batched_encoder import warmup

PLUGIN_SRC = Path(__file__).resolve().parents[1] / "src"


def _config(name: str = "gemma-test") -> Any:
    # The logger reads only model_config.served_model_name from VllmConfig.
    return SimpleNamespace(model_config=SimpleNamespace(served_model_name=name))


def _value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    v = reg.get_sample_value(name, labels)
    return 0.0 if v is None else v


def _request_iterations(
    arrival: float, ttft: float, itls: list[float], finish: bool = True
) -> list[IterationStats]:
    """One IterationStats per engine step of a request, built by vLLM's own update methods."""
    req = RequestStateStats(arrival_time=arrival)
    lora = LoRARequestStates(log_stats=True)
    iters: list[IterationStats] = []
    core_ts = 1000.0  # engine-core monotonic clock
    it = IterationStats()
    it.iteration_timestamp = arrival + ttft
    it.update_from_output(
        EngineCoreOutput(request_id="r", new_token_ids=[1]), core_ts, True, req, lora, None
    )
    iters.append(it)
    t = arrival + ttft
    for gap in itls:
        core_ts += gap
        t += gap
        it = IterationStats()
        it.iteration_timestamp = t
        it.update_from_output(
            EngineCoreOutput(request_id="r", new_token_ids=[2]), core_ts, False, req, lora, None
        )
        iters.append(it)
    if finish:
        iters[-1].update_from_finished_request(
            finish_reason=FinishReason.LENGTH,
            request_id="r",
            num_prompt_tokens=8,
            max_tokens_param=len(itls) + 1,
            req_stats=req,
        )
    return iters


def test_buckets_resolve_the_slo() -> None:
    b = lm.LATENCY_BUCKETS
    assert list(b) == sorted(b)
    for boundary in (0.1, 0.2, 0.25, 0.3):
        assert boundary in b
    # 10 ms .. 1 s: no gap wider than 25 ms up to the SLO, 50 ms up to 0.4 s, 250 ms to 1 s.
    below = [x for x in b if 0.01 <= x <= 0.3]
    assert max(y - x for x, y in itertools.pairwise(below)) <= 0.025 + 1e-9
    assert b[0] <= 0.01 and 1.0 in b and b[-1] >= 60


def test_is_a_vllm_stat_logger_with_the_aggregate_interface() -> None:
    assert issubclass(lm.Gemma4LatencyStatLogger, vllm_loggers.StatLoggerBase)
    assert issubclass(lm.Gemma4LatencyStatLogger, vllm_loggers.AggregateStatLoggerBase)
    assert not issubclass(lm.Gemma4LatencyStatLogger, vllm_loggers.PrometheusStatLogger)


def test_records_ttft_itl_e2e_from_real_iteration_stats() -> None:
    reg = CollectorRegistry()
    logger = lm.Gemma4LatencyStatLogger(_config(), engine_indexes=[0], registry=reg)
    labels = {"model_name": "gemma-test", "engine": "0"}
    # Series exist at 0 before any traffic (rate() needs the zero sample).
    assert reg.get_sample_value(f"{lm.E2E_METRIC}_count", labels) == 0.0

    # Request A: TTFT 0.12 s, 3 more tokens 20 ms apart -> e2e 0.18 s.
    # Request B: TTFT 0.22 s, 2 more tokens 50 ms apart -> e2e 0.32 s (misses the SLO).
    for it in _request_iterations(100.0, 0.12, [0.02, 0.02, 0.02]) + _request_iterations(
        200.0, 0.22, [0.05, 0.05]
    ):
        logger.record(scheduler_stats=None, iteration_stats=it, engine_idx=0)

    ttft = f"{lm.TTFT_METRIC}_bucket"
    assert _value(reg, f"{lm.TTFT_METRIC}_count", **labels) == 2
    assert _value(reg, ttft, le="0.1", **labels) == 0
    assert _value(reg, ttft, le="0.125", **labels) == 1  # vLLM's buckets: both in (0.1, 0.25]
    assert _value(reg, ttft, le="0.2", **labels) == 1
    assert _value(reg, ttft, le="0.225", **labels) == 2
    assert _value(reg, f"{lm.TTFT_METRIC}_sum", **labels) == pytest.approx(0.34)

    e2e = f"{lm.E2E_METRIC}_bucket"
    assert _value(reg, f"{lm.E2E_METRIC}_count", **labels) == 2
    assert _value(reg, e2e, le="0.2", **labels) == 1
    assert _value(reg, e2e, le="0.3", **labels) == 1  # the SLO bucket
    assert _value(reg, e2e, le="0.35", **labels) == 2
    assert _value(reg, f"{lm.E2E_METRIC}_sum", **labels) == pytest.approx(0.50)

    assert _value(reg, f"{lm.ITL_METRIC}_count", **labels) == 5
    assert _value(reg, f"{lm.ITL_METRIC}_bucket", le="0.02", **labels) == 3
    assert _value(reg, f"{lm.ITL_METRIC}_bucket", le="0.05", **labels) == 5
    assert _value(reg, f"{lm.ITL_METRIC}_sum", **labels) == pytest.approx(0.16)


def test_finished_request_stats_and_engine_label() -> None:
    reg = CollectorRegistry()
    logger = lm.Gemma4LatencyStatLogger(_config("m"), engine_indexes=[0, 1], registry=reg)
    it = IterationStats()
    it.finished_requests.append(
        FinishedRequestStats(finish_reason=FinishReason.STOP, e2e_latency=0.29)
    )
    it.time_to_first_tokens_iter.append(0.05)
    logger.record(None, it, mm_cache_stats=None, engine_idx=1)
    # An engine index seen only at record time still gets its own series.
    logger.record(None, it, engine_idx=3)
    for engine in ("1", "3"):
        labels = {"model_name": "m", "engine": engine}
        assert _value(reg, f"{lm.E2E_METRIC}_bucket", le="0.3", **labels) == 1
        assert _value(reg, f"{lm.E2E_METRIC}_bucket", le="0.275", **labels) == 0
        assert _value(reg, f"{lm.TTFT_METRIC}_count", **labels) == 1
    assert _value(reg, f"{lm.E2E_METRIC}_count", model_name="m", engine="0") == 0
    # scheduler-only updates and None are ignored.
    logger.record(None, None, engine_idx=0)
    logger.log()
    logger.log_engine_initialized()
    logger.record_sleep_state(1, 1)


def test_warmup_requests_stay_out_of_the_slo_histogram() -> None:
    """The start-up warm-up's requests (ids as vLLM builds them from warmup.py's request_id)
    are not observed as e2e latency; a user's request with any other id is."""
    reg = CollectorRegistry()
    logger = lm.Gemma4LatencyStatLogger(_config("m"), engine_indexes=[0], registry=reg)
    it = IterationStats()
    for request_id, latency in (
        (f"chatcmpl-{warmup.REQUEST_TAG}42-7-a1b2", 0.9),
        ("chatcmpl-3f2a9c", 0.25),
        (None, 0.1),
    ):
        it.finished_requests.append(
            FinishedRequestStats(
                finish_reason=FinishReason.LENGTH, request_id=request_id, e2e_latency=latency
            )
        )
    logger.record(None, it, engine_idx=0)
    labels = {"model_name": "m", "engine": "0"}
    assert _value(reg, f"{lm.E2E_METRIC}_count", **labels) == 2
    assert _value(reg, f"{lm.E2E_METRIC}_sum", **labels) == pytest.approx(0.35)


def test_per_engine_factory_call_and_old_positional_engine_idx() -> None:
    """Older vLLM called factories per engine as cls(vllm_config, idx) and record(s, i, idx)."""
    reg = CollectorRegistry()
    logger = lm.Gemma4LatencyStatLogger(_config("old"), 2, registry=reg)
    assert logger.engine_indexes == [2]
    it = IterationStats()
    it.time_to_first_tokens_iter.append(0.2)
    logger.record(None, it, 2)
    assert _value(reg, f"{lm.TTFT_METRIC}_count", model_name="old", engine="2") == 1


def test_served_model_name_variants() -> None:
    assert lm._served_model_name(_config("a")) == "a"
    assert lm._served_model_name(_config(["b", "c"])) == "b"
    cfg = SimpleNamespace(model_config=SimpleNamespace(served_model_name=None, model="/m"))
    assert lm._served_model_name(cfg) == "/m"
    assert lm._served_model_name(SimpleNamespace(model_config=None)) == "unknown"


def test_families_registered_once_per_registry() -> None:
    reg = CollectorRegistry()
    a = lm.Gemma4LatencyStatLogger(_config(), [0], registry=reg)
    b = lm.Gemma4LatencyStatLogger(_config(), [0], registry=reg)  # no duplicate error
    assert a._families is b._families


def test_works_through_vllm_stat_logger_manager_semantics() -> None:
    """StatLoggerManager builds aggregate loggers with keyword args and a list of engines."""
    reg = CollectorRegistry()
    factory = lm.Gemma4LatencyStatLogger
    assert isinstance(factory, type) and issubclass(factory, vllm_loggers.AggregateStatLoggerBase)
    logger = factory(vllm_config=_config(), engine_indexes=[0, 1], registry=reg)
    assert logger.engine_indexes == [0, 1]


def test_entry_point_is_declared_and_loads() -> None:
    """vLLM finds the plugin through importlib.metadata (the package must be installed)."""
    eps = importlib.metadata.entry_points(group=lm.PLUGIN_GROUP)
    ours = [ep for ep in eps if ep.name == lm.PLUGIN_NAME]
    assert ours, f"entry point {lm.PLUGIN_GROUP}:{lm.PLUGIN_NAME} not installed"
    assert ours[0].value == "gemma4_batched_encoder.latency_metrics:Gemma4LatencyStatLogger"
    # vLLM's own loader accepts it (it raises TypeError for non-StatLoggerBase classes).
    factories = vllm_loggers.load_stat_logger_plugin_factories()
    assert any(f.__name__ == "Gemma4LatencyStatLogger" for f in factories)


def test_fallback_hook_only_without_plugin_group(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.engine import async_llm

    # This vLLM has the group: the hook is not needed and changes nothing.
    assert lm.vllm_has_plugin_group()
    before = async_llm.AsyncLLM.__init__
    assert lm.install_fallback_hook() is False
    assert async_llm.AsyncLLM.__init__ is before

    # Simulate an older vLLM without the group: AsyncLLM gets the logger injected.
    seen: list[Any] = []

    def fake_init(self: Any, *args: Any, **kwargs: Any) -> None:
        seen.append(kwargs.get("stat_loggers"))

    monkeypatch.delattr(vllm_loggers, "load_stat_logger_plugin_factories")
    monkeypatch.setattr(async_llm.AsyncLLM, "__init__", fake_init)
    monkeypatch.setattr(lm, "_hook_installed", False)
    assert lm.install_fallback_hook() is True
    assert lm.install_fallback_hook() is True  # idempotent
    obj = object.__new__(async_llm.AsyncLLM)
    async_llm.AsyncLLM.__init__(obj, stat_loggers=None)
    async_llm.AsyncLLM.__init__(obj, stat_loggers=[lm.Gemma4LatencyStatLogger])
    assert seen == [[lm.Gemma4LatencyStatLogger], [lm.Gemma4LatencyStatLogger]]


def test_multiprocess_mode_reaches_vllms_metrics_registry(tmp_path: Path) -> None:
    """With PROMETHEUS_MULTIPROC_DIR set (images/entrypoint.sh), the histograms must appear in
    the registry vLLM's /metrics serves (get_prometheus_registry -> MultiProcessCollector)."""
    mp_dir = tmp_path / "mp"
    mp_dir.mkdir()
    code = textwrap.dedent(
        """
        from types import SimpleNamespace
        from prometheus_client import generate_latest
        from vllm.v1.metrics.prometheus import get_prometheus_registry
        from vllm.v1.metrics.stats import IterationStats
        from gemma4_batched_encoder.latency_metrics import Gemma4LatencyStatLogger
        cfg = SimpleNamespace(model_config=SimpleNamespace(served_model_name="mp-model"))
        logger = Gemma4LatencyStatLogger(vllm_config=cfg, engine_indexes=[0])
        it = IterationStats()
        it.time_to_first_tokens_iter.append(0.15)
        logger.record(None, it, engine_idx=0)
        print(generate_latest(get_prometheus_registry()).decode())
        """
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp_dir)}
    env["PYTHONPATH"] = os.pathsep.join([str(PLUGIN_SRC), env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert any(p.name.startswith("histogram_") for p in mp_dir.iterdir())
    fams = {f.name: f for f in text_string_to_metric_families(out.stdout)}
    ttft = fams[lm.TTFT_METRIC]
    samples = {
        (s.name, s.labels.get("le")): s.value
        for s in ttft.samples
        if s.labels.get("model_name") == "mp-model"
    }
    assert samples[(f"{lm.TTFT_METRIC}_count", None)] == 1
    assert samples[(f"{lm.TTFT_METRIC}_bucket", "0.15")] == 1
    assert samples[(f"{lm.TTFT_METRIC}_bucket", "0.125")] == 0
    assert lm.E2E_METRIC in fams and lm.ITL_METRIC in fams


# ----------------------------------------------------------------------------------------
# e2e: the real local vLLM with the plugin
# ----------------------------------------------------------------------------------------
def _hist(text: str, name: str) -> dict[str, float]:
    """count, sum and per-le buckets of a histogram, summed over label sets."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == f"{name}_count":
                out["count"] = out.get("count", 0.0) + s.value
            elif s.name == f"{name}_sum":
                out["sum"] = out.get("sum", 0.0) + s.value
            elif s.name == f"{name}_bucket":
                key = f"le={s.labels['le']}"
                out[key] = out.get(key, 0.0) + s.value
    return out


def _labels(text: str, name: str) -> list[dict[str, str]]:
    return [
        s.labels
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == f"{name}_count"
    ]


def _chat(base_url: str, model: str, content: Any, max_tokens: int, stream: bool) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        f"{base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        resp.read()
        assert resp.status == 200


@pytest.mark.e2e
def test_e2e_histograms_count_real_requests(vllm_server: Any) -> None:
    before = vllm_server.metrics_text()
    assert f"# TYPE {lm.E2E_METRIC} histogram" in before, (
        "gemma4_latency plugin not active on /metrics; server log: " + str(vllm_server.log_path)
    )
    n, max_tokens = 4, 6
    for i in range(n):
        _chat(vllm_server.base_url, vllm_server.model, f"Say hello {i}", max_tokens, i % 2 == 0)
    # vLLM records stats right after the last output; give the output handler a moment.
    deadline = time.monotonic() + 30
    while True:
        after = vllm_server.metrics_text()
        if (
            _hist(after, lm.E2E_METRIC).get("count", 0)
            - _hist(before, lm.E2E_METRIC).get("count", 0)
            >= n
            or time.monotonic() > deadline
        ):
            break
        time.sleep(0.5)

    def delta(text_a: str, text_b: str, name: str, key: str) -> float:
        return _hist(text_b, name).get(key, 0.0) - _hist(text_a, name).get(key, 0.0)

    # Every finished request lands once in ours and once in vLLM's own histogram.
    assert delta(before, after, lm.E2E_METRIC, "count") == n
    assert delta(before, after, "vllm:e2e_request_latency_seconds", "count") == n
    assert delta(before, after, lm.TTFT_METRIC, "count") == n
    assert delta(before, after, "vllm:time_to_first_token_seconds", "count") == n
    assert delta(before, after, lm.ITL_METRIC, "count") == delta(
        before, after, "vllm:inter_token_latency_seconds", "count"
    )
    assert delta(before, after, lm.ITL_METRIC, "count") > 0
    # Same observations: the sums agree with vLLM's.
    assert delta(before, after, lm.E2E_METRIC, "sum") == pytest.approx(
        delta(before, after, "vllm:e2e_request_latency_seconds", "sum"), rel=1e-6, abs=1e-9
    )
    # The SLO bucket exists with the exact label value the rules use.
    assert f"le={0.3}" in _hist(after, lm.E2E_METRIC)
    # Labels match vLLM's (model_name = served model name, engine index).
    labels = _labels(after, lm.E2E_METRIC)
    assert {"model_name": vllm_server.model, "engine": "0"} in [
        {k: v for k, v in lb.items() if k in ("model_name", "engine")} for lb in labels
    ]


def test_each_registry_gets_its_own_families_even_at_a_reused_address() -> None:
    """A registry that is garbage-collected and a new one at the same address (id reuse) must
    not share histogram families: they were cached by id() once, and a test saw 0 counts.
    Refcounting frees each registry at `del`, so the next one usually takes its address; no
    gc.collect() (a full collection of this process's heap took seconds a call in CI)."""
    seen: set[int] = set()
    reused = 0
    for _ in range(50):
        reg = CollectorRegistry()
        lm.latency_histograms(reg).ttft.labels("m", "0").observe(0.1)
        labels = {"model_name": "m", "engine": "0"}
        assert _value(reg, f"{lm.TTFT_METRIC}_count", **labels) == 1
        reused += id(reg) in seen
        seen.add(id(reg))
        del reg
    assert reused, "no registry reused an address: the case was not exercised"


def test_contract_table_lists_every_label():
    """docs/architecture.md is the metric contract: each gemma4_request_* row names exactly the
    labels the registered families carry (``engine`` was missing once)."""
    import re

    text = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    families = lm.latency_histograms(CollectorRegistry())
    columns = (families.ttft, families.e2e, families.itl)
    for name, family in zip(lm.METRIC_NAMES, columns, strict=True):
        (row,) = [line for line in text.splitlines() if line.startswith(f"| `{name}` |")]
        documented = re.findall(r"`([a-z_]+)`", row.split("|")[3])
        assert tuple(family._labelnames) == lm.LABEL_NAMES
        assert sorted(documented) == sorted(lm.LABEL_NAMES), row
