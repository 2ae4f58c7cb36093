"""Float8 fast mode's activation quantization, and its MLP middle as one Triton kernel.

With float8 GEMMs (``fast_layers``: ``merged-triton-fp8``) each GEMM's input is quantized per
token: each row scaled by its absolute maximum (``quantize_rows``). For the down projection that
input is ``gelu_tanh(gate) * up``, and inductor made GELU x up + amax + quantize a looped
reduction over E4B's 3,072-wide rows that read the gate/up GEMM's output twice: 7.0 of the 37.4
GPU ms at 16 videos on the H200 (sixteenth sitting, ``bench/results/h200/vllm-0.26.0-16-random/``),
half of what the float8 GEMMs saved. ``gelu_mul_quant`` is one program per row holding the row in
registers: gate and up are read once, the float8 row and its scale written once (4.82 ms there,
near the memory bound; seventeenth sitting, ``bench/results/h200/vllm-0.26.0-17-random/``).

Its arithmetic is fp32 without the bf16 roundings of the eager ops in between (GELU-tanh written
as ``g * sigmoid(2 * inner)``, which is ``0.5 * g * (1 + tanh(inner))``), then ``quantize_rows``'
quantization: fast mode's deviation, which ``verify --mode fast`` reports. A ``torch.library``
custom op, so the compiled layer calls it as one opaque node; without CUDA (and without
``TRITON_INTERPRET=1``, which the CPU tests use) it runs the same math in torch.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .launch_config import launch
from .qkv_kernel import triton, triton_usable

FP8_MAX = 448.0  # float8_e4m3fn's largest finite value


def quantize_rows(t: Tensor) -> tuple[Tensor, Tensor]:
    """Each row of ``t`` in float8_e4m3fn, and the float32 scale that multiplies it back."""
    scale = t.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12) / FP8_MAX
    return (t.float() / scale).to(torch.float8_e4m3fn), scale


def gelu_mul_quant_reference(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """[M, 2I] gate|up -> ``quantize_rows(gelu_tanh(gate) * up)`` computed in fp32, in torch."""
    g, u = gate_up.float().chunk(2, dim=-1)
    return quantize_rows(torch.nn.functional.gelu(g, approximate="tanh") * u)


if triton is not None:
    import triton.language as tl

    _MAX: tl.constexpr = tl.constexpr(FP8_MAX)
    _SQRT_2_OVER_PI: tl.constexpr = tl.constexpr(0.7978845608028654)

    @triton.jit
    def _gelu_mul_quant_kernel(
        gate_up, out, scale_out, m, width, BLOCK: tl.constexpr, ROWS: tl.constexpr
    ):
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK)
        row_ok = rows < m
        mask = row_ok[:, None] & (cols < width)[None, :]
        src = gate_up + rows[:, None] * (2 * width) + cols[None, :]
        g = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(src + width, mask=mask, other=0.0).to(tl.float32)
        inner = _SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)
        h = g * tl.sigmoid(2.0 * inner) * u  # masked columns are 0: they leave the amax alone
        scale = tl.maximum(tl.max(tl.abs(h), axis=1), 1e-12) / _MAX
        dst = out + rows[:, None] * width + cols[None, :]
        tl.store(dst, (h / scale[:, None]).to(tl.float8e4nv), mask=mask)
        tl.store(scale_out + rows, scale, mask=row_ok)


def _launch_gelu_mul_quant(
    gate_up: Tensor, rows: int | None = None, warps: int | None = None
) -> tuple[Tensor, Tensor]:
    m, both = gate_up.shape
    width = both // 2
    gate_up = gate_up.contiguous()
    out = gate_up.new_empty((m, width), dtype=torch.float8_e4m3fn)
    scale = gate_up.new_empty((m, 1), dtype=torch.float32)
    block = triton.next_power_of_2(width)
    # rows a program quantizes, and its warps (0: 4,096 wide a row as E4B's, 16 warps, 8 fp32
    # pairs a thread); the launch changes the time, never a byte (launch_config.py)
    choice = launch("gelu_quant", gate_up.device)
    rows = rows or choice["rows"]
    warps = warps or choice["warps"] or min(16, max(4, rows * block // 256))
    grid = (triton.cdiv(m, rows),)
    _gelu_mul_quant_kernel[grid](
        gate_up, out, scale, m, width, BLOCK=block, ROWS=rows, num_warps=warps
    )
    return out, scale


@torch.library.custom_op("gemma4_batched_encoder::gelu_mul_quant", mutates_args=())
def gelu_mul_quant(gate_up: Tensor) -> tuple[Tensor, Tensor]:
    """float8 rows of ``gelu_tanh(gate) * up`` and their scales (see the module doc)."""
    if not triton_usable(gate_up) or gate_up.shape[1] % 2:
        return gelu_mul_quant_reference(gate_up)
    return _launch_gelu_mul_quant(gate_up)


@gelu_mul_quant.register_fake
def _(gate_up):
    m, both = gate_up.shape
    return (
        gate_up.new_empty((m, both // 2), dtype=torch.float8_e4m3fn),
        gate_up.new_empty((m, 1), dtype=torch.float32),
    )
