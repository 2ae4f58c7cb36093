"""CPU use of a server's processes and threads over a window, and the GPU's busy fraction.

Reads /proc/PID/task/TID/stat at the start and end of the window (utime + stime), so the
figures are exact CPU seconds, not samples; no process is paused. With vLLM the interesting
question at a throughput ceiling is whether one thread (the engine core's busy loop, an API
server's event loop) sits at 100% of a core while the GPU idles.

    python3 bench/proc_cpu.py --pgid PGID [--pid PID ...] --seconds 20 --out cpu.json

Prints one line per process (CPU % of one core, busiest threads, the unlisted ones summed: the
JSON lists the busiest 8 a process) and the GPU's mean utilization.gpu (nvidia-smi, sampled every
200 ms) when nvidia-smi is there.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
GPU_EVERY = ("-lms", "200")


def _stat(path: Path) -> tuple[str, int, int] | None:
    """(comm, pgrp, utime + stime ticks) from a /proc stat file; None if it is gone."""
    try:
        text = path.read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1 : text.rindex(")")]
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state): pgrp is field 5, utime 14, stime 15.
    return comm, int(fields[2]), int(fields[11]) + int(fields[12])


def _title(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(raw.replace(b"\0", b" ").decode(errors="replace").split())[:80] or "?"


def _pids(pgid: int | None, extra: list[int]) -> list[int]:
    found = set(extra)
    if pgid is not None:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                stat = _stat(entry / "stat")
                if stat and stat[1] == pgid:
                    found.add(int(entry.name))
    return sorted(found)


KEPT_THREADS = 8  # listed one by one, busiest first


def _threads(pid: int) -> dict[int, tuple[str, int]]:
    out = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        stat = _stat(task / "stat")
        if stat:
            out[int(task.name)] = (stat[0], stat[2])
    return out


def _gpu_sampler() -> subprocess.Popen[str] | None:
    if not shutil.which("nvidia-smi"):
        return None
    return subprocess.Popen(
        ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", *GPU_EVERY],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def measure(pgid: int | None, extra: list[int], seconds: float) -> dict:
    pids = _pids(pgid, extra)
    before = {pid: _threads(pid) for pid in pids}
    gpu = _gpu_sampler()
    t0 = time.monotonic()
    time.sleep(seconds)
    after = {pid: _threads(pid) for pid in pids}
    wall = time.monotonic() - t0
    gpu_util = None
    if gpu is not None:
        gpu.terminate()
        samples = [float(v) for v in (gpu.communicate()[0] or "").split() if v.strip().isdigit()]
        if samples:
            gpu_util = {"mean_percent": sum(samples) / len(samples), "samples": len(samples)}
    processes = []
    for pid in pids:
        threads = []
        for tid, (comm, ticks) in after.get(pid, {}).items():
            start = before[pid].get(tid, (comm, 0))[1]  # a thread born in the window: all of it
            percent = 100 * (ticks - start) / TICK / wall
            threads.append({"tid": tid, "name": comm, "cpu_percent": percent})
        threads.sort(key=lambda t: -t["cpu_percent"])
        rest = threads[KEPT_THREADS:]
        processes.append(
            {
                "pid": pid,
                "title": _title(pid),
                "cpu_percent": sum(t["cpu_percent"] for t in threads),
                "threads": threads[:KEPT_THREADS],
                # the threads not listed, summed: a pool of many small spinners (OpenCV's one
                # worker per core in an API server) hides below the busiest few
                "other_threads": {
                    "count": len(rest),
                    "cpu_percent": sum(t["cpu_percent"] for t in rest),
                },
            }
        )
    processes.sort(key=lambda p: -p["cpu_percent"])
    return {"seconds": wall, "processes": processes, "gpu_utilization": gpu_util}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pgid", type=int, help="every process of this process group")
    parser.add_argument("--pid", type=int, action="append", default=[], help="one more process")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.pgid is None and not args.pid:
        parser.error("give --pgid or --pid")
    result = measure(args.pgid, args.pid, args.seconds)
    for proc in result["processes"]:
        busiest = ", ".join(f"{t['name']} {t['cpu_percent']:.0f}%" for t in proc["threads"][:3])
        others = proc["other_threads"]
        if others["count"]:
            busiest += f"; {others['count']} threads unlisted {others['cpu_percent']:.0f}%"
        print(f"{proc['cpu_percent']:6.0f}%  {proc['pid']:>7}  {proc['title'][:48]:48}  {busiest}")
    if result["gpu_utilization"]:
        print(f"GPU utilization: {result['gpu_utilization']['mean_percent']:.0f}% (mean)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
