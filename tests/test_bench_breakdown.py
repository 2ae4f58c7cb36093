"""bench/ttft_gap.py's per-phase breakdown reads the real server's /metrics: one video request
shows up once in each stage it passes, and nothing else moves between the two scrapes."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
import pytest

import media

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ttft_gap

pytestmark = pytest.mark.e2e


def test_one_video_appears_once_in_every_stage_it_passes(vllm_server):
    url = media.data_url("video/mp4", media.mp4_bytes(frames=3, width=320, height=240, seed=7))
    body = {
        "model": vllm_server.model,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}, media.video_part(url)]}
        ],
        "max_tokens": 2,
    }
    before = ttft_gap.stage_sums(vllm_server.metrics_text())
    resp = httpx.post(f"{vllm_server.base_url}/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    stages = ttft_gap.breakdown(before, ttft_gap.stage_sums(vllm_server.metrics_text()))
    # the plugin's stages, their thread states and vLLM's stages all present
    assert set(stages) == set(ttft_gap.STAGES) | set(ttft_gap.THREAD_STATES)
    for label in ("mp4 decode (API server)", "vLLM processor (API server)", "prefill (engine)"):
        assert stages[label]["count"] == 1, (label, stages)
    assert stages["  of which image processor"]["count"] >= 1
    assert stages["vision encoder, per call (engine)"]["count"] >= 1
    timed = [label for label in ttft_gap.STAGES if label != "queue (engine)"]
    assert all(stages[label]["mean_ms"] > 0 for label in timed), stages
    proc = stages["vLLM processor (API server)"]["mean_ms"]
    assert stages["  of which image processor"]["mean_ms"] <= proc
    # the processor's wall time splits into on a CPU, waiting for one and blocked, exactly
    split = [v for k, v in stages.items() if k.startswith("    processor ")]
    assert len(split) == 3 and all(v["count"] == 1 for v in split)
    assert sum(v["mean_ms"] for v in split) == pytest.approx(proc, rel=1e-6)
    assert stages["    processor on a CPU"]["mean_ms"] > 0
    # no request in between: a second breakdown over the same scrape is empty
    after = ttft_gap.stage_sums(vllm_server.metrics_text())
    assert ttft_gap.breakdown(after, after) == {}


def _chat_ports(log: Path) -> list[str]:
    """The client ports of the server's access-log lines for chat requests, in order."""
    lines = log.read_text(errors="replace").splitlines()
    return [ln.split()[1].rsplit(":", 1)[1] for ln in lines if '"POST /v1/chat/completions' in ln]


@pytest.mark.parametrize(
    "drain, fresh, connections", [(False, False, 2), (True, False, 1), (True, True, 2)]
)
def test_sequential_probes_reuse_one_connection_only_when_draining(
    vllm_server, drain, fresh, connections
):
    """The gap probe's default stops reading at the first content, which closes the connection,
    so with several API servers each request may land on another one; --drain keeps one, unless
    --fresh-connections asks for a new one each time."""
    url = f"{vllm_server.base_url}/chat/completions"
    body = ttft_gap.chat_body(vllm_server.model, "hello there", stream=True)

    async def two() -> list[float]:
        async with ttft_gap.probe_client(fresh) as client:
            return [await ttft_gap.ttft(client, url, body, drain) for _ in range(2)]

    seen = len(_chat_ports(vllm_server.log_path))
    assert all(ms > 0 for ms in asyncio.run(two()))
    deadline = time.monotonic() + 10  # the second line is logged as its response starts
    while (
        len(ports := _chat_ports(vllm_server.log_path)[seen:]) < 2 and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert len(ports) == 2 and len(set(ports)) == connections, ports
