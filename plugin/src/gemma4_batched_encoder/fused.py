"""Fused encoder layers: inductor fuses the elementwise work; in exact mode it keeps the bits.

At scale the stock tower is bound by unfused elementwise work (fp32 norms, rotary, gelu,
residuals), not by its GEMMs. Each encoder layer is compiled by inductor, with what inductor
would compute differently from eager kept out of its hands:

- ``emulate_precision_casts`` (per compile, not global: vLLM compiles the language model with
  inductor too): bf16 intermediates are rounded after every op, as eager does;
- the RMSNorm's mean (a reduction: inductor sums in another order) and its ``pow(x, -0.5)``
  (eager runs ATen's rsqrt, inductor's CPU code another) run as custom ops, i.e. the same eager
  ATen kernels on the same tensors. GEMMs and SDPA are ATen calls either way.

Measured on one H200 (E4B dims, bf16; bench/results/h200/encoder-fusion/): bit-identical to the
serial per-item tower at 1-16 videos and with images; inside CUDA graphs one 6-frame video 11.1
-> 5.9 ms and 16 videos 145 -> 73 ms (`bench/encoder_fusion_probe.py`). Every new (device,
dtype) is self-checked against the unfused path first; any difference or compile error keeps the
unfused path. On by default for CUDA (``GEMMA4_ENCODER_FUSED=auto``): served on vLLM 0.20.0 this
version compiled nothing after start-up (``TORCH_LOGS=recompiles``), where the first build (one
compile per layer) had compiled while serving and its p95 at 35 video req/s was 1033 ms (unfused
222; bench/results/h200/vllm-0.20.0-8api*/NOTES.md).

Fast mode (``FusedLayers(vt, exact=False)``) runs the same shared layer call compiled plainly:
no cast emulation, the norms fused, no bit check (H200, ninth sitting, with CUDA graphs: 4.0 /
50.7 ms for 1 / 16 videos).
"""

from __future__ import annotations

from collections.abc import Callable
from types import MethodType

import torch
from torch import Tensor, nn
from transformers.masking_utils import create_bidirectional_mask

from .chunk import no_padding_means_no_mask

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
    """A vision tower's encoder layers (its modules, not copies), run through one compiled call.

    ``exact=True`` (exact mode): the norms inside the layers get an instance-level ``_norm`` that
    runs the same eager kernels as the class's (so the stock path, which calls the same modules,
    keeps its values), and bf16 casts are emulated. ``exact=False`` (fast mode): plain inductor,
    which may round and reduce differently (fast mode reports its deviation; `verify`). The layer
    modules themselves are not changed.
    """

    def __init__(self, vt: nn.Module, exact: bool = True) -> None:
        import torch._inductor.config as inductor_config

        if exact and not hasattr(inductor_config, "emulate_precision_casts"):
            raise RuntimeError(f"torch {torch.__version__} has no emulate_precision_casts")
        encoder = vt.encoder
        self.encoder = encoder
        self.exact = exact
        layers = list(encoder.layers[: encoder.config.num_hidden_layers])
        if exact:
            for layer in layers:
                for module in layer.modules():
                    if _is_rms_norm(module):
                        module._norm = MethodType(_norm_eager_reduction, module)
        self.layers = layers

    def hidden(
        self, inputs_embeds: Tensor, attention_mask: object, pixel_position_ids: Tensor
    ) -> Tensor:
        """``vt.encoder(...).last_hidden_state`` with the compiled layers (same steps)."""
        encoder = self.encoder
        # Inside a capture too, no padding gives no mask (chunk.py): a capture-time mask is an
        # input the compiled layers never saw, so they recompiled inside every capture of an
        # unpadded batch and it failed (transformers 5.17, H200, 2026-11-30).
        with no_padding_means_no_mask():
            mask = create_bidirectional_mask(
                config=encoder.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask
            )
        hidden_states = inputs_embeds
        position_embeddings = encoder.rotary_emb(hidden_states, pixel_position_ids)
        call = _compiled_layer_call(self.exact)
        # An inference tensor like every other input here (dynamo guards on the dispatch keys:
        # a plain tensor from outside inference mode would compile another graph under load).
        position_ids = pixel_position_ids.clone()
        # Batch and length are dynamic from the first compile, so that new request shapes reuse
        # the graphs the self-check compiled (torch still specialises size 1: one more graph).
        _dynamic_batch_and_length(mask, position_ids, *position_embeddings)
        for layer in self.layers:
            _dynamic_batch_and_length(hidden_states)
            hidden_states = call(layer, hidden_states, mask, position_embeddings, position_ids)
        return hidden_states


def _dynamic_batch_and_length(*tensors: object) -> None:
    for t in tensors:
        if isinstance(t, Tensor):
            dims = (0, 2, 3) if t.dim() == 4 else (0, 1)  # a [B, 1, L, L] mask, else [B, L, ...]
            for d in dims:
                torch._dynamo.maybe_mark_dynamic(t, d)


def _layer_call(
    layer: nn.Module,
    hidden: Tensor,
    mask: object,
    position_embeddings: object,
    position_ids: Tensor,
) -> Tensor:
    return layer(
        hidden,
        attention_mask=mask,
        position_embeddings=position_embeddings,
        position_ids=position_ids,
    )


_COMPILED: dict[bool, Callable[..., Tensor]] = {}


def _compiled_layer_call(exact: bool = True) -> Callable[..., Tensor]:
    """One compiled function for every layer of every tower in the process. The layer is an
    input (torch inlines nn.Modules and lifts their parameters), so all layers share its few
    cache entries (with mask / without, batch of one / more). One ``torch.compile`` per layer
    makes each layer its own backend and cache entry: 16 layers passed dynamo's recompile limit
    (8) on the H200 and the rest ran unfused (2026-11-30). Exact and fast each have their own."""
    if exact not in _COMPILED:
        _COMPILED[exact] = torch.compile(_layer_call, options=_OPTIONS if exact else None)
    return _COMPILED[exact]
