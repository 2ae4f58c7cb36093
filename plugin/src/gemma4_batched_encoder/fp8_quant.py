"""Float8 fast mode's activation quantization, its MLP middle as one Triton kernel, and (opt-in)
the residual add + RMS norm + quantize in front of the other two GEMMs as another.

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

``add_norm_quant`` (``merged-triton-fp8-norms``): in front of the Q/K/V and gate/up GEMMs a layer
adds a normed branch to the residual stream (the previous layer's down projection after its
post-FFW norm; the attention output after its post-attention norm), norms the new stream and
quantizes it per row. Inductor made that two reductions over 768-wide rows (4.0 of 34.2 GPU ms
at 16 videos on the H200, twentieth sitting); here one program holds a block of rows in registers,
reads the stream and the branch once, and writes the new stream (bf16) and the float8 rows with
their scales once. Its roundings follow the eager ops (each norm's output and the new stream
rounded to the stream's dtype, the quantization from the rounded norm output); only the sums'
order and ``rsqrt`` for ``pow(.., -0.5)`` differ. Not measured on a GPU yet, so opt-in.
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
    def gelu_tanh_mul(g, u):
        # gelu_tanh(g) * u in fp32, GELU-tanh written as g * sigmoid(2 * inner) (the module doc);
        # also fp8_gemm.py's epilogue
        inner = _SQRT_2_OVER_PI * (g + 0.044715 * g * g * g)
        return g * tl.sigmoid(2.0 * inner) * u

    @triton.jit
    def _store_quantized(h, out, scale_out, rows, cols, width, mask, row_ok):
        # quantize_rows' formula on fp32 rows held in registers (masked columns are 0: they
        # leave the amax alone); the float8 rows and their scales written once
        scale = tl.maximum(tl.max(tl.abs(h), axis=1), 1e-12) / _MAX
        dst = out + rows[:, None] * width + cols[None, :]
        tl.store(dst, (h / scale[:, None]).to(tl.float8e4nv), mask=mask)
        tl.store(scale_out + rows, scale, mask=row_ok)

    # two kernels (not one with a switch) so that profiles tell GELU x up from the plain rows
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
        _store_quantized(gelu_tanh_mul(g, u), out, scale_out, rows, cols, width, mask, row_ok)

    @triton.jit
    def _quant_rows_kernel(src, out, scale_out, m, width, BLOCK: tl.constexpr, ROWS: tl.constexpr):
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK)
        row_ok = rows < m
        mask = row_ok[:, None] & (cols < width)[None, :]
        h = tl.load(src + rows[:, None] * width + cols[None, :], mask=mask, other=0.0)
        _store_quantized(h.to(tl.float32), out, scale_out, rows, cols, width, mask, row_ok)


def _launch_rows(
    kernel: object, src: Tensor, width: int, rows: int | None, warps: int | None
) -> tuple[Tensor, Tensor]:
    """One of the row kernels above over ``src``'s rows, each ``width`` wide out: float8 rows
    and their scales. Rows a program and its warps from the table's ``gelu_quant`` entry (0
    warps: 4,096 wide a row as E4B's, 16 warps, 8 fp32 pairs a thread); the launch changes the
    time, never a byte (launch_config.py)."""
    m = src.shape[0]
    src = src.contiguous()
    out = src.new_empty((m, width), dtype=torch.float8_e4m3fn)
    scale = src.new_empty((m, 1), dtype=torch.float32)
    block = triton.next_power_of_2(width)
    choice = launch("gelu_quant", src.device)
    rows = rows or choice["rows"]
    warps = warps or choice["warps"] or min(16, max(4, rows * block // 256))
    kernel[(triton.cdiv(m, rows),)](  # type: ignore[index]
        src, out, scale, m, width, BLOCK=block, ROWS=rows, num_warps=warps
    )
    return out, scale


@torch.library.custom_op("gemma4_batched_encoder::quant_rows", mutates_args=())
def quant_rows(t: Tensor) -> tuple[Tensor, Tensor]:
    """``quantize_rows`` of a [M, N] tensor as one Triton kernel (the float8 GEMM with GELU x up
    in its epilogue leaves only this to the kernel after it; fp8_gemm.py)."""
    if not triton_usable(t):
        return quantize_rows(t)
    return _launch_rows(_quant_rows_kernel, t, t.shape[1], None, None)


@quant_rows.register_fake
def _(t):
    scale = t.new_empty((t.shape[0], 1), dtype=torch.float32)
    return t.new_empty(t.shape, dtype=torch.float8_e4m3fn), scale


def _launch_gelu_mul_quant(
    gate_up: Tensor, rows: int | None = None, warps: int | None = None
) -> tuple[Tensor, Tensor]:
    return _launch_rows(_gelu_mul_quant_kernel, gate_up, gate_up.shape[1] // 2, rows, warps)


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


def add_norm_quant_reference(
    x: Tensor,
    branch: Tensor | None,
    branch_weight: Tensor | None,
    norm_weight: Tensor | None,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """[M, D] ``x + rms(branch) * branch_weight`` (or ``x`` when ``branch`` is None), then that
    stream's ``rms(.) * norm_weight`` quantized per row: (new stream, float8 rows, scales), as the
    eager layer computes them (fast_layers._layer)."""
    from .qkv_kernel import _rms

    if branch is not None:
        x = x + _rms(branch, branch_weight, eps)
    q, scale = quantize_rows(_rms(x, norm_weight, eps))
    return x, q, scale


if triton is not None:

    @triton.jit
    def _add_norm_quant_kernel(
        x, branch, branch_w, norm_w, x_out, q_out, scale_out, m, width, eps,
        HAS_BRANCH: tl.constexpr, HAS_BRANCH_W: tl.constexpr, HAS_NORM_W: tl.constexpr,
        BLOCK: tl.constexpr, ROWS: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, BLOCK)
        row_ok = rows < m
        col_ok = cols < width
        mask = row_ok[:, None] & col_ok[None, :]
        at = rows[:, None] * width + cols[None, :]
        s = tl.load(x + at, mask=mask, other=0.0)
        if HAS_BRANCH:
            b = tl.load(branch + at, mask=mask, other=0.0).to(tl.float32)
            b = b * tl.rsqrt(tl.sum(b * b, axis=1) / width + eps)[:, None]
            if HAS_BRANCH_W:
                b = b * tl.load(branch_w + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            # the normed branch in the stream's dtype, then the add rounded to it (eager's bf16 +)
            s = (s.to(tl.float32) + b.to(s.dtype).to(tl.float32)).to(s.dtype)
            tl.store(x_out + at, s, mask=mask)
        h = s.to(tl.float32)
        h = h * tl.rsqrt(tl.sum(h * h, axis=1) / width + eps)[:, None]
        if HAS_NORM_W:
            h = h * tl.load(norm_w + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        h = h.to(s.dtype).to(tl.float32)  # the norm's output in the stream's dtype, as eager
        scale = tl.maximum(tl.max(tl.abs(h), axis=1), 1e-12) / _MAX
        tl.store(q_out + at, (h / scale[:, None]).to(tl.float8e4nv), mask=mask)
        tl.store(scale_out + rows, scale, mask=row_ok)


def _launch_add_norm_quant(
    x: Tensor,
    branch: Tensor | None,
    branch_weight: Tensor | None,
    norm_weight: Tensor | None,
    eps: float,
    rows: int | None = None,
    warps: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    m, width = x.shape
    x = x.contiguous()
    x_out = torch.empty_like(x) if branch is not None else x
    q = x.new_empty((m, width), dtype=torch.float8_e4m3fn)
    scale = x.new_empty((m, 1), dtype=torch.float32)
    choice = launch("norm_quant", x.device)
    rows = rows or choice["rows"]
    warps = warps or choice["warps"]
    dummy = x  # never read where its HAS_* flag is off
    _add_norm_quant_kernel[(triton.cdiv(m, rows),)](
        x,
        branch.contiguous() if branch is not None else dummy,
        branch_weight if branch_weight is not None else dummy,
        norm_weight if norm_weight is not None else dummy,
        x_out,
        q,
        scale,
        m,
        width,
        eps,
        HAS_BRANCH=branch is not None,
        HAS_BRANCH_W=branch_weight is not None,
        HAS_NORM_W=norm_weight is not None,
        BLOCK=triton.next_power_of_2(width),
        ROWS=rows,
        num_warps=warps,
    )
    return x_out, q, scale


@torch.library.custom_op("gemma4_batched_encoder::add_norm_quant", mutates_args=())
def add_norm_quant(
    x: Tensor,
    branch: Tensor | None,
    branch_weight: Tensor | None,
    norm_weight: Tensor | None,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """(new residual stream, its normed rows in float8, their scales): see the module doc. With
    no ``branch`` the stream is ``x`` itself and the first output is empty (a custom op may not
    return its input)."""
    if not triton_usable(x):
        out, q, scale = add_norm_quant_reference(x, branch, branch_weight, norm_weight, eps)
    else:
        out, q, scale = _launch_add_norm_quant(x, branch, branch_weight, norm_weight, eps)
    return (out if branch is not None else x.new_empty(0)), q, scale


@add_norm_quant.register_fake
def _(x, branch, branch_weight, norm_weight, eps):
    m, width = x.shape
    return (
        torch.empty_like(x) if branch is not None else x.new_empty(0),
        x.new_empty((m, width), dtype=torch.float8_e4m3fn),
        x.new_empty((m, 1), dtype=torch.float32),
    )
