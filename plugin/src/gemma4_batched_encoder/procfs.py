"""A Linux thread's CPU time and run-queue wait, from /proc (media stages, engine thread)."""

from __future__ import annotations

import os

TICK = os.sysconf("SC_CLK_TCK")


def run_queue_seconds(schedstat: str = "/proc/thread-self/schedstat") -> float | None:
    """Seconds the thread spent runnable but not running (schedstat's second field, updated
    whenever it is scheduled in, so exact), or None where the file is missing."""
    try:
        with open(schedstat, "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds(stat: str) -> float | None:
    """utime + stime of a /proc/.../stat file in seconds, or None once the task is gone."""
    try:
        with open(stat, "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(b")") + 2 :].split()  # fields[0] is field 3: utime 14, stime 15
    return (int(fields[11]) + int(fields[12])) / TICK
