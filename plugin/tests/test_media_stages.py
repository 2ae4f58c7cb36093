"""Where a media stage's wall time went: on the CPU, waiting for a CPU, or blocked (GIL, I/O).

Real threads and processes on this machine; each case produces the state it checks."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time

import pytest

from gemma4_batched_encoder.media import stages


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def burn(cpu_seconds: float) -> None:
    """Run until this thread has used cpu_seconds of CPU (however long other threads hold the GIL
    or other processes the CPUs)."""
    end = time.thread_time() + cpu_seconds
    while time.thread_time() < end:
        pass


def states_of(work) -> tuple[float, dict[str, float]]:
    start = stages.ThreadClock.now()
    work()
    return start.split(stages.ThreadClock.now())


def test_split_sums_to_wall_and_clamps() -> None:
    start = stages.ThreadClock(wall=10.0, cpu=1.0, run_queue=5.0)
    wall, states = start.split(stages.ThreadClock(wall=10.5, cpu=1.2, run_queue=5.1))
    assert wall == pytest.approx(0.5)
    assert states == pytest.approx({"on_cpu": 0.2, "runnable": 0.1, "blocked": 0.2})
    assert sum(states.values()) == pytest.approx(wall)
    # no schedstat: its time counts as blocked; readings never exceed the wall
    _, states = start.split(stages.ThreadClock(wall=10.1, cpu=2.0, run_queue=None))
    assert states == pytest.approx({"on_cpu": 0.1, "runnable": 0.0, "blocked": 0.0})


def test_sleep_is_blocked() -> None:
    wall, states = states_of(lambda: time.sleep(0.1))
    assert wall >= 0.1
    assert states["blocked"] >= 0.09, states
    assert states["on_cpu"] < 0.02, states


def test_waiting_for_a_cpu_is_runnable() -> None:
    assert stages.run_queue_seconds() is not None, "Linux schedstat missing"
    busy = [mp.Process(target=spin, args=(3.0,)) for _ in range(2 * (os.cpu_count() or 1) + 2)]
    for p in busy:
        p.start()
    try:
        time.sleep(0.3)  # let them all run
        wall, states = states_of(lambda: burn(0.3))
    finally:
        for p in busy:
            p.terminate()
            p.join()
    # 2 x cpu_count + 2 spinning processes: this thread gets well under its fair share of a CPU, and
    # the wait shows as runnable, not blocked (which only other threads' GIL holds can add here)
    assert states["runnable"] > 0.25 * wall, states
    assert states["runnable"] > states["blocked"], states


def test_waiting_for_the_gil_is_blocked() -> None:
    stop = threading.Event()

    def contend() -> None:
        while not stop.is_set():
            pass

    other = threading.Thread(target=contend)
    other.start()
    try:
        wall, states = states_of(lambda: spin(0.5))
    finally:
        stop.set()
        other.join()
    assert states["blocked"] > 0.2 * wall, states


def test_timed_records_wall_and_states_on_the_registry() -> None:
    from prometheus_client import REGISTRY

    def read() -> tuple[float, dict[str, float]]:
        wall = REGISTRY.get_sample_value(f"{stages.METRIC_NAME}_sum", {"stage": "test_stage"})
        per_state = {
            state: REGISTRY.get_sample_value(
                f"{stages.THREAD_METRIC_NAME}_total", {"stage": "test_stage", "state": state}
            )
            or 0.0
            for state in stages.THREAD_STATES
        }
        return wall or 0.0, per_state

    wall0, states0 = read()
    with stages.timed("test_stage"):
        time.sleep(0.05)
        burn(0.05)
    wall1, states1 = read()
    delta = {s: states1[s] - states0[s] for s in stages.THREAD_STATES}
    assert wall1 - wall0 >= 0.1
    assert abs(sum(delta.values()) - (wall1 - wall0)) < 1e-6
    assert delta["blocked"] >= 0.045 and delta["on_cpu"] >= 0.05, delta
