"""Batched, bit-identical Gemma 4 vision encoder (core API without vLLM) and its vLLM plugin."""

from __future__ import annotations

from .encoder import BatchedVisionEncoder, encode_frames
from .settings import Settings

__version__ = "0.1.0"
__all__ = ["BatchedVisionEncoder", "Settings", "__version__", "encode_frames"]
