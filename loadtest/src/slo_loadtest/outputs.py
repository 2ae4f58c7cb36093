"""Writing every output of a summary into a directory, and the log markers the Job uses.

A run directory holds ``summary.json`` (the artifact), ``results.csv``, ``report.md``,
``latency-vs-rate.png``, ``steps/<workload>-r<rate>/`` (guidellm's scenario, log and raw JSON
report per rate) and ``data/`` (the generated datasets and media).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from slo_loadtest import plots, report
from slo_loadtest.summary import SUMMARY_NAME, write_json

CSV_NAME = "results.csv"
MD_NAME = "report.md"
BEGIN_MARKER = "===== SLO-LOADTEST SUMMARY JSON BEGIN ====="
END_MARKER = "===== SLO-LOADTEST SUMMARY JSON END ====="


def write_outputs(
    summary: Mapping[str, Any], out: Path, with_plots: bool = True
) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {"summary": write_json(out / SUMMARY_NAME, summary)}
    paths["csv"] = report.write_text(out / CSV_NAME, report.to_csv(summary))
    plot_paths: list[Path] = []
    if with_plots and any(r.get("measurement") for r in summary["results"]):
        plot_paths = plots.plot_summary(summary, out)
        paths["plot"] = plot_paths[0]
    paths["markdown"] = report.write_text(
        out / MD_NAME, report.to_markdown(summary, [str(p) for p in plot_paths])
    )
    return paths


def summary_block(summary: Mapping[str, Any]) -> str:
    """The summary between markers, as the Job prints it to its log (short lines only)."""
    return f"{BEGIN_MARKER}\n{json.dumps(summary, indent=1)}\n{END_MARKER}\n"


def extract_summary(log_text: str) -> dict[str, Any] | None:
    """The last summary block in a log, or None."""
    end = log_text.rfind(END_MARKER)
    if end < 0:
        return None
    begin = log_text.rfind(BEGIN_MARKER, 0, end)
    if begin < 0:
        return None
    body = log_text[begin + len(BEGIN_MARKER) : end]
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None
