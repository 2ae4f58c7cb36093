"""Exact mode's fused encoder layers: inductor fuses the elementwise work and keeps the bits.

At scale the stock tower is bound by unfused elementwise work (fp32 norms, rotary, gelu,
residuals), not by its GEMMs. Each encoder layer is compiled by inductor, with what inductor
would compute differently from eager kept out of its hands:

- ``emulate_precision_casts`` (per compile, not global: vLLM compiles the language model with
  inductor too): bf16 intermediates are rounded after every op, as eager does;
- the RMSNorm's mean (a reduction: inductor sums in another order) and its ``pow(x, -0.5)``
  (eager runs ATen's rsqrt, inductor's CPU code another) run as custom ops, i.e. the same eager
  ATen kernels on the same tensors. GEMMs and SDPA are ATen calls either way.

Measured on one H200 (E4B dims, bf16, `bench/encoder_fusion_probe.py`): bit-identical to the
serial per-item tower at 1-16 videos and with images, one 6-frame video 11.1 -> 5.9 ms and 16
videos 145 -> 73 ms inside CUDA graphs. Every new (device, dtype) is self-checked against the
unfused path first; any difference or compile error keeps the unfused path.
"""

from __future__ import annotations

from types import MethodType

import torch
from torch import Tensor, nn
from transformers.masking_utils import create_bidirectional_mask

_OPTIONS = {"emulate_precision_casts": True}


@torch.library.custom_op("gemma4_batched_encoder::mean_last_dim", mutates_args=())
def mean_last_dim(x: Tensor) -> Tensor:
    return x.mean(-1, keepdim=True)


@mean_last_dim.register_fake
def _(x: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], 1))


@torch.library.custom_op("gemma4_batched_encoder::pow_neg_half", mutates_args=())
def pow_neg_half(x: Tensor) -> Tensor:
    return torch.pow(x, -0.5)


@pow_neg_half.register_fake
def _(x: Tensor) -> Tensor:
    return torch.empty_like(x)


def _norm_eager_reduction(self: nn.Module, hidden_states: Tensor) -> Tensor:
    # transformers' Gemma4RMSNorm._norm: the same ops in the same order; two stay eager kernels.
    mean_squared = mean_last_dim(hidden_states.pow(2)) + self.eps
    return hidden_states * pow_neg_half(mean_squared)


def _is_rms_norm(module: nn.Module) -> bool:
    return type(module).__name__ == "Gemma4RMSNorm" and hasattr(module, "_norm")


class FusedLayers:
    """Compiled forwards of a vision tower's encoder layers (the tower's modules, not copies).

    The norms inside the layers get an instance-level ``_norm`` that runs the same eager kernels
    as the class's (so the stock path, which calls the same modules, keeps its values); the layer
    modules themselves are not changed.
    """

    def __init__(self, vt: nn.Module) -> None:
        import torch._inductor.config as inductor_config

        if not hasattr(inductor_config, "emulate_precision_casts"):
            raise RuntimeError(f"torch {torch.__version__} has no emulate_precision_casts")
        encoder = vt.encoder
        self.encoder = encoder
        layers = list(encoder.layers[: encoder.config.num_hidden_layers])
        for layer in layers:
            for module in layer.modules():
                if _is_rms_norm(module):
                    module._norm = MethodType(_norm_eager_reduction, module)
        # dynamic=None: the first new shape recompiles with dynamic sizes, later ones reuse it.
        self.layers = [torch.compile(layer.forward, options=_OPTIONS) for layer in layers]

    def hidden(
        self, inputs_embeds: Tensor, attention_mask: object, pixel_position_ids: Tensor
    ) -> Tensor:
        """``vt.encoder(...).last_hidden_state`` with the compiled layers (same steps)."""
        encoder = self.encoder
        mask = create_bidirectional_mask(
            config=encoder.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
        )
        hidden_states = inputs_embeds
        position_embeddings = encoder.rotary_emb(hidden_states, pixel_position_ids)
        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                attention_mask=mask,
                position_embeddings=position_embeddings,
                position_ids=pixel_position_ids,
            )
        return hidden_states
