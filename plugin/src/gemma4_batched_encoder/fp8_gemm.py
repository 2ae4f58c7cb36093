"""Float8 GEMMs with fused epilogues for fast mode (Triton), where cuBLAS's end at a bf16 output.

``torch._scaled_mm`` (cuBLASLt) writes each GEMM's bf16 output, which the next kernel reads back:
at 16 videos on the H200 the gate/up GEMM writes 669 MB a layer that the GELU x up + quantize
kernel reads again only to halve it (fp8_quant.py). Here the GEMM's epilogue applies the row and
column scales itself and, with ``gelu_mul``, computes ``gelu_tanh(gate) * up`` from the fp32
accumulator before anything is written: half the bytes out, and the kernel after it only
quantizes.

``fp8_gemm_qkv`` does the same for the merged Q/K/V GEMM: its epilogue applies the per-head RMS
norms and the 2D rotary (qkv_kernel.py's arithmetic) with q and k in ``qkv_pair_order``, each
rotary partner beside its mate in the tile, and writes q, k and v as three tensors.

``fp8_gemm_gelu_amax`` also gathers each output row's absolute maximum (atomic maxima over the
row's tiles), and ``fp8_gemm_quant_a`` takes those bf16 rows with their maxima and makes each A
tile float8 in registers with ``quant_rows``' formula: the down projection without a quantize
kernel writing a float8 copy in between, and with the same operand bytes.

The weight rows for ``gelu_mul`` are interleaved (gate 0, up 0, gate 1, up 1, ...:
``interleave_gate_up``), so each output tile holds matching gate and up columns and splits them
in registers. Products accumulate in fp32 as cuBLAS's do; the order of the K sums may differ
(fast mode's deviation, reported by ``verify --mode fast``).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .fp8_quant import FP8_MAX
from .launch_config import launch as launch_choice
from .qkv_kernel import triton, triton_usable

if triton is not None:
    import triton.language as tl

    from .fp8_quant import _MAX, gelu_tanh_mul

    @triton.jit
    def _tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
        # grouped order: GROUP_M row blocks walk the columns together, so their A rows and the
        # weight's column blocks stay in L2
        num_m = tl.cdiv(M, BLOCK_M)
        num_n = tl.cdiv(N, BLOCK_N)
        in_group = GROUP_M * num_n
        first_m = (pid // in_group) * GROUP_M
        size_m = min(num_m - first_m, GROUP_M)
        return first_m + (pid % in_group) % size_m, (pid % in_group) // size_m

    @triton.jit
    def _fp8_gemm_kernel(
        a, b, a_scale, b_scale, out, M, N, K, cos, sin, qw, kw, eps, row_amax,
        EPILOGUE: tl.constexpr, A_QUANT: tl.constexpr, HD: tl.constexpr, D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ):  # fmt: skip
        # a [M, K] float8 rows, b [N, K] float8 weight rows (K contiguous in both, as float8
        # wgmma wants them); the epilogue (_epilogue) writes out
        pid_m, pid_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        # rows past M read row M - 1 (their results are never stored): no masks in the K loop
        a_at = a + tl.minimum(rm, M - 1).to(tl.int64)[:, None] * K + rk[None, :]
        b_at = b + tl.minimum(rn, N - 1).to(tl.int64)[None, :] * K + rk[:, None]
        a_div = _row_divisor(a_scale, rm, M, A_QUANT)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for _ in range(0, K // BLOCK_K):
            acc = tl.dot(_a_operand(tl.load(a_at), a_div, A_QUANT), tl.load(b_at), acc)
            a_at += BLOCK_K
            b_at += BLOCK_K
        _epilogue(acc, a_scale, b_scale, out, rm, rn, pid_n, M, N, cos, sin, qw, kw, eps,
                  row_amax, EPILOGUE, A_QUANT, HD, D, BLOCK_M, BLOCK_N)  # fmt: skip

    @triton.jit
    def _fp8_gemm_tma_kernel(
        a_desc, b_desc, a_scale, b_scale, out, M, N, K, cos, sin, qw, kw, eps, row_amax,
        EPILOGUE: tl.constexpr, A_QUANT: tl.constexpr, HD: tl.constexpr, D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ):  # fmt: skip
        # the same with the tiles loaded by the Hopper TMA unit (rows past M read as zeros)
        pid_m, pid_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        _tma_tile(a_desc, b_desc, a_scale, b_scale, out, M, N, K, cos, sin, qw, kw, eps,
                  row_amax, pid_m, pid_n, EPILOGUE, A_QUANT, HD, D, BLOCK_M, BLOCK_N,
                  BLOCK_K)  # fmt: skip

    @triton.jit
    def _fp8_gemm_persistent_kernel(
        a_desc, b_desc, a_scale, b_scale, out, M, N, K, cos, sin, qw, kw, eps, row_amax,
        EPILOGUE: tl.constexpr, A_QUANT: tl.constexpr, HD: tl.constexpr, D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
        PROGRAMS: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
    ):  # fmt: skip
        # TMA loads, one program a multiprocessor walking the tiles: with FLATTEN the tile loop
        # and the K loop are one software pipeline, so the next tile's loads overlap this one's
        # epilogue (E4B's K of 768 is six K blocks: a pipeline's fill and drain are a large
        # share of each tile)
        tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), tiles, PROGRAMS, flatten=FLATTEN,
                             warp_specialize=WARP_SPECIALIZE):  # fmt: skip
            pid_m, pid_n = _tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            _tma_tile(a_desc, b_desc, a_scale, b_scale, out, M, N, K, cos, sin, qw, kw, eps,
                      row_amax, pid_m, pid_n, EPILOGUE, A_QUANT, HD, D, BLOCK_M, BLOCK_N,
                      BLOCK_K)  # fmt: skip

    @triton.jit
    def _tma_tile(
        a_desc, b_desc, a_scale, b_scale, out, M, N, K, cos, sin, qw, kw, eps, row_amax, pid_m,
        pid_n, EPILOGUE: tl.constexpr, A_QUANT: tl.constexpr, HD: tl.constexpr, D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        # one output tile from TMA loads: its K loop, then the epilogue
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        rm = off_m + tl.arange(0, BLOCK_M)
        rn = off_n + tl.arange(0, BLOCK_N)
        a_div = _row_divisor(a_scale, rm, M, A_QUANT)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a_t = _a_operand(a_desc.load([off_m, k]), a_div, A_QUANT)
            acc = tl.dot(a_t, b_desc.load([off_n, k]).T, acc)
        _epilogue(acc, a_scale, b_scale, out, rm, rn, pid_n, M, N, cos, sin, qw, kw, eps,
                  row_amax, EPILOGUE, A_QUANT, HD, D, BLOCK_M, BLOCK_N)  # fmt: skip

    @triton.jit
    def _row_divisor(a_scale, rm, M, A_QUANT: tl.constexpr):
        # A_QUANT: a_scale holds each row's amax; quant_rows' scale from it (else unused)
        if A_QUANT:
            amax = tl.load(a_scale + tl.minimum(rm, M - 1))
            return tl.maximum(amax, 1e-12) / _MAX
        else:
            return tl.full(rm.shape, 1.0, tl.float32)

    @triton.jit
    def _a_operand(a, a_div, A_QUANT: tl.constexpr):
        # A_QUANT: a tile of wide rows made float8 in registers, as quant_rows makes them
        if A_QUANT:
            return (a.to(tl.float32) / a_div[:, None]).to(tl.float8e4nv)
        else:
            return a

    @triton.jit
    def _epilogue(
        acc, a_scale, b_scale, out, rm, rn, pid_n, M, N, cos, sin, qw, kw, eps, row_amax,
        EPILOGUE: tl.constexpr, A_QUANT: tl.constexpr, HD: tl.constexpr, D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        m_ok = rm < M
        if A_QUANT:
            acc = acc * _row_divisor(a_scale, rm, M, A_QUANT)[:, None]
        else:
            acc = acc * tl.load(a_scale + rm, mask=m_ok, other=0.0)[:, None]
        acc = acc * tl.load(b_scale + rn, mask=rn < N, other=0.0)[None, :]
        ty = out.dtype.element_ty
        if EPILOGUE == 1 or EPILOGUE == 3:
            # GELU x up: columns gate 0, up 0, gate 1, ... (interleave_gate_up)
            g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
            h = gelu_tanh_mul(g, u).to(ty)
            rh = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
            dst = out + rm.to(tl.int64)[:, None] * (N // 2) + rh[None, :]
            tl.store(dst, h, mask=m_ok[:, None] & (rh < N // 2)[None, :])
            if EPILOGUE == 3:  # and each row's amax of what was stored, over all tiles
                tile_amax = tl.max(tl.abs(h.to(tl.float32)), axis=1)
                tl.atomic_max(row_amax + rm, tile_amax, mask=m_ok)
        elif EPILOGUE == 2:  # Q/K/V: per-head norms and the 2D rotary (qkv_kernel's arithmetic)
            HB: tl.constexpr = BLOCK_N // D  # heads in this tile, all of one of q, k, v
            part = (pid_n * BLOCK_N) // HD
            x = tl.reshape(acc, (BLOCK_M, HB, D))
            x = x * (1.0 / tl.sqrt(tl.sum(x * x, axis=2) / D + eps))[:, :, None]
            rows = rm.to(tl.int64)[:, None]
            dst = out + part.to(tl.int64) * M * HD + rows * HD + (pid_n * BLOCK_N - part * HD)
            dst += tl.arange(0, BLOCK_N)[None, :]
            if part == 2:  # v: a norm without scale, no rotary
                tl.store(dst, tl.reshape(x, (BLOCK_M, BLOCK_N)).to(ty), mask=m_ok[:, None])
            else:
                d = tl.arange(0, D)
                w = tl.where(part == 0, tl.load(qw + d), tl.load(kw + d)).to(tl.float32)
                n = (x * w[None, None, :]).to(ty).to(tl.float32)  # rounded, as the layer
                # q/k columns are pairs (rotary partner a, partner b): qkv_pair_order
                a, b = tl.split(tl.reshape(n, (BLOCK_M, HB, D // 2, 2)))
                j = tl.arange(0, D // 2)
                col = (j // (D // 4)) * (D // 2) + j % (D // 4)  # partner a's column in cos
                at = tl.minimum(rows, M - 1) * D + col[None, :]
                ca = tl.load(cos + at).to(tl.float32)[:, None, :]
                cb = tl.load(cos + at + D // 4).to(tl.float32)[:, None, :]
                sa = tl.load(sin + at).to(tl.float32)[:, None, :]
                sb = tl.load(sin + at + D // 4).to(tl.float32)[:, None, :]
                o = tl.join(a * ca - b * sa, b * cb + a * sb)
                tl.store(dst, tl.reshape(o, (BLOCK_M, BLOCK_N)).to(ty), mask=m_ok[:, None])
        else:
            dst = out + rm.to(tl.int64)[:, None] * N + rn[None, :]
            tl.store(dst, acc.to(ty), mask=m_ok[:, None] & (rn < N)[None, :])


# tma: TMA loads (Hopper+), else pointer loads; persistent (with TMA): one program a
# multiprocessor, its tile and K loops one pipeline with ``flatten``, warp-specialized with
# ``warp_specialize`` (where the Triton version offers them: a launch that fails is the tuner's)
DEFAULT_LAUNCH = {
    "block_m": 128, "block_n": 128, "block_k": 128, "group_m": 8, "stages": 4, "warps": 8,
    "tma": 0, "persistent": 0, "flatten": 0, "warp_specialize": 0,
}  # fmt: skip
_PLAIN, _GELU_MUL, _QKV, _GELU_MUL_AMAX = 0, 1, 2, 3


def interleave_gate_up(w: Tensor) -> Tensor:
    """[2I, ...] gate rows then up rows -> rows gate 0, up 0, gate 1, up 1, ... (``gelu_mul``)."""
    gate, up = w.chunk(2, dim=0)
    return torch.stack([gate, up], dim=1).reshape(w.shape)


def qkv_pair_order(head_dim: int) -> list[int]:
    """The order of a q/k head's dims that ``fp8_gemm_qkv`` works in: each rotary pair side by
    side (rotate_half pairs quarter 0 with 1 and 2 with 3 of the head). Attention scores are the
    same under any order shared by q and k, so q and k stay in it; v keeps the layer's order."""
    quarter = head_dim // 4
    return [
        (j // quarter) * 2 * quarter + part * quarter + j % quarter
        for j in range(head_dim // 2)
        for part in (0, 1)
    ]


def _fitted(cfg: dict[str, int], k: int, q_width: int, dim: int) -> dict[str, int]:
    """``cfg`` with its K block halved until it divides ``k`` and, for the Q/K/V epilogue, its N
    block made whole heads of ``dim`` dividing q's width ``q_width`` (small towers)."""
    cfg = dict(cfg)
    while k % cfg["block_k"] and cfg["block_k"] > 16:
        cfg["block_k"] //= 2
    if k % cfg["block_k"]:
        raise ValueError(f"K={k} is no multiple of 16")
    if q_width:  # whole heads (at least one), a power of two of them dividing q's width
        block = max(cfg["block_n"], dim)
        while (q_width % block or block % dim) and block > dim:
            block //= 2
        if q_width % block or block % dim or block & (block - 1):
            raise ValueError(f"no N block holds whole heads of {dim} in q's width {q_width}")
        cfg["block_n"] = block
    return cfg


def _launch(
    a: Tensor,
    a_scale: Tensor,
    w: Tensor,
    w_scale: Tensor,
    out: Tensor,
    epilogue: int,
    launch: dict[str, int] | None,
    rope: tuple[Tensor, Tensor, Tensor, Tensor, float, int] | None = None,
    row_amax: Tensor | None = None,
    a_quant: bool = False,
) -> Tensor:
    m, k = a.shape
    n = w.shape[0]
    cos, sin, qw, kw, eps, dim = rope if rope is not None else (a, a, a, a, 0.0, 1)
    cfg = _fitted({**DEFAULT_LAUNCH, **(launch or {})}, k, n // 3 if epilogue == _QKV else 0, dim)
    if w.shape[1] != k:
        raise ValueError(f"the weight's K ({w.shape[1]}) is not the input's ({k})")
    tiles = triton.cdiv(m, cfg["block_m"]) * triton.cdiv(n, cfg["block_n"])
    grid = (tiles,)
    extra: dict[str, int] = {}
    a, w = a.contiguous(), w.contiguous()
    if cfg["tma"] or cfg["persistent"]:
        from triton.tools.tensor_descriptor import TensorDescriptor

        kernel = _fp8_gemm_tma_kernel
        a_in = TensorDescriptor.from_tensor(a, [cfg["block_m"], cfg["block_k"]])
        w_in = TensorDescriptor.from_tensor(w, [cfg["block_n"], cfg["block_k"]])
        if cfg["persistent"]:
            kernel = _fp8_gemm_persistent_kernel
            grid = (min(tiles, _multiprocessors(a.device)),)
            extra = {"PROGRAMS": grid[0], "FLATTEN": bool(cfg["flatten"]),
                     "WARP_SPECIALIZE": bool(cfg["warp_specialize"])}  # fmt: skip
    else:
        kernel, a_in, w_in = _fp8_gemm_kernel, a, w
    kernel[grid](
        a_in, w_in, a_scale.reshape(-1).contiguous(), w_scale.reshape(-1).contiguous(), out,
        m, n, k, cos.contiguous(), sin.contiguous(), qw.contiguous(), kw.contiguous(), eps,
        row_amax if row_amax is not None else out, EPILOGUE=epilogue, A_QUANT=a_quant,
        HD=n // 3, D=dim, BLOCK_M=cfg["block_m"], BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"],
        GROUP_M=cfg["group_m"], num_stages=cfg["stages"], num_warps=cfg["warps"], **extra,
    )  # fmt: skip
    return out


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # Triton's interpreter on the CPU: a few programs, each several tiles
    return torch.cuda.get_device_properties(device).multi_processor_count


def fp8_gemm(
    a: Tensor,
    a_scale: Tensor,
    w: Tensor,
    w_scale: Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    gelu_mul: bool = False,
    launch: dict[str, int] | None = None,
) -> Tensor:
    """``(a * a_scale) @ (w * w_scale).T`` for float8 ``a`` [M, K] and ``w`` [N, K] with fp32
    scales per row of each ([M, 1] or [M], [N, 1] or [1, N] or [N]); with ``gelu_mul`` (``w``
    from ``interleave_gate_up``) ``gelu_tanh(gate) * up`` of it, [M, N / 2]."""
    m, n = a.shape[0], w.shape[0]
    if gelu_mul and n % 2:
        raise ValueError("gelu_mul needs an even number of interleaved gate/up rows")
    out = a.new_empty((m, n // 2 if gelu_mul else n), dtype=out_dtype)
    return _launch(a, a_scale, w, w_scale, out, _GELU_MUL if gelu_mul else _PLAIN, launch)


def fp8_gemm_gelu_amax(
    a: Tensor,
    a_scale: Tensor,
    w: Tensor,
    w_scale: Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    launch: dict[str, int] | None = None,
) -> tuple[Tensor, Tensor]:
    """``fp8_gemm(..., gelu_mul=True)`` and each output row's absolute maximum [M] (fp32, of
    the values as stored), gathered over the row's tiles with atomic maxima: what
    ``fp8_gemm_quant_a`` needs to quantize those rows as ``quant_rows`` would."""
    m, n = a.shape[0], w.shape[0]
    if n % 2:
        raise ValueError("gelu_mul needs an even number of interleaved gate/up rows")
    out = a.new_empty((m, n // 2), dtype=out_dtype)
    amax = torch.zeros(m, dtype=torch.float32, device=a.device)
    _launch(a, a_scale, w, w_scale, out, _GELU_MUL_AMAX, launch, row_amax=amax)
    return out, amax


def fp8_gemm_quant_a(
    a: Tensor,
    a_amax: Tensor,
    w: Tensor,
    w_scale: Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    launch: dict[str, int] | None = None,
) -> Tensor:
    """``fp8_gemm(*quant_rows(a), w, w_scale)`` for wide rows ``a`` [M, K] (bf16) whose
    absolute maxima ``a_amax`` [M] are known: each A tile is made float8 in registers as
    ``quant_rows`` makes it (the same bytes), so no float8 copy of ``a`` is written or read."""
    out = a.new_empty((a.shape[0], w.shape[0]), dtype=out_dtype)
    return _launch(a, a_amax, w, w_scale, out, _PLAIN, launch, a_quant=True)


def fp8_gemm_qkv(
    a: Tensor,
    a_scale: Tensor,
    w: Tensor,
    w_scale: Tensor,
    cos: Tensor,
    sin: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    heads: int,
    eps: float,
    out_dtype: torch.dtype = torch.bfloat16,
    launch: dict[str, int] | None = None,
) -> Tensor:
    """The merged Q/K/V GEMM with the per-head norms and the rotary in its epilogue: [3, M, H*D]
    (q, k, v). ``w``'s q and k rows and ``q_weight``/``k_weight`` in ``qkv_pair_order`` (so are
    q and k out); ``cos``/``sin`` [M, D] in the layer's order."""
    m, n = a.shape[0], w.shape[0]
    out = a.new_empty((3, m, n // 3), dtype=out_dtype)
    dim = n // 3 // heads
    rope = (cos, sin, q_weight, k_weight, eps, dim)
    return _launch(a, a_scale, w, w_scale, out, _QKV, launch, rope)


def fp8_gemm_reference(
    a: Tensor, a_scale: Tensor, w: Tensor, w_scale: Tensor, gelu_mul: bool = False
) -> Tensor:
    """``fp8_gemm`` in fp32 torch (the gate/up rows interleaved as for it)."""
    out = (a.float() * a_scale.reshape(-1, 1)) @ (w.float() * w_scale.reshape(-1, 1)).t()
    if not gelu_mul:
        return out
    g, u = out[:, 0::2], out[:, 1::2]
    return torch.nn.functional.gelu(g, approximate="tanh") * u


def fp8_gemm_qkv_reference(
    a: Tensor,
    a_scale: Tensor,
    w: Tensor,
    w_scale: Tensor,
    cos: Tensor,
    sin: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    heads: int,
    eps: float,
    out_dtype: torch.dtype = torch.bfloat16,
) -> Tensor:
    """``fp8_gemm_qkv`` in torch: the same fp32 arithmetic and roundings."""
    m = a.shape[0]
    x = fp8_gemm_reference(a, a_scale, w, w_scale).view(m, 3, heads, -1)
    dim = x.shape[-1]
    x = x * (1.0 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))
    out = x.new_empty(x.shape)
    out[:, 2] = x[:, 2]
    order = torch.tensor(qkv_pair_order(dim), device=cos.device)
    col = order[0::2]  # partner a's column in the layer's order (b's: + D / 4)
    ca, cb = cos.float()[:, None, col], cos.float()[:, None, col + dim // 4]
    sa, sb = sin.float()[:, None, col], sin.float()[:, None, col + dim // 4]
    for i, weight in ((0, q_weight), (1, k_weight)):
        n = (x[:, i] * weight.float()).to(out_dtype).float()
        pa, pb = n[..., 0::2], n[..., 1::2]
        out[:, i, :, 0::2] = pa * ca - pb * sa
        out[:, i, :, 1::2] = pb * cb + pa * sb
    return out.to(out_dtype).permute(1, 0, 2, 3).reshape(3, m, -1).contiguous()


# fast mode's layers call these as opaque ops (torch.library), the launches from the table
# (launch_config.py: "gemm_gelu", "gemm_qkv"); without CUDA (and without TRITON_INTERPRET=1) the
# torch references run


@torch.library.custom_op("gemma4_batched_encoder::gemm_gelu_mul", mutates_args=())
def gemm_gelu_mul(
    a: Tensor, a_scale: Tensor, w: Tensor, w_scale: Tensor, dtype: torch.dtype
) -> Tensor:
    """``gelu_tanh(gate) * up`` of the float8 gate/up GEMM, in ``dtype`` (``fp8_gemm``)."""
    if not triton_usable(a):
        return fp8_gemm_reference(a, a_scale, w, w_scale, gelu_mul=True).to(dtype)
    return fp8_gemm(a, a_scale, w, w_scale, dtype, True, launch_choice("gemm_gelu", a.device))


@gemm_gelu_mul.register_fake
def _(a, a_scale, w, w_scale, dtype):
    return a.new_empty((a.shape[0], w.shape[0] // 2), dtype=dtype)


@torch.library.custom_op("gemma4_batched_encoder::gemm_qkv", mutates_args=())
def gemm_qkv(
    a: Tensor,
    a_scale: Tensor,
    w: Tensor,
    w_scale: Tensor,
    cos: Tensor,
    sin: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    heads: int,
    eps: float,
    dtype: torch.dtype,
) -> Tensor:
    """The Q/K/V GEMM with the norms and rotary in its epilogue, [3, M, H*D] (``fp8_gemm_qkv``;
    ``cos``/``sin`` [M, D])."""
    args = (a, a_scale, w, w_scale, cos, sin, q_weight, k_weight, heads, eps, dtype)
    if not triton_usable(a):
        return fp8_gemm_qkv_reference(*args)
    return fp8_gemm_qkv(*args, launch=launch_choice("gemm_qkv", a.device))


@gemm_qkv.register_fake
def _(a, a_scale, w, w_scale, cos, sin, q_weight, k_weight, heads, eps, dtype):
    return a.new_empty((3, a.shape[0], w.shape[0] // 3), dtype=dtype)


def gemm_gelu_amax_reference(
    a: Tensor, a_scale: Tensor, w: Tensor, w_scale: Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """``fp8_gemm_gelu_amax`` in torch."""
    h = fp8_gemm_reference(a, a_scale, w, w_scale, gelu_mul=True).to(dtype)
    return h, h.float().abs().amax(-1)


def gemm_quant_a_reference(
    a: Tensor, a_amax: Tensor, w: Tensor, w_scale: Tensor, dtype: torch.dtype
) -> Tensor:
    """``fp8_gemm_quant_a`` in torch: ``a``'s rows quantized from ``a_amax`` as quant_rows."""
    scale = a_amax.reshape(-1, 1).float().clamp(min=1e-12) / FP8_MAX
    q = (a.float() / scale).to(torch.float8_e4m3fn)
    return fp8_gemm_reference(q, scale, w, w_scale).to(dtype)


@torch.library.custom_op("gemma4_batched_encoder::gemm_gelu_mul_amax", mutates_args=())
def gemm_gelu_mul_amax(
    a: Tensor, a_scale: Tensor, w: Tensor, w_scale: Tensor, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """``gemm_gelu_mul`` and its rows' absolute maxima (``fp8_gemm_gelu_amax``)."""
    if not triton_usable(a):
        return gemm_gelu_amax_reference(a, a_scale, w, w_scale, dtype)
    return fp8_gemm_gelu_amax(a, a_scale, w, w_scale, dtype, launch_choice("gemm_gelu", a.device))


@gemm_gelu_mul_amax.register_fake
def _(a, a_scale, w, w_scale, dtype):
    m = a.shape[0]
    return a.new_empty((m, w.shape[0] // 2), dtype=dtype), a.new_empty(m, dtype=torch.float32)


@torch.library.custom_op("gemma4_batched_encoder::gemm_quant_a", mutates_args=())
def gemm_quant_a(
    a: Tensor, a_amax: Tensor, w: Tensor, w_scale: Tensor, dtype: torch.dtype
) -> Tensor:
    """The down projection of wide bf16 rows quantized inside the GEMM (``fp8_gemm_quant_a``)."""
    if not triton_usable(a):
        return gemm_quant_a_reference(a, a_amax, w, w_scale, dtype)
    return fp8_gemm_quant_a(a, a_amax, w, w_scale, dtype, launch_choice("gemm_down", a.device))


@gemm_quant_a.register_fake
def _(a, a_amax, w, w_scale, dtype):
    return a.new_empty((a.shape[0], w.shape[0]), dtype=dtype)
