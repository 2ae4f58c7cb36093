"""Fast mode's hand-written encoder layers: Q/K/V and gate/up merged into one GEMM each.

The Gemma 4 vision layer as transformers writes it runs seven GEMMs per layer (q, k, v, o, gate,
up, down); here q/k/v and gate/up read their input once as two wider GEMMs, and the norms, 2D
rotary, GELU and residuals are left to inductor to fuse around them (``torch.compile``;
inductor's max-autotune, Triton GEMM templates with fused epilogues, measured slower on the
H200, so it is not offered). With ``triton_qkv`` the per-head norms and the rotary after the
Q/K/V GEMM run as one hand-written Triton kernel (qkv_kernel.py): inductor's kernel for them was
the largest elementwise cost. The arithmetic is the layer's own (fp32 RMS norms, attention scale
1, GELU-tanh), so it deviates from ``exact`` only by rounding order, which fast mode reports
(``verify --mode fast``).

Only for towers whose linear layers are plain ``nn.Linear`` weights without clipping (the public
E4B checkpoint's); anything else raises ``Unsupported`` at construction and fast mode keeps the
compiled stock layers (``fused.FusedLayers(exact=False)``). The merged weights are copies, taken
at fast mode's first call (after vLLM has loaded the weights): about 200 MB more GPU memory for
E4B's tower in bf16, and weights changed in place later are not seen.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .fused import _dynamic_batch_and_length
from .qkv_kernel import _rms, qkv_norm_rope, qkv_norm_rope_reference


class Unsupported(ValueError):
    """The tower's layers are not the plain structure these kernels assume."""


def _weight(linear: nn.Module) -> Tensor:
    if getattr(linear, "use_clipped_linears", False):
        raise Unsupported("clipped linears")
    inner = getattr(linear, "linear", linear)
    if not isinstance(inner, nn.Linear) or inner.bias is not None:
        raise Unsupported(f"{type(inner).__name__} is not a bias-free nn.Linear")
    return inner.weight


def _norm_weight(norm: nn.Module) -> Tensor | None:
    if type(norm).__name__ != "Gemma4RMSNorm":
        raise Unsupported(f"norm {type(norm).__name__}")
    return norm.weight if getattr(norm, "with_scale", True) else None


def _layer(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    w: dict[str, Tensor | None],
    heads: int,
    head_dim: int,
    eps: float,
    triton_qkv: bool,
) -> Tensor:
    b, n, _ = x.shape
    h = _rms(x, w["input_norm"], eps)
    qkv_fn = qkv_norm_rope if triton_qkv else qkv_norm_rope_reference
    q, k, v = qkv_fn(F.linear(h, w["qkv"]), cos, sin, w["q_norm"], w["k_norm"], heads, eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    attn = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    attn = F.linear(attn.transpose(1, 2).reshape(b, n, heads * head_dim), w["o"])
    x = x + _rms(attn, w["post_attn_norm"], eps)
    h = _rms(x, w["pre_ffw_norm"], eps)
    gate, up = F.linear(h, w["gate_up"]).chunk(2, dim=-1)
    h = F.linear(F.gelu(gate, approximate="tanh") * up, w["down"])
    return x + _rms(h, w["post_ffw_norm"], eps)


_COMPILED: Callable[..., Tensor] | None = None


def _compiled() -> Callable[..., Tensor]:
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = torch.compile(_layer)
    return _COMPILED


class MergedLayers:
    """The tower's encoder layers as merged-weight calls; same ``hidden`` as ``FusedLayers``."""

    def __init__(self, vt: nn.Module, triton_qkv: bool = False, compile: bool = True) -> None:
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
        self.triton_qkv = triton_qkv
        self.call = _compiled() if compile else _layer

    def hidden(
        self, inputs_embeds: Tensor, attention_mask: object, pixel_position_ids: Tensor
    ) -> Tensor:
        """``vt.encoder(...).last_hidden_state`` for unpadded items (fast mode passes no mask)."""
        if attention_mask is not None:
            raise Unsupported("merged layers attend over valid patches only (no mask)")
        cos, sin = self.encoder.rotary_emb(inputs_embeds, pixel_position_ids)
        _dynamic_batch_and_length(cos, sin)
        hidden = inputs_embeds
        for w in self.weights:
            _dynamic_batch_and_length(hidden)
            hidden = self.call(
                hidden, cos, sin, w, self.heads, self.head_dim, self.eps, self.triton_qkv
            )
        return hidden
