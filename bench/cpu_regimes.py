"""Shared by the CPU decode benchmarks (media_decode.py, cv2_pool.py): the busy regime's spinning
processes, and the wall / CPU table both print. OpenCV-free and vLLM-free on purpose."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def _spin() -> None:
    while True:
        pass


@contextmanager
def spinning(processes: int) -> Iterator[None]:
    """`processes` busy-looping processes for the duration (an API server's cores shared with
    the engine and the other API servers)."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(processes)]
    for p in spinners:
        p.start()
    try:
        yield
    finally:
        for p in spinners:
            p.terminate()


def print_table(
    regime: str,
    rows: list[dict[str, Any]],
    names: list[str],
    label: Callable[[dict[str, Any]], str] = lambda r: r["clip"],
) -> None:
    """One markdown row a clip: median wall / CPU ms of each variant, and the frames check."""
    print(f"\n{regime}: median ms per video, wall / CPU (all threads of this process)")
    print("| clip | " + " | ".join(names) + " | frames identical |")
    print("|---" * (len(names) + 2) + "|")
    for r in rows:
        cells = [f"{r['wall_ms'][k]:.1f} / {r['cpu_ms'][k]:.1f}" for k in names]
        print(f"| {label(r)} | " + " | ".join(cells) + f" | {r['identical']} |")
