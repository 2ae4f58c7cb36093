"""Every dashboard query, evaluated against a real Prometheus that scraped the real local vLLM
(with the plugin) after real traffic, must return data: no "No data" panel.

* serving + encoder dashboards: the root ``prometheus`` fixture (scrapes ``vllm_server`` with
  the chart's scrape settings and loads ``dashboards/rules/*.yaml``). Traffic is sent here in
  two rounds, each waited for in Prometheus, so every counter has a zero-or-earlier sample and
  an increase inside the rate window: text (streamed and not), images (one and two per
  request) and a short video, as OpenAI chat completions with data URLs.
* load-test dashboard: a real Pushgateway (Debian ``prometheus-pushgateway``) and a second
  real Prometheus scraping it (``honor_labels``, as a Pushgateway scrape must). What is pushed
  is the real output of a short ``slo-loadtest run --pushgateway ...`` (guidellm) against the
  same vLLM.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dashlib
import pytest

DASHBOARDS = dashlib.load_dashboards()
RATE_WINDOW = "5m"  # what $__rate_interval expands to here (covers both traffic rounds)

pytestmark = pytest.mark.e2e


def _queries(names: list[str]) -> list[tuple[str, str, str]]:
    out = []
    for name in names:
        for panel, t in dashlib.iter_targets(DASHBOARDS[name]):
            out.append((name, f"{panel['title']} [{t['refId']}]", t["expr"]))
    return out


def _var_queries(names: list[str]) -> list[tuple[str, str, str]]:
    """Template variables: label_values(selector, label) -> the selector must have series."""
    out = []
    for name in names:
        for v in DASHBOARDS[name]["templating"]["list"]:
            if v["type"] == "query":
                selector = v["definition"].removeprefix("label_values(").rsplit(",", 1)[0]
                out.append((name, f"variable ${v['name']}", selector))
    return out


# --------------------------------------------------------------------------------------
# Traffic
# --------------------------------------------------------------------------------------
def _post(url: str, body: dict[str, Any], timeout: float = 300) -> bytes:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        assert resp.status == 200
        return resp.read()


def _chat(server: Any, content: Any, max_tokens: int = 8, stream: bool = False) -> None:
    _post(
        f"{server.base_url}/chat/completions",
        {
            "model": server.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": stream,
        },
    )


def _send_round(server: Any, seed: int) -> int:
    import media  # local/media.py (root conftest puts local/ on sys.path)

    def img(i: int) -> dict[str, Any]:
        return media.image_part(media.data_url("image/png", media.png_bytes(seed=seed * 10 + i)))

    vid = media.video_part(
        media.data_url("video/mp4", media.mp4_bytes(frames=4, width=96, height=64, seed=seed))
    )
    jobs: list[Callable[[], None]] = [
        lambda: _chat(server, f"Count to ten, round {seed}.", stream=False),
        lambda: _chat(server, f"Name a colour, round {seed}.", stream=True),
        lambda: _chat(server, f"Say hi {seed}.", max_tokens=16, stream=True),
        lambda: _chat(server, [{"type": "text", "text": "What is shown?"}, img(0)]),
        lambda: _chat(server, [{"type": "text", "text": "Compare."}, img(1), img(2)], stream=True),
        lambda: _chat(server, [{"type": "text", "text": "Describe the video."}, vid]),
    ]
    with cf.ThreadPoolExecutor(max_workers=4) as pool:
        for fut in [pool.submit(j) for j in jobs]:
            fut.result()
    return len(jobs)


def _value(prom: Any, expr: str) -> float:
    res = prom.query(expr)
    return float(res[0]["value"][1]) if res else 0.0


def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(1)
    raise TimeoutError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def scraped(vllm_server: Any, prometheus: Any) -> Any:
    """Prometheus after two scraped rounds of real text/image/video traffic."""
    base = _value(prometheus, "sum(gemma4_request_e2e_latency_seconds_count)")
    sent = 0
    for seed in (1, 2):
        calls_before = _value(prometheus, "sum(gemma4_encoder_calls_total)")
        sent += _send_round(vllm_server, seed)
        target = base + sent
        _wait(
            lambda t=target: (
                _value(prometheus, "sum(gemma4_request_e2e_latency_seconds_count)") >= t
            ),
            60,
            "Prometheus to scrape the finished requests",
        )
        # The encoder counters too (the image/video requests must have reached them); a
        # timeout here is reported precisely by the per-query tests below.
        with contextlib.suppress(TimeoutError):
            _wait(
                lambda cb=calls_before: _value(prometheus, "sum(gemma4_encoder_calls_total)") > cb,
                30,
                "encoder calls",
            )
    # Recording rules (evaluated at the scrape interval) must have produced the 1h ratio.
    with contextlib.suppress(TimeoutError):
        _wait(
            lambda: bool(prometheus.query("gemma4:request_e2e_slo_error_ratio:rate1h")),
            60,
            "recording rules",
        )
    return prometheus


SERVER_BOARDS = ["gemma4-serving.json", "gemma4-encoder.json"]


@pytest.mark.parametrize(
    ("board", "title", "expr"),
    _queries(SERVER_BOARDS) + _var_queries(SERVER_BOARDS),
    ids=lambda x: x if len(x) < 60 else x[:60],
)
def test_server_dashboard_query_returns_data(
    scraped: Any, board: str, title: str, expr: str
) -> None:
    promql = dashlib.substitute(expr, RATE_WINDOW)
    result = scraped.query(promql)
    assert result, f"{board} / {title}: no data for\n{promql}"


def test_slo_compliance_agrees_with_vllms_bucket(scraped: Any) -> None:
    """Our le=0.3 bucket and vLLM's are the same boundary over the same requests."""
    w = RATE_WINDOW
    ours = _value(
        scraped,
        f'sum(increase(gemma4_request_e2e_latency_seconds_bucket{{le="0.3"}}[{w}]))'
        f" / sum(increase(gemma4_request_e2e_latency_seconds_count[{w}]))",
    )
    theirs = _value(
        scraped,
        f'sum(increase(vllm:e2e_request_latency_seconds_bucket{{le="0.3"}}[{w}]))'
        f" / sum(increase(vllm:e2e_request_latency_seconds_count[{w}]))",
    )
    assert ours == pytest.approx(theirs, abs=0.05)


def test_rules_load_and_evaluate_in_the_real_prometheus(scraped: Any) -> None:
    """The fixture's Prometheus loaded dashboards/rules/*.yaml: every rule evaluates cleanly
    on real series, the SLO recording rules have data, and no alert fires on a healthy stack
    except the latency burn (a CPU box is far slower than 300 ms)."""
    with urllib.request.urlopen(f"{scraped.url}/api/v1/rules", timeout=10) as resp:
        groups = json.load(resp)["data"]["groups"]
    names = {g["name"] for g in groups}
    assert {"gemma4-slo.rules", "gemma4-slo.alerts", "gemma4-serving.alerts"} <= names
    for g in groups:
        for r in g["rules"]:
            assert r["health"] == "ok", f"{r['name']}: {r.get('lastError')}"
    for record in (
        "gemma4:request_e2e_slo_error_ratio:rate5m",
        "gemma4:request_e2e_slo_error_ratio:rate1h",
        "gemma4:request_ttft_seconds:p95_rate5m",
        "gemma4:request_e2e_seconds:p95_rate5m",
    ):
        assert scraped.query(record), f"recording rule {record} has no data"
    firing = {
        r["metric"]["alertname"]
        for r in scraped.query('ALERTS{alertstate="firing"}')
        if r["metric"]["alertname"] != "Gemma4LatencySLOBudgetBurn"
    }
    assert not firing, f"alerts firing on the healthy local stack: {firing}"


def test_png_render_from_real_prometheus(scraped: Any, tmp_path: Path) -> None:
    render_png = dashlib.load_module("render_png")
    out = render_png.render(scraped.url, tmp_path / "serving-latency.png", minutes=10, step="2s")
    assert out.stat().st_size > 5000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------------------
# Load-test dashboard: Pushgateway + its own Prometheus
# --------------------------------------------------------------------------------------
def _slo_loadtest_push(server: Any, pushgateway: str, out: Path) -> str:
    """A real (short) `slo-loadtest run` against the local vLLM that pushes its summary."""
    exe = shutil.which("slo-loadtest") or str(Path(sys.executable).parent / "slo-loadtest")
    argv = [
        exe, "run",
        "--target", server.url,
        "--workloads", "text",
        "--rates", "1",
        "--duration", "6",
        "--warmup", "1",
        "--prompt-tokens", "32",
        "--output-tokens", "4",
        "--tokenizer", str(server.model_path),
        "--out", str(out),
        "--no-plots",
        "--seed", "1",
        "--pushgateway", pushgateway,
    ]  # fmt: skip
    # Exit code 0 pass / 1 fail / 2 incomplete: a CPU box fails the SLO; the push is what counts.
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert "pushed http" in proc.stderr, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stderr


@pytest.fixture(scope="module")
def loadtest_prometheus(vllm_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    import stack  # local/stack.py

    binary = shutil.which("prometheus-pushgateway")
    assert binary, "apt-get install -y prometheus-pushgateway"
    work = tmp_path_factory.mktemp("pushgateway")
    pg_port = stack.free_port()
    pg = stack.Process(
        "pushgateway",
        [binary, f"--web.listen-address=127.0.0.1:{pg_port}"],
        {},
        work / "pushgateway.log",
    )
    pg.start()

    class PushgatewayPrometheus(stack.PrometheusServer):
        def config(self) -> dict:
            return {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "pushgateway",
                        "honor_labels": True,
                        "static_configs": [{"targets": [self.target]}],
                    }
                ],
            }

    prom = None
    try:
        pg.wait_until(f"http://127.0.0.1:{pg_port}/-/ready", 30)
        _slo_loadtest_push(vllm_server, f"http://127.0.0.1:{pg_port}", work / "results")
        prom = PushgatewayPrometheus(target=f"127.0.0.1:{pg_port}", workdir=work / "prom").start()
        _wait(lambda: bool(prom.query("slo_loadtest_slo_pass")), 60, "pushgateway scrape")
        yield prom
    finally:
        if prom:
            prom.stop()
        pg.stop()


@pytest.mark.parametrize(
    ("board", "title", "expr"),
    _queries(["gemma4-loadtest.json"]) + _var_queries(["gemma4-loadtest.json"]),
    ids=lambda x: x if len(x) < 60 else x[:60],
)
def test_loadtest_dashboard_query_returns_data(
    loadtest_prometheus: Any, board: str, title: str, expr: str
) -> None:
    promql = dashlib.substitute(expr, RATE_WINDOW)
    result = loadtest_prometheus.query(promql)
    assert result, f"{board} / {title}: no data for\n{promql}"
