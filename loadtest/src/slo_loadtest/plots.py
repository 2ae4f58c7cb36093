"""The blog's figure, redrawn from a summary: p95 TTFT and median ITL against request rate on a
log y axis, every workload on the same axes, plus p95 total latency with the SLO line (the
quantity the verdict is about; only that panel has it). Filled markers passed, hollow ones
failed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

PLOT_NAME = "latency-vs-rate.png"
COLORS = {"text": "tab:blue", "video": "tab:red", "image": "tab:green"}

SLO_PANEL = "latency_p95_ms"
PANELS = (
    ("ttft_p95_ms", "p95 time to first token (ms)"),
    ("itl_median_ms", "median inter-token latency (ms)"),
    ("latency_p95_ms", "p95 total request latency (ms)"),
)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - matplotlib is a dependency
        raise SystemExit(
            "plots need matplotlib: pip install 'matplotlib>=3.7' (or pass --no-plots)"
        ) from exc
    return plt


def plot_summary(summary: Mapping[str, Any], out_dir: Path) -> list[Path]:
    plt = _pyplot()
    fig = summary_figure(summary)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / PLOT_NAME
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def summary_figure(summary: Mapping[str, Any]) -> Any:
    """The figure of :func:`plot_summary` (a matplotlib Figure, one axes per panel)."""
    plt = _pyplot()
    slo = float(summary["criteria"]["slo_ms"])
    series: dict[str, list[tuple[float, dict[str, Any], bool]]] = {}
    for r in summary["results"]:
        series.setdefault(r["workload"], [])
        m = r.get("measurement")
        if m:
            series[r["workload"]].append((r["target_rate"], m, bool(r["passed"])))
    fig, axes = plt.subplots(1, len(PANELS), figsize=(5.2 * len(PANELS), 4.2))
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        plotted = False
        for name, points in series.items():
            pts = sorted((x, m.get(key), ok) for x, m, ok in points if _positive(m.get(key)))
            color = COLORS.get(name)
            if not pts:
                ax.plot([], [], "-", color=color, label=f"{name} (no successful requests)")
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=color, label=name)
            for x, y, ok in pts:
                ax.plot([x], [y], "o", color=color, markerfacecolor=color if ok else "white")
            plotted = True
        if key == SLO_PANEL:  # the SLO bounds total latency; on TTFT it would read as a bound
            ax.axhline(slo, color="black", linestyle="--", linewidth=1, label=f"SLO {slo:g} ms")
        if plotted or key != "itl_median_ms":
            ax.set_yscale("log")
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    model = summary.get("model") or ""
    fig.suptitle(f"{model}: constant-rate sweep (filled = rate passed the SLO)", fontsize=10)
    fig.tight_layout()
    return fig


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and v > 0


# One (rate, p95 total latency ms or None, passed) per rate a configuration ran.
ComparePoints = list[tuple[float, float | None, bool]]
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def plot_compare(
    workload: str,
    series: list[tuple[str, ComparePoints]],  # empty points: the config did not run it
    slos: list[tuple[float, str]],  # (SLO ms, legend label)
    path: Path,
) -> Path:
    """``slo-loadtest compare``'s figure: p95 total latency against rate for one workload, one
    line per configuration (colour and marker by its position, so a config looks the same in
    every workload's figure), log y, the SLO line(s); filled markers passed, hollow failed."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, (label, points) in enumerate(series):
        if not points:  # this config did not run the workload
            continue
        color, marker = f"C{i % 10}", MARKERS[i % len(MARKERS)]
        pts = sorted((x, y, ok) for x, y, ok in points if _positive(y))
        if not pts:
            ax.plot([], [], "-", color=color, marker=marker, label=f"{label} (no p95 latency)")
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        ax.plot(xs, ys, "-", color=color, marker=marker, label=label)
        failed = [(x, y) for x, y, ok in pts if not ok]
        if failed:  # hollow over the filled marker
            ax.plot(*zip(*failed, strict=True), marker, color=color, markerfacecolor="white")
    for (slo, label), style in zip(slos, ("--", ":", "-.") * len(slos), strict=False):
        ax.axhline(slo, color="black", linestyle=style, linewidth=1, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("p95 total request latency (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{workload}: configurations compared (filled = rate passed)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
