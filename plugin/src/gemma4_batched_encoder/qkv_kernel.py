"""Fast mode's Q/K/V epilogue as one Triton kernel: per-head RMS norms and the 2D rotary.

After the merged Q/K/V GEMM, each head's q and k get an RMS norm (scaled) and Gemma 4's axial
rotary (``apply_multidimensional_rope``: each half of the head dim rotated by ``rotate_half``
with its own axis' angles), v a norm without scale. Inductor fused this into one kernel that
took 0.49 ms a layer at 16 videos on the H200 (~1 TB/s; 8 of fast mode's 49 GPU ms,
bench/results/h200/encoder-fast-kernels/). Here one program normalises and rotates a block of
rows of one head (or of all heads: ``all_heads``) in registers: the rotated partner of each
element is a second load of the same row (an L1 hit), so q/k/v are read once from memory and
written once. With ``quarters`` (a launch choice, launch_config.py) each head is loaded as its
four quarters instead, every load a contiguous run and none repeated: rotate_half only pairs
quarters, so the rotary needs no second load (the norm's sum then adds in another order).

Arithmetic as the layer's, in fp32 with one rounding to the output dtype after the norm and one
after the rotary (the stock layer rounds each bf16 op): fast mode's deviation, not exact's bits.
A ``torch.library`` custom op, so the compiled layer calls it as one opaque node; without CUDA
(and without ``TRITON_INTERPRET=1``, which the CPU tests use) it runs the same math in torch.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from .launch_config import launch

try:
    import triton
    import triton.language as tl
except ImportError:  # a CPU-only install without triton: the torch path below
    triton = None


def _rms(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    # Gemma4RMSNorm.forward on a bare weight (the merged layers hold weights, not modules):
    # fp32, x * pow(mean(x^2) + eps, -0.5) [* w], back to x's dtype.
    h = x.float()
    h = h * torch.pow(h.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    if weight is not None:
        h = h * weight.float()
    return h.type_as(x)


def rope_2d(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """apply_multidimensional_rope for 2 position dims: transformers' rotary on each half of the
    head dim with that half's angles. x [B, L, N, D]; cos/sin [B, L, D]."""
    # imported here: the plugin must import even where a transformers version lacks the name
    # (only this reference path needs it; the CUDA path runs the kernel)
    from transformers.models.gemma4.modeling_gemma4 import apply_rotary_pos_emb

    half = x.shape[-1] // 2
    parts = [
        apply_rotary_pos_emb(x[..., sl], cos[..., sl], sin[..., sl], unsqueeze_dim=2)
        for sl in (slice(0, half), slice(half, None))
    ]
    return torch.cat(parts, dim=-1)


def qkv_norm_rope_reference(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    heads: int,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """The layer's own ops (transformers' order and roundings): q, k, v as [B, L, H, D]."""
    b, n, _ = qkv.shape
    x = qkv.view(b, n, 3, heads, -1)
    q = rope_2d(_rms(x[:, :, 0], q_weight, eps), cos, sin)
    k = rope_2d(_rms(x[:, :, 1], k_weight, eps), cos, sin)
    return q, k, _rms(x[:, :, 2], None, eps)


if triton is not None:

    @triton.jit
    def _norm_rope_head(src, w_ptr, dst, c, s, d, rot, sign, m2, eps, D: tl.constexpr):
        x = tl.load(src + d[None, :], mask=m2, other=0.0).to(tl.float32)
        xr = tl.load(src + rot[None, :], mask=m2, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
        w = tl.load(w_ptr + d).to(tl.float32)
        wr = tl.load(w_ptr + rot).to(tl.float32)
        # the norm's output is rounded to the working dtype before the rotary, as the layer does
        n = (x * inv[:, None] * w[None, :]).to(dst.dtype.element_ty).to(tl.float32)
        nr = (xr * inv[:, None] * wr[None, :]).to(dst.dtype.element_ty).to(tl.float32)
        out = n * c + sign[None, :] * nr * s
        tl.store(dst + d[None, :], out.to(dst.dtype.element_ty), mask=m2)

    @triton.jit
    def _norm_rope_quarters(
        src, w_ptr, dst, c0, c1, c2, c3, s0, s1, s2, s3, e, m2, eps, D: tl.constexpr
    ):
        # the same arithmetic from four loads of a quarter of the head each, so that no element
        # is loaded twice and every load is a contiguous run: rotate_half pairs quarters 0-1 and
        # 2-3 ([a, b] -> [-b, a]); only the norm's sum runs in another order
        Q: tl.constexpr = D // 4
        x0 = tl.load(src + e[None, :], mask=m2, other=0.0).to(tl.float32)
        x1 = tl.load(src + Q + e[None, :], mask=m2, other=0.0).to(tl.float32)
        x2 = tl.load(src + 2 * Q + e[None, :], mask=m2, other=0.0).to(tl.float32)
        x3 = tl.load(src + 3 * Q + e[None, :], mask=m2, other=0.0).to(tl.float32)
        squares = tl.sum(x0 * x0, axis=1) + tl.sum(x1 * x1, axis=1)
        squares += tl.sum(x2 * x2, axis=1) + tl.sum(x3 * x3, axis=1)
        inv = (1.0 / tl.sqrt(squares / D + eps))[:, None]
        ty = dst.dtype.element_ty
        n0 = (x0 * inv * tl.load(w_ptr + e).to(tl.float32)[None, :]).to(ty).to(tl.float32)
        n1 = (x1 * inv * tl.load(w_ptr + Q + e).to(tl.float32)[None, :]).to(ty).to(tl.float32)
        n2 = (x2 * inv * tl.load(w_ptr + 2 * Q + e).to(tl.float32)[None, :]).to(ty).to(tl.float32)
        n3 = (x3 * inv * tl.load(w_ptr + 3 * Q + e).to(tl.float32)[None, :]).to(ty).to(tl.float32)
        tl.store(dst + e[None, :], (n0 * c0 + (-n1) * s0).to(ty), mask=m2)
        tl.store(dst + Q + e[None, :], (n1 * c1 + n0 * s1).to(ty), mask=m2)
        tl.store(dst + 2 * Q + e[None, :], (n2 * c2 + (-n3) * s2).to(ty), mask=m2)
        tl.store(dst + 3 * Q + e[None, :], (n3 * c3 + n2 * s3).to(ty), mask=m2)

    @triton.jit
    def _quarters(ptr, rows, e, m2, D: tl.constexpr):
        # a [rows, D] table (cos or sin) as its four [rows, D/4] quarters, in fp32
        at = ptr + rows[:, None] * D + e[None, :]
        Q: tl.constexpr = D // 4
        return (
            tl.load(at, mask=m2, other=0.0).to(tl.float32),
            tl.load(at + Q, mask=m2, other=0.0).to(tl.float32),
            tl.load(at + 2 * Q, mask=m2, other=0.0).to(tl.float32),
            tl.load(at + 3 * Q, mask=m2, other=0.0).to(tl.float32),
        )

    @triton.jit
    def _qkv_norm_rope_kernel(
        qkv, cos, sin, qw, kw, q_out, k_out, v_out, M, eps,
        H: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, ALL_HEADS: tl.constexpr,
        QUARTERS: tl.constexpr,
    ):  # fmt: skip
        # ALL_HEADS: one program takes every head of its rows, so the rows' cos/sin are read once
        # (else once per head: a second grid axis). QUARTERS: each head as four quarter loads
        # (_norm_rope_quarters), else as whole rows plus a second load of the rotated partners.
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
        m2 = (rows < M)[:, None]
        if QUARTERS:
            e = tl.arange(0, D // 4)
            c0, c1, c2, c3 = _quarters(cos, rows, e, m2, D)
            s0, s1, s2, s3 = _quarters(sin, rows, e, m2, D)
            if ALL_HEADS:
                for h in tl.static_range(H):
                    _qkv_head_quarters(qkv, qw, kw, q_out, k_out, v_out, rows, h, c0, c1, c2, c3,
                                       s0, s1, s2, s3, e, m2, eps, H, D)  # fmt: skip
            else:
                _qkv_head_quarters(qkv, qw, kw, q_out, k_out, v_out, rows, tl.program_id(1), c0,
                                   c1, c2, c3, s0, s1, s2, s3, e, m2, eps, H, D)  # fmt: skip
        else:
            d = tl.arange(0, D)
            # rotate_half within each half of the head dim: [a, b] -> [-b, a], a and b D/4 wide
            quarter: tl.constexpr = D // 4
            first = (d % (2 * quarter)) < quarter
            rot = tl.where(first, d + quarter, d - quarter)
            sign = tl.where(first, -1.0, 1.0)
            c = tl.load(cos + rows[:, None] * D + d[None, :], mask=m2, other=0.0).to(tl.float32)
            s = tl.load(sin + rows[:, None] * D + d[None, :], mask=m2, other=0.0).to(tl.float32)
            if ALL_HEADS:
                for h in tl.static_range(H):
                    _qkv_head(qkv, qw, kw, q_out, k_out, v_out, rows, h, c, s, d, rot, sign, m2,
                              eps, H, D)  # fmt: skip
            else:
                _qkv_head(qkv, qw, kw, q_out, k_out, v_out, rows, tl.program_id(1), c, s, d, rot,
                          sign, m2, eps, H, D)  # fmt: skip

    @triton.jit
    def _v_norm(src, dst, d, m2, eps, D: tl.constexpr):
        v = tl.load(src + d[None, :], mask=m2, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(v * v, axis=1) / D + eps)
        tl.store(dst + d[None, :], (v * inv[:, None]).to(dst.dtype.element_ty), mask=m2)

    @triton.jit
    def _qkv_head(
        qkv, qw, kw, q_out, k_out, v_out, rows, h, c, s, d, rot, sign, m2, eps,
        H: tl.constexpr, D: tl.constexpr,
    ):  # fmt: skip
        src = qkv + rows[:, None] * (3 * H * D) + h * D
        out = rows[:, None] * (H * D) + h * D
        _norm_rope_head(src, qw, q_out + out, c, s, d, rot, sign, m2, eps, D)
        _norm_rope_head(src + H * D, kw, k_out + out, c, s, d, rot, sign, m2, eps, D)
        _v_norm(src + 2 * H * D, v_out + out, d, m2, eps, D)

    @triton.jit
    def _qkv_head_quarters(
        qkv, qw, kw, q_out, k_out, v_out, rows, h, c0, c1, c2, c3, s0, s1, s2, s3, e, m2, eps,
        H: tl.constexpr, D: tl.constexpr,
    ):  # fmt: skip
        src = qkv + rows[:, None] * (3 * H * D) + h * D
        out = rows[:, None] * (H * D) + h * D
        _norm_rope_quarters(src, qw, q_out + out, c0, c1, c2, c3, s0, s1, s2, s3, e, m2, eps, D)
        _norm_rope_quarters(src + H * D, kw, k_out + out, c0, c1, c2, c3, s0, s1, s2, s3, e, m2,
                            eps, D)  # fmt: skip
        _v_norm(src + 2 * H * D, v_out + out, tl.arange(0, D), m2, eps, D)


def triton_usable(t: Tensor) -> bool:
    """Whether the kernel runs for this tensor: CUDA with triton, or triton's CPU interpreter."""
    if triton is None:
        return False
    return t.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


@torch.library.custom_op("gemma4_batched_encoder::qkv_norm_rope", mutates_args=())
def qkv_norm_rope(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    heads: int,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v as [B, L, H, D] from the merged projection [B, L, 3*H*D] (see the module doc)."""
    dim = qkv.shape[-1] // (3 * heads)
    if not triton_usable(qkv) or dim % 4 or dim & (dim - 1):
        return qkv_norm_rope_reference(qkv, cos, sin, q_weight, k_weight, heads, eps)
    return _launch_qkv_norm_rope(qkv, cos, sin, q_weight, k_weight, heads, eps)


def _launch_qkv_norm_rope(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    heads: int,
    eps: float,
    block_m: int | None = None,
    warps: int | None = None,
    all_heads: bool | None = None,
    quarters: bool | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    b, n, width = qkv.shape
    dim = width // (3 * heads)
    qkv, cos, sin = qkv.contiguous(), cos.contiguous(), sin.contiguous()
    q, k, v = (qkv.new_empty((b, n, heads, dim)) for _ in range(3))
    rows = b * n
    # rows a program takes, its warps, one program for all heads of its rows or one a head
    # (launch_config.py: the time, and at most a row sum's order)
    choice = launch("qkv", qkv.device)
    block = block_m or choice["block_m"]
    if all_heads is None:
        # all heads a program only where the rows alone fill the GPU: at 1 video (3,402 rows)
        # the H200's fastest launch was one program a head, at 16 (54,432) all heads
        all_heads = choice["all_heads"] and rows >= choice["all_heads_min_rows"]
    grid = (triton.cdiv(rows, block),) if all_heads else (triton.cdiv(rows, block), heads)
    _qkv_norm_rope_kernel[grid](
        qkv, cos, sin, q_weight.contiguous(), k_weight.contiguous(), q, k, v, rows, eps,
        H=heads, D=dim, BLOCK_M=block, ALL_HEADS=all_heads,
        QUARTERS=choice.get("quarters", False) if quarters is None else quarters,
        num_warps=warps or choice["warps"],
    )  # fmt: skip
    return q, k, v


@qkv_norm_rope.register_fake
def _(qkv, cos, sin, q_weight, k_weight, heads, eps):
    b, n, width = qkv.shape
    shape = (b, n, heads, width // (3 * heads))
    return qkv.new_empty(shape), qkv.new_empty(shape), qkv.new_empty(shape)
