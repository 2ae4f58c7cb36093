"""Push a summary to a Prometheus Pushgateway, so the load-test dashboard shows the last sweep.

Names, labels and grouping are the contract in dashboards/generate.py (job ``slo_loadtest``,
one group per workload, all gauges, ``rate`` as the requested rate formatted with ``%g``):

* ``slo_loadtest_e2e_p95_seconds{workload,rate}``
* ``slo_loadtest_ttft_p95_seconds{workload,rate}``
* ``slo_loadtest_itl_p95_seconds{workload,rate}``
* ``slo_loadtest_achieved_rps{workload,rate}``
* ``slo_loadtest_error_ratio{workload,rate}``
* ``slo_loadtest_slo_pass{workload}``: 1 when the workload's verdict passed (the required rate
  was met, or with no requirement every rate passed, and the sweep completed), else 0 (failed,
  inconclusive or incomplete)
* ``slo_loadtest_max_rate_within_slo{workload}``: the highest passing rate (0 when none)
* ``slo_loadtest_last_run_timestamp_seconds{workload}``

Each push is an HTTP PUT of the text exposition format to
``/metrics/job/<job>[/release@base64/<release>]/workload/<workload>``, which replaces the group,
so rates of an older sweep do not linger, and the sweep of another release (``--push-release``,
``<namespace>/<release>`` in the chart's Jobs) stays. The dashboard aggregates ``max by
(workload[, rate])`` and filters by ``workload`` only, so the extra label changes none of its
queries. Rates that never ran (no measurement) are not pushed. No client library is needed.
"""

from __future__ import annotations

import base64
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from slo_loadtest.credentials import redact_url, split_userinfo

PER_RATE = {
    "slo_loadtest_e2e_p95_seconds": ("latency_p95_ms", 1e-3, "client-side e2e latency p95"),
    "slo_loadtest_ttft_p95_seconds": ("ttft_p95_ms", 1e-3, "client-side TTFT p95"),
    "slo_loadtest_itl_p95_seconds": ("itl_p95_ms", 1e-3, "client-side inter-token latency p95"),
    "slo_loadtest_achieved_rps": ("achieved_rate", 1.0, "achieved request throughput"),
}


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _line(name: str, labels: Mapping[str, str], value: float) -> str:
    lab = ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())
    return f"{name}{{{lab}}} {value!r}" if lab else f"{name} {value!r}"


def exposition(summary: Mapping[str, Any], workload: str, now: float | None = None) -> str:
    """The text exposition of one workload's group."""
    lines: list[str] = []
    results = [r for r in summary["results"] if r["workload"] == workload]

    def gauge(name: str, help_: str) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} gauge")

    for name, (key, scale, help_) in PER_RATE.items():
        gauge(name, help_)
        for r in results:
            m = r.get("measurement") or {}
            if isinstance(m.get(key), int | float):
                lines.append(_line(name, {"rate": f"{r['target_rate']:g}"}, m[key] * scale))
    gauge("slo_loadtest_error_ratio", "failed / all requests")
    for r in results:
        m = r.get("measurement") or {}
        total = sum(int(m.get(k) or 0) for k in ("successful", "errored", "incomplete"))
        if not total:  # never ran (not_run, guidellm failed): no ratio, not 100 % errors
            continue
        ratio = int(m.get("errored") or 0) / total
        lines.append(_line("slo_loadtest_error_ratio", {"rate": f"{r['target_rate']:g}"}, ratio))
    w = summary["workloads"].get(workload, {})
    if w.get("requirement_met") is not None:
        passed = bool(w["requirement_met"])
    else:
        listed = [r for r in results if not r.get("search_probe")]
        passed = bool(listed) and all(r["passed"] for r in listed)
    passed = passed and bool(summary.get("complete"))
    gauge("slo_loadtest_slo_pass", "verdict of the last sweep: 1 pass, 0 fail")
    lines.append(_line("slo_loadtest_slo_pass", {}, 1.0 if passed else 0.0))
    gauge("slo_loadtest_max_rate_within_slo", "highest passing request rate (req/s)")
    lines.append(
        _line("slo_loadtest_max_rate_within_slo", {}, float(w.get("highest_passing_rate") or 0.0))
    )
    gauge("slo_loadtest_last_run_timestamp_seconds", "unix time of the sweep's end")
    lines.append(
        _line(
            "slo_loadtest_last_run_timestamp_seconds",
            {},
            float(now if now is not None else time.time()),
        )
    )
    return "\n".join(lines) + "\n"


def _b64(value: str) -> str:
    """The Pushgateway's base64url form of a label value: '/' may not appear in a path segment."""
    return base64.urlsafe_b64encode(value.encode()).decode()


def push(
    url: str,
    summary: Mapping[str, Any],
    job: str = "slo_loadtest",
    timeout_s: float = 10.0,
    release: str = "",
) -> list[str]:
    """PUT one group per workload; returns the URLs pushed to. Raises RuntimeError on failure."""
    base = url.rstrip("/")
    if "://" not in base:
        base = "http://" + base
    # user:password@ is sent as HTTP Basic (urllib would take it for a host name); the URLs
    # returned and quoted in errors carry no credentials
    base, authorization = split_userinfo(base)
    pushed = []
    now = time.time()
    for workload in summary["workloads"]:
        path = (
            f"/metrics/job/{urllib.parse.quote(job, safe='')}"
            + (f"/release@base64/{_b64(release)}" if release else "")
            + f"/workload/{urllib.parse.quote(workload, safe='')}"
        )
        body = exposition(summary, workload, now).encode()
        req = urllib.request.Request(
            base + path,
            data=body,
            method="PUT",
            headers={
                "Content-Type": "text/plain; version=0.0.4; charset=utf-8",
                **({"Authorization": authorization} if authorization else {}),
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                if resp.status // 100 != 2:
                    raise RuntimeError(
                        f"pushgateway answered {resp.status} for {redact_url(base + path)}"
                    )
        except (urllib.error.URLError, OSError) as exc:
            raise RuntimeError(f"push to {redact_url(base + path)} failed: {exc}") from exc
        pushed.append(redact_url(base + path))
    return pushed
