"""Batched, bit-identical Gemma 4 vision encoder (core API without vLLM) and its vLLM plugin."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .encoder import BatchedVisionEncoder, encode_frames
    from .settings import Settings

__version__ = "0.1.0"
__all__ = ["BatchedVisionEncoder", "Settings", "__version__", "encode_frames"]

# Imported on first use: the encoder pulls in torch (~5 s here), which the warm-up CLI, the
# metrics readers and the media helpers that live in this package never need.
_LAZY = {"BatchedVisionEncoder": ".encoder", "encode_frames": ".encoder", "Settings": ".settings"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
