"""Running a sweep: preflight, pre-generated datasets, one bounded guidellm run per rate,
an optional search past the last rate, and a summary that is written even when it goes wrong.

Order: workload by workload, rates ascending. A rate that guidellm could not finish (timeout,
crash, server unreachable) is followed by a health probe of the server; if the server does not
answer, the sweep stops there and every remaining rate is recorded as ``not_run``, so the report
names the failing rate. Nothing waits longer than a step's wall-time bound.
"""

from __future__ import annotations

import json
import math
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from slo_loadtest import guidellm_adapter as gl
from slo_loadtest.config import SweepConfig
from slo_loadtest.credentials import redact_url, split_userinfo
from slo_loadtest.dataset import Dataset, DatasetWriter
from slo_loadtest.verdict import (
    STATUS_ERROR,
    STATUS_NOT_RUN,
    STATUS_OK,
    RateResult,
    is_content_note,
    judge_result,
    no_content_hint,
    rate_verdict,
)

Log = Callable[[str], None]
MAX_SEARCH_PROBES = 12


def rate_tag(rate: float) -> str:
    return f"r{rate:g}".replace(".", "p")


def _endpoint(target: str, path: str, authorization: str = "") -> tuple[str, dict[str, str]]:
    """The URL of ``path`` on the target, without credentials (so every message may quote it),
    and the headers that authenticate: ``authorization`` (an ``Authorization`` value), else HTTP
    Basic from the target's ``user:password@`` (urllib would take those for a host name)."""
    url, basic = split_userinfo(_base(target))
    auth = authorization or basic
    return url + path, ({"Authorization": auth} if auth else {})


def served_models(target: str, authorization: str = "", timeout_s: float = 10.0) -> list[str]:
    """The model names the server lists at /v1/models; raises ConnectionError when it can't."""
    url, headers = _endpoint(target, "/v1/models", authorization)
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout_s
        ) as resp:
            data = json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        raise ConnectionError(f"{url}: HTTP {exc.code} {_error_body(exc)}") from exc
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ConnectionError(f"{url}: {getattr(exc, 'reason', exc)}") from exc
    models = [m.get("id") for m in (data or {}).get("data", []) if isinstance(m, dict)]
    models = [str(m) for m in models if m]
    if not models:
        raise ConnectionError(f"{url} lists no models")
    return models


def resolve_model(target: str, authorization: str = "", timeout_s: float = 10.0) -> str:
    """The first model the server lists at /v1/models; raises ConnectionError when it can't."""
    return served_models(target, authorization, timeout_s)[0]


def probe_request(
    target: str,
    model: str,
    authorization: str = "",
    extra_body: dict[str, Any] | None = None,
    timeout_s: float = 60.0,
) -> None:
    """One real chat completion (one output token, the sweep's extra body), so a request every
    rate would fail (auth, a refused body key, a broken server) is reported with the server's
    own error before the sweep starts. Raises ConnectionError."""
    body = {
        **(extra_body or {}),
        "model": model,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
        "stream": False,
    }
    url, headers = _endpoint(target, "/v1/chat/completions", authorization)
    headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        raise ConnectionError(f"{url}: HTTP {exc.code} {_error_body(exc)}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise ConnectionError(f"{url}: {getattr(exc, 'reason', exc)}") from exc


def _base(target: str) -> str:
    return target.rstrip("/").removesuffix("/v1")


def _error_body(exc: urllib.error.HTTPError, limit: int = 300) -> str:
    """The server's error message (vLLM: {"error": {"message": ...}}), else the raw body."""
    try:
        raw = exc.read().decode(errors="replace")
    except OSError:
        return str(exc.reason)
    try:
        data = json.loads(raw)
        err = data.get("error", data) if isinstance(data, dict) else data
        msg = err.get("message", err) if isinstance(err, dict) else err
        raw = msg if isinstance(msg, str) else json.dumps(msg)
    except ValueError:
        pass
    return " ".join(raw.split())[:limit] or str(exc.reason)


def server_healthy(target: str, authorization: str = "", timeout_s: float = 5.0) -> bool:
    for path in ("/health", "/v1/models"):
        url, headers = _endpoint(target, path, authorization)
        try:
            req = urllib.request.Request(url, headers=headers)
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            continue
    return False


@dataclass
class SweepOutcome:
    results: list[RateResult]
    model: str
    seed: int
    aborted: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)


class Sweep:
    def __init__(self, cfg: SweepConfig, log: Log = print) -> None:
        self.cfg = cfg
        self.log = log
        self.seed = cfg.seed if cfg.seed else random.SystemRandom().randrange(1, 2**31)
        self.model = cfg.model
        self.results: list[RateResult] = []
        self.timings: dict[str, float] = {"media_s": 0.0, "guidellm_s": 0.0}
        self._writer: DatasetWriter | None = None
        self._current: tuple[str, float] = ("", 0.0)

    # -- public ----------------------------------------------------------------------------

    def run(self) -> SweepOutcome:
        cfg = self.cfg
        self.log(
            f"slo-loadtest: target {redact_url(cfg.target)}, workloads {','.join(cfg.workloads)}, "
            f"rates {','.join(f'{r:g}' for r in cfg.rates)}, {cfg.duration_s:g} s each"
        )
        if cfg.extra_body:
            self.log(f"extra request body: {json.dumps(cfg.extra_body, sort_keys=True)}")
        if cfg.connection_per_request:
            self.log("a new connection for every request (Connection: close)")
        try:
            try:
                self._preflight()
            except ConnectionError as exc:
                return self._abort_before_start(str(exc))
            try:
                self._writer = DatasetWriter(
                    cfg.effective_data_dir, cfg.shape, self.seed, cfg.tokenizer or None
                )
                datasets = self._prepare(cfg.rates)
            except (OSError, RuntimeError, ValueError) as exc:
                return self._abort_before_start(f"dataset generation failed: {exc}")
            for workload in cfg.workloads:
                aborted = self._sweep_workload(workload, datasets)
                if aborted:
                    self._mark_not_run(workload)
                    return self._outcome(aborted)
        except KeyboardInterrupt:
            # SIGTERM lands here too (cli._raise_interrupt), the preflight included
            workload, rate = self._current
            self._mark_not_run(workload)
            where = f"during {workload} {rate:g} req/s" if workload else "before the first rate"
            return self._outcome(
                {
                    "workload": workload,
                    "rate": rate if workload else None,
                    "reason": f"interrupted {where}",
                }
            )
        return self._outcome(None)

    def _preflight(self) -> None:
        """The server lists the model and answers one real request; raises ConnectionError."""
        cfg = self.cfg
        try:
            models = served_models(cfg.target_url, cfg.authorization)
        except ConnectionError as exc:
            raise ConnectionError(f"target unreachable: {exc}") from None
        if not self.model:
            self.model = models[0]
            self.log(f"model: {self.model} (from /v1/models)")
        elif self.model not in models:
            raise ConnectionError(
                f"model {self.model!r} is not served by {redact_url(cfg.target)}; /v1/models "
                "lists: " + ", ".join(models)
            )
        try:
            probe_request(
                cfg.target_url,
                self.model,
                cfg.authorization,
                cfg.extra_body,
                cfg.request_timeout_s,
            )
        except ConnectionError as exc:
            raise ConnectionError(f"preflight request failed: {exc}") from None

    def _server_healthy(self) -> bool:
        return server_healthy(self.cfg.target_url, self.cfg.authorization)

    # -- steps -----------------------------------------------------------------------------

    def _prepare(self, rates: tuple[float, ...]) -> dict[tuple[str, float], Dataset]:
        """Every dataset and media file of the listed rates, before anything is sent."""
        assert self._writer is not None
        t0 = time.monotonic()
        out = {}
        for workload in self.cfg.workloads:
            for rate in rates:
                out[(workload, rate)] = self._writer.write(
                    workload, rate, self.cfg.duration_s, rate_tag(rate)
                )
        dt = time.monotonic() - t0
        self.timings["media_s"] += dt
        rows = sum(d.rows for d in out.values())
        self.log(
            f"datasets: {rows} rows for {len(out)} steps written in {dt:.1f} s "
            f"({self.cfg.effective_data_dir})"
        )
        return out

    def _sweep_workload(
        self, workload: str, datasets: dict[tuple[str, float], Dataset]
    ) -> dict[str, Any] | None:
        for rate in self.cfg.rates:
            r = self._step(workload, rate, datasets[(workload, rate)])
            if r.status != STATUS_OK and not self._server_healthy():
                return {
                    "workload": workload,
                    "rate": rate,
                    "reason": f"server stopped answering at {workload} {rate:g} req/s: {r.message}",
                }
            if every_request_failed(r):
                return self._all_failed(r)
        if self.cfg.search_beyond:
            return self._search(workload)
        return None

    def _step(self, workload: str, rate: float, ds: Dataset, probe: bool = False) -> RateResult:
        cfg = self.cfg
        self._current = (workload, rate)
        spec = gl.StepSpec(
            # no credentials in guidellm's target: it writes the target into its scenario,
            # report and log; they travel in its environment (api_key, authorization)
            target=cfg.target_url,
            model=self.model,
            rate=rate,
            duration_s=cfg.duration_s,
            warmup_s=cfg.warmup_s,
            data_path=ds.path,
            step_dir=cfg.out / "steps" / f"{workload}-{rate_tag(rate)}",
            request_timeout_s=cfg.request_timeout_s,
            max_workers=cfg.max_workers,
            api_key=cfg.api_key,
            authorization=cfg.target_authorization,
            tokenizer=cfg.tokenizer,
            sample_size=cfg.report_samples,
            labels={"workload": workload, "rate": f"{rate:g}", "tool": "slo-loadtest"},
            extra_body=cfg.extra_body,
            connection_per_request=cfg.connection_per_request,
        )
        self.log(
            f"[{workload} {rate:g} req/s] guidellm run ({ds.rows} rows, bound "
            f"{cfg.effective_step_timeout_s:.0f} s)"
        )
        outcome = gl.run_step(spec, cfg.effective_step_timeout_s)
        self.timings["guidellm_s"] += outcome.wall_s
        r = RateResult(
            workload=workload,
            target_rate=rate,
            status=outcome.status,
            message=outcome.message,
            wall_s=round(outcome.wall_s, 2),
            guidellm_version=gl.guidellm_version(),
            search_probe=probe,
        )
        if outcome.report_path is not None:
            r.report_path = str(outcome.report_path)
            try:
                report = gl.load_report(outcome.report_path)
                if report.measurements:
                    r.measurement = report.measurements[0]
                    r.measurement.target_rate = rate
                    r.guidellm_version = report.guidellm_version
            except (ValueError, OSError) as exc:
                r.status, r.message = STATUS_ERROR, f"unreadable guidellm report: {exc}"
        if r.status == STATUS_OK and r.measurement is None:
            r.status, r.message = STATUS_ERROR, "guidellm report has no benchmark"
        judge_result(r, cfg.criteria)
        self.results.append(r)
        self.log(self._line(r))
        return r

    def _line(self, r: RateResult) -> str:
        m = r.measurement
        head = f"[{r.workload} {r.target_rate:g} req/s]"
        if r.status != STATUS_OK or m is None:
            return f"{head} {r.status.upper()}: {r.message}"

        def f(v: float | None) -> str:
            return "-" if v is None else f"{v:.0f}"

        notes = "".join(
            f"\n{head} note: {n}"
            + (f" ({no_content_hint(self.cfg.extra_body)})" if is_content_note(n) else "")
            for n in r.notes
        )
        return (
            f"{head} {rate_verdict(r).upper()} achieved "
            f"{(m.achieved_rate or 0):.2f} req/s, TTFT p95 {f(m.ttft_p95_ms)} ms, "
            f"total p95 {f(m.latency_p95_ms)} ms, ok/err/inc {m.successful}/{m.errored}/"
            f"{m.incomplete}, dispatch p95 {f(m.dispatch_delay_p95_ms)} ms"
            + ("" if r.passed else f" ({'; '.join(r.reasons)})")
            + notes
        )

    # -- search past the last rate -----------------------------------------------------------

    def next_probe(self, passed: list[float], failed: list[float]) -> float | None:
        """Pure search policy: grow the step geometrically while rates pass, then bisect
        between the highest pass and the lowest failure above it."""
        cfg = self.cfg
        lo = max(passed) if passed else None
        hi_candidates = [f for f in failed if lo is None or f > lo]
        hi = min(hi_candidates) if hi_candidates else None
        if lo is None:
            return None
        if hi is None:
            last = max(cfg.rates)
            step0 = cfg.search_step if cfg.search_step > 0 else last
            n_beyond = len([p for p in passed if p > last])
            nxt = lo + step0 * (2**n_beyond)
            nxt = min(nxt, cfg.search_max_rate)
            return None if nxt <= lo else _round_rate(nxt)
        if hi - lo <= cfg.search_resolution:
            return None
        mid = _round_rate((lo + hi) / 2)
        return None if mid <= lo or mid >= hi else mid

    def _search(self, workload: str) -> dict[str, Any] | None:
        rs = [r for r in self.results if r.workload == workload]
        if not rs or not all(r.passed for r in rs):
            self.log(f"[{workload}] search beyond: not started (not every listed rate passed)")
            return None
        passed = [r.target_rate for r in rs]
        failed: list[float] = []
        assert self._writer is not None
        for _ in range(MAX_SEARCH_PROBES):
            rate = self.next_probe(passed, failed)
            if rate is None:
                break
            t0 = time.monotonic()
            ds = self._writer.write(workload, rate, self.cfg.duration_s, rate_tag(rate))
            self.timings["media_s"] += time.monotonic() - t0
            r = self._step(workload, rate, ds, probe=True)
            (passed if r.passed else failed).append(rate)
            if r.status != STATUS_OK and not self._server_healthy():
                return {
                    "workload": workload,
                    "rate": rate,
                    "reason": f"server stopped answering at {workload} {rate:g} req/s "
                    f"(search): {r.message}",
                }
            if every_request_failed(r):
                return self._all_failed(r)
        self.log(f"[{workload}] search beyond: highest passing {max(passed):g} req/s")
        return None

    # -- endings -----------------------------------------------------------------------------

    def _all_failed(self, r: RateResult) -> dict[str, Any]:
        m = r.measurement
        assert m is not None
        errors = "; ".join(m.top_errors) or "no error text in the guidellm report"
        return {
            "workload": r.workload,
            "rate": r.target_rate,
            "reason": f"every request failed at {r.workload} {r.target_rate:g} req/s "
            f"({m.errored} errored, none successful), so the higher rates would say nothing "
            f"about the server; most common errors: {errors}",
        }

    def _mark_not_run(self, from_workload: str) -> None:
        done = {(r.workload, r.target_rate) for r in self.results}
        for w in self.cfg.workloads:
            for rate in self.cfg.rates:
                if (w, rate) not in done:
                    self.results.append(
                        RateResult(
                            workload=w, target_rate=rate, status=STATUS_NOT_RUN, message="not run"
                        )
                    )

    def _abort_before_start(self, reason: str) -> SweepOutcome:
        self.log(f"ABORT: {reason}")
        first = self.cfg.workloads[0]
        self.results.append(
            RateResult(
                workload=first, target_rate=self.cfg.rates[0], status=STATUS_ERROR, message=reason
            )
        )
        self._mark_not_run(first)
        return self._outcome({"workload": first, "rate": self.cfg.rates[0], "reason": reason})

    def _outcome(self, aborted: dict[str, Any] | None) -> SweepOutcome:
        if aborted:
            self.log(f"sweep stopped: {aborted['reason']}")
        return SweepOutcome(
            results=self.results,
            model=self.model,
            seed=self.seed,
            aborted=aborted,
            timings=self.timings,
        )


def every_request_failed(r: RateResult) -> bool:
    """A rate with no successful request and errors other than timeouts: the requests
    themselves are refused (wrong model, auth, a body the server rejects, a media limit), not
    too many for the server. Timeouts alone are overload, which the verdict judges as a failure."""
    m = r.measurement
    if r.status != STATUS_OK or m is None or m.successful > 0 or m.errored == 0:
        return False
    return not m.top_errors or not all("Timeout" in e for e in m.top_errors)


def _round_rate(r: float) -> float:
    return math.floor(r * 100 + 0.5) / 100


def config_record(cfg: SweepConfig, seed: int) -> dict[str, Any]:
    """The configuration as stored in the summary (no secrets)."""
    d = asdict(cfg)
    d.pop("api_key", None)
    d["target"] = redact_url(cfg.target)
    d["pushgateway"] = redact_url(cfg.pushgateway)
    d["seed"] = seed
    d["out"] = str(cfg.out)
    d["data_dir"] = str(cfg.effective_data_dir)
    d["step_timeout_s"] = cfg.effective_step_timeout_s
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in d.items()}
