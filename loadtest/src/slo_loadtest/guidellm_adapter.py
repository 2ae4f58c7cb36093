"""The only module that knows guidellm: how to run one rate, and how to read its JSON report.

guidellm's CLI and report schema drift between versions (``benchmark`` became ``run``,
``--rate-type`` became ``--profile``, report fields moved). Everything version-specific is here:
the scenario file we hand to ``guidellm run --scenario`` and the paths we read in its report.
It was written against guidellm 0.8.1; tests/fixtures holds real 0.8.1 reports.

Each rate is its own ``python -m guidellm run`` subprocess in its own session, bounded in wall
time by us (guidellm #431: hangs between constant-rate steps), killed as a process group when
it overruns. With credentials in the target URL it is ``python -m slo_loadtest.guidellm_adapter
run``: guidellm's CLI plus the ``Authorization`` header, which no file guidellm writes holds
(bottom of this module).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slo_loadtest.credentials import scrub

SUPPORTED_VERSIONS = ("0.8.1",)
REPORT_NAME = "guidellm-report.json"


def guidellm_version() -> str:
    try:
        return importlib.metadata.version("guidellm")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@dataclass(frozen=True)
class StepSpec:
    """One guidellm invocation: one workload at one constant rate."""

    target: str
    model: str
    rate: float
    duration_s: float
    warmup_s: float
    data_path: Path
    step_dir: Path
    request_timeout_s: float = 30.0
    max_workers: int = 2
    api_key: str = ""
    # an Authorization header value for every request (HTTP Basic from the target URL's
    # user:password@); like api_key, it reaches guidellm through its environment only
    authorization: str = ""
    tokenizer: str = ""
    sample_size: int | None = 20
    labels: Mapping[str, str] = field(default_factory=dict)
    # merged into every request body (guidellm's backend ``extras.body``)
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    # every request on a new connection (``extras.headers``: ``Connection: close``)
    connection_per_request: bool = False

    @property
    def report_path(self) -> Path:
        return self.step_dir / REPORT_NAME

    @property
    def log_path(self) -> Path:
        return self.step_dir / "guidellm.log"

    @property
    def scenario_path(self) -> Path:
        return self.step_dir / "scenario.json"


@dataclass
class StepOutcome:
    status: str  # "ok" | "timeout" | "error"
    returncode: int | None
    wall_s: float
    report_path: Path | None
    log_path: Path
    message: str = ""


def build_scenario(spec: StepSpec) -> dict[str, Any]:
    """The guidellm 0.8.1 scenario for one step (``guidellm run --scenario FILE``)."""
    backend: dict[str, Any] = {
        "kind": "openai_http",
        "target": spec.target,
        "model": spec.model,
        "request_format": "/v1/chat/completions",
        "stream": True,
        "timeout": spec.request_timeout_s,
        "timeout_connect": min(5.0, spec.request_timeout_s),
    }
    # no api_key here: the scenario is a file in the results; step_env passes the key
    extras: dict[str, Any] = {}
    if spec.extra_body:
        # guidellm 0.8.1 deep-merges extras.body into each request body after it has set model,
        # stream and the output length; the CLI refuses those keys (validation.RESERVED_BODY_KEYS)
        extras["body"] = dict(spec.extra_body)
    if spec.connection_per_request:
        # and extras.headers into each request's headers; httpx closes the connection after the
        # response, so the next request opens (and the server accepts) a new one
        extras["headers"] = {"Connection": "close"}
    if extras:
        backend["extras"] = extras
    scenario: dict[str, Any] = {
        "metadata": {"labels": dict(spec.labels)},
        "spec": {
            "backend": backend,
            "profile": {"kind": "constant", "rate": [spec.rate], "warmup": _warmup(spec.warmup_s)},
            "constraints": [{"kind": "max_duration", "seconds": spec.duration_s}],
            "data": [{"kind": "json_file", "path": str(spec.data_path.resolve())}],
            "outputs": [{"kind": "json", "path": str(spec.report_path.resolve())}],
            # Per-request samples carry whole request bodies (base64 video): keep a few only.
            "metrics": {"kind": "generative", "sample_size": spec.sample_size},
        },
    }
    if spec.tokenizer:
        scenario["spec"]["tokenizer"] = {"kind": "huggingface_auto", "model": spec.tokenizer}
    return scenario


def _warmup(seconds: float) -> float | dict[str, Any]:
    """guidellm reads a bare number below 1 as a *fraction* of the duration; say seconds."""
    return {"mode": "duration", "value": seconds} if seconds > 0 else 0


# guidellm's BenchmarkScenario is a pydantic BaseSettings (prefix GUIDELLM__, nested "__"): it
# fills spec.backend.api_key from this variable, so the key never has to be written to disk
# (api_key is a SecretStr: guidellm's report shows it as '**********', its log not at all)
API_KEY_ENV = "GUIDELLM__SPEC__BACKEND__API_KEY"
# Credentials of the target URL (user:password@) have no such field: guidellm 0.8.1 writes the
# backend's target, in plain text, into its report (twice) and its log, and its extras.headers
# too; api_key can only be sent as Bearer. So guidellm gets the target without them, and the
# step runs `python -m slo_loadtest.guidellm_adapter run ...` (guidellm's own CLI, below), which
# adds the Authorization header from this variable to every request the openai_http backend
# builds, in the main process and in each worker process (spawned: they run this module's top
# level as __mp_main__).
AUTHORIZATION_ENV = "SLO_LOADTEST_GUIDELLM_AUTHORIZATION"
LAUNCHER = "slo_loadtest.guidellm_adapter"


def step_env(spec: StepSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    # only the sweep's own credentials authenticate, as they do the preflight
    env.pop(API_KEY_ENV, None)
    env.pop(AUTHORIZATION_ENV, None)
    if spec.api_key:
        env[API_KEY_ENV] = spec.api_key
    if spec.authorization:
        env[AUTHORIZATION_ENV] = spec.authorization
    env.update(
        {
            "GUIDELLM__MAX_WORKER_PROCESSES": str(spec.max_workers),
            # Nothing in a sweep may reach the hub (the GPU hosts have no network).
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def run_step(spec: StepSpec, timeout_s: float) -> StepOutcome:
    """Run one guidellm invocation, never longer than ``timeout_s`` seconds of wall time."""
    spec.step_dir.mkdir(parents=True, exist_ok=True)
    spec.report_path.unlink(missing_ok=True)
    spec.scenario_path.write_text(json.dumps(build_scenario(spec), indent=2))
    cmd = [
        sys.executable,
        "-m",
        # guidellm's CLI either way; this module's adds the Authorization header (see above)
        LAUNCHER if spec.authorization else "guidellm",
        "run",
        "--scenario",
        str(spec.scenario_path.resolve()),
        "--disable-console-interactive",
    ]
    t0 = time.monotonic()
    with spec.log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=spec.step_dir,
            env=step_env(spec),
            start_new_session=True,
        )
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
            status = "ok"
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, status = None, "timeout"
        except BaseException:  # interrupted (SIGTERM/Ctrl-C): leave no guidellm behind
            _kill_group(proc)
            raise
    wall = time.monotonic() - t0
    report = spec.report_path if spec.report_path.is_file() else None
    if status == "timeout":
        msg = f"guidellm did not finish within {timeout_s:.0f} s and was killed"
        return StepOutcome("timeout", None, wall, report, spec.log_path, msg)
    if rc != 0 or report is None:
        why = f"exit code {rc}" if rc != 0 else "no report written"
        return StepOutcome(
            "error",
            rc,
            wall,
            report,
            spec.log_path,
            f"guidellm failed ({why}): " + scrub(last_error_line(spec.log_path)),
        )
    return StepOutcome("ok", rc, wall, report, spec.log_path)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            # the group may still hold worker processes; SIGKILL them too
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def last_error_line(log_path: Path, limit: int = 400) -> str:
    """The most telling line of a guidellm log: the last exception/error line, else the tail."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines()]
    except OSError:
        return "(no log)"
    lines = [ln for ln in lines if ln]
    keys = ("Error", "error", "Exception", "refused", "failed", "Traceback")
    for ln in reversed(lines):
        if any(k in ln for k in keys) and not ln.startswith("Traceback"):
            return ln[:limit]
    return (lines[-1] if lines else "(empty log)")[:limit]


# --------------------------------------------------------------------------------------------
# Reading reports
# --------------------------------------------------------------------------------------------


@dataclass
class Measurement:
    """One benchmark (one constant rate) of a guidellm report, in our units (ms, req/s)."""

    target_rate: float
    achieved_rate: float | None
    duration_s: float | None
    successful: int
    errored: int
    incomplete: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    ttft_p99_ms: float | None
    itl_median_ms: float | None
    itl_p95_ms: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    dispatch_delay_median_ms: float | None
    dispatch_delay_p95_ms: float | None
    prompt_tokens_mean: float | None
    output_tokens_mean: float | None
    guidellm_rps_mean: float | None = None
    # successful requests with a first streamed token (guidellm's TTFT sample count); fewer than
    # ``successful`` means some requests streamed no content. None: not in the report.
    ttft_samples: int | None = None
    # guidellm's 95% confidence interval of the p95 total latency (distribution-free, from the
    # order statistics of all successful requests); None: guidellm reported none (too few
    # requests, or a guidellm without percentile_cis).
    latency_p95_ci_low_ms: float | None = None
    latency_p95_ci_high_ms: float | None = None
    stop_reason: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    # "<count> x <error>" for the most common errors among the errored requests guidellm kept
    # in its report (``requests.errored[].info.error``; at most --report-samples of them)
    top_errors: list[str] = field(default_factory=list)


@dataclass
class Report:
    guidellm_version: str
    measurements: list[Measurement]
    source: str = ""


def _get(d: Any, *path: str | int) -> Any:
    for p in path:
        if isinstance(d, Mapping) and isinstance(p, str):
            d = d.get(p)
        elif isinstance(d, list) and isinstance(p, int) and -len(d) <= p < len(d):
            d = d[p]
        else:
            return None
        if d is None:
            return None
    return d


def _num(v: Any, scale: float = 1.0) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) * scale


def _count(dist: Any, status: str = "successful") -> int | None:
    count = _get(dist, status, "count")
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def _has_values(dist: Any, status: str) -> bool:
    count = _get(dist, status, "count")
    return not isinstance(count, int) or count > 0


def _pct(dist: Any, name: str, scale: float = 1.0, status: str = "successful") -> float | None:
    if not _has_values(dist, status):
        return None
    return _num(_get(dist, status, "percentiles", name), scale)


def _pct_ci(dist: Any, name: str, bound: str, scale: float = 1.0) -> float | None:
    """A bound of guidellm's confidence interval of a percentile of the successful requests."""
    if not _has_values(dist, "successful"):
        return None
    return _num(_get(dist, "successful", "percentile_cis", name, bound), scale)


def _median(dist: Any, scale: float = 1.0, status: str = "successful") -> float | None:
    if not _has_values(dist, status):
        return None
    return _num(_get(dist, status, "median"), scale)


def is_guidellm_report(data: Any) -> bool:
    return isinstance(data, Mapping) and isinstance(data.get("benchmarks"), list)


def parse_report(data: Mapping[str, Any], source: str = "") -> Report:
    """Read a guidellm 0.8.x JSON report (``--output kind=json``)."""
    if not is_guidellm_report(data):
        raise ValueError(f"{source or 'input'} is not a guidellm JSON report (no 'benchmarks')")
    version = str(
        _get(data, "metadata", "guidellm_version") or _get(data, "metadata", "version") or "unknown"
    )
    labels = _get(data, "config", "metadata", "labels") or {}
    out = [_measurement(b, dict(labels)) for b in data["benchmarks"]]
    return Report(guidellm_version=version, measurements=out, source=source)


def _achieved_rate(b: Mapping[str, Any], successful: int) -> float | None:
    """Successful requests per second over the measured window, from the first request's
    dispatch (or the end of warm-up) to the end of the window. guidellm's own
    ``requests_per_second.successful.mean`` also counts the scheduler's ~0.5 s start delay, which
    makes a short run look slower than it was; both are kept in the summary."""
    sm = b.get("scheduler_metrics") or {}
    start = max(
        (
            v
            for v in (_num(sm.get("measure_start_time")), _num(sm.get("request_start_time")))
            if v is not None
        ),
        default=None,
    )
    end = _num(sm.get("measure_end_time"))
    if start is None or end is None or end <= start:
        return None
    return successful / (end - start)


def _stop_reason(b: Mapping[str, Any]) -> str:
    reasons = _get(b, "scheduler_state", "end_processing_constraints") or {}
    return ",".join(sorted(reasons)) if isinstance(reasons, Mapping) else ""


def _measurement(b: Mapping[str, Any], labels: dict[str, str]) -> Measurement:
    m = b.get("metrics") or {}
    totals = m.get("request_totals") or {}
    rate = _get(b, "config", "strategy", "rate")
    if isinstance(rate, list):
        rate = rate[0] if rate else None
    successful = int(totals.get("successful") or 0)
    return Measurement(
        target_rate=float(rate) if isinstance(rate, int | float) else float("nan"),
        achieved_rate=_achieved_rate(b, successful),
        duration_s=_num(b.get("duration")),
        successful=successful,
        errored=int(totals.get("errored") or 0),
        incomplete=int(totals.get("incomplete") or 0),
        ttft_p50_ms=_pct(m.get("time_to_first_token_ms"), "p50"),
        ttft_p95_ms=_pct(m.get("time_to_first_token_ms"), "p95"),
        ttft_p99_ms=_pct(m.get("time_to_first_token_ms"), "p99"),
        itl_median_ms=_median(m.get("inter_token_latency_ms")),
        itl_p95_ms=_pct(m.get("inter_token_latency_ms"), "p95"),
        latency_p50_ms=_pct(m.get("request_latency"), "p50", 1000.0),
        latency_p95_ms=_pct(m.get("request_latency"), "p95", 1000.0),
        latency_p99_ms=_pct(m.get("request_latency"), "p99", 1000.0),
        # client lag concerns every dispatched request, whatever became of it
        dispatch_delay_median_ms=_median(m.get("request_dispatch_delay"), 1000.0, "total"),
        dispatch_delay_p95_ms=_pct(m.get("request_dispatch_delay"), "p95", 1000.0, "total"),
        prompt_tokens_mean=_num(_get(m, "prompt_token_count", "successful", "mean")),
        output_tokens_mean=_num(_get(m, "output_token_count", "successful", "mean")),
        guidellm_rps_mean=_num(_get(m, "requests_per_second", "successful", "mean")),
        ttft_samples=_count(m.get("time_to_first_token_ms")),
        latency_p95_ci_low_ms=_pct_ci(m.get("request_latency"), "p95", "lower", 1000.0),
        latency_p95_ci_high_ms=_pct_ci(m.get("request_latency"), "p95", "upper", 1000.0),
        stop_reason=_stop_reason(b),
        labels=labels,
        top_errors=top_errors(b),
    )


def _error_text(err: Any) -> str:
    """One line of a guidellm request error: httpx's 'For more information check: <mdn url>'
    tail and the request URL's line break dropped, so equal errors group together."""
    # guidellm stores repr(exception): the line break may be a literal backslash-n
    text = re.split(r"(?:\\n|\n)For more information", str(err), maxsplit=1)[0]
    # a report of an older run (or another tool) may quote a URL with its credentials
    return scrub(" ".join(text.split()))[:300]


def top_errors(b: Mapping[str, Any], limit: int = 3) -> list[str]:
    """The most common errors of a benchmark's sampled errored requests, most common first."""
    counts: dict[str, int] = {}
    for req in _get(b, "requests", "errored") or []:
        err = _get(req, "info", "error")
        if err:
            text = _error_text(err)
            counts[text] = counts.get(text, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
    return [f"{n} x {text}" for text, n in ranked]


def load_report(path: Path) -> Report:
    with Path(path).open() as fh:
        data = json.load(fh)
    return parse_report(data, source=str(path))


# --------------------------------------------------------------------------------------------
# `python -m slo_loadtest.guidellm_adapter run ...`: guidellm's CLI with an Authorization header
# --------------------------------------------------------------------------------------------


def _send_authorization_from_env() -> None:
    """Add the ``AUTHORIZATION_ENV`` header to every request of guidellm's openai_http backend
    (its one header builder: the health check, /v1/models and every generation request)."""
    value = os.environ.get(AUTHORIZATION_ENV)
    if not value:
        return
    from guidellm.backends.openai.http import OpenAIHTTPBackend

    build = getattr(OpenAIHTTPBackend, "_build_headers", None)
    if build is None:  # another guidellm: fail the step rather than send no credentials
        raise RuntimeError(
            f"guidellm {guidellm_version()} has no OpenAIHTTPBackend._build_headers: cannot send "
            "the target URL's credentials (supported: " + ", ".join(SUPPORTED_VERSIONS) + ")"
        )

    def build_headers(
        self: Any, existing_headers: dict[str, str] | None = None
    ) -> dict[str, str] | None:
        return {**(build(self, existing_headers) or {}), "Authorization": value}

    OpenAIHTTPBackend._build_headers = build_headers  # type: ignore[method-assign]


if __name__ in ("__main__", "__mp_main__"):  # guidellm's main process, or one of its workers
    _send_authorization_from_env()
    if __name__ == "__main__":
        from guidellm.cli import cli

        cli()
