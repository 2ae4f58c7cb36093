"""`python -m gemma4_batched_encoder.warmup` against the real CPU server: every phase's requests
reach the engine (text, an image, each burst of videos at once) and stay out of the SLO
histogram, a refused request fails the run with the server's reason, and a server that never
comes up is reported as such."""

from __future__ import annotations

import http.server
import json
import re
import socket
import threading

import pytest

from gemma4_batched_encoder import warmup

pytestmark = pytest.mark.e2e

SMALL = ["--video-frames", "2", "--width", "160", "--height", "120", "--wait", "60"]


def counter_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        m = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
            total += float(m.group(2))
    return total


def test_every_phase_reaches_the_engine(vllm_server, capsys):
    before = vllm_server.metrics_text()
    rc = warmup.main(
        ["--target", vllm_server.url, "--bursts", "1,3", "--image-bursts", "2", *SMALL]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["ok"] and report["model"] == vllm_server.model
    assert [(p["phase"], p["requests"], p["failed"]) for p in report["phases"]] == [
        ("text", 1, 0),
        ("image", 1, 0),
        ("1 video at once", 1, 0),
        ("3 videos at once", 3, 0),
        ("2 images at once", 2, 0),
    ]
    after = vllm_server.metrics_text()

    def delta(name: str, **labels: str) -> float:
        return counter_sum(after, name, **labels) - counter_sum(before, name, **labels)

    assert delta("vllm:request_success_total") == 8
    assert delta("gemma4_media_preprocess_seconds_count", stage="video_decode") == 4
    # tagged through vLLM's request ids: served, but not users' latency in the SLO histogram
    assert delta("vllm:e2e_request_latency_seconds_count") == 8
    assert delta("gemma4_request_e2e_latency_seconds_count") == 0


def test_a_refused_request_fails_the_run_with_the_reason(vllm_server, capsys):
    rc = warmup.main(
        ["--target", vllm_server.url, "--model", "no-such-model", "--bursts", "1", *SMALL]
    )
    captured = capsys.readouterr()
    assert rc == 1
    assert json.loads(captured.out.strip().splitlines()[-1])["ok"] is False
    assert "warmup: text: 404" in captured.err and "no-such-model" in captured.err


def test_a_server_that_never_comes_up(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    rc = warmup.main(["--target", f"http://127.0.0.1:{port}", "--wait", "2"])
    assert rc == 2
    assert "not healthy after 2 s" in capsys.readouterr().err


class _HealthyButDropsRequests(http.server.BaseHTTPRequestHandler):
    """Answers /health and /v1/models, then drops every completion unanswered (a server that
    dies under the warm-up)."""

    def do_GET(self):
        body = b'{"data": [{"id": "m"}]}' if self.path == "/v1/models" else b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.close_connection = True  # no status line at all

    def log_message(self, *args):
        pass


def test_requests_left_unanswered_fail_the_run(capsys):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HealthyButDropsRequests)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        target = f"http://127.0.0.1:{server.server_address[1]}"
        rc = warmup.main(["--target", target, "--bursts", "2", "--image-bursts", "none", *SMALL])
    finally:
        server.shutdown()
    captured = capsys.readouterr()
    assert rc == 1
    report = json.loads(captured.out.strip().splitlines()[-1])
    assert [p["failed"] for p in report["phases"]] == [1, 1, 2]
    assert "warmup: text: 0 b'no answer:" in captured.err


@pytest.mark.parametrize(
    "argv", [["--bursts", "0,2"], ["--api-servers", "0"], ["--reach-rounds", "-1"]]
)
def test_bad_options_are_refused(argv):
    with pytest.raises(SystemExit) as exc:
        warmup.main(argv)
    assert exc.value.code == 2
