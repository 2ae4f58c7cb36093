"""bench/proc_cpu.py on real processes whose CPU use is known: one spinning thread, one idle."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import proc_cpu

# A process with one spinning thread beside an idle one (named, as vLLM's threads are).
CHILD = """
import threading, time
for _ in range(11):  # with the main thread 12 in all: 8 listed, 4 summed as the others
    threading.Thread(target=time.sleep, args=(60,), name="idle", daemon=True).start()
end = time.perf_counter() + 60
while time.perf_counter() < end:
    pass
"""


def test_cpu_per_process_and_thread_of_real_processes() -> None:
    busy = subprocess.Popen([sys.executable, "-c", CHILD], start_new_session=True)
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)  # started
        result = proc_cpu.measure(os.getpgid(busy.pid), [idle.pid], seconds=2.0)
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()
    by_pid = {p["pid"]: p for p in result["processes"]}
    assert set(by_pid) == {busy.pid, idle.pid}  # the group (the busy one) plus --pid
    assert 50 < by_pid[busy.pid]["cpu_percent"] < 110  # one core, on a shared 2-core machine
    assert by_pid[idle.pid]["cpu_percent"] < 10
    threads = by_pid[busy.pid]["threads"]
    assert len(threads) == 8 and threads[0]["cpu_percent"] > 50  # the spinning main thread first
    assert all(t["cpu_percent"] < 10 for t in threads[1:])
    others = by_pid[busy.pid]["other_threads"]
    assert others["count"] == 4 and others["cpu_percent"] < 10
    total = sum(t["cpu_percent"] for t in threads) + others["cpu_percent"]
    assert abs(total - by_pid[busy.pid]["cpu_percent"]) < 1e-6
    assert result["processes"][0]["pid"] == busy.pid  # busiest first
    assert "python" in by_pid[busy.pid]["title"] and "\n" not in by_pid[busy.pid]["title"]
    assert result["gpu_utilization"] is None  # no nvidia-smi here


SPIN = """
import os, time
os.sched_setaffinity(0, {%d})
end = time.perf_counter() + 60
while time.perf_counter() < end:
    pass
"""


def test_wait_for_a_core_of_threads_sharing_one() -> None:
    # Two spinners pinned to one core: each runs about half the window and waits for the core
    # the other half, which is what a preempted engine busy loop looks like.
    core = min(os.sched_getaffinity(0))
    spinners = [
        subprocess.Popen([sys.executable, "-c", SPIN % core], start_new_session=True)
        for _ in range(2)
    ]
    alone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        result = proc_cpu.measure(None, [p.pid for p in spinners] + [alone.pid], seconds=2.0)
    finally:
        for proc in [*spinners, alone]:
            proc.kill()
            proc.wait()
    by_pid = {p["pid"]: p for p in result["processes"]}
    for proc in spinners:
        spinner = by_pid[proc.pid]
        assert 25 < spinner["cpu_percent"] < 75
        assert 25 < spinner["wait_for_cpu_percent"] < 75
        assert spinner["cpu_percent"] + spinner["wait_for_cpu_percent"] > 85  # on a core or queued
        assert spinner["threads"][0]["wait_for_cpu_percent"] == spinner["wait_for_cpu_percent"]
    assert by_pid[alone.pid]["wait_for_cpu_percent"] < 5  # asleep: not queued
    assert result["cpu_pressure"]["some_percent"] > 25  # the host saw a task waiting
