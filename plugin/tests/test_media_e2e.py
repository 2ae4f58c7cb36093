"""The shared vLLM server answers video requests with the media fast path on (its default) and
shows the per-stage preprocessing histogram on /metrics.

The histogram appears once the plugin's register() calls `gemma4_batched_encoder.media.install()`
(bench/MEDIA.md, "Wiring").
"""

from __future__ import annotations

import os
import re

import httpx
import pytest

import media

pytestmark = pytest.mark.e2e

STAGES = ("base64_decode", "video_decode", "image_processor", "mm_processor")


def video_request(server, seed: int) -> httpx.Response:
    url = media.data_url("video/mp4", media.mp4_bytes(frames=6, width=640, height=480, seed=seed))
    body = {
        "model": server.model,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "describe"}, media.video_part(url)],
            }
        ],
        "max_tokens": 3,
        "temperature": 0.0,
    }
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)


def stage_counts(text: str) -> dict[str, float]:
    pattern = re.compile(
        r'^gemma4_media_preprocess_seconds_count\{[^}]*stage="([^"]+)"[^}]*\} (\S+)$', re.M
    )
    return {stage: float(value) for stage, value in pattern.findall(text)}


def test_video_request_with_fast_path(vllm_server) -> None:
    # The server inherits this environment: the fast path is at its default (on). The API
    # server's plugin INFO lines do not show in its log (seen on vLLM 0.32), so the install-time
    # self-check is covered by the unit tests instead.
    assert os.environ.get("GEMMA4_MEDIA_FAST_PATH", "1") == "1"
    resp = video_request(vllm_server, seed=801)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["prompt_tokens"] > 300  # 6 frames x 63 soft tokens and markers


def test_stage_histogram_on_metrics(vllm_server) -> None:
    before = stage_counts(vllm_server.metrics_text())
    assert video_request(vllm_server, seed=802).status_code == 200
    after = stage_counts(vllm_server.metrics_text())
    for stage in STAGES:
        assert after.get(stage, 0) >= before.get(stage, 0) + 1, (stage, after)
    text = vllm_server.metrics_text()
    assert 'gemma4_media_preprocess_seconds_bucket{le="0.0005",stage="video_decode"}' in text
    # vLLM 0.32's frame-count check: the test clips are plain mp4s, so it was not run
    assert re.search(
        r'^gemma4_media_frame_count_check_total\{[^}]*outcome="skipped"[^}]*\} [1-9]', text, re.M
    )
    # where the API server's processor thread spent that time, all three states exported
    for state in ("on_cpu", "runnable", "blocked"):
        assert re.search(
            r'^gemma4_media_preprocess_thread_seconds_total\{[^}]*stage="mm_processor"'
            rf'[^}}]*state="{state}"[^}}]*\}} \S+$',
            text,
            re.M,
        ), state
