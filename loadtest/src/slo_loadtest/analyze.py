"""Re-judging saved results: raw guidellm JSON reports, our summaries, or whole run directories."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slo_loadtest import guidellm_adapter as gl
from slo_loadtest.summary import SUMMARY_NAME, is_summary, read_summary
from slo_loadtest.verdict import STATUS_OK, RateResult


@dataclass
class Loaded:
    results: list[RateResult] = field(default_factory=list)
    target: str = ""
    model: str = ""
    guidellm_versions: set[str] = field(default_factory=set)
    workloads: list[str] = field(default_factory=list)
    aborted: dict[str, Any] | None = None
    config: dict[str, Any] = field(default_factory=dict)


def load_inputs(paths: list[Path], workload: str = "") -> Loaded:
    out = Loaded()
    for p in paths:
        path = p / SUMMARY_NAME if p.is_dir() else p
        if not path.is_file():
            raise ValueError(f"{p}: no such file (or no {SUMMARY_NAME} in that directory)")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
        if is_summary(data):
            results, meta = read_summary(data)
            for r in results:
                if workload:
                    r.workload = workload
            out.results.extend(results)
            out.target = out.target or meta.get("target", "")
            out.model = out.model or meta.get("model", "")
            out.aborted = out.aborted or meta.get("aborted")
            out.config = out.config or dict(meta.get("config") or {})
            if meta.get("guidellm_version"):
                out.guidellm_versions.add(meta["guidellm_version"])
            for w in meta.get("workloads") or {}:
                if w not in out.workloads and not workload:
                    out.workloads.append(w)
        elif gl.is_guidellm_report(data):
            rep = gl.parse_report(data, str(path))
            out.guidellm_versions.add(rep.guidellm_version)
            for m in rep.measurements:
                name = workload or m.labels.get("workload") or path.stem
                out.results.append(
                    RateResult(
                        workload=name,
                        target_rate=m.target_rate,
                        status=STATUS_OK,
                        measurement=m,
                        report_path=str(path),
                        guidellm_version=rep.guidellm_version,
                    )
                )
            cfg_backend = ((data.get("config") or {}).get("spec") or {}).get("backend") or {}
            out.target = out.target or str(cfg_backend.get("target") or "")
            out.model = out.model or str(cfg_backend.get("model") or "")
        else:
            raise ValueError(f"{path}: neither a guidellm JSON report nor an slo-loadtest summary")
    for r in out.results:
        if r.workload not in out.workloads:
            out.workloads.append(r.workload)
    _check_duplicates(out.results)
    return out


def _check_duplicates(results: list[RateResult]) -> None:
    seen: set[tuple[str, float]] = set()
    for r in results:
        key = (r.workload, r.target_rate)
        if key in seen:
            raise ValueError(
                f"two results for {r.workload} at {r.target_rate:g} req/s; name the workload of "
                "each report (--workload) or analyze them separately"
            )
        seen.add(key)
