"""images/entrypoint.sh with GEMMA4_WARMUP=1, serving real vLLM with two API servers: the done
file (the chart's startup probe) appears only after the warm-up's requests were served and each
API server has decoded a video, a stale one from a previous container is never trusted, the
server keeps serving, and a SIGTERM to the entrypoint alone (what the kubelet sends to PID 1)
stops vLLM."""

from __future__ import annotations

import json
import re
import signal
import time

import httpx
import pytest

from gemma4_batched_encoder.api_processes import process_counts

pytestmark = pytest.mark.e2e

# one video only: a second API server is reached by the warm-up's extra rounds, or not at all
WARMUP_ARGS = "--bursts 1 --image-bursts 2 --video-frames 2 --width 160 --height 120"


def successes(text: str) -> float:
    return sum(
        float(v) for v in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M)
    )


def test_warmup_gates_the_done_file_and_sigterm_stops_vllm(vllm_server_factory, tmp_path):
    done = tmp_path / "warmup" / "done"
    done.parent.mkdir()
    done.write_text("stale: from the previous container")
    server = vllm_server_factory(
        "warmup",
        env={
            "GEMMA4_WARMUP": "1",
            "GEMMA4_WARMUP_DONE_FILE": str(done),
            "GEMMA4_WARMUP_ARGS": WARMUP_ARGS,
        },
        args=["--api-server-count", "2"],
    )
    deadline = time.monotonic() + 180
    while done.read_text() if done.exists() else True:  # the stale file is removed at start
        assert time.monotonic() < deadline, server.log_path.read_text()[-3000:]
        time.sleep(0.5)
    log = server.log_path.read_text()
    report = json.loads(next(ln for ln in log.splitlines() if ln.startswith('{"target"')))
    assert report["ok"], report
    # text, an image, 1 video, 2 images at once, then rounds of 2 videos and 2 texts at once
    # until both API servers had decoded a video: all served before the file
    reach = report["api_servers"]
    assert reach["expected"] == 2 and reach["reached"] == 2 and reach["rounds"] >= 1, reach
    assert [p["phase"] for p in report["phases"]] == [
        "text",
        "image",
        "1 video at once",
        "2 images at once",
        *(f"reach round {r}: 2 videos and 2 texts at once" for r in range(1, reach["rounds"] + 1)),
    ]
    assert successes(server.metrics_text()) == 5 + 4 * reach["rounds"]
    shares = process_counts(server.metrics_dir)
    assert len(shares) == 2 and all(c["videos"] >= 1 for c in shares.values()), shares
    resp = httpx.post(
        f"{server.base_url}/chat/completions",
        json={
            "model": server.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2,
        },
        timeout=60,
    )
    assert resp.status_code == 200, resp.text

    popen = server.process.popen
    popen.send_signal(signal.SIGTERM)  # the entrypoint only, not its process group
    popen.wait(timeout=60)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{server.url}/health", timeout=5)
