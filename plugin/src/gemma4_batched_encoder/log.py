"""The plugin's logger. Named under ``vllm.`` so that inside vLLM its records go through vLLM's
handler and format (a logger outside that tree has no handler there and INFO lines are lost)."""

from __future__ import annotations

import logging

logger = logging.getLogger("vllm.gemma4_batched_encoder")
