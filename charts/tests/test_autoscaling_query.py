"""The rendered KEDA query is evaluated by a real Prometheus engine (`promtool test rules`) on
synthetic series: it returns the share of requests slower than 300 ms for this release's Service
only, and 0 (not NaN, not empty) when the server is idle or not scraped yet."""

from __future__ import annotations

import shutil
import subprocess

import yaml
from chartlib import FULLNAME, NAMESPACE, install_dry_run, one, render, require_tool

SEL = f'namespace="{NAMESPACE}", service="{FULLNAME}"'


def series(name: str, labels: str, values: str) -> dict:
    return {"series": f"{name}{{{labels}}}", "values": values}


def promtool_test(tmp_path, tests: list[dict]) -> subprocess.CompletedProcess:
    promtool = require_tool(shutil.which("promtool"), "promtool")
    path = tmp_path / "query-test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}))
    return subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)


def keda_query() -> str:
    so = one(render("autoscaling-multi-replica"), "ScaledObject")
    return so["spec"]["triggers"][0]["metadata"]["query"]


def test_keda_query_is_the_slow_request_share(tmp_path):
    query = keda_query()
    bucket = "gemma4_request_e2e_latency_seconds_bucket"
    count = "gemma4_request_e2e_latency_seconds_count"
    busy = {
        "interval": "1m",
        "input_series": [
            # pod a: 60 req/min, 54 within 300 ms; pod b: 40 req/min, 36 within -> 10 % slow
            series(bucket, f'{SEL}, pod="a", model_name="m", le="0.3"', "0+54x20"),
            series(count, f'{SEL}, pod="a", model_name="m"', "0+60x20"),
            series(bucket, f'{SEL}, pod="b", model_name="m", le="0.3"', "0+36x20"),
            series(count, f'{SEL}, pod="b", model_name="m"', "0+40x20"),
            # another release in the namespace, all slow: must not count
            series(bucket, f'namespace="{NAMESPACE}", service="other", le="0.3"', "0+0x20"),
            series(count, f'namespace="{NAMESPACE}", service="other"', "0+100x20"),
        ],
        "promql_expr_test": [
            {
                "expr": f"round(({query}), 0.0001)",
                "eval_time": "10m",
                "exp_samples": [{"labels": "{}", "value": 0.1}],
            }
        ],
    }
    idle = {
        "interval": "1m",
        "input_series": [
            series(bucket, f'{SEL}, pod="a", le="0.3"', "5x20"),
            series(count, f'{SEL}, pod="a"', "5x20"),
        ],
        "promql_expr_test": [
            {"expr": query, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 0}]}
        ],
    }
    fast = {
        "interval": "1m",
        "input_series": [
            series(bucket, f'{SEL}, pod="a", le="0.3"', "0+60x20"),
            series(count, f'{SEL}, pod="a"', "0+60x20"),
        ],
        "promql_expr_test": [
            {"expr": query, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 0}]}
        ],
    }
    unscraped = {
        "interval": "1m",
        "input_series": [series("up", 'job="x"', "1x20")],
        "promql_expr_test": [
            {"expr": query, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 0}]}
        ],
    }
    proc = promtool_test(tmp_path, [busy, idle, fast, unscraped])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_notes_slo_query_evaluates(tmp_path):
    notes = install_dry_run()["info"]["notes"]
    lines = notes.split("4. Check the SLO", 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("sum(rate("))
    query = " ".join(line.strip() for line in lines[start : start + 2])
    test = {
        "interval": "1m",
        "input_series": [
            series("gemma4_request_e2e_latency_seconds_bucket", f'{SEL}, le="0.3"', "0+57x20"),
            series("gemma4_request_e2e_latency_seconds_count", SEL, "0+60x20"),
        ],
        "promql_expr_test": [
            {
                "expr": f"round({query}, 0.0001)",
                "eval_time": "10m",
                "exp_samples": [{"labels": "{}", "value": 0.95}],
            }
        ],
    }
    proc = promtool_test(tmp_path, [test])
    assert proc.returncode == 0, proc.stdout + proc.stderr
