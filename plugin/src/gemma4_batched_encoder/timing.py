"""Encoder time per call without a host sync: CUDA events are read once they have completed
(checked at later calls); on CPU the work is synchronous and perf_counter is exact."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import torch

Observe = Callable[[str, float], None]


class CallTimer:
    def __init__(self, observe: Observe, max_pending: int = 256) -> None:
        self._observe = observe
        self._pending: deque[tuple[torch.cuda.Event, torch.cuda.Event, str]] = deque()
        self._max_pending = max_pending
        self._start: torch.cuda.Event | float | None = None

    def start(self, device: torch.device) -> None:
        self.drain()
        if device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._start = event
        else:
            self._start = time.perf_counter()

    def stop(self, path: str) -> None:
        start, self._start = self._start, None
        if start is None:
            return
        if isinstance(start, float):
            self._observe(path, time.perf_counter() - start)
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        if len(self._pending) >= self._max_pending:
            self._pending.popleft()  # drop the oldest rather than grow without bound
        self._pending.append((start, end, path))
        self.drain()

    def drain(self) -> None:
        while self._pending and self._pending[0][1].query():
            start, end, path = self._pending.popleft()
            self._observe(path, start.elapsed_time(end) / 1000.0)
