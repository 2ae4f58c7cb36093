"""``python -m gemma4_batched_encoder.warmup``: media traffic against a fresh server before it
takes real requests, so first-time work happens here and not in a user's request.

What a fresh vLLM does the first time it meets a batch mix, beyond its own start-up warm-up
(which runs text-only dummy batches): Triton compiles new specialisations of its kernels. vLLM
0.20's attention kernel takes the step's image ranges as a constexpr and Triton specialises
integer arguments such as `num_seqs` on "== 1" / "divisible by 16" / other. On the H200 a fresh
server's first burst of 8 videos waited 738..835 ms while `kernel_unified_attention` compiled;
after this warm-up (then bursts 1, 2, 16) that burst took 115..186 ms on one server and
307..394 ms on another, which compiled the slot-mapping kernel for it
(bench/results/h200/vllm-0.20.0-11-warmup-full/NOTES.md, section 1). So the warm-up sends, in
order: one text request, one image, then for each burst size k, k videos at once (default 1, 2,
4, 8 and 16), each with the frame count real traffic uses (the ranges' count is the frames'),
then images at once (default 2 and 16: an image is one range, another constexpr value). Unique
pixels per request; 10 output tokens.

With several API servers each process has first-time work of its own (on this 2-core CPU a
process's first text request took 40-176 ms against a median of 19 without the warm-up), and
which process takes a connection is up to the kernel. With `--api-servers N` and the server's
multiprocess metrics directory (`--metrics-dir`, default $PROMETHEUS_MULTIPROC_DIR; the
entrypoint passes both), the warm-up then checks that every API server has decoded a video and,
while some has not, sends N videos and N text requests at once (at most `--reach-rounds`
times); the JSON line says how many it reached.

Exits 0 when every request got a 200, 1 otherwise (the server answered but refused something:
its reasons are printed), 2 when the server did not come up in --wait seconds. Prints one JSON
line with each phase's wall time. The image's entrypoint runs it before the pod turns Ready
when GEMMA4_WARMUP=1 (images/entrypoint.sh).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .noise_media import data_url, jpeg_bytes, mp4_bytes

OUTPUT_TOKENS = 10
# Every warm-up request's id carries this tag (vLLM names the engine request
# "chatcmpl-<request_id>..."), so the SLO histogram leaves them out (latency_metrics.py): a cold
# server's synthetic bursts are not users' latency, and would trip the burn-rate alerts and the
# SLO autoscaler on every rollout of an idle service.
REQUEST_TAG = "gemma4-warmup-"


class Client:
    def __init__(self, target: str, api_key: str | None, timeout: float) -> None:
        self.target = target.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    def get(self, path: str) -> tuple[int, bytes]:
        return self._send(urllib.request.Request(self.target + path, headers=self.headers))

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
        data = json.dumps(body).encode()
        return self._send(
            urllib.request.Request(self.target + path, data=data, headers=self.headers)
        )

    def _send(self, req: urllib.request.Request) -> tuple[int, bytes]:
        """(HTTP status, body); status 0 when no answer came (refused, reset, timed out)."""
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError as e:  # URLError, a reset connection, a timeout
            return 0, f"no answer: {e}".encode()

    def wait_healthy(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.get("/health")[0] == 200:
                return True
            time.sleep(1)
        return False

    def model(self) -> str:
        status, body = self.get("/v1/models")
        if status != 200:
            raise RuntimeError(f"GET /v1/models: {status} {body[:200]!r}")
        return json.loads(body)["data"][0]["id"]


_request_numbers = itertools.count(1)


def chat_body(model: str, content: list[dict[str, Any]] | str) -> dict[str, Any]:
    return {
        "request_id": f"{REQUEST_TAG}{os.getpid()}-{next(_request_numbers)}",
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": OUTPUT_TOKENS,
        "min_tokens": OUTPUT_TOKENS,
        "ignore_eos": True,
        "temperature": 0.0,
    }


def media_maker(args: argparse.Namespace, model: str) -> Callable[[str], dict[str, Any]]:
    """A request body with one new noise image or video (unique pixels each call)."""
    seeds = itertools.count(1)

    def media(kind: str) -> dict[str, Any]:
        seed = next(seeds)
        if kind == "video":
            payload = mp4_bytes(args.video_frames, args.width, args.height, seed=seed)
            url = data_url("video/mp4", payload)
        else:
            url = data_url("image/jpeg", jpeg_bytes(args.width, args.height, seed=seed))
        part = {"type": f"{kind}_url", f"{kind}_url": {"url": url}}
        return chat_body(model, [{"type": "text", "text": "describe"}, part])

    return media


TEXT = "warm up " * 100


def phases(
    args: argparse.Namespace, model: str, media: Callable[[str], dict[str, Any]]
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """(name, request bodies sent at once) in order; each phase's media is made only when it
    is due (16 noise videos of 854x480 are tens of MB as data URLs)."""
    yield "text", [chat_body(model, TEXT)]
    yield "image", [media("image")]
    for kind, bursts in (("video", args.bursts), ("image", args.image_bursts)):
        for k in bursts:
            yield f"{k} {kind}{'s' if k > 1 else ''} at once", [media(kind) for _ in range(k)]


def run(args: argparse.Namespace) -> int:
    client = Client(args.target, args.api_key, args.timeout)
    if not client.wait_healthy(args.wait):
        print(f"warmup: {args.target} not healthy after {args.wait:.0f} s", file=sys.stderr)
        return 2
    try:
        model = args.model or client.model()
    except (RuntimeError, ValueError, LookupError) as e:
        print(f"warmup: no served model to warm up: {e}", file=sys.stderr)
        return 1
    report: dict[str, Any] = {"target": args.target, "model": model, "phases": []}
    failures: list[str] = []

    def send(name: str, bodies: list[dict[str, Any]]) -> None:
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
            results = list(pool.map(lambda b: client.post("/v1/chat/completions", b), bodies))
        seconds = time.monotonic() - t0
        bad = [f"{name}: {status} {body[:300]!r}" for status, body in results if status != 200]
        failures.extend(bad)
        report["phases"].append(
            {
                "phase": name,
                "requests": len(bodies),
                "seconds": round(seconds, 3),
                "failed": len(bad),
            }
        )

    media = media_maker(args, model)
    for name, bodies in phases(args, model, media):
        send(name, bodies)
    if args.api_servers > 1 and args.metrics_dir:
        report["api_servers"] = reach_every_api_server(args, model, media, send)
    report["ok"] = not failures
    print(json.dumps(report), flush=True)
    for line in failures:
        print(f"warmup: {line}", file=sys.stderr)
    reach = report.get("api_servers")
    if reach and reach["reached"] < reach["expected"]:
        print(
            f"warmup: {reach['reached']} of {reach['expected']} API servers served a video "
            f"after {reach['rounds']} extra rounds; the others do their first-time work on "
            "users' requests",
            file=sys.stderr,
        )
    return 0 if not failures else 1


def reach_every_api_server(
    args: argparse.Namespace,
    model: str,
    media: Callable[[str], dict[str, Any]],
    send: Callable[[str, list[dict[str, Any]]], None],
) -> dict[str, int]:
    """Rounds of N videos and N text requests at once until each of the N API servers has
    decoded a video (or served a request, where the media fast path records no decode)."""
    from .api_processes import process_counts  # prometheus_client: only where vLLM is

    n = args.api_servers
    rounds = 0
    while True:
        counts = process_counts(args.metrics_dir)
        key = "videos" if any(c["videos"] for c in counts.values()) else "requests"
        reached = sum(1 for c in counts.values() if c[key])
        if reached >= n or rounds == args.reach_rounds:
            return {"expected": n, "reached": reached, "rounds": rounds}
        rounds += 1
        bodies = [media("video") for _ in range(n)] + [chat_body(model, TEXT) for _ in range(n)]
        send(f"reach round {rounds}: {n} videos and {n} texts at once", bodies)


def _int_list(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers like 1,2,16, got {text!r}")
    return values


def _int_list_or_none(text: str) -> list[int]:
    return [] if text.strip().lower() == "none" else _int_list(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=f"http://127.0.0.1:{os.environ.get('PORT', '8000')}")
    parser.add_argument("--model", help="served model name (default: the server's first)")
    parser.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY") or None)
    parser.add_argument(
        "--bursts", type=_int_list, default=[1, 2, 4, 8, 16], help="videos at once, per phase"
    )
    parser.add_argument(
        "--image-bursts",
        type=_int_list_or_none,
        default=[2, 16],
        help="images at once, per phase, after the videos ('none': no image bursts)",
    )
    parser.add_argument(
        "--video-frames", type=int, default=6, help="frames per video (real traffic's)"
    )
    parser.add_argument("--width", type=int, default=854)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument(
        "--api-servers",
        type=int,
        default=1,
        help="the server's --api-server-count: check that the warm-up reached each of them",
    )
    parser.add_argument(
        "--metrics-dir",
        type=Path,
        default=os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None,
        help="the server's PROMETHEUS_MULTIPROC_DIR (same host), read per process",
    )
    parser.add_argument(
        "--reach-rounds",
        type=int,
        default=4,
        help="at most this many extra rounds to reach every API server",
    )
    parser.add_argument("--wait", type=float, default=1800.0, help="seconds to wait for /health")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    args = parser.parse_args(argv)
    if args.video_frames < 1 or args.width < 16 or args.height < 16:
        parser.error("--video-frames must be >= 1 and --width/--height >= 16")
    if args.api_servers < 1 or args.reach_rounds < 0:
        parser.error("--api-servers must be >= 1 and --reach-rounds >= 0")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
