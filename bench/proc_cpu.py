"""CPU use of a server's processes and threads over a window, and the GPU's busy fraction.

Reads /proc/PID/task/TID/stat at the start and end of the window (utime + stime), so the
figures are exact CPU seconds, not samples; no process is paused. With vLLM the interesting
question at a throughput ceiling is whether one thread (the engine core's busy loop, an API
server's event loop) sits at 100% of a core while the GPU idles. Beside each thread's CPU, its
time runnable but waiting for a core (the second field of /proc/PID/task/TID/schedstat): a busy
loop below 100% of a core is either blocked (the GIL, a lock, the driver) or preempted by the
other processes on the host, and only this tells the two apart; the host's CPU pressure (PSI,
/proc/pressure/cpu) over the window says how often any task waited.

    python3 bench/proc_cpu.py --pgid PGID [--pid PID ...] --seconds 20 --out cpu.json

Prints one line per process (CPU % of one core, busiest threads with their wait for a core,
the unlisted ones summed: the JSON lists the busiest 8 a process), the host's CPU pressure, and
the GPU's mean utilization.gpu (nvidia-smi, sampled every 200 ms) when nvidia-smi is there.
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


def _run_wait_ns(task: Path) -> int:
    """Nanoseconds this thread spent runnable on a run queue, waiting for a core (0 if the
    kernel keeps no schedstat)."""
    try:
        return int((task / "schedstat").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _threads(pid: int) -> dict[int, tuple[str, int, int]]:
    """tid -> (name, CPU ticks, ns waiting for a core)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        stat = _stat(task / "stat")
        if stat:
            out[int(task.name)] = (stat[0], stat[2], _run_wait_ns(task))
    return out


def _cpu_pressure_us() -> int | None:
    """The host's cumulative CPU pressure ("some": microseconds in which at least one runnable
    task waited for a core), or None without PSI."""
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    return int(first.rsplit("total=", 1)[1])


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
    pressure0 = _cpu_pressure_us()
    gpu = _gpu_sampler()
    t0 = time.monotonic()
    time.sleep(seconds)
    after = {pid: _threads(pid) for pid in pids}
    wall = time.monotonic() - t0
    pressure1 = _cpu_pressure_us()
    pressure = None
    if pressure0 is not None and pressure1 is not None:
        pressure = {"some_percent": 100 * (pressure1 - pressure0) / 1e6 / wall}
    gpu_util = None
    if gpu is not None:
        gpu.terminate()
        samples = [float(v) for v in (gpu.communicate()[0] or "").split() if v.strip().isdigit()]
        if samples:
            gpu_util = {"mean_percent": sum(samples) / len(samples), "samples": len(samples)}
    processes = []
    for pid in pids:
        threads = []
        for tid, (comm, ticks, waited) in after.get(pid, {}).items():
            # a thread born in the window: all of it
            _, start, waited0 = before[pid].get(tid, (comm, 0, 0))
            threads.append(
                {
                    "tid": tid,
                    "name": comm,
                    "cpu_percent": 100 * (ticks - start) / TICK / wall,
                    "wait_for_cpu_percent": 100 * (waited - waited0) / 1e9 / wall,
                }
            )
        threads.sort(key=lambda t: -t["cpu_percent"])
        rest = threads[KEPT_THREADS:]
        processes.append(
            {
                "pid": pid,
                "title": _title(pid),
                "cpu_percent": sum(t["cpu_percent"] for t in threads),
                "wait_for_cpu_percent": sum(t["wait_for_cpu_percent"] for t in threads),
                "threads": threads[:KEPT_THREADS],
                # the threads not listed, summed: a pool of many small spinners (OpenCV's one
                # worker per core in an API server) hides below the busiest few
                "other_threads": {
                    "count": len(rest),
                    "cpu_percent": sum(t["cpu_percent"] for t in rest),
                    "wait_for_cpu_percent": sum(t["wait_for_cpu_percent"] for t in rest),
                },
            }
        )
    processes.sort(key=lambda p: -p["cpu_percent"])
    return {
        "seconds": wall,
        "processes": processes,
        "gpu_utilization": gpu_util,
        "cpu_pressure": pressure,
    }


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
        busiest = ", ".join(
            f"{t['name']} {t['cpu_percent']:.0f}% (waited {t['wait_for_cpu_percent']:.0f}%)"
            for t in proc["threads"][:3]
        )
        others = proc["other_threads"]
        if others["count"]:
            busiest += f"; {others['count']} threads unlisted {others['cpu_percent']:.0f}%"
        print(f"{proc['cpu_percent']:6.0f}%  {proc['pid']:>7}  {proc['title'][:48]:48}  {busiest}")
    if result["cpu_pressure"]:
        some = result["cpu_pressure"]["some_percent"]
        print(f"CPU pressure: some task waited for a core {some:.0f}% of the time")
    if result["gpu_utilization"]:
        print(f"GPU utilization: {result['gpu_utilization']['mean_percent']:.0f}% (mean)")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
