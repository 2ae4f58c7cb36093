"""The rendered autoscaling queries are evaluated by a real Prometheus engine (`promtool test
rules`) on synthetic series: the KEDA load query returns the requests in flight (running +
waiting) across this release's pods only, averaged over 2 minutes, and 0 (not NaN, not empty) when
idle or not scraped yet, so desired replicas = ceil(in flight / targetPerPod) follow the load and
not the current replica count; the opt-in SLO trigger returns the share of requests slower than
300 ms; the chart README's prometheus-adapter rule computes the same load for the HPA."""

from __future__ import annotations

import shutil
import subprocess

import yaml
from chartlib import CHART, FULLNAME, NAMESPACE, install_dry_run, one, render, require_tool

SEL = f'namespace="{NAMESPACE}", service="{FULLNAME}"'
E2E = "gemma4_request_e2e_latency_seconds"


def series(name: str, labels: str, values: str) -> dict:
    return {"series": f"{name}{{{labels}}}", "values": values}


def promtool_test(tmp_path, tests: list[dict]) -> subprocess.CompletedProcess:
    promtool = require_tool(shutil.which("promtool"), "promtool")
    path = tmp_path / "query-test.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}))
    return subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True)


def keda_queries(*sets: str) -> dict[str, str]:
    so = one(render("autoscaling-multi-replica", sets=sets), "ScaledObject")
    return {t.get("name", "load"): t["metadata"]["query"] for t in so["spec"]["triggers"]}


def load_series(labels: str, running: str, waiting: str) -> list[dict]:
    return [
        series("vllm:num_requests_running", f'{labels}, model_name="m", engine="0"', running),
        series("vllm:num_requests_waiting", f'{labels}, model_name="m", engine="0"', waiting),
    ]


def test_keda_load_query_is_the_release_in_flight_requests(tmp_path):
    query = keda_queries()["load"]
    target = 6  # autoscaling.targetPerPod of the profile (the chart's default)
    busy = {
        "interval": "1m",
        "input_series": [
            # pod a: 7 running + 2 waiting, pod b: 8 + 3 -> 20 in flight
            *load_series(f'{SEL}, pod="a"', "7x20", "2x20"),
            *load_series(f'{SEL}, pod="b"', "8x20", "3x20"),
            # another release in the namespace, swamped: must not count
            *load_series(f'namespace="{NAMESPACE}", service="other", pod="x"', "50x20", "90x20"),
            # this release's latency is healthy (no slow requests): the load alone decides
            series(f"{E2E}_bucket", f'{SEL}, pod="a", le="0.3"', "0+60x20"),
            series(f"{E2E}_count", f'{SEL}, pod="a"', "0+60x20"),
        ],
        "promql_expr_test": [
            {"expr": query, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": 20}]},
            # what the HPA computes from AverageValue: 4 pods, however many run now
            {
                "expr": f"ceil(({query}) / {target})",
                "eval_time": "10m",
                "exp_samples": [{"labels": "{}", "value": 4}],
            },
        ],
    }
    # a one-minute burst of 24 in flight on one pod adds ~6 to the 2-minute average, not 24
    burst = {
        "interval": "1m",
        "input_series": load_series(f'{SEL}, pod="a"', "4 4 4 4 4 4 4 4 4 28 4", "0x10"),
        "promql_expr_test": [
            {
                "expr": f"round(({query}), 0.01)",
                "eval_time": "9m30s",
                "exp_samples": [{"labels": "{}", "value": 16}],  # (4 + 28) / 2 samples
            },
            {"expr": query, "eval_time": "12m", "exp_samples": [{"labels": "{}", "value": 4}]},
        ],
    }
    idle = {
        "interval": "1m",
        "input_series": load_series(f'{SEL}, pod="a"', "0x20", "0x20"),
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
    proc = promtool_test(tmp_path, [busy, burst, idle, unscraped])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_keda_slo_trigger_is_the_slow_request_share(tmp_path):
    query = keda_queries("autoscaling.keda.sloTrigger.enabled=true")["slo"]
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
    proc = promtool_test(tmp_path, [busy, idle, fast])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_readme_adapter_rule_computes_the_release_load(tmp_path):
    """The prometheus-adapter external rule in the chart README, with the label matchers the
    adapter fills in from the HPA's selector, gives the same total as the KEDA query."""
    text = (CHART / "README.md").read_text()
    block = text.split("```yaml\nrules:\n  external:", 1)[1].split("```", 1)[0]
    rules = yaml.safe_load("rules:\n  external:" + block)["rules"]["external"]
    (rule,) = [r for r in rules if r["name"]["as"] == "gemma4_inflight_requests"]
    query = (
        rule["metricsQuery"]
        .replace("<<.LabelMatchers>>", SEL)
        .replace("<<.GroupBy>>", "namespace, service")
    )
    test = {
        "interval": "1m",
        "input_series": [
            *load_series(f'{SEL}, pod="a"', "7x20", "2x20"),
            *load_series(f'{SEL}, pod="b"', "8x20", "3x20"),
            *load_series(f'namespace="{NAMESPACE}", service="other", pod="x"', "50x20", "90x20"),
        ],
        "promql_expr_test": [
            {
                "expr": query,
                "eval_time": "10m",
                "exp_samples": [{"labels": "{" + SEL + "}", "value": 20}],
            }
        ],
    }
    proc = promtool_test(tmp_path, [test])
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
