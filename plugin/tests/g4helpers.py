"""Shared builders for the plugin tests: real random towers, real inputs, and the real upstream
vLLM model class instantiated around them (no vLLM config: only the encoder attributes the
upstream encoding methods read are set)."""

from __future__ import annotations

import torch
from torch import nn

from gemma4_batched_encoder import synthetic as S
from gemma4_batched_encoder.presets import VISION_PRESETS

PATCH_DIM = 3 * VISION_PRESETS["tiny"]["patch_size"] ** 2
K = VISION_PRESETS["tiny"]["pooling_kernel_size"]

FRAME_480P = S.Media("frame", (21, 27), 70)  # 336x432 px, 63 tokens
FRAME_720P = S.Media("frame", (18, 33), 70)  # 288x528 px, 66 tokens
FRAME_FULL = S.Media("frame", (21, 30), 70)  # no padding at all


def image(budget: int, aspect: float = 4 / 3) -> S.Media:
    return S.Media("image", S.grid_for_budget(budget, K, aspect), budget)


# What the encoder runs on inside Triton's interpreter, which steps through a kernel one program
# (a row or a few) at a time in Python: a padded frame and a padded image of other shapes, not
# the seven items of test_bit_identity's "images_and_videos" (minutes a kernel check in CI).
INTERPRETED_MIX = [FRAME_480P, image(70, 2.0)]


def tower(dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: object) -> nn.Module:
    return S.build_vision_tower({**VISION_PRESETS["tiny"], **overrides}, seed=seed, dtype=dtype)


def batch(
    media: list[S.Media], dtype: torch.dtype, seed: int = 0
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    pvs, pps = S.make_batch(media, PATCH_DIM, K, seed=seed)
    return [p.to(dtype) for p in pvs], pps


def host_model(cls: type, vt: nn.Module, dtype: torch.dtype, text_hidden: int = 48) -> nn.Module:
    """An instance of a vLLM Gemma 4 model class carrying just a vision tower and projection."""
    from types import SimpleNamespace

    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4MultimodalEmbedder

    obj = cls.__new__(cls)
    nn.Module.__init__(obj)
    obj.vision_tower = vt
    torch.manual_seed(123)
    obj.embed_vision = Gemma4MultimodalEmbedder(
        vt.config, Gemma4TextConfig(hidden_size=text_hidden)
    ).to(dtype)
    obj.config = SimpleNamespace(vision_config=vt.config)
    obj.model_dtype = dtype
    obj._enable_mm_lora = False
    if hasattr(cls, "_embed_patches"):  # vLLM 0.34+: its input norm (off: a cast) and no DP
        from vllm.model_executor.layers.fusion.mm_input_norm import IdentityInputNorm

        obj.vision_input_norm = IdentityInputNorm()
        obj.use_data_parallel = False
    return obj


def _ignore_mask_as_in_5_17(padding_mask, kv_length, local_attention_size=None) -> bool:
    # transformers 5.17's `_ignore_bidirectional_mask_sdpa` (no XPU branch): `is_tracing` first,
    # looked up in masking_utils at call time, as there.
    import transformers.masking_utils as masking

    return (
        not masking.is_tracing(padding_mask)
        and (padding_mask is None or bool(padding_mask.all()))
        and (local_attention_size is None or kv_length < local_attention_size)
    )


def emulate_capture_on_5_17(monkeypatch) -> None:
    """As if a CUDA stream were capturing (for transformers and for the plugin's chunk.py), with
    transformers 5.17's mask step: it counts capture as tracing and builds an all-true mask for
    "no padding" (the H200 host's version; 5.19, installed here, does not)."""
    import transformers.masking_utils as masking

    import gemma4_batched_encoder.chunk as chunk

    monkeypatch.setattr(masking, "_ignore_bidirectional_mask_sdpa", _ignore_mask_as_in_5_17)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    monkeypatch.setattr(chunk, "_capturing", lambda: True)


def resolve_cudagraph_mode(requested: str, support: str, backend: str) -> str:
    """vLLM's own resolution of a requested CUDA-graph mode against its attention backends'
    support (without torch.compile: FULL narrows to FULL_DECODE_ONLY), by name."""
    from vllm.config.compilation import CompilationConfig, CompilationMode
    from vllm.v1.attention.backend import AttentionCGSupport

    config = CompilationConfig(
        mode=CompilationMode.NONE, cudagraph_mode=requested, max_cudagraph_capture_size=64
    )
    return config.resolve_cudagraph_mode_and_sizes(AttentionCGSupport[support], backend).name
