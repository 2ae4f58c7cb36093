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
