"""Fast mode's hand-written encoder layers: Q/K/V and gate/up merged into one GEMM each.

The Gemma 4 vision layer as transformers writes it runs seven GEMMs per layer (q, k, v, o, gate,
up, down); here q/k/v and gate/up read their input once as two wider GEMMs, and the norms, 2D
rotary, GELU and residuals are left to inductor to fuse around them (``torch.compile``;
inductor's max-autotune, Triton GEMM templates with fused epilogues, measured slower on the
H200, so it is not offered). With ``triton_qkv`` the per-head norms and the rotary after the
Q/K/V GEMM run as one hand-written Triton kernel (qkv_kernel.py): inductor's kernel for them was
the largest elementwise cost. Each compiled call ends at a layer's down projection and the next
opens with that layer's post-FFW norm and residual add, so inductor fuses them with its own input
norm (one pass over the rows where there were two; twentieth sitting: 0.13-0.14 ms less at 1 and
16 videos). The arithmetic is the layer's own (fp32 RMS norms, attention scale 1, GELU-tanh), so
it deviates from ``exact`` only by rounding order, which fast mode reports (``verify --mode
fast``).

With ``gemm_epilogues`` (float8 with the fused norms: ``merged-triton-fp8-epilogues``) the Q/K/V
and gate/up GEMMs are Triton's (fp8_gemm.py) with the q/k/v norms + rotary and GELU x up in their
epilogues (``_layer_epilogues``); with ``quant_down`` (``merged-triton-fp8-gemms``) the down GEMM
too, quantizing its input itself.

With ``fp8`` the four GEMMs run in float8 (e4m3) through ``torch._scaled_mm``: each weight row
and each activation row is scaled by its own absolute maximum (per output channel, per token), the
products accumulate in fp32 and come out in the layer's dtype. That halves the GEMMs' bytes and
doubles the H200's matrix rate, at a precision cost that ``verify --mode fast`` reports like any
other fast kernel; it needs float8 GEMMs on the device (Hopper/Ada on CUDA, or the CPU), else
``Unsupported``.

Only for towers whose linear layers are plain, unquantized, bias-free linears without clipping
(the public E4B checkpoint's: ``nn.Linear``, or the ``ReplicatedLinear`` that vLLM 0.32, not
0.20, puts in their place); anything else raises ``Unsupported`` at construction and fast mode
keeps the compiled stock layers (``fused.FusedLayers(exact=False)``). The merged weights are
copies, taken at fast mode's first call (after vLLM has loaded the weights): about 200 MB more
GPU memory for E4B's tower in bf16 (half that in float8), and weights changed in place later are
not seen.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .fp8_gemm import (
    gemm_gelu_mul,
    gemm_gelu_mul_amax,
    gemm_qkv,
    gemm_quant_a,
    interleave_gate_up,
    qkv_pair_order,
)
from .fp8_quant import add_norm_quant, gelu_mul_quant, quant_rows, quantize_rows
from .fused import _dynamic_batch_and_length
from .qkv_kernel import _rms, qkv_norm_rope, qkv_norm_rope_reference


class Unsupported(ValueError):
    """The tower's layers are not the plain structure these kernels assume."""


def _weight(linear: nn.Module) -> Tensor:
    if getattr(linear, "use_clipped_linears", False):
        raise Unsupported("clipped linears")
    inner = getattr(linear, "linear", linear)
    # vLLM 0.32 (not 0.20) swaps the tower's nn.Linear for its ReplicatedLinear
    # (recursive_replace_linear); unquantized and bias-free, it runs F.linear on the same weight
    plain = isinstance(inner, nn.Linear) or (
        type(inner).__name__ == "ReplicatedLinear"
        and type(getattr(inner, "quant_method", None)).__name__ == "UnquantizedLinearMethod"
    )
    if not plain or getattr(inner, "bias", None) is not None:
        raise Unsupported(f"{type(inner).__name__} is not a bias-free, unquantized linear")
    if inner.weight.numel() == 0:  # vLLM's CPU GEMM dispatch packs bf16 weights away
        raise Unsupported(f"{type(inner).__name__}'s weight was packed away")
    return inner.weight


def _norm_weight(norm: nn.Module) -> Tensor | None:
    if type(norm).__name__ != "Gemma4RMSNorm":
        raise Unsupported(f"norm {type(norm).__name__}")
    return norm.weight if getattr(norm, "with_scale", True) else None


GEMMS = ("qkv", "o", "gate_up", "down")

# GEMMA4_ENCODER_FAST_KERNELS' merged-layer choices (settings.FastKernels besides "stock"), each
# as MergedLayers' switches; every choice adds to the one before it
_FP8 = {"triton_qkv": True, "fp8": True}
_NORMS = {**_FP8, "fused_norms": True}
CHOICES: dict[str, dict[str, bool]] = {
    "merged": {},
    "merged-triton": {"triton_qkv": True},
    "merged-triton-fp8": _FP8,
    "merged-triton-fp8-norms": _NORMS,
    "merged-triton-fp8-epilogues": {**_NORMS, "gemm_epilogues": True},
    "merged-triton-fp8-gemms": {**_NORMS, "gemm_epilogues": True, "quant_down": True},
}


def _linear(
    x: Tensor,
    w: dict[str, Tensor | None],
    name: str,
    quantized: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """``F.linear(x, w[name])``, or its float8 GEMM when the weight was quantized. ``quantized``:
    x's float8 rows and scales when the caller already made them (x then gives only the output's
    leading shape and dtype)."""
    weight, w_scale = w[name], w.get(name + "_scale")
    assert weight is not None
    if w_scale is None:
        return F.linear(x, weight)
    xq, x_scale = quantized or quantize_rows(x.reshape(-1, x.shape[-1]))
    # bf16 out: the only high-precision output CUDA's row-wise scaled GEMM offers
    out = torch._scaled_mm(
        xq, weight.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=torch.bfloat16
    ).to(x.dtype)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def fp8_gemm_error(device: torch.device) -> str | None:
    """Why float8 GEMMs with row-wise scales cannot run on ``device`` (None: they can)."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        return f"float8 GEMMs need compute capability 8.9+ ({torch.cuda.get_device_name(device)})"
    try:
        a = torch.ones(16, 16, device=device).to(torch.float8_e4m3fn)
        ones = torch.ones(16, 1, device=device)
        torch._scaled_mm(a, a.t(), scale_a=ones, scale_b=ones.t(), out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError) as e:
        return f"float8 GEMMs unavailable: {e}"
    return None


def _add_norm_linear(
    x: Tensor,
    branch: Tensor | None,
    branch_norm: Tensor | None,
    w: dict[str, Tensor | None],
    norm: str,
    gemm: str,
    eps: float,
    fused: bool,
) -> tuple[Tensor, Tensor]:
    """``x += rms(branch)`` (when there is a branch), then the GEMM ``gemm`` of ``rms(x)``:
    (new stream, GEMM output). ``fused`` (float8 only): the add, the norm and the quantization
    of the GEMM's input as one Triton kernel (``fp8_quant.add_norm_quant``)."""
    if not fused:
        if branch is not None:
            x = x + _rms(branch, branch_norm, eps)
        return x, _linear(_rms(x, w[norm], eps), w, gemm)
    x, hq, hs = _add_norm_quant(x, branch, branch_norm, w[norm], eps)
    return x, _linear(x, w, gemm, quantized=(hq, hs))


def _add_norm_quant(
    x: Tensor, branch: Tensor | None, branch_norm: Tensor | None, norm: Tensor | None, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """``fp8_quant.add_norm_quant`` on [B, L, D] rows: (new stream, float8 rows, their scales)."""
    b, n, d = x.shape
    flat = None if branch is None else branch.reshape(-1, d)
    s, hq, hs = add_norm_quant(x.reshape(-1, d), flat, branch_norm, norm, eps)
    return (x if branch is None else s.view(b, n, d)), hq, hs


def _attention(
    q: Tensor, k: Tensor, v: Tensor, w: dict[str, Tensor | None], heads: int, head_dim: int
) -> Tensor:
    """Attention (scale 1, no mask: valid patches only) and the o projection; q, k, v as
    [B, L, H, D]."""
    b, n = q.shape[:2]
    attn = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), scale=1.0)
    return _linear(attn.transpose(1, 2).reshape(b, n, heads * head_dim), w, "o")


def _close(
    x: Tensor, h: Tensor, w: dict[str, Tensor | None], eps: float, last: bool
) -> tuple[Tensor, Tensor | None]:
    """A layer call's result: (stream, down projection left for the next call to add), or in
    the last layer the final stream with the down projection's post-FFW norm added."""
    if last:
        return x + _rms(h, w["post_ffw_norm"], eps), None
    return x, h


def _layer_epilogues(
    x: Tensor,
    pending: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    w: dict[str, Tensor | None],
    heads: int,
    head_dim: int,
    eps: float,
    pending_norm: Tensor | None = None,
    last: bool = False,
    quant_down: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """``_layer`` with the Q/K/V and gate/up GEMMs in Triton, each with what follows it in its
    epilogue (fp8_gemm.py: the norms and rotary; GELU x up): q and k in ``qkv_pair_order``, which
    attention does not see. ``quant_down``: the gate/up GEMM also gathers its rows' maxima and
    the down GEMM (Triton too) quantizes its bf16 input tile by tile, as ``quant_rows`` would,
    instead of a quantize kernel writing a float8 copy between them."""
    b, n, _ = x.shape
    x, hq, hs = _add_norm_quant(x, pending, pending_norm, w["input_norm"], eps)
    cos, sin = cos.reshape(b * n, -1), sin.reshape(b * n, -1)
    qkv = gemm_qkv(
        hq, hs, w["qkv"], w["qkv_scale"], cos, sin, w["q_norm"], w["k_norm"], heads, eps, x.dtype
    )
    q, k, v = (t.view(b, n, heads, head_dim) for t in qkv.unbind(0))
    attn = _attention(q, k, v, w, heads, head_dim)
    x, hq, hs = _add_norm_quant(x, attn, w["post_attn_norm"], w["pre_ffw_norm"], eps)
    if quant_down:
        mid, amax = gemm_gelu_mul_amax(hq, hs, w["gate_up"], w["gate_up_scale"], x.dtype)
        h = gemm_quant_a(mid, amax, w["down"], w["down_scale"], x.dtype).view(b, n, -1)
    else:
        mid = gemm_gelu_mul(hq, hs, w["gate_up"], w["gate_up_scale"], x.dtype)
        h = _linear(mid.view(b, n, -1), w, "down", quantized=quant_rows(mid))
    return _close(x, h, w, eps, last)


def _layer(
    x: Tensor,
    pending: Tensor | None,
    cos: Tensor,
    sin: Tensor,
    w: dict[str, Tensor | None],
    heads: int,
    head_dim: int,
    eps: float,
    triton_qkv: bool,
    pending_norm: Tensor | None = None,
    last: bool = False,
    fused_norms: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """One layer up to its down projection: (residual stream, down projection). ``pending``: the
    previous layer's down projection, whose post-FFW norm (``pending_norm``) and residual add open
    this call, so that one compiled graph holds them beside this layer's input norm (one pass
    over the rows instead of two). ``last``: close this layer too (returns the final stream).
    ``fused_norms`` (float8 only): each residual add + norm + quantization in front of the Q/K/V
    and gate/up GEMMs as one Triton kernel (``fp8_quant.add_norm_quant``)."""
    b, n, _ = x.shape
    qkv_fn = qkv_norm_rope if triton_qkv else qkv_norm_rope_reference
    x, qkv = _add_norm_linear(x, pending, pending_norm, w, "input_norm", "qkv", eps, fused_norms)
    q, k, v = qkv_fn(qkv, cos, sin, w["q_norm"], w["k_norm"], heads, eps)
    attn = _attention(q, k, v, w, heads, head_dim)
    x, gate_up = _add_norm_linear(
        x, attn, w["post_attn_norm"], w, "pre_ffw_norm", "gate_up", eps, fused_norms
    )
    if w.get("down_scale") is not None:
        # float8: GELU x up, the row's amax and the quantization in one kernel
        h = _linear(gate_up, w, "down", quantized=gelu_mul_quant(gate_up.reshape(b * n, -1)))
    else:
        gate, up = gate_up.chunk(2, dim=-1)
        h = _linear(F.gelu(gate, approximate="tanh") * up, w, "down")
    return _close(x, h, w, eps, last)


def _embed(pixel_values: Tensor, position_ids: Tensor, weight: Tensor, table: Tensor) -> Tensor:
    """Gemma4VisionPatchEmbedder.forward on valid patches only: without padding its ``where``
    (zeroing padding's position embeddings) and ``clamp`` (of padding's -1 positions) change
    nothing, so eagerly these are its ops and its bits; compiled, the two table lookups and both
    adds become one kernel (twenty-second sitting, 16 videos on the H200: the embedder's kernels
    outside its GEMM took ~0.6 GPU ms, the two lookups as gathers 0.23 of it, the ``where`` 0.12,
    the adds 0.12, the input's rescale 0.15)."""
    x = (2 * (pixel_values - 0.5)).to(weight.dtype)
    x_emb = F.embedding(position_ids[..., 0], table[0])
    y_emb = F.embedding(position_ids[..., 1], table[1])
    return F.linear(x, weight) + (x_emb + y_emb)


@functools.cache
def _compiled(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``torch.compile(fn)``, once a process (one compiled function, its graphs shared)."""
    return torch.compile(fn)


class MergedLayers:
    """The tower's encoder layers as merged-weight calls; same ``hidden`` as ``FusedLayers``."""

    def __init__(
        self,
        vt: nn.Module,
        triton_qkv: bool = False,
        compile: bool = True,
        fp8: bool = False,
        fused_norms: bool = False,
        gemm_epilogues: bool = False,
        quant_down: bool = False,
    ) -> None:
        encoder = vt.encoder
        cfg = encoder.config
        if getattr(cfg, "hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise Unsupported(f"activation {cfg.hidden_activation}")
        if cfg.num_key_value_heads != cfg.num_attention_heads:
            raise Unsupported("grouped K/V heads")
        if cfg.rope_parameters.get("rope_type") != "axial":
            raise Unsupported("rope type")
        self.encoder = encoder
        self.heads = cfg.num_attention_heads
        self.head_dim = cfg.head_dim
        self.eps = cfg.rms_norm_eps
        self.weights: list[dict[str, Tensor | None]] = []
        with torch.no_grad():
            for layer in encoder.layers[: cfg.num_hidden_layers]:
                a, m = layer.self_attn, layer.mlp
                if a.v_norm.with_scale or not (a.q_norm.with_scale and a.k_norm.with_scale):
                    raise Unsupported("q/k/v norm scales other than Gemma 4's")
                self.weights.append(
                    {
                        "qkv": torch.cat([_weight(a.q_proj), _weight(a.k_proj), _weight(a.v_proj)]),
                        "o": _weight(a.o_proj),
                        "gate_up": torch.cat([_weight(m.gate_proj), _weight(m.up_proj)]),
                        "down": _weight(m.down_proj),
                        "q_norm": _norm_weight(a.q_norm),
                        "k_norm": _norm_weight(a.k_norm),
                        "input_norm": _norm_weight(layer.input_layernorm),
                        "post_attn_norm": _norm_weight(layer.post_attention_layernorm),
                        "pre_ffw_norm": _norm_weight(layer.pre_feedforward_layernorm),
                        "post_ffw_norm": _norm_weight(layer.post_feedforward_layernorm),
                    }
                )
        if fused_norms and not fp8:
            raise Unsupported("the fused norm + quantize kernel feeds float8 GEMMs only")
        if gemm_epilogues and not (fused_norms and triton_qkv):
            raise Unsupported("the GEMMs with epilogues take the fused norms' float8 rows")
        if gemm_epilogues and (self.head_dim % 4 or self.head_dim & (self.head_dim - 1)):
            raise Unsupported(f"head dim {self.head_dim}: the Q/K/V epilogue takes powers of two")
        if gemm_epilogues and (cfg.hidden_size % 16 or cfg.intermediate_size % 16):
            raise Unsupported("the Triton float8 GEMMs take K in blocks of 16")
        if quant_down and not gemm_epilogues:
            raise Unsupported("the down GEMM quantizing its input takes the GELU GEMM's maxima")
        if gemm_epilogues:
            self._epilogue_order()
        if fp8:
            self._quantize(next(encoder.parameters()).device)
        self.triton_qkv = triton_qkv
        self.fused_norms = fused_norms
        self.gemm_epilogues = gemm_epilogues
        self.quant_down = quant_down
        self.call = _compiled(_layer) if compile else _layer
        self.call_epilogues = _compiled(_layer_epilogues) if compile else _layer_epilogues
        embedder = vt.patch_embedder
        try:  # a quantized or swapped input projection: the tower's own embedder (embed: None)
            self.embed_weight: Tensor | None = _weight(embedder.input_proj)
        except Unsupported:
            self.embed_weight = None
        self.position_table = embedder.position_embedding_table
        self._embed = _compiled(_embed) if compile else _embed

    def embed(self, pixel_values: Tensor, position_ids: Tensor) -> Tensor | None:
        """The patch embedder on valid patches (``_embed``); None where the tower's input
        projection is not a plain linear (the caller then runs the tower's embedder)."""
        if self.embed_weight is None:
            return None
        _dynamic_batch_and_length(pixel_values, position_ids)
        return self._embed(pixel_values, position_ids, self.embed_weight, self.position_table)

    def _epilogue_order(self) -> None:
        """The weights as the GEMMs with epilogues take them: q and k rows (and their norms'
        scales) in ``qkv_pair_order``, gate and up rows interleaved."""
        order = torch.tensor(qkv_pair_order(self.head_dim))
        with torch.no_grad():
            for w in self.weights:
                qkv, q_norm, k_norm = w["qkv"], w["q_norm"], w["k_norm"]
                assert qkv is not None and q_norm is not None and k_norm is not None
                heads = qkv.view(3, self.heads, self.head_dim, -1)
                at = order.to(qkv.device)
                w["qkv"] = torch.cat([heads[:2][:, :, at], heads[2:]]).reshape(qkv.shape)
                w["q_norm"], w["k_norm"] = q_norm[at], k_norm[at]
                gate_up = w["gate_up"]
                assert gate_up is not None
                w["gate_up"] = interleave_gate_up(gate_up)

    def _quantize(self, device: torch.device) -> None:
        """The four GEMMs' weights as float8 rows plus their scales (``[1, out]``, as
        ``_scaled_mm`` takes them); the bf16 merged copies are dropped."""
        error = fp8_gemm_error(device)
        if error:
            raise Unsupported(error)
        with torch.no_grad():
            for w in self.weights:
                for name in GEMMS:
                    weight = w[name]
                    assert weight is not None
                    w[name], scale = quantize_rows(weight)
                    w[name + "_scale"] = scale.t().contiguous()

    def hidden(
        self, inputs_embeds: Tensor, attention_mask: object, pixel_position_ids: Tensor
    ) -> Tensor:
        """``vt.encoder(...).last_hidden_state`` for unpadded items (fast mode passes no mask)."""
        if attention_mask is not None:
            raise Unsupported("merged layers attend over valid patches only (no mask)")
        cos, sin = self.encoder.rotary_emb(inputs_embeds, pixel_position_ids)
        _dynamic_batch_and_length(cos, sin)
        hidden, pending, pending_norm = inputs_embeds, None, None
        for i, w in enumerate(self.weights):
            _dynamic_batch_and_length(hidden, pending)
            last = i == len(self.weights) - 1
            if self.gemm_epilogues:
                hidden, pending = self.call_epilogues(
                    hidden, pending, cos, sin, w, self.heads, self.head_dim, self.eps,
                    pending_norm, last, self.quant_down,
                )  # fmt: skip
            else:
                hidden, pending = self.call(
                    hidden, pending, cos, sin, w, self.heads, self.head_dim, self.eps,
                    self.triton_qkv, pending_norm, last, self.fused_norms,
                )  # fmt: skip
            pending_norm = w["post_ffw_norm"]
        return hidden
