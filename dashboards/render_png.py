#!/usr/bin/env python3
"""Render the serving dashboard's latency panels from a real Prometheus to a PNG (no Grafana).

    python dashboards/render_png.py --prometheus http://127.0.0.1:9090 \
        --out dashboards/img/serving-latency.png --minutes 15

The queries are the dashboard's own (read from gemma4-serving.json, Grafana variables set to
"All"), evaluated with /api/v1/query_range, so the picture shows what the panels show.
"""

from __future__ import annotations

import argparse
import json
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PANELS = ("e2e latency p50 / p95 / p99", "Time to first token p50 / p95 / p99")
SLO_SECONDS = 0.3


def _expand(expr: str, window: str) -> str:
    expr = expr.replace("$__rate_interval", window)
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)


def query_range(prom: str, expr: str, start: float, end: float, step: str) -> list[dict[str, Any]]:
    qs = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prom}/api/v1/query_range?{qs}", timeout=30) as resp:
        body = json.load(resp)
    if body.get("status") != "success":
        raise RuntimeError(f"query_range failed: {expr}: {body}")
    return body["data"]["result"]


def render(
    prometheus: str, out: Path, minutes: float = 15, step: str = "5s", window: str = "1m"
) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dash = json.loads((HERE / "gemma4-serving.json").read_text())
    panels = {p["title"]: p for p in dash["panels"] if p.get("type") != "row"}
    end = time.time()
    start = end - minutes * 60
    fig, axes = plt.subplots(1, len(PANELS), figsize=(12, 3.6), sharey=True)
    for ax, title in zip(axes, PANELS, strict=True):
        drawn = 0
        for t in panels[title]["targets"]:
            for series in query_range(prometheus, _expand(t["expr"], window), start, end, step):
                xs = [(float(ts) - end) / 60 for ts, _ in series["values"]]
                ys = [float(v) * 1000 for _, v in series["values"]]
                ax.plot(xs, ys, label=t["legendFormat"], linewidth=1.4)
                drawn += 1
        ax.axhline(SLO_SECONDS * 1000, color="red", linestyle="--", linewidth=1, label="SLO")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("minutes (0 = now)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
        if not drawn:
            raise RuntimeError(f"panel {title!r} has no data in the last {minutes} min")
    axes[0].set_ylabel("ms")
    fig.suptitle("Gemma 4 serving: server-side latency from the plugin's fine histograms")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prometheus", required=True, help="Prometheus base URL")
    ap.add_argument("--out", type=Path, default=HERE / "img" / "serving-latency.png")
    ap.add_argument("--minutes", type=float, default=15)
    ap.add_argument("--step", default="5s")
    ap.add_argument("--window", default="1m", help="what $__rate_interval expands to")
    args = ap.parse_args(argv)
    print(render(args.prometheus, args.out, args.minutes, args.step, args.window))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
