"""``slo-loadtest compare``: several sweeps side by side ("did my change help?").

Each configuration is read from its ``results.csv``, the one file every run directory has (older
ones have no ``summary.json``). Pass/fail is kept as each run judged it, not re-judged, so the
comparison shows what each run reported. The SLO shown and drawn is the run's own
(``summary.json`` criteria) when it has one, else ``--slo-ms``.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slo_loadtest import run_config
from slo_loadtest.outputs import CSV_NAME
from slo_loadtest.summary import SUMMARY_NAME
from slo_loadtest.verdict import (
    INCONCLUSIVE,
    STATUS_NOT_RUN,
    STATUS_OK,
    RateResult,
    highest_passing_rate,
)

MD_NAME = "compare.md"
REQUIRED_COLUMNS = ("workload", "target_rate", "status", "passed", "latency_p95_ms")
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


class CompareError(ValueError):
    """Bad input; the message is meant for a human and fits on one line."""


@dataclass(frozen=True)
class Point:
    rate: float
    status: str
    passed: bool
    latency_p95_ms: float | None
    search_probe: bool
    inconclusive: bool = False  # the client fell behind (the CSV's verdict column)


@dataclass
class Config:
    label: str
    path: str  # as the user gave it
    csv_path: Path
    slo_ms: float
    slo_source: str  # where slo_ms came from
    # the run configuration (run_config.flat); None where the run recorded none (older runs)
    settings: dict[str, str] | None = None
    points: dict[str, dict[float, Point]] = field(default_factory=dict)  # workload -> rate -> point

    def highest_passing(self, workload: str) -> float | None:
        # verdict.highest_passing_rate is the definition summary.json uses; reuse it as is
        rows = self.points.get(workload, {}).values()
        return highest_passing_rate(
            [
                RateResult(
                    workload=workload,
                    target_rate=p.rate,
                    status=p.status,
                    passed=p.passed,
                    inconclusive=p.inconclusive,
                )
                for p in rows
            ]
        )


def parse_spec(spec: str) -> tuple[str, str]:
    """LABEL=PATH, split at the first '=' (a path may hold one, a label may not)."""
    label, sep, path = spec.partition("=")
    label = label.strip()
    if not sep:
        raise CompareError(f"{spec!r} is not LABEL=PATH (no '=')")
    if not label:
        raise CompareError(f"{spec!r} has an empty label; use LABEL=PATH")
    if not path:
        raise CompareError(f"{spec!r} has an empty path; use LABEL=PATH")
    return label, path


def load_configs(specs: list[str], default_slo_ms: float) -> list[Config]:
    configs: list[Config] = []
    for spec in specs:
        label, path = parse_spec(spec)
        if any(c.label == label for c in configs):
            raise CompareError(f"duplicate label {label!r}; each LABEL=PATH needs its own label")
        configs.append(load_config(label, path, default_slo_ms))
    return configs


def load_config(label: str, path: str, default_slo_ms: float) -> Config:
    p = Path(path)
    where = f"{label}={path}"
    if p.is_dir():
        csv_path = p / CSV_NAME
        if not csv_path.is_file():
            raise CompareError(f"{where}: no {CSV_NAME} in that directory")
    elif p.is_file():
        csv_path = p
    else:
        raise CompareError(f"{where}: no such file or directory")
    # the summary beside a results.csv is the same run's
    summary = csv_path.parent / SUMMARY_NAME if csv_path.name == CSV_NAME else None
    settings: dict[str, str] | None = None
    if summary is not None and summary.is_file():
        data = _read_summary(summary, where)
        slo_ms, source = _summary_slo(data, summary, where), SUMMARY_NAME
        settings = run_config.flat(data)
    else:
        slo_ms, source = default_slo_ms, "--slo-ms (no summary.json)"
    rows = _read_rows(csv_path, where)
    if settings is None:
        settings = run_config.from_csv_row(rows[0])
    cfg = Config(label, path, csv_path, slo_ms, source, settings)
    for row in rows:
        pt = _point(row, where)
        rates = cfg.points.setdefault(row["workload"], {})
        if pt.rate in rates:
            raise CompareError(f"{where}: two rows for {row['workload']} at {pt.rate:g} req/s")
        rates[pt.rate] = pt
    return cfg


def _read_summary(path: Path, where: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CompareError(f"{where}: cannot read {path.name} ({exc})") from None
    if not isinstance(data, dict):
        raise CompareError(f"{where}: {path.name} is not a JSON object")
    return data


def _summary_slo(data: dict[str, Any], path: Path, where: str) -> float:
    try:
        slo = data["criteria"]["slo_ms"]
    except (KeyError, TypeError):
        raise CompareError(f"{where}: {path.name} has no criteria.slo_ms") from None
    if not isinstance(slo, int | float) or isinstance(slo, bool) or not slo > 0:
        raise CompareError(f"{where}: {path.name} has an invalid criteria.slo_ms {slo!r}")
    return float(slo)


def _read_rows(path: Path, where: str) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise CompareError(
                    f"{where}: {path.name} is not an slo-loadtest results.csv "
                    f"(missing column(s) {', '.join(missing)})"
                )
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise CompareError(f"{where}: cannot read {path.name} ({exc})") from None
    if not rows:
        raise CompareError(f"{where}: {path.name} has no rows")
    return rows


def _point(row: dict[str, Any], where: str) -> Point:
    # DictReader fills a short row's missing cells with None and keeps extras under None
    if None in row or any(row.get(c) is None for c in REQUIRED_COLUMNS):
        raise CompareError(f"{where}: a row has the wrong number of cells: {_clip(row)}")
    if not row["workload"].strip():
        raise CompareError(f"{where}: a row has no workload: {_clip(row)}")
    rate = _float(row["target_rate"])
    if rate is None or rate <= 0:
        raise CompareError(f"{where}: target_rate {row['target_rate']!r} is not a positive number")
    latency = _float(row["latency_p95_ms"])
    if latency is None and row["latency_p95_ms"].strip():
        raise CompareError(f"{where}: latency_p95_ms {row['latency_p95_ms']!r} is not a number")
    return Point(
        rate=rate,
        status=row["status"].strip() or STATUS_OK,
        passed=_bool(row["passed"], "passed", where),
        latency_p95_ms=latency,
        search_probe=_bool(row.get("search_probe") or "false", "search_probe", where),
        # older CSVs have no verdict column: pass/fail only
        inconclusive=(row.get("verdict") or "").strip() == INCONCLUSIVE,
    )


def _float(s: str) -> float | None:
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _bool(s: str, column: str, where: str) -> bool:
    v = s.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise CompareError(f"{where}: {column} {s!r} is not True or False")


def _clip(row: dict[Any, Any]) -> str:
    cells = [v for k, v in row.items() if k is not None and v is not None] + row.get(None, [])
    text = ",".join(str(v) for v in cells)
    return text if len(text) <= 60 else text[:57] + "..."


def select_workloads(configs: list[Config], wanted: str | None) -> list[str]:
    """Every workload in the inputs (first seen first), or the --workloads list, each of which
    must be in some input."""
    present: list[str] = []
    for c in configs:
        present += [w for w in c.points if w not in present]
    if wanted is None:
        return present
    items = [w.strip() for w in wanted.split(",") if w.strip()]
    if not items:
        raise CompareError("--workloads is empty; name at least one workload")
    if len(set(items)) != len(items):
        raise CompareError(f"duplicate workloads in --workloads {wanted!r}")
    unknown = [w for w in items if w not in present]
    if unknown:
        raise CompareError(
            f"workload(s) {', '.join(unknown)} not in any input (present: {', '.join(present)})"
        )
    return items


# ---- Markdown ----------------------------------------------------------------------------------

PASS, FAIL, ABSENT, UNDECIDED = "✓", "✗", "–", "?"


def _esc(s: str) -> str:
    return s.replace("|", "\\|")


def _rate(v: float | None) -> str:
    return "none" if v is None else f"{v:g} req/s"


def cell(p: Point | None) -> str:
    """``p95 ms ✓/✗`` for one config at one rate; – where it did not run that rate."""
    if p is None or p.status == STATUS_NOT_RUN:
        return ABSENT
    if p.status != STATUS_OK:
        value = p.status
    elif p.latency_p95_ms is None:
        value = "no p95"
    else:
        value = f"{p.latency_p95_ms:.0f}"
    mark = PASS if p.passed else (UNDECIDED if p.inconclusive else FAIL)
    return f"{value} {mark}" + (" (search)" if p.search_probe else "")


def _header(configs: list[Config]) -> str:
    return "| " + " | ".join(_esc(c.label) for c in configs) + " |"


def rate_table(configs: list[Config], workload: str) -> list[str]:
    rates = sorted({r for c in configs for r in c.points.get(workload, {})})
    lines = [
        f"## {workload}: p95 total latency (ms) by target rate",
        "",
        "| req/s " + _header(configs),
        "|---" * (len(configs) + 1) + "|",
    ]
    for r in rates:
        cells = [cell(c.points.get(workload, {}).get(r)) for c in configs]
        lines.append(f"| {r:g} | " + " | ".join(cells) + " |")
    return lines


def highest_table(configs: list[Config], workloads: list[str]) -> list[str]:
    lines = [
        "## Highest passing rate",
        "",
        "| workload " + _header(configs),
        "|---" * (len(configs) + 1) + "|",
    ]
    for w in workloads:
        cells = [_rate(c.highest_passing(w)) if w in c.points else ABSENT for c in configs]
        lines.append(f"| {w} | " + " | ".join(cells) + " |")
    return lines


def slo_line(configs: list[Config]) -> str:
    slos = {c.slo_ms for c in configs}
    if len(slos) == 1:
        return f"SLO: p95 total latency <= {next(iter(slos)):g} ms"
    each = ", ".join(f"{_esc(c.label)} {c.slo_ms:g} ms" for c in configs)
    return f"SLO differs between configs ({each}); each passed or failed against its own"


def slo_lines(configs: list[Config], workload: str) -> list[tuple[float, str]]:
    """(SLO ms, legend label) per distinct SLO of the configs that ran the workload."""
    by_slo: dict[float, list[str]] = {}
    for c in configs:
        if workload in c.points:
            by_slo.setdefault(c.slo_ms, []).append(c.label)
    if len(by_slo) == 1:
        return [(slo, f"SLO {slo:g} ms") for slo in by_slo]
    return [(slo, f"SLO {slo:g} ms ({', '.join(labels)})") for slo, labels in by_slo.items()]


def config_differences(configs: list[Config], workloads: list[str]) -> dict[str, dict[str, str]]:
    """key -> {label: value} for every compared setting whose recorded values differ."""
    return run_config.differences({c.label: c.settings for c in configs}, workloads)


def config_warnings(configs: list[Config], workloads: list[str]) -> list[str]:
    """Plain lines (no 'warning:' prefix): first where the runs are not like for like, one line
    per differing setting, then the runs whose settings could not be checked."""
    lines = []
    diffs = config_differences(configs, workloads)
    if diffs:
        lines.append(
            f"the configurations differ in {', '.join(diffs)}: these runs are not like for like, "
            "so a difference in latency may come from the settings, not the server"
        )
        for key, values in diffs.items():
            lines.append(f"{key}: " + ", ".join(f"{lab} {v}" for lab, v in values.items()))
    lines += _unchecked(configs)
    return lines


def _unchecked(configs: list[Config]) -> list[str]:
    unknown = [c.label for c in configs if c.settings is None]
    if not unknown or len(configs) < 2:
        return []
    return [
        f"{', '.join(unknown)}: no recorded configuration (an older run: no summary.json and no "
        "config_ columns in results.csv), so its settings were not checked"
    ]


def config_table(configs: list[Config], workloads: list[str]) -> list[str]:
    """The compared settings of every config; a differing row is marked."""
    diffs = config_differences(configs, workloads)
    lines = [
        "## Configuration",
        "",
        "| setting " + _header(configs) + " differs |",
        "|---" * (len(configs) + 2) + "|",
    ]
    for key in run_config.compared_keys(workloads):
        cells = [
            _esc(c.settings.get(key) or "not recorded") if c.settings else ABSENT for c in configs
        ]
        lines.append(
            f"| {key} | " + " | ".join(cells) + f" | {'**yes**' if key in diffs else ''} |"
        )
    return lines


def tables(configs: list[Config], workloads: list[str]) -> list[str]:
    """The part printed on stdout: the SLO and every table."""
    lines = [slo_line(configs), ""]
    for w in workloads:
        lines += [*rate_table(configs, w), ""]
    return [*lines, *highest_table(configs, workloads)]


def to_markdown(configs: list[Config], workloads: list[str], plots: list[str]) -> str:
    lines = ["# Sweep comparison", ""]
    diffs = config_differences(configs, workloads)
    if diffs:
        head, *each = config_warnings(configs, workloads)[: len(diffs) + 1]
        lines += [f"**Warning: {_esc(head)}** (see Configuration):", ""]
        lines += [*(f"- {_esc(w)}" for w in each), ""]
    lines += [f"Note: {_esc(w)}." for w in _unchecked(configs)]
    lines += [""] if _unchecked(configs) else []
    for c in configs:
        lines.append(f"- `{_esc(c.label)}`: `{c.path}` (SLO {c.slo_ms:g} ms from {c.slo_source})")
    lines += [
        f"- {PASS} passed, {FAIL} failed (as each run judged it: SLO, achieved rate, errors, "
        f"client dispatch delay), {UNDECIDED} inconclusive (the client fell behind, so the rate "
        f"was not judged), {ABSENT} rate not run; (search) marks a search probe",
        "- highest passing rate: the highest rate such that it and every lower rate of that "
        "config passed",
        "",
        *tables(configs, workloads),
        "",
        *config_table(configs, workloads),
    ]
    if plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def plot_name(workload: str) -> str:
    # a workload name comes from a CSV cell; keep the file name to safe characters
    return "compare-" + re.sub(r"[^A-Za-z0-9_.-]", "_", workload) + ".png"
