"""Judging one rate, and a whole workload's sweep, against the SLO.

A rate passes when all of these hold:

* p95 total request latency (client side, successful requests) <= the SLO (default 300 ms);
* achieved rate >= 95 % of the target rate;
* errored requests <= 1 % of all requests (``--max-error-ratio``; 0: none allowed);
* the client kept up: p95 of guidellm's request dispatch delay (how late a request left the
  client compared with its schedule) <= 50 ms. Above that the client, not the server, set the
  pace and the latencies are not those of the target rate (coordinated omission), so such a rate
  is *inconclusive*: neither passed nor failed (``RateResult.inconclusive``), when every other
  failed check is one the client's pace explains (p95 over the SLO, achieved rate short,
  incomplete requests, none finished while requests were in flight; :func:`failed_checks`).
  Errors above the maximum, an exhausted dataset, or no request succeeding with none in flight
  still fail it: a server failure is not hidden behind "rerun with a faster client";
* at most ``ceil(rate x SLO) + 1`` requests were left incomplete when the duration ended: more
  means requests older than the SLO were still running, which the latency percentiles of the
  successful requests cannot show;
* the rate actually ran (guidellm produced a report with at least one successful request).

Notes (``RateResult.notes``) never change the verdict. Two are kept today. A *marginal* rate:
the SLO lies inside guidellm's 95% confidence interval of the p95 total latency, so a rerun of
the same length may well give the other verdict (seen on the H200: one server failed 25 req/s at
331 ms and passed 30 at 242 ms with ~200 requests a rate); a longer ``--duration`` narrows the
interval. And successful requests that streamed no content: TTFT and ITL are timed from the
first and later streamed text deltas; a model that emits only special tokens (dummy weights)
streams none, because vLLM drops special tokens from streamed text, so those columns stay empty
(or ITL reads 0) although the total latency, which the SLO judges, is measured.

A workload's *highest passing rate* is the highest tested rate such that it and every lower
tested rate passed, so one lucky rate above a failing one does not count; an inconclusive rate
ends it as a failure would. A workload's verdict (:func:`workload_verdict`) is ``inconclusive``
only when its outcome depends on an inconclusive rate: a definite failure still fails it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from slo_loadtest.config import Criteria
from slo_loadtest.guidellm_adapter import Measurement

STATUS_OK = "ok"  # guidellm ran and wrote a report
STATUS_TIMEOUT = "timeout"  # killed by our wall-time bound
STATUS_ERROR = "error"  # guidellm failed / server unreachable
STATUS_NOT_RUN = "not_run"  # the sweep stopped before this rate

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
BEHIND = "client fell behind"  # how the reason that makes a rate inconclusive starts


@dataclass
class RateResult:
    workload: str
    target_rate: float
    status: str = STATUS_OK
    passed: bool = False
    reasons: list[str] = field(default_factory=list)
    measurement: Measurement | None = None
    message: str = ""
    report_path: str = ""
    guidellm_version: str = ""
    wall_s: float | None = None
    search_probe: bool = False
    notes: list[str] = field(default_factory=list)
    # the client could not keep the schedule: not judged (see the module doc)
    inconclusive: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        m = d.pop("measurement") or {}
        m.pop("target_rate", None)
        d.update(m)
        return d


def allowed_incomplete(rate: float, slo_ms: float) -> int:
    return math.ceil(rate * slo_ms / 1000.0) + 1


def failed_checks(m: Measurement, c: Criteria) -> list[tuple[str, bool]]:
    """Each failed check as (reason, pace-dependent): whether a client that fell behind can
    explain it. A late client sends less (achieved rate short), its requests queue behind one
    another (p95 over the SLO) and are still running when the duration ends (incomplete; a
    window where none finished at all: no successful requests, hence no p95 or achieved rate).
    Errors above the maximum and the dataset running out are not its pace, nor is a window where
    no request succeeded and none was left in flight (all errored, or none sent), nor a report
    lacking a p95 or achieved rate although requests succeeded."""
    out: list[tuple[str, bool]] = []
    total = m.successful + m.errored + m.incomplete
    # nothing finished while requests were in flight: the client's pace can explain it
    unfinished = m.successful == 0 and m.incomplete > 0
    if m.successful == 0:
        out.append(("no successful requests", unfinished))
    if m.latency_p95_ms is None:
        out.append(("no p95 latency", unfinished))
    elif m.latency_p95_ms > c.slo_ms:
        out.append((f"p95 latency {m.latency_p95_ms:.0f} ms > SLO {c.slo_ms:g} ms", True))
    if m.achieved_rate is None:
        out.append(("no achieved rate", unfinished))
    elif m.achieved_rate < c.min_achieved_ratio * m.target_rate:
        out.append(
            (
                f"achieved {m.achieved_rate:.2f} req/s < {c.min_achieved_ratio:.0%} of "
                f"{m.target_rate:g}",
                True,
            )
        )
    # a *maximum*: exactly the ratio passes, so --max-error-ratio 0 means "no errors", not
    # "every rate fails"
    if total and m.errored / total > c.max_error_ratio:
        # the error text says why (a refused body, auth, a media limit, timeouts)
        top = f" (most common: {'; '.join(m.top_errors)})" if m.top_errors else ""
        out.append((f"errors {m.errored}/{total} > {c.max_error_ratio:.0%}{top}", False))
    if m.dispatch_delay_p95_ms is not None and m.dispatch_delay_p95_ms > c.max_dispatch_delay_ms:
        out.append(
            (
                f"{BEHIND}: p95 dispatch delay {m.dispatch_delay_p95_ms:.0f} ms > "
                f"{c.max_dispatch_delay_ms:g} ms",
                True,
            )
        )
    allowed = allowed_incomplete(m.target_rate, c.slo_ms)
    if m.incomplete > allowed:
        out.append((f"{m.incomplete} incomplete requests > {allowed} allowed in flight", True))
    if m.stop_reason and "requests_exhausted" in m.stop_reason:
        out.append(("dataset ran out of rows before the duration ended", False))
    return out


def judge(m: Measurement, c: Criteria) -> tuple[bool, list[str]]:
    """Return (passed, reasons it failed)."""
    reasons = [why for why, _ in failed_checks(m, c)]
    return (not reasons), reasons


def fell_behind_only(checks: list[tuple[str, bool]]) -> bool:
    """Inconclusive: the client fell behind and every other failed check is pace-dependent."""
    return any(why.startswith(BEHIND) for why, _ in checks) and all(p for _, p in checks)


def no_content_hint(extra_body: Mapping[str, Any] | None) -> str:
    """The likely cause of successful requests that streamed no text, and the fix. With
    ``skip_special_tokens`` already false in the request body (the H100 sitting's sweeps) special
    tokens are not the cause, so the hint says what is left instead of repeating the fix."""
    rest = (
        "ids its tokenizer does not name decode to nothing (a test tokenizer smaller than the "
        "model's vocabulary), and so do byte tokens that never complete a UTF-8 character "
        "(random weights)"
    )
    if (extra_body or {}).get("skip_special_tokens") is False:
        return f"the requests already set skip_special_tokens false; {rest}"
    return (
        "a model that emits only special tokens (dummy weights) streams no text, because vLLM "
        "drops special tokens from streamed text; for such a model pass "
        """--extra-body '{"skip_special_tokens": false}'; """
        f"{rest}"
    )


def _missing(v: float | None) -> bool:
    return v is None or v != v  # None or NaN


def content_notes(m: Measurement) -> list[str]:
    """Plain-language notes when successful requests streamed no content (see module doc);
    :func:`no_content_hint` says the likely cause and the fix."""
    n = m.successful
    if n <= 0:
        return []
    if m.ttft_samples == 0 or (m.ttft_samples is None and _missing(m.ttft_p95_ms)):
        return [
            f"no streamed content arrived: none of the {n} successful requests streamed any "
            "text, so TTFT and ITL were not measured (the total latency, which the SLO judges, "
            "was)"
        ]
    if m.ttft_samples is not None and m.ttft_samples < n:
        return [
            f"streamed content arrived for only {m.ttft_samples} of {n} successful requests, "
            f"so TTFT and ITL rest on those {m.ttft_samples}"
        ]
    out_tokens = m.output_tokens_mean or 0.0
    if m.itl_median_ms == 0 and out_tokens > 1:
        return [
            f"median ITL is 0 ms for {out_tokens:g} output tokens a request: the streamed text "
            "arrived in one piece at most, so TTFT and ITL are not meaningful"
        ]
    return []


MARGINAL = "marginal:"  # how a marginal note starts


def is_content_note(note: str) -> bool:
    """A note about streamed content (content_notes), not a marginal one: the no-content hint
    belongs to these alone (report.py, the sweep's log lines)."""
    return not note.startswith(MARGINAL)


def marginal_notes(m: Measurement, c: Criteria) -> list[str]:
    """A note when the SLO lies inside the p95's confidence interval (see module doc)."""
    lo, hi = m.latency_p95_ci_low_ms, m.latency_p95_ci_high_ms
    if lo is None or hi is None or not lo <= c.slo_ms <= hi:
        return []
    return [
        f"{MARGINAL} the SLO ({c.slo_ms:g} ms) lies inside the 95% confidence interval of the "
        f"p95 total latency, {lo:.0f}..{hi:.0f} ms ({m.successful} requests), so a rerun may "
        "give the other verdict; a longer --duration narrows the interval"
    ]


def judge_result(r: RateResult, c: Criteria) -> RateResult:
    r.inconclusive = False
    if r.status != STATUS_OK or r.measurement is None:
        r.passed = False
        r.notes = []
        if not r.reasons:
            r.reasons = [r.message or r.status]
        return r
    checks = failed_checks(r.measurement, c)
    r.reasons = [why for why, _ in checks]
    r.passed = not checks
    # the other reasons stay listed; when each is one the client's pace explains, they describe
    # that pace, not the target rate's. Errors over the maximum or an exhausted dataset are not
    # the client's pace: the rate fails (a server failure is not hidden behind "rerun")
    r.inconclusive = fell_behind_only(checks)
    r.notes = marginal_notes(r.measurement, c) + content_notes(r.measurement)
    return r


def rate_verdict(r: RateResult) -> str:
    """pass | fail | inconclusive, or the status of a rate that produced no measurement."""
    if r.status != STATUS_OK:
        return r.status
    return INCONCLUSIVE if r.inconclusive else (PASS if r.passed else FAIL)


def _ran(results: list[RateResult]) -> list[RateResult]:
    return sorted((r for r in results if r.status != STATUS_NOT_RUN), key=lambda r: r.target_rate)


def highest_passing_rate(results: list[RateResult], optimistic: bool = False) -> float | None:
    """``optimistic``: as if every inconclusive rate had passed (what the rate could be)."""
    best: float | None = None
    for r in _ran(results):
        if not (r.passed or (optimistic and r.inconclusive)):
            break
        best = r.target_rate
    return best


def first_failing_rate(results: list[RateResult]) -> float | None:
    """The lowest rate that failed outright (an inconclusive rate did not)."""
    for r in _ran(results):
        if not r.passed and not r.inconclusive:
            return r.target_rate
    return None


def first_inconclusive_rate(results: list[RateResult]) -> float | None:
    return next((r.target_rate for r in _ran(results) if r.inconclusive), None)


def workload_verdict(results: list[RateResult], require_rate: float | None = None) -> str:
    """pass, fail, or inconclusive when the outcome hangs on a rate the client could not keep.

    With a required rate: pass when it is met; fail when it would not be met even had every
    inconclusive rate passed. Without: pass when every listed rate (search probes are expected
    to fail at the edge) passed; fail when one failed outright."""
    if require_rate:
        hp = highest_passing_rate(results)
        if hp is not None and hp >= require_rate:
            return PASS
        best = highest_passing_rate(results, optimistic=True)
        return INCONCLUSIVE if best is not None and best >= require_rate else FAIL
    listed = [r for r in _ran(results) if not r.search_probe]
    if not listed:
        return FAIL
    if all(r.passed for r in listed):
        return PASS
    return INCONCLUSIVE if all(r.passed or r.inconclusive for r in listed) else FAIL
