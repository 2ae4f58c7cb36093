"""Launch choices of fast mode's Triton kernels (rows a program, warps, ...), per GPU.

As vLLM keeps its fused-MoE kernel configs: a table measured per device name
(``fast_launch.json``, written by ``bench/fast_kernel_tune.py --write``), and ``default`` for a
device without an entry. A launch changes a kernel's time, not its formulas: the GELU x up +
quantize kernel gives the same bytes under every launch (amax is exact in any order; checked in
Triton's interpreter by make test and compiled on the H200), and so does the q/k/v kernel in the
interpreter; compiled, a launch with more warps than its rows fill may sum a row's squares in
another order (16 rows with 8 warps: one bf16 step on the H200, twentieth sitting). The q/k/v
kernel's ``quarters`` is a formulation rather than a launch (each head as four quarter loads; the
norm's sum in another order: up to one bf16 step from the default on the H200, twenty-second
sitting), picked by the same tuning because it only changes the time and that sum's order.
The float8 GEMMs with epilogues (fp8_gemm.py: ``gemm_gelu``, ``gemm_qkv``) take tile sizes,
stages, warps and TMA or pointer loads; their K block sets the order of the K sums.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import torch

TABLE = "fast_launch.json"
_overrides: dict[str, dict[str, Any]] = {}


@functools.cache
def table() -> dict[str, dict[str, dict[str, Any]]]:
    return json.loads(resources.files(__package__).joinpath(TABLE).read_text())


@functools.cache
def device_name(device: torch.device) -> str:
    """The table's key for ``device``: CUDA's device name (``NVIDIA H200``), else the type."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def launch(kernel: str, device: torch.device) -> dict[str, Any]:
    """``kernel``'s launch on ``device``: the default, then the device's entry, then overrides."""
    entry = table().get(device_name(device), {})
    return {**table()["default"][kernel], **entry.get(kernel, {}), **_overrides.get(kernel, {})}


@contextlib.contextmanager
def overridden(launches: dict[str, dict[str, Any]]) -> Iterator[None]:
    """Other launches while the block runs (the tuning bench; graphs captured inside keep them)."""
    saved = {k: dict(v) for k, v in _overrides.items()}
    for kernel, choice in launches.items():
        _overrides.setdefault(kernel, {}).update(choice)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)


def enter(path: str | Path, device: torch.device, launches: dict[str, dict[str, Any]]) -> None:
    """Write ``launches`` (kernel -> choice) into the launch table at ``path`` under
    ``device``'s name, keeping that entry's other kernels (the bench tools that tune different
    kernels each enter theirs: bench/fast_kernel_tune.py, bench/fp8_gemm_probe.py)."""
    path = Path(path)
    table = json.loads(path.read_text())
    table.setdefault(device_name(device), {}).update(launches)
    path.write_text(json.dumps(table, indent=2) + "\n")
