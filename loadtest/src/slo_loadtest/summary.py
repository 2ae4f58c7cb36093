"""The versioned JSON summary of a sweep: the artifact every other output is drawn from.

``schema_version`` changes whenever a field changes meaning or goes away; fields may be added
without a bump. ``slo-loadtest analyze`` reads summaries (and raw guidellm reports) back, re-judges
the stored measurements and redraws every output, so nothing needs the server again.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from slo_loadtest import __version__
from slo_loadtest.config import Criteria
from slo_loadtest.credentials import redact_url
from slo_loadtest.guidellm_adapter import Measurement
from slo_loadtest.verdict import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    STATUS_NOT_RUN,
    STATUS_OK,
    RateResult,
    first_failing_rate,
    first_inconclusive_rate,
    highest_passing_rate,
    judge_result,
    workload_verdict,
)

SCHEMA_VERSION = 1
SUMMARY_NAME = "summary.json"


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()


def build_summary(
    results: Iterable[RateResult],
    criteria: Criteria,
    *,
    workloads: Iterable[str] | None = None,
    target: str = "",
    model: str = "",
    guidellm_version: str = "",
    config: Mapping[str, Any] | None = None,
    require_rate: float | None = None,
    aborted: Mapping[str, Any] | None = None,
    source: str = "run",
    created_at: str | None = None,
) -> dict[str, Any]:
    results = [judge_result(r, criteria) for r in results]
    names = list(workloads) if workloads else []
    for r in results:
        if r.workload not in names:
            names.append(r.workload)
    per_workload: dict[str, Any] = {}
    for name in names:
        rs = sorted((r for r in results if r.workload == name), key=lambda r: r.target_rate)
        hp = highest_passing_rate(rs)
        per_workload[name] = {
            "highest_passing_rate": hp,
            "first_failing_rate": first_failing_rate(rs),
            # the client could not keep this rate's schedule: not judged (verdict.py)
            "first_inconclusive_rate": first_inconclusive_rate(rs),
            "rates_run": [r.target_rate for r in rs if r.status != STATUS_NOT_RUN],
            "requirement_met": (
                None if not require_rate else (hp is not None and hp >= require_rate)
            ),
            "verdict": workload_verdict(rs, require_rate),
        }
    incomplete = [r for r in results if r.status != STATUS_OK]
    complete = not incomplete and aborted is None
    verdicts = {w["verdict"] for w in per_workload.values()}
    if not complete:
        verdict = "incomplete"
    elif not verdicts or FAIL in verdicts:
        verdict = FAIL
    else:
        # a failure anywhere decides; otherwise an inconclusive rate the verdict hangs on does
        verdict = INCONCLUSIVE if INCONCLUSIVE in verdicts else PASS
    failing = next((r for r in results if r.status not in (STATUS_OK, STATUS_NOT_RUN)), None)
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "slo-loadtest", "version": __version__},
        "guidellm_version": guidellm_version,
        "created_at": created_at or now_iso(),
        "source": source,
        "target": redact_url(target),
        "model": model,
        "criteria": asdict(criteria),
        "require_rate": require_rate or None,
        "config": dict(config or {}),
        "complete": complete,
        "verdict": verdict,
        "failed_step": None
        if failing is None
        else {
            "workload": failing.workload,
            "rate": failing.target_rate,
            "status": failing.status,
            "message": failing.message,
        },
        "aborted": dict(aborted) if aborted else None,
        "workloads": per_workload,
        "results": [_result_dict(r) for r in results],
    }


def _result_dict(r: RateResult) -> dict[str, Any]:
    d = asdict(r)
    return d


def result_from_dict(d: Mapping[str, Any]) -> RateResult:
    m = d.get("measurement")
    known_m = {f.name for f in dataclasses.fields(Measurement)}
    measurement = Measurement(**{k: v for k, v in m.items() if k in known_m}) if m else None
    known = {f.name for f in dataclasses.fields(RateResult)} - {"measurement"}
    r = RateResult(**{k: v for k, v in d.items() if k in known})
    r.measurement = measurement
    return r


def is_summary(data: Any) -> bool:
    return isinstance(data, Mapping) and "schema_version" in data and "results" in data


def read_summary(data: Mapping[str, Any]) -> tuple[list[RateResult], dict[str, Any]]:
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(
            f"summary schema_version {version!r} is not supported (this tool reads "
            f"{SCHEMA_VERSION})"
        )
    return [result_from_dict(r) for r in data["results"]], dict(data)


def write_json(path: Path, data: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_default) + "\n")
    tmp.replace(path)
    return path


def _default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, tuple | set):
        return list(o)
    raise TypeError(f"cannot serialise {type(o).__name__}")
