"""bench/resize_exact.py: the processor's antialiased bicubic resize of uint8 frames as integer
tensor ops (so a GPU can resize with stock's bytes), checked against torchvision's CPU resize."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import resize_exact  # noqa: E402


@pytest.mark.parametrize("capability", ["", "default"])
def test_the_recipe_equals_torchvisions_cpu_resize_on_every_case(capability: str) -> None:
    """The processor's targets for common frame and image sizes at every soft-token budget, and
    random sizes (upscales and one-axis resizes too); `default` forces ATen's generic uint8
    kernel instead of its AVX one: both give the recipe's bytes."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability} if capability else None
    proc = subprocess.run(
        [sys.executable, str(BENCH / "resize_exact.py"), "--frames", "1", "--random-cases", "8"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["identical"] and report["cases"] >= 40
    if capability:
        assert report["cpu_capability"] == "DEFAULT"
    targets = {tuple(r["target"]) for r in report["results"]}
    assert (288, 528) in targets  # the SLO clip's 854x480 frames at 70 soft tokens


@pytest.fixture
def fresh_weights():
    """The weights are cached per axis size: a changed filter must not outlive its test."""
    resize_exact._axis_tensors.cache_clear()
    yield
    resize_exact._axis_tensors.cache_clear()


def _height_first(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    tall = resize_exact._resample_last_dim(x.transpose(-1, -2), size[0]).transpose(-1, -2)
    return resize_exact._resample_last_dim(tall.contiguous(), size[1])


def _no_rounding_term(x: torch.Tensor, out_size: int) -> torch.Tensor:
    index, weight, precision = resize_exact._axis_tensors(x.shape[-1], out_size, x.device)
    acc = torch.zeros((*x.shape[:-1], out_size), dtype=torch.int32)
    for k in range(index.shape[1]):
        acc += x[..., index[:, k]].to(torch.int32) * weight[:, k]
    return (acc >> precision).clamp_(0, 255).to(torch.uint8)


@pytest.mark.parametrize("change", ["OpenCV cubic (a = -0.75)", "no rounding term", "height first"])
def test_another_arithmetic_is_caught(monkeypatch, fresh_weights, change: str) -> None:
    x = resize_exact._frames(480, 854, 2, seed=3)
    target = (288, 528)
    stock = resize_exact._stock(x, target)
    assert torch.equal(resize_exact.resize_bicubic_aa_uint8(x, target), stock)
    resize_exact._axis_tensors.cache_clear()
    if change.startswith("OpenCV"):
        monkeypatch.setattr(resize_exact, "_A", -0.75)
        got = resize_exact.resize_bicubic_aa_uint8(x, target)
    elif change == "no rounding term":
        monkeypatch.setattr(resize_exact, "_resample_last_dim", _no_rounding_term)
        got = resize_exact.resize_bicubic_aa_uint8(x, target)
    else:
        got = _height_first(x, target)
    assert not torch.equal(got, stock), change


def test_only_uint8_frames() -> None:
    with pytest.raises(TypeError, match="uint8"):
        resize_exact.resize_bicubic_aa_uint8(torch.zeros(1, 3, 8, 8), (4, 4))
    same = torch.zeros(1, 3, 8, 8, dtype=torch.uint8)
    assert resize_exact.resize_bicubic_aa_uint8(same, (8, 8)) is same
