"""engine_cpu: the model thread's CPU and run-queue wait, read from /proc into real counters."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from gemma4_batched_encoder import engine_cpu
from gemma4_batched_encoder.metrics import NO_METRICS

SRC = str(Path(__file__).parents[1] / "src")


def counters() -> tuple[Counter, Counter]:
    registry = CollectorRegistry()
    return (
        Counter("cpu_seconds", "test", registry=registry),
        Counter("wait_seconds", "test", registry=registry),
    )


def value(counter: Counter) -> float:
    """The counter's value as its registry exposes it."""
    (metric,) = counter.collect()
    return next(s.value for s in metric.samples if s.name.endswith("_total"))


def spin_thread(seconds: float) -> tuple[threading.Thread, list[int]]:
    tid: list[int] = []

    def spin() -> None:
        tid.append(threading.get_native_id())
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    thread = threading.Thread(target=spin)
    thread.start()
    while not tid:
        time.sleep(0.01)
    return thread, tid


def test_interval_from_env(monkeypatch):
    for raw, expected in (
        (None, 5.0),
        ("on", 5.0),
        ("off", None),
        ("0", None),
        ("2.5", 2.5),
        ("1", 1.0),
        ("-1", None),
    ):
        if raw is None:
            monkeypatch.delenv(engine_cpu.ENV, raising=False)
        else:
            monkeypatch.setenv(engine_cpu.ENV, raw)
        assert engine_cpu.interval_from_env() == expected, raw
    monkeypatch.setenv(engine_cpu.ENV, "sometimes")
    with pytest.raises(ValueError, match="GEMMA4_ENGINE_CPU_METRICS='sometimes'"):
        engine_cpu.interval_from_env()


def test_a_spinning_thread_adds_its_cpu_and_an_idle_one_nothing():
    thread, tid = spin_thread(1.5)
    cpu, wait = counters()
    sampler = engine_cpu.ThreadSampler(tid[0], cpu, wait, interval=60)
    time.sleep(1.0)
    assert sampler.sample()  # still spinning
    assert 0.5 < value(cpu) < 1.3  # one core for ~1 s, on a shared 2-core machine
    assert value(wait) >= 0
    thread.join()
    # join() returns before the OS thread is gone: wait for the kernel to drop it
    deadline = time.monotonic() + 5
    while engine_cpu.read_thread(tid[0]) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    # the thread has ended: the next sample says so and adds nothing
    before = value(cpu)
    assert not sampler.sample()
    assert value(cpu) == before
    # an idle thread (this one's sleeping sibling) adds ~nothing
    idle_tid: list[int] = []
    idle = threading.Thread(
        target=lambda: (idle_tid.append(threading.get_native_id()), time.sleep(1))
    )
    idle.start()
    while not idle_tid:
        time.sleep(0.01)
    cpu2, wait2 = counters()
    sampler2 = engine_cpu.ThreadSampler(idle_tid[0], cpu2, wait2, interval=60)
    time.sleep(0.5)
    assert sampler2.sample()
    idle.join()
    assert value(cpu2) < 0.1 and value(wait2) < 0.1


SHARED_CORE = """
import os, sys, threading, time
sys.path.insert(0, {src!r})
from prometheus_client import CollectorRegistry, Counter
from gemma4_batched_encoder import engine_cpu
os.sched_setaffinity(0, {{{core}}})
registry = CollectorRegistry()
cpu = Counter("c", "t", registry=registry)
wait = Counter("w", "t", registry=registry)
sampler = engine_cpu.ThreadSampler(threading.get_native_id(), cpu, wait, interval=0.5).start()
end = time.perf_counter() + 3
while time.perf_counter() < end:
    pass
sampler.stop()
print(registry.get_sample_value("c_total"), registry.get_sample_value("w_total"))
"""


def test_the_background_sampler_sees_a_thread_waiting_for_a_shared_core():
    # The sampled thread shares one core with a spinner: it runs about half the time and waits
    # for the core the other half, which the wait counter shows (the engine thread preempted).
    core = min(os.sched_getaffinity(0))
    rival = subprocess.Popen(
        [sys.executable, "-c", f"import os,time\nos.sched_setaffinity(0,{{{core}}})\n"
         "e=time.perf_counter()+30\nwhile time.perf_counter()<e: pass"]
    )  # fmt: skip
    try:
        out = subprocess.run(
            [sys.executable, "-c", SHARED_CORE.format(src=SRC, core=core)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        rival.kill()
        rival.wait()
    assert out.returncode == 0, out.stderr[-2000:]
    cpu_s, wait_s = map(float, out.stdout.split())
    # ~3 s of wall, sampled every 0.5 s by the daemon thread (the last partial interval lost)
    assert 0.7 < cpu_s < 2.2
    assert 0.7 < wait_s < 2.2
    assert cpu_s + wait_s > 2.0


def test_start_for_this_thread_once_per_process_and_not_where_nothing_records(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(engine_cpu, "_sampler", None)
    cpu, wait = counters()
    metrics = SimpleNamespace(engine_thread_cpu=cpu, engine_thread_wait=wait)
    monkeypatch.setenv(engine_cpu.ENV, "off")
    assert engine_cpu.start_for_this_thread(metrics) is None
    monkeypatch.setenv(engine_cpu.ENV, "never")  # a typo: a warning, no sampler, no exception
    assert engine_cpu.start_for_this_thread(metrics) is None
    monkeypatch.setenv(engine_cpu.ENV, "on")
    assert engine_cpu.start_for_this_thread(NO_METRICS) is None  # a rank that does not record
    monkeypatch.setenv(engine_cpu.ENV, "0.2")
    sampler = engine_cpu.start_for_this_thread(metrics)
    try:
        assert sampler is not None and sampler.tid == threading.get_native_id()
        assert engine_cpu.start_for_this_thread(metrics) is sampler  # once per process
        end = time.perf_counter() + 0.6
        while time.perf_counter() < end:  # this thread busy: the daemon adds its CPU
            pass
        time.sleep(0.3)
        assert value(cpu) > 0.2
    finally:
        sampler.stop()
