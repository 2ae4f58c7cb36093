"""The local stack serves text, image and video chat completions and exposes vLLM's metrics."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import httpx
import pytest

import media
import stack
from gemma4_batched_encoder.api_processes import process_counts

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ttft_gap

pytestmark = pytest.mark.e2e

OUTPUT_TOKENS = 10


def chat(server, content, **extra) -> httpx.Response:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": OUTPUT_TOKENS,
        # Random weights may emit EOS at once; the SLO workload is exactly 10 output tokens.
        "min_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "temperature": 0.0,
        **extra,
    }
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)


def assert_ten_tokens(resp: httpx.Response) -> None:
    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    assert usage["completion_tokens"] == OUTPUT_TOKENS
    assert resp.json()["choices"][0]["message"]["content"]


def prompt(words: int) -> str:
    return " ".join(f"w{i % 2000}" for i in range(words))


def test_text(vllm_server):
    resp = chat(vllm_server, prompt(500))
    assert_ten_tokens(resp)
    # one word, one token (plus the chat markers): the load test's ~500-token sizing holds
    assert 500 <= resp.json()["usage"]["prompt_tokens"] <= 520


def test_image(vllm_server):
    url = media.data_url("image/png", media.png_bytes(320, 240, seed=1))
    assert_ten_tokens(
        chat(vllm_server, [{"type": "text", "text": "describe"}, media.image_part(url)])
    )


def test_video(vllm_server):
    url = media.data_url("video/mp4", media.mp4_bytes(frames=6, width=640, height=480, seed=2))
    resp = chat(vllm_server, [{"type": "text", "text": "describe"}, media.video_part(url)])
    assert_ten_tokens(resp)
    # 6 frames of 480p at 70 soft tokens a frame budget: hundreds of prompt tokens
    assert resp.json()["usage"]["prompt_tokens"] > 300


def test_streaming_reports_first_token(vllm_server):
    body = {
        "model": vllm_server.model,
        "messages": [{"role": "user", "content": prompt(50)}],
        "max_tokens": OUTPUT_TOKENS, "min_tokens": OUTPUT_TOKENS, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    with httpx.stream(
        "POST", f"{vllm_server.base_url}/chat/completions", json=body, timeout=120
    ) as r:
        assert r.status_code == 200
        chunks = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert chunks[-1] == "data: [DONE]"
    assert sum('"content"' in c for c in chunks) >= 1


def test_metrics_expose_latency_histograms(vllm_server):
    assert_ten_tokens(chat(vllm_server, prompt(20)))
    text = vllm_server.metrics_text()
    for name in (
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:request_queue_time_seconds_bucket",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
    ):
        assert name in text, f"{name} missing from /metrics"
    count = [
        line for line in text.splitlines()
        if line.startswith("vllm:e2e_request_latency_seconds_count")
    ]  # fmt: skip
    assert count and float(count[0].split()[-1]) >= 1


def test_prometheus_scrapes_the_server(vllm_server, prometheus):
    assert_ten_tokens(chat(vllm_server, prompt(20)))
    prometheus.wait_for_scrapes(2)
    up = prometheus.query('up{job="gemma4-serving"}')
    assert up and up[0]["value"][1] == "1"
    assert prometheus.query("vllm:e2e_request_latency_seconds_count")


def test_several_api_servers_serve_video_and_share_metrics(vllm_server_factory):
    """The chart's topology (server.apiServerCount > 1, the chart's server.pluginEnv) serves
    video, and /metrics sums what the API-server processes preprocessed, whichever of them took
    each request (multi-process mode)."""
    server = vllm_server_factory(
        "api-servers-2", env=stack.chart_plugin_env(), args=["--api-server-count", "2"]
    )
    n = 4
    for seed in range(n):
        url = media.data_url(
            "video/mp4", media.mp4_bytes(frames=3, width=320, height=240, seed=seed)
        )
        assert_ten_tokens(
            chat(server, [{"type": "text", "text": "describe"}, media.video_part(url)])
        )
    text = server.metrics_text()
    counts = dict(
        re.findall(r'^gemma4_media_preprocess_seconds_count\{stage="(\w+)"\} (\S+)$', text, re.M)
    )
    assert float(counts["video_decode"]) == n
    assert re.search(r"^gemma4_encoder_calls_total\{path=\"plugin\"\} (\S+)$", text, re.M)
    success = re.search(
        r'^vllm:request_success_total\{[^}]*finished_reason="length"[^}]*\} (\S+)$', text, re.M
    )
    assert success and float(success.group(1)) == n
    log = server.log_path.read_text()
    # two API-server processes really ran, each with the media fast path (a launcher that
    # ignores the flag runs one)
    for n_api in (0, 1):
        assert re.search(rf"\(ApiServer_{n_api} pid=\d+\) .*gemma4 media: installed", log)
    # the chart's GEMMA4_MEDIA_UINT8=on (test_manifests pins it) reached both processes
    assert "uint8 pixel values received" in log

    # Each process's own files hold its share, and the shares add up to what /metrics sums; the
    # gap probe's --multiproc-dir places each sequential request on the API server that took it
    api_pids = {int(p) for p in re.findall(r"\(ApiServer_\d pid=(\d+)\)", log)}
    shares = process_counts(server.metrics_dir)
    assert set(shares) <= api_pids  # the engine core serves no request itself
    assert sum(c["videos"] for c in shares.values()) == n
    assert sum(c["requests"] for c in shares.values()) == n
    watch = ttft_gap.ProcessWatch(server.metrics_dir)
    body = ttft_gap.chat_body(server.model, "hello there", stream=True)

    async def sequence() -> list[dict | None]:
        took = []
        async with ttft_gap.probe_client(fresh_connections=True) as client:
            for _ in range(4):
                await ttft_gap.ttft(client, f"{server.base_url}/chat/completions", body)
                took.append(watch.took())
        return took

    took = asyncio.run(sequence())
    assert all(t is not None and t["pid"] in api_pids for t in took), took
    for t in took:  # each placed request moved its process's count on by one
        share = shares.setdefault(t["pid"], {"requests": 0.0, "videos": 0.0})
        assert share["requests"] == t["requests_before"], (t, shares)
        share["requests"] += 1
