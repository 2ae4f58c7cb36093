"""Thread-count switches of the media fast path, read from the environment."""

from __future__ import annotations

import logging

from ..settings import env_value, parse_switch

logger = logging.getLogger("vllm.gemma4_batched_encoder.media")


def thread_count(name: str, default: int = 1) -> int:
    """A non-negative count from `name` (0 = leave the library's own setting); `default` when
    unset or empty, with a warning when it is not a count."""
    value = (env_value(name) or str(default)).strip()
    try:
        threads = int(value)
    except ValueError:
        threads = -1
    if threads < 0:
        logger.warning("gemma4 media: %s=%r is not a count; using %d", name, value, default)
        return default
    return threads


ENV_UINT8 = "GEMMA4_MEDIA_UINT8"


def switch(name: str, default: bool) -> bool:
    """An on/off variable read as the settings read theirs (1/0/true/false/yes/no/on/off); unset
    or empty: `default`. Anything else: a warning and `default` (media switches are read in the
    API servers, which should not fail to start over a typo)."""
    raw = env_value(name)
    if raw is None:
        return default
    value = parse_switch(raw)
    if value is None:
        logger.warning("gemma4 media: %s=%r is not on/off; using %s", name, raw, default)
        return default
    return value


def uint8_requested() -> bool:
    """`GEMMA4_MEDIA_UINT8` (default off). Read by the API server (emit uint8) and the engine
    (batch guard)."""
    return switch(ENV_UINT8, False)
