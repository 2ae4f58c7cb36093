"""Thread-count switches of the media fast path, read from the environment."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger("vllm.gemma4_batched_encoder.media")


def thread_count(name: str, default: int = 1) -> int:
    """A non-negative count from `name` (0 = leave the library's own setting); `default` when
    unset, with a warning when it is not a count."""
    value = os.environ.get(name, str(default)).strip()
    try:
        threads = int(value)
    except ValueError:
        threads = -1
    if threads < 0:
        logger.warning("gemma4 media: %s=%r is not a count; using %d", name, value, default)
        return default
    return threads


ENV_UINT8 = "GEMMA4_MEDIA_UINT8"
_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off", "")


def uint8_requested() -> bool:
    """`GEMMA4_MEDIA_UINT8`: on|off (default off; 1/0/yes/no/true/false too), with a warning
    when it is neither. Read by the API server (emit uint8) and the engine (batch guard)."""
    value = os.environ.get(ENV_UINT8, "off").strip().lower()
    if value in _ON:
        return True
    if value not in _OFF:
        logger.warning("gemma4 media: %s=%r is not on/off; using off", ENV_UINT8, value)
    return False
