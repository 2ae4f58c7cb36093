"""CSV and Markdown renderings of a summary (see :mod:`slo_loadtest.summary`)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slo_loadtest import run_config
from slo_loadtest.verdict import INCONCLUSIVE, STATUS_OK, is_content_note, no_content_hint

CSV_COLUMNS = [
    "workload", "target_rate", "status", "passed", "achieved_rate", "guidellm_rps_mean",
    "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "itl_median_ms", "itl_p95_ms",
    "latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_p95_ci_low_ms",
    "latency_p95_ci_high_ms", "successful", "errored", "incomplete",
    "dispatch_delay_median_ms", "dispatch_delay_p95_ms", "prompt_tokens_mean",
    "output_tokens_mean", "duration_s", "stop_reason", "search_probe", "wall_s",
    "guidellm_version", "reasons", "message", "notes", "verdict",
    # the run's configuration, the same in every row (run_config.py): last, so readers of the
    # columns above by position or by name keep working
    *run_config.CSV_COLUMNS,
]  # fmt: skip


def flat_rows(summary: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for r in summary["results"]:
        row = {k: v for k, v in r.items() if k != "measurement"}
        row.update(r.get("measurement") or {})
        row["reasons"] = "; ".join(r.get("reasons") or [])
        row["notes"] = "; ".join(r.get("notes") or [])
        row["verdict"] = _rate_verdict(r)
        # a rate's own version, else the run's (a hand-built or older result has none)
        row["guidellm_version"] = row.get("guidellm_version") or summary.get("guidellm_version")
        rows.append(row)
    return rows


def _rate_verdict(r: Mapping[str, Any]) -> str:
    """pass | fail | inconclusive, or the status of a rate without a measurement."""
    if (r.get("status") or STATUS_OK) != STATUS_OK:
        return str(r["status"])
    return INCONCLUSIVE if r.get("inconclusive") else ("pass" if r.get("passed") else "fail")


def to_csv(summary: Mapping[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    config = run_config.csv_cells(summary)
    for row in flat_rows(summary):
        w.writerow({k: _csv_value(row.get(k)) for k in CSV_COLUMNS} | config)
    return buf.getvalue()


def _csv_value(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.4f}".rstrip("0").rstrip(".") if v == v else ""
    return "" if v is None else v


def _fmt(v: Any, digits: int = 0) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _rate(v: Any) -> str:
    return "none" if v is None else f"{v:g} req/s"


def to_markdown(summary: Mapping[str, Any], plots: list[str] | None = None) -> str:
    c = summary["criteria"]
    out: list[str] = []
    out.append("# SLO load test")
    out.append("")
    rows = flat_rows(summary)
    behind = [row for row in rows if row["verdict"] == INCONCLUSIVE]
    out.append(
        f"- verdict: **{summary['verdict'].upper()}**"
        + ("" if summary["complete"] else " (partial: the sweep did not finish)")
    )
    if behind:
        where = ", ".join(f"{row['workload']} {row['target_rate']:g}" for row in behind)
        out.append(
            f"- **inconclusive rates** ({where} req/s): the client fell behind (p95 dispatch "
            f"delay > {c['max_dispatch_delay_ms']:g} ms), so the load generator, not the server, "
            "set the pace and those rates were neither passed nor failed; rerun them from a "
            "client with more CPU (or more --max-workers)"
        )
    target, model = summary.get("target") or "–", summary.get("model") or "–"
    out.append(f"- target: `{target}`, model: `{model}`")
    out.append(
        f"- SLO: p95 total latency <= {c['slo_ms']:g} ms; achieved >= "
        f"{c['min_achieved_ratio']:.0%} of target; errors <= {c['max_error_ratio']:.0%}; "
        f"p95 dispatch delay <= {c['max_dispatch_delay_ms']:g} ms"
    )
    if summary.get("require_rate"):
        out.append(f"- required rate: {summary['require_rate']:g} req/s per workload")
    out.append(
        f"- guidellm {summary.get('guidellm_version') or '?'}, slo-loadtest "
        f"{summary['tool']['version']}, {summary['created_at']}, source: {summary.get('source')}"
    )
    extra_body = (summary.get("config") or {}).get("extra_body")
    if extra_body:
        out.append(f"- extra request body: `{json.dumps(extra_body, sort_keys=True)}`")
    noted = [row for row in rows if row["notes"]]
    no_content = [
        r for r in summary["results"] if any(is_content_note(n) for n in r.get("notes", []))
    ]
    marginal = {
        (r["workload"], r["target_rate"])
        for r in summary["results"]
        if any(not is_content_note(n) for n in r.get("notes", []))
    }
    if no_content:
        at: dict[str, list[str]] = {}
        for r in no_content:
            at.setdefault(r["workload"], []).append(f"{r['target_rate']:g}")
        where = "; ".join(f"{w} {', '.join(rates)} req/s" for w, rates in at.items())
        out.append(
            f"- **TTFT/ITL not (fully) measured** at {where}: some or all successful requests "
            f"streamed no text (see Notes); {no_content_hint(extra_body)}. Pass/fail rests on "
            "the total latency and is not affected."
        )
    if summary.get("failed_step"):
        f = summary["failed_step"]
        out.append(
            f"- **failed at {f['workload']} {f['rate']:g} req/s** ({f['status']}): {f['message']}"
        )
    if summary.get("aborted"):
        out.append(f"- sweep aborted: {summary['aborted'].get('reason', '')}")
    out.append("")
    out.append("## Highest passing rate")
    out.append("")
    # the column only where some rate was inconclusive: most reports have none
    inc_col = any(
        w.get("first_inconclusive_rate") is not None for w in summary["workloads"].values()
    )
    out.append(
        "| workload | highest passing rate | first failing rate | requirement met |"
        + (" first inconclusive rate |" if inc_col else "")
    )
    out.append("|---|---|---|---|" + ("---|" if inc_col else ""))
    for name, w in summary["workloads"].items():
        req = w.get("requirement_met")
        hp, ff = w["highest_passing_rate"], w["first_failing_rate"]
        out.append(
            f"| {name} | {_rate(hp)}{' (marginal)' if (name, hp) in marginal else ''} "
            f"| {_rate(ff)}{' (marginal)' if (name, ff) in marginal else ''} "
            f"| {'–' if req is None else ('yes' if req else 'no')} |"
            + (f" {_rate(w.get('first_inconclusive_rate'))} |" if inc_col else "")
        )
    if marginal:
        out.append("")
        out.append(
            "(marginal: the SLO lies inside the 95% confidence interval of that rate's p95, so a "
            "rerun of the same length may give the other verdict; see Notes.)"
        )
    out.append("")
    out.append("## Per rate")
    out.append("")
    out.append(
        "| workload | target | achieved | TTFT p50 / p95 / p99 ms | ITL median / p95 ms "
        "| total p95 ms (95% CI) | ok / err / incomplete | dispatch p95 ms | pass | why not |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        probe = " (search)" if row.get("search_probe") else ""
        why = "; ".join(x for x in (row["reasons"], "see Notes" if row["notes"] else "") if x)
        out.append(
            f"| {row['workload']} | {row['target_rate']:g}{probe} "
            f"| {_fmt(row.get('achieved_rate'), 2)} "
            f"| {_fmt(row.get('ttft_p50_ms'))} / {_fmt(row.get('ttft_p95_ms'))} / "
            f"{_fmt(row.get('ttft_p99_ms'))} "
            f"| {_fmt(row.get('itl_median_ms'), 1)} / {_fmt(row.get('itl_p95_ms'), 1)} "
            f"| {_fmt(row.get('latency_p95_ms'))}{_ci(row)} "
            f"| {_fmt(row.get('successful'))} / {_fmt(row.get('errored'))} / "
            f"{_fmt(row.get('incomplete'))} "
            f"| {_fmt(row.get('dispatch_delay_p95_ms'))} "
            f"| {_PASS_CELL.get(row['verdict'], 'no')} | {why} |"
        )
    if noted:
        out.append("")
        out.append("## Notes")
        out.append("")
        for row in noted:
            probe = " (search)" if row.get("search_probe") else ""
            out.append(f"- {row['workload']} {row['target_rate']:g} req/s{probe}: {row['notes']}")
    out += ["", "## Configuration", "", "| setting | value |", "|---|---|"]
    for key, value in run_config.markdown_rows(summary):
        cell = value.replace("|", "\\|")  # a | in a value would end the table cell
        out.append(f"| {key} | {cell} |")
    if plots:
        out.append("")
        out.append("## Plots")
        out.append("")
        for p in plots:
            out.append(f"![{Path(p).stem}]({Path(p).name})")
    out.append("")
    return "\n".join(out)


_PASS_CELL = {"pass": "yes", "fail": "no", INCONCLUSIVE: "inconclusive"}


def _ci(row: Mapping[str, Any]) -> str:
    lo, hi = row.get("latency_p95_ci_low_ms"), row.get("latency_p95_ci_high_ms")
    return "" if lo is None or hi is None else f" ({_fmt(lo)}..{_fmt(hi)})"


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
