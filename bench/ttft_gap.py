"""Single-request TTFT of text vs video, and simultaneous-video bursts, against a running server.

    python bench/ttft_gap.py --target http://127.0.0.1:8000 --n 20 --burst 8,16 --out gap.json

Text: ~500 one-token words, 10 output tokens. Video: one mp4 of 6 frames at 854x480 (unique per
request, made with slo_loadtest's generator; MPEG-4 Part 2, or H.264 with --video-codec h264),
10 output tokens. Requests are sequential for the
gap (median of n after 3 warm-ups); a burst sends k videos at once and reports the spread of
their TTFTs. TTFT = first streamed content delta, measured by an httpx client on the same host.
A request stops reading at its first content, which closes its connection, so the next one
opens a new connection while the server still generates the rest; `--drain` reads each stream
to its end (one reused connection, each request on an idle engine); with `--fresh-connections`
as well, each request still opens its own connection.

Where the time went, per phase (the sequential videos, each warm burst): the server's /metrics
before and after, as mean ms per observation of each stage (the plugin's media stages and encoder
calls, vLLM's queue, prefill and TTFT; the media stages' split into on a CPU, waiting for a
CPU and blocked); stages a server does not export are left out.

    python bench/ttft_gap.py --between before.txt after.txt   # the same breakdown, saved scrapes

Which API-server process took each request (same host as the server): `--multiproc-dir DIR`,
vLLM's multiprocess metrics directory (PROMETHEUS_MULTIPROC_DIR), holds one set of files per
process id; the process whose first-token count grew took the request. Each sequential request
then records that process and what it had served before (requests, videos), and the run records
what every process had served when the probe began (how far the warm-up reached), so a slow
request can be checked against being its process's first.

What compiled while it ran (same host as the server): `--watch-dir ~/.triton/cache --watch-dir
/tmp/torchinductor_$USER` records, per phase, the files that appeared in those compile caches, so
a stall at a batch mix the server had not run before (a Triton kernel specialised anew at serving
time) shows up with the kernel's name.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gemma4_batched_encoder.api_processes import PROCESS_COUNTS, process_counts
from slo_loadtest.media import VIDEO_CODECS, write_video

# label in the breakdown -> (histogram name, label values it must have)
STAGES = {
    "mp4 decode (API server)": ("gemma4_media_preprocess_seconds", {"stage": "video_decode"}),
    "vLLM processor (API server)": ("gemma4_media_preprocess_seconds", {"stage": "mm_processor"}),
    "  of which image processor": ("gemma4_media_preprocess_seconds", {"stage": "image_processor"}),
    "queue (engine)": ("vllm:request_queue_time_seconds", {}),
    "vision encoder, per call (engine)": ("gemma4_encoder_seconds", {"path": "plugin"}),
    "prefill (engine)": ("vllm:request_prefill_time_seconds", {}),
    "TTFT (server side)": ("vllm:time_to_first_token_seconds", {}),
}

# Where a stage's calling thread spent its wall time (the plugin's thread-state counter), per
# observation of the stage: label -> (stage label above, media stage, state).
THREAD_STATES = {
    f"{indent}{what}": (parent, stage, state)
    for parent, stage, indent in (
        ("mp4 decode (API server)", "video_decode", "    decode "),
        ("vLLM processor (API server)", "mm_processor", "    processor "),
    )
    for state, what in (
        ("on_cpu", "on a CPU"),
        ("runnable", "waiting for a CPU"),
        ("blocked", "blocked (GIL, locks, I/O, other threads)"),
    )
}
THREAD_COUNTER = "gemma4_media_preprocess_thread_seconds_total"

Sums = dict[str, tuple[float, float]]


def stage_sums(exposition: str) -> Sums:
    """(sum seconds, count) per STAGES and THREAD_STATES label, summed over processes and other
    labels; a thread state's count is its stage's."""
    totals: dict[str, list[float]] = {label: [0.0, 0.0] for label in (*STAGES, *THREAD_STATES)}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            for label, (name, want) in STAGES.items():
                if sample.name not in (f"{name}_sum", f"{name}_count"):
                    continue
                if any(sample.labels.get(k) != v for k, v in want.items()):
                    continue
                totals[label][sample.name.endswith("_count")] += sample.value
            if sample.name == THREAD_COUNTER:
                for label, (_, stage, state) in THREAD_STATES.items():
                    if sample.labels.get("stage") == stage and sample.labels.get("state") == state:
                        totals[label][0] += sample.value
    for label, (parent, _, _) in THREAD_STATES.items():
        totals[label][1] = totals[parent][1]
    return {label: (s, c) for label, (s, c) in totals.items()}


def breakdown(before: Sums, after: Sums) -> dict[str, dict[str, float]]:
    """Mean ms and number of observations per stage between two scrapes (observed stages only)."""
    out = {}
    for label, (s1, c1) in after.items():
        s0, c0 = before.get(label, (0.0, 0.0))
        if c1 > c0:
            out[label] = {"mean_ms": 1000 * (s1 - s0) / (c1 - c0), "count": c1 - c0}
    return out


# A compiled kernel's file in Triton's cache (.cubin) or Inductor's (.py: its generated code).
KERNEL_SUFFIXES = (".cubin", ".hsaco", ".py")


class CompileWatch:
    """Files that appear in the watched compile caches between one `mark` and the next."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs
        self.phases: dict[str, dict] = {}
        self._seen = self._files()

    def _files(self) -> set[Path]:
        return {p for d in self.dirs if d.is_dir() for p in d.rglob("*") if p.is_file()}

    def mark(self, phase: str) -> None:
        now = self._files()
        new = now - self._seen
        self._seen = now
        if new:
            kernels = sorted({p.stem for p in new if p.suffix in KERNEL_SUFFIXES})
            self.phases[phase] = {"new_files": len(new), "kernels": kernels}


class ProcessWatch:
    """Which process took each sequential request: the one whose first-token count grew since
    the last look (a request is counted when its first token is sent, so by the time the probe
    has read it). Without a directory it records nothing."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        self.at_start = process_counts(directory) if directory else {}
        self._last = self.at_start

    def took(self) -> dict | None:
        """{"pid", "requests_before", "videos_before"} for the request just read; None without
        a directory or when not exactly one process's count grew (the request is not placed)."""
        if self.directory is None:
            return None
        now = process_counts(self.directory)
        last, self._last = self._last, now
        zero = dict.fromkeys(PROCESS_COUNTS, 0.0)
        moved = {
            pid: c["requests"] - last.get(pid, zero)["requests"]
            for pid, c in now.items()
            if c["requests"] != last.get(pid, zero)["requests"]
        }
        if list(moved.values()) != [1.0]:
            return None
        (pid,) = moved
        before = last.get(pid, zero)
        return {
            "pid": pid,
            "requests_before": before["requests"],
            "videos_before": before["videos"],
        }


async def scrape(client: httpx.AsyncClient, target: str) -> Sums:
    resp = await client.get(target.rstrip("/") + "/metrics")
    resp.raise_for_status()
    return stage_sums(resp.text)


def video_url(
    key: int, seed: int, tmp: Path, width: int = 854, height: int = 480, codec: str = "mpeg4"
) -> str:
    """A 6-frame synthetic mp4 as a data URL (also used by greedy_outputs.py)."""
    path = write_video(
        tmp / f"v{key}.mp4", key, frames=6, width=width, height=height, fps=2, seed=seed,
        codec=codec,
    )  # fmt: skip
    return "data:video/mp4;base64," + base64.b64encode(path.read_bytes()).decode()


def chat_body(model: str, content: object, **extra: object) -> dict:
    """A greedy request for exactly 10 tokens (the SLO's shape)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 10,
        "min_tokens": 10,
        "ignore_eos": True,
        "temperature": 0.0,
        # A dummy-weights model emits only special tokens; keep them so content is streamed.
        "skip_special_tokens": False,
        **extra,
    }


def _body(model: str, content: object) -> dict:
    return chat_body(model, content, stream=True)


async def ttft(client: httpx.AsyncClient, url: str, body: dict, drain: bool = False) -> float:
    """ms to the first streamed content. Leaving the stream there closes its connection (the
    next request opens a new one, on any of several API servers) while the server still
    generates the rest; `drain` reads to the end instead, so the connection is reused and the
    next request starts on an idle engine."""
    t0 = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data: ") and '"content"' in line:
                first = 1000 * (time.perf_counter() - t0)
                if not drain:
                    return first
    if first is None:
        raise RuntimeError("stream ended without content")
    return first


def probe_client(fresh_connections: bool = False) -> httpx.AsyncClient:
    """The probe's client; with `fresh_connections` no connection is kept between requests, so
    each request opens its own (and with several API servers may land on any of them)."""
    if fresh_connections:
        return httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_keepalive_connections=0))
    return httpx.AsyncClient(timeout=120)


async def run(args: argparse.Namespace) -> dict:
    url = args.target.rstrip("/") + "/v1/chat/completions"
    text = " ".join(f"w{i % 2000}" for i in range(args.text_words))
    results: dict = {
        "target": args.target,
        "model": args.model,
        "n": args.n,
        "video_codec": args.video_codec,
        "drain": args.drain,
        "fresh_connections": args.fresh_connections,
    }
    watch = CompileWatch(args.watch_dir)
    processes = ProcessWatch(args.multiproc_dir)
    if args.multiproc_dir:  # what the warm-up and anything before reached, per process
        results["processes_at_start"] = {str(p): c for p, c in processes.at_start.items()}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        n_videos = 3 + args.n + sum(args.burst) * 2
        videos = [video_url(i, args.seed, tmp, codec=args.video_codec) for i in range(n_videos)]
        video_content = [
            [{"type": "text", "text": "describe"}, {"type": "video_url", "video_url": {"url": v}}]
            for v in videos
        ]
        async with probe_client(args.fresh_connections) as client:
            d = args.drain
            for _ in range(3):  # warm-up
                await ttft(client, url, _body(args.model, text), d)
                await ttft(client, url, _body(args.model, video_content.pop()), d)
            watch.mark("warm-up")
            processes.took()  # the sequences' requests are placed from here on
            text_ms, text_took = [], []
            for _ in range(args.n):
                text_ms.append(await ttft(client, url, _body(args.model, text), d))
                text_took.append(processes.took())
            watch.mark("text, one at a time")
            before = await scrape(client, args.target)
            video_ms, video_took = [], []
            for _ in range(args.n):
                video_ms.append(await ttft(client, url, _body(args.model, video_content.pop()), d))
                video_took.append(processes.took())
            watch.mark("video, one at a time")
            if args.multiproc_dir:
                results["text_processes"], results["video_processes"] = text_took, video_took
            results["video_stages"] = breakdown(before, await scrape(client, args.target))
            results["text_ttft_ms"] = {"p50": statistics.median(text_ms), "all": text_ms}
            results["video_ttft_ms"] = {"p50": statistics.median(video_ms), "all": video_ms}
            results["video_minus_text_ms"] = statistics.median(video_ms) - statistics.median(
                text_ms
            )
            for k in args.burst:
                spreads = []
                for which in ("first", "second"):  # the second burst is warm
                    bodies = [_body(args.model, video_content.pop()) for _ in range(k)]
                    before = await scrape(client, args.target)
                    spreads.append(
                        sorted(await asyncio.gather(*(ttft(client, url, b) for b in bodies)))
                    )
                    watch.mark(f"{k} videos at once, {which} burst")
                    stages = breakdown(before, await scrape(client, args.target))
                results[f"burst_{k}_ttft_ms"] = {
                    "min": spreads[-1][0],
                    "max": spreads[-1][-1],
                    "all_cold": spreads[0],
                    "all_warm": spreads[-1],
                    "stages_warm": stages,
                }
    results["compiled"] = watch.phases if args.watch_dir else None
    return results


def first_in_process_summary(results: dict) -> str:
    """One line: how far the warm-up reached, and whether the slow sequential requests (more
    than 20 ms above their sequence's median) were each their process's first of the kind."""
    start = results["processes_at_start"]
    line = (
        f"processes before the probe: {len(start)} had served requests, "
        f"{sum(1 for c in start.values() if c['videos'])} videos"
    )
    for kind, key in (("text", "requests_before"), ("video", "videos_before")):
        ms = results[f"{kind}_ttft_ms"]["all"]
        took = results[f"{kind}_processes"]
        slow = [t for m, t in zip(ms, took, strict=True) if m > statistics.median(ms) + 20]
        placed = [t for t in slow if t is not None]
        first = sum(1 for t in placed if t[key] == 0)
        spread = len({t["pid"] for t in took if t})
        line += (
            f"; {kind}: {len(slow)} slow, of which {first} of {len(placed)} placed were their "
            f"process's first {kind} (taken by {spread} processes)"
        )
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--model")
    parser.add_argument(
        "--between",
        nargs=2,
        type=Path,
        metavar=("BEFORE", "AFTER"),
        help="only print the per-stage breakdown between two saved /metrics scrapes (files)",
    )
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument(
        "--video-codec", choices=VIDEO_CODECS, default="mpeg4", help="the clips' codec"
    )
    parser.add_argument("--text-words", type=int, default=480)
    parser.add_argument("--burst", type=lambda s: [int(x) for x in s.split(",") if x], default=[])
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument(
        "--drain",
        action="store_true",
        help="read each stream to its end (one reused connection, each request on an idle "
        "engine); by default a request stops at its first content, as TTFT needs",
    )
    parser.add_argument(
        "--fresh-connections",
        action="store_true",
        help="open a new connection for every request, also when draining",
    )
    parser.add_argument(
        "--watch-dir",
        type=Path,
        action="append",
        default=[],
        help="a compile cache to watch (Triton's, Inductor's); repeatable",
    )
    parser.add_argument(
        "--multiproc-dir",
        type=Path,
        help="the server's PROMETHEUS_MULTIPROC_DIR (same host): record which API-server "
        "process took each sequential request",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.between:
        before, after = (stage_sums(path.read_text()) for path in args.between)
        for label, v in breakdown(before, after).items():
            print(f"{label:<60} {v['mean_ms']:8.1f} ms  x{v['count']:.0f}")
        return
    if not (args.target and args.model):
        parser.error("--target and --model are required (or --between BEFORE AFTER)")
    results = asyncio.run(run(args))
    line = (
        f"text p50 {results['text_ttft_ms']['p50']:.1f} ms | video p50 "
        f"{results['video_ttft_ms']['p50']:.1f} ms | gap {results['video_minus_text_ms']:.1f} ms"
    )
    for k in args.burst:
        b = results[f"burst_{k}_ttft_ms"]
        line += f" | {k} videos at once {b['min']:.0f}..{b['max']:.0f} ms"
    print(line)
    phases = [("one video at a time", results["video_stages"])] + [
        (f"{k} videos at once", results[f"burst_{k}_ttft_ms"]["stages_warm"]) for k in args.burst
    ]
    for phase, stages in phases:
        print(f"  {phase}: " + ", ".join(f"{k} {v['mean_ms']:.1f}" for k, v in stages.items()))
    if args.multiproc_dir:
        print("  " + first_in_process_summary(results))
    for phase, new in (results["compiled"] or {}).items():
        print(f"  compiled during {phase}: {new['new_files']} files, kernels {new['kernels']}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
