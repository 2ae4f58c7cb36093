"""CPU time of the thread that runs the model, on /metrics (``GEMMA4_ENGINE_CPU_METRICS``).

With one GPU vLLM runs the model in its engine core's main thread, the thread whose busy loop
also schedules every step. When that thread is on a core all the time, the engine is CPU-bound:
the GPU waits for launches, and neither more API servers nor a faster GPU raise the ceiling. The
thirty-first sitting found exactly that at its 25 video req/s ceiling (77% of a core, 1.7% of the
thread's time waiting for the GPU, the GPU busy 61%), and vLLM exports no such figure. With
several GPUs the thread is each worker's (rank 0 records, as for every plugin metric).

A daemon thread reads the model thread's own /proc counters every ``interval`` seconds and adds
the differences to two counters: CPU time (utime + stime) and time runnable but waiting for a
core (schedstat's second field; a busy loop below 100% of a core is blocked, by the GIL or the
driver, or preempted, and only this tells the two apart). Reading two small files every few
seconds costs nothing measurable; Linux only (elsewhere it stays off, with one INFO line).
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .log import logger
from .metrics import NO_METRICS
from .procfs import cpu_seconds, run_queue_seconds

ENV = "GEMMA4_ENGINE_CPU_METRICS"
DEFAULT_INTERVAL_S = 5.0


def interval_from_env() -> float | None:
    """Seconds between samples: on (the default) = 5, off/0 = None, a number = that many."""
    raw = (os.environ.get(ENV) or "on").strip().lower()
    if raw in ("on", "true", "yes", "auto"):  # ("1" is a number: one second)
        return DEFAULT_INTERVAL_S
    if raw in ("off", "0", "false", "no"):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(
            f"{ENV}={raw!r}: expected on, off or a sampling interval in seconds"
        ) from None
    if value <= 0:
        return None
    return value


@dataclass
class ThreadTimes:
    cpu_s: float
    wait_s: float


def read_thread(tid: int) -> ThreadTimes | None:
    """This process's thread `tid`: CPU seconds and seconds waiting for a core so far; None once
    it is gone (a kernel without schedstat reads 0 waiting)."""
    task = f"/proc/{os.getpid()}/task/{tid}"
    cpu_s = cpu_seconds(f"{task}/stat")
    if cpu_s is None:
        return None
    return ThreadTimes(cpu_s, run_queue_seconds(f"{task}/schedstat") or 0.0)


class ThreadSampler:
    """Adds one thread's CPU and run-queue wait to two counters, every ``interval`` seconds."""

    def __init__(self, tid: int, cpu_counter: Any, wait_counter: Any, interval: float) -> None:
        self.tid = tid
        self._cpu = cpu_counter
        self._wait = wait_counter
        self._interval = interval
        self._last = read_thread(tid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gemma4-engine-cpu", daemon=True)

    def start(self) -> ThreadSampler:
        self._thread.start()
        return self

    def sample(self) -> bool:
        """One reading added to the counters; False once the thread is gone."""
        now = read_thread(self.tid)
        if now is None or self._last is None:
            return False
        # counters never go down; a reading can only repeat the last one
        self._cpu.inc(max(0.0, now.cpu_s - self._last.cpu_s))
        self._wait.inc(max(0.0, now.wait_s - self._last.wait_s))
        self._last = now
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if not self.sample():
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._interval + 1)


_sampler: ThreadSampler | None = None
_lock = threading.Lock()


def start_for_this_thread(metrics: Any) -> ThreadSampler | None:
    """Sample the calling thread (the one building the model runs it) into ``metrics``'
    ``engine_thread_cpu`` and ``engine_thread_wait``, once per process; None when off, not
    Linux, or this process records no metrics (``metrics`` is NO_METRICS: a sampler would only
    add a thread)."""
    global _sampler
    try:
        interval = interval_from_env()
    except ValueError as exc:  # a typo costs this metric, not the encoder
        logger.warning("gemma4_batched_encoder: %s; engine thread CPU not sampled", exc)
        return None
    if interval is None:
        return None
    if not Path(f"/proc/{os.getpid()}/task").is_dir():
        logger.info("gemma4_batched_encoder: %s: no /proc here; engine thread CPU not sampled", ENV)
        return None
    if metrics is NO_METRICS:
        return None
    with _lock:
        if _sampler is None:
            tid = threading.get_native_id()
            _sampler = ThreadSampler(
                tid, metrics.engine_thread_cpu, metrics.engine_thread_wait, interval
            ).start()
            logger.info(
                "gemma4_batched_encoder: engine thread CPU sampled every %.0f s "
                "(gemma4_engine_thread_cpu_seconds_total; pid %d, thread %d)",
                interval,
                os.getpid(),
                tid,
            )
        return _sampler
