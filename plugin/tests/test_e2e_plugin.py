"""The plugin inside a real vLLM (CPU) server: loaded, used, measured, and output-neutral."""

from __future__ import annotations

import re
import time

import httpx
import pytest

import media  # local/media.py (root conftest puts local/ on sys.path)

pytestmark = pytest.mark.e2e

OVERRIDE_LINE = "gemma4_batched_encoder: vision encoder override active"


def chat(server, content, max_tokens: int = 8) -> dict:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "logprobs": True,
    }
    resp = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


def image_request(seed: int) -> list[dict]:
    url = media.data_url("image/png", media.png_bytes(320, 240, seed=seed))
    return [{"type": "text", "text": "describe"}, media.image_part(url)]


def video_request(seed: int) -> list[dict]:
    url = media.data_url("video/mp4", media.mp4_bytes(frames=6, width=640, height=480, seed=seed))
    return [{"type": "text", "text": "describe"}, media.video_part(url)]


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    found = False
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
            found = True
    assert found, f"{name}{labels} not on /metrics"
    return total


def tokens(response: dict) -> list[str]:
    return [t["token"] for t in response["choices"][0]["logprobs"]["content"]]


def test_override_is_logged(vllm_server):
    log = vllm_server.log_path.read_text()
    assert OVERRIDE_LINE in log
    assert "mode=exact" in log
    assert "plugin inactive" not in log and "does not recognise" not in log
    # vLLM 0.32 copies the image ranges asynchronously itself; the placeholder cache applies
    # (the greedy-output test below then serves images and videos through it).
    assert "without a host sync" in log and "PlaceholderRange.extract_embeds_range" in log
    # GEMMA4_ENGINE_GRAPH_RANGES is auto: a CPU server runs no FULL CUDA graphs, so no buffer
    assert "graph-safe buffer" not in log and "cudagraph_mode FULL" not in log


def test_image_and_video_go_through_plugin(vllm_server):
    before = vllm_server.metrics_text()
    calls_before = metric(before, "gemma4_encoder_calls_total", path="plugin")
    chat(vllm_server, image_request(seed=101))
    chat(vllm_server, video_request(seed=102))
    text = vllm_server.metrics_text()
    assert metric(text, "gemma4_encoder_calls_total", path="plugin") >= calls_before + 2
    assert metric(text, "gemma4_encoder_items_per_call_sum", kind="frame") >= 6
    assert metric(text, "gemma4_encoder_items_per_call_count", kind="image") >= 1
    assert metric(text, "gemma4_encoder_seconds_count", path="plugin") >= 2
    assert metric(text, "gemma4_encoder_seconds_sum", path="plugin") > 0
    assert metric(text, "gemma4_encoder_info", mode="exact", cuda_graphs="false") == 1
    assert "gemma4_encoder_fallbacks_total{" not in text, "plugin fell back to stock"
    assert metric(text, "gemma4_encoder_calls_total", path="stock") == 0


def test_the_model_threads_cpu_is_on_metrics(vllm_server):
    """The thread that built the model runs it: its CPU time reaches /metrics from the model's
    process through vLLM's multi-process collector, sampled every 5 s by default."""
    log = vllm_server.log_path.read_text()
    assert "engine thread CPU sampled every 5 s" in log
    chat(vllm_server, video_request(seed=104))
    cpu = metric(vllm_server.metrics_text(), "gemma4_engine_thread_cpu_seconds_total")
    deadline = time.monotonic() + 15
    while cpu == 0 and time.monotonic() < deadline:  # the first sample is due within 5 s
        time.sleep(1)
        cpu = metric(vllm_server.metrics_text(), "gemma4_engine_thread_cpu_seconds_total")
    assert cpu > 0
    metric(vllm_server.metrics_text(), "gemma4_engine_thread_wait_seconds_total")  # exported


def test_greedy_outputs_identical_with_plugin_disabled(vllm_server, vllm_server_factory):
    """Same weights, same requests: the plugin does not change a single token or logprob."""
    requests = [image_request(seed=201), video_request(seed=202), image_request(seed=203)]
    with_plugin = [chat(vllm_server, r) for r in requests]
    # The comparison means something only if the outputs depend on the pixels: two different
    # images must give different logprobs (they would not with vLLM's near-zero dummy weights).
    first = [t["logprob"] for t in with_plugin[0]["choices"][0]["logprobs"]["content"]]
    third = [t["logprob"] for t in with_plugin[2]["choices"][0]["logprobs"]["content"]]
    assert first != third, "outputs do not depend on the image: the test model has no weights?"
    stock = vllm_server_factory("plugin-disabled", env={"GEMMA4_ENCODER_DISABLE": "1"})
    assert OVERRIDE_LINE not in stock.log_path.read_text()
    without = [chat(stock, r) for r in requests]
    for a, b in zip(with_plugin, without, strict=True):
        assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
        assert tokens(a) == tokens(b)
        logprobs_a = [t["logprob"] for t in a["choices"][0]["logprobs"]["content"]]
        logprobs_b = [t["logprob"] for t in b["choices"][0]["logprobs"]["content"]]
        assert logprobs_a == logprobs_b


def test_fast_mode_keeps_greedy_tokens_on_fixed_inputs(vllm_server, vllm_server_factory):
    """The opt-in fast mode (other kernels, not bitwise) gives the same greedy tokens as exact on
    a fixed set of image and video requests, logprobs within a small distance; its mode shows on
    /metrics."""
    requests = [image_request(seed=301), video_request(seed=302), image_request(seed=303)]
    exact = [chat(vllm_server, r) for r in requests]
    fast_server = vllm_server_factory("fast-mode", env={"GEMMA4_ENCODER_MODE": "fast"})
    assert "mode=fast" in fast_server.log_path.read_text()
    fast = [chat(fast_server, r) for r in requests]
    deviation = 0.0
    for a, b in zip(exact, fast, strict=True):
        assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
        assert tokens(a) == tokens(b)
        for x, y in zip(
            a["choices"][0]["logprobs"]["content"],
            b["choices"][0]["logprobs"]["content"],
            strict=True,
        ):
            deviation = max(deviation, abs(x["logprob"] - y["logprob"]))
    assert deviation < 0.5, deviation
    text = fast_server.metrics_text()
    info = {"mode": "fast", "fast_kernels": "eager", "cuda_graphs": "false"}
    assert metric(text, "gemma4_encoder_info", **info) == 1
    assert metric(text, "gemma4_encoder_calls_total", path="plugin") >= 3


def test_chart_configuration_after_warm_up_keeps_greedy_outputs(vllm_server, vllm_server_factory):
    """The server as the chart runs it: `server.pluginEnv` (uint8 hand-off: the API server sends
    uint8 patches, the engine rescales them) and the warm-up's traffic before the first user
    request. Same tokens and logprobs as the plugin's defaults on text, image and video requests:
    neither the configuration nor the history a warm-up leaves may change what a request gets
    (the H200's sixteenth sitting saw such a server differ in logprobs, text included)."""
    import stack  # local/stack.py: the chart's values, as `make demo` serves them
    from gemma4_batched_encoder import warmup

    requests = [
        [{"type": "text", "text": "describe the weather in three words"}],
        image_request(seed=401),
        video_request(seed=402),
        image_request(seed=403),
    ]
    defaults = [chat(vllm_server, r) for r in requests]
    assert "uint8 pixel values received" not in vllm_server.log_path.read_text()
    # GPU batching, one of the keys, installs only on an accelerator: here it is only accepted
    chart_env = stack.chart_plugin_env()
    assert chart_env.get("GEMMA4_MEDIA_UINT8") == "on", chart_env  # what the assertions below read
    server = vllm_server_factory("chart-config", env=chart_env)
    small = ["--video-frames", "2", "--width", "160", "--height", "120", "--wait", "60"]
    rc = warmup.main(["--target", server.url, "--bursts", "1,3", "--image-bursts", "2", *small])
    assert rc == 0
    configured = [chat(server, r) for r in requests]
    # the engine saw bytes, not floats (logged once, at the first uint8 batch)
    assert "uint8 pixel values received" in server.log_path.read_text()
    for a, b in zip(defaults, configured, strict=True):
        assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
        assert tokens(a) == tokens(b)
        assert [t["logprob"] for t in a["choices"][0]["logprobs"]["content"]] == [
            t["logprob"] for t in b["choices"][0]["logprobs"]["content"]
        ]
    text = server.metrics_text()
    assert "gemma4_encoder_fallbacks_total{" not in text, "plugin fell back to stock"


def test_graph_safe_ranges_keep_greedy_outputs(vllm_server, vllm_server_factory):
    """GEMMA4_ENGINE_GRAPH_RANGES on the real runner: its dispatch reads the step's query windows
    from vLLM's own input batch and requests (a failure there would log "range count check
    failed" and keep every step out of FULL graphs); width 2 < the video's 6 frames, so its
    prefill is the step kept out. Same tokens and logprobs (the range tensor itself only feeds
    the Triton kernel, which a CPU build does not run: graph_ranges_kernel_check.py covers it)."""
    requests = [video_request(seed=501), image_request(seed=502), video_request(seed=503)]
    default = [chat(vllm_server, r) for r in requests]
    server = vllm_server_factory("graph-ranges", env={"GEMMA4_ENGINE_GRAPH_RANGES": "2"})
    ranged = [chat(server, r) for r in requests]
    log = server.log_path.read_text()
    assert "image ranges in a graph-safe buffer, 2 a request" in log
    assert "more than 2 image ranges for one request kept out of FULL CUDA graphs" in log
    assert "range count check failed" not in log
    # each refused step counted (the video prefills), on the server's /metrics
    assert metric(server.metrics_text(), "gemma4_engine_full_graph_refusals_total") >= 2
    for a, b in zip(default, ranged, strict=True):
        assert tokens(a) == tokens(b)
        assert [t["logprob"] for t in a["choices"][0]["logprobs"]["content"]] == [
            t["logprob"] for t in b["choices"][0]["logprobs"]["content"]
        ]
