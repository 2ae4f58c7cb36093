"""How evenly vLLM's API-server processes share the work, with keep-alive connections and with a
new connection per request (slo-loadtest --connection-per-request), side by side on one server.

    .venv/bin/python bench/api_server_balance.py --api-servers 4 --requests 200 --connections 6 \
        --out bench/results/media/cpu-2core-api-server-balance.json

vLLM with --api-server-count N shares one listening socket among N processes; a connection is
served to its end by the process that accepted it. A client with a few keep-alive connections
(guidellm, a gateway's upstream pool) therefore loads the processes unevenly (H200, eleventh
sitting: 92 / 77 / 40 / 21 / 11 / 7 / 2 / 1 % of a CPU across eight); a connection per request is
accepted by whichever process is free. Measured: CPU seconds each API-server process spent while
the requests ran (/proc), local tiny model (local/stack.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "local"))
import stack

TICK = os.sysconf("SC_CLK_TCK")


def api_servers(group: int) -> dict[str, int]:
    """VLLM::APIServer_N process title -> pid (vLLM sets the titles), in process group `group`
    (the server's: another vLLM on this machine is not counted)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode().strip()
            if title.startswith("VLLM::APIServer") and os.getpgid(int(pid)) == group:
                found[title] = int(pid)
        except OSError:  # (gone meanwhile)
            continue
    return found


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for title, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out[title] = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
    return out


async def send(url: str, model: str, requests: int, connections: int, close: bool) -> None:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    headers = {"Connection": "close"} if close else {}
    gate = asyncio.Semaphore(connections)
    async with httpx.AsyncClient(limits=limits, timeout=120) as client:

        async def one(i: int) -> None:
            async with gate:
                body = {
                    "model": model,
                    "messages": [{"role": "user", "content": f"request {i}: say something"}],
                    "max_tokens": 2,
                }
                r = await client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
                r.raise_for_status()

        await asyncio.gather(*(one(i) for i in range(requests)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--api-servers", type=int, default=4)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--connections", type=int, default=6, help="client connections at once")
    p.add_argument("--rounds", type=int, default=2, help="keep-alive / per-request, alternated")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as work:
        server = stack.VllmServer(
            model_path=stack.ensure_model(),
            workdir=Path(work),
            extra_args=["--api-server-count", str(args.api_servers)],
        ).start()
        try:
            assert server.process is not None and server.process.popen is not None
            pids = api_servers(os.getpgid(server.process.popen.pid))
            if len(pids) != args.api_servers:
                sys.exit(f"expected {args.api_servers} API-server processes, found {pids}")
            rows = []
            for _ in range(args.rounds):
                for close in (False, True):
                    before, t0 = cpu_seconds(pids), time.perf_counter()
                    asyncio.run(
                        send(server.url, server.model, args.requests, args.connections, close)
                    )
                    after, wall = cpu_seconds(pids), time.perf_counter() - t0
                    shares = {k: round(after[k] - before[k], 2) for k in sorted(pids)}
                    total = sum(shares.values()) or 1.0
                    rows.append(
                        {
                            "connections": "per request" if close else "keep-alive",
                            "cpu_s": shares,
                            "max_share": round(max(shares.values()) / total, 3),
                            "wall_s": round(wall, 2),
                        }
                    )
                    print(
                        f"{rows[-1]['connections']:>12}: busiest process "
                        f"{rows[-1]['max_share']:.0%} of API-server CPU (even: "
                        f"{1 / len(pids):.0%}), {shares}, {wall:.1f} s"
                    )
        finally:
            server.stop()
    if args.out:
        args.out.write_text(
            json.dumps({"args": vars(args) | {"out": str(args.out)}, "rows": rows}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
