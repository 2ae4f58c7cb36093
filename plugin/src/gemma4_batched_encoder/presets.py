"""Vision-tower presets as plain ``Gemma4VisionConfig`` keyword arguments.

``local/build_model.py`` imports ``VISION_PRESETS``; keep the name and the plain-dict shape.
"""

from __future__ import annotations

from typing import Any

# E4B vision tower (transformers defaults, matching the public checkpoint's vision_config).
E4B: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 16,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
    "head_dim": 64,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "patch_size": 16,
    "pooling_kernel_size": 3,
    "position_embedding_size": 10240,
    "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0},
    "standardize": False,
    "use_clipped_linears": False,
    # vLLM reads this from vision_config (soft tokens of an image at the default budget).
    "default_output_length": 280,
}

# A tower small enough for CPU tests and the tiny served model; same structure as E4B.
TINY: dict[str, Any] = {
    **E4B,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "position_embedding_size": 256,
}

VISION_PRESETS: dict[str, dict[str, Any]] = {"tiny": TINY, "e4b": E4B}
