"""The encoder's metrics leave out vLLM's start-up profile run.

Before serving, vLLM's model runner (``profile_run``) runs the encoder on dummy inputs of the
largest size to size the KV cache, and the plugin's first call captures its start-up CUDA graphs
there: on the thirty-first sitting's H100 that one call took 29.5 s, which sat in
``gemma4_encoder_seconds``'s top bucket for good (30.8 s of the 58 calls recorded before that
sitting's sweep), so lifetime averages (sum over count, what a bench reads without a baseline)
read as a slow encoder (Prometheus's rates did not see it: it precedes the first scrape). Those
calls still run through the plugin (the profile must measure what serving will use); only their
recording is skipped (``metrics.unrecorded``), as for the media stages on vLLM's dummy processor
inputs (media/__init__.py, ``untimed_dummy_inputs``).

Installed where the model is built (the engine core with one GPU, the workers otherwise), on
every model runner of this vLLM that defines ``profile_run`` (``RUNNERS``): Model Runner V1
(0.20-0.33; vLLM's CPU runner inherits it), V2 (0.26+; 0.34's CPU runner inherits it) and 0.34's
standalone CPU runner.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

from .log import logger
from .metrics import unrecorded

RUNNERS = (
    ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
    ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"),
    ("vllm.v1.worker.cpu.standalone_model_runner", "StandaloneCPUModelRunner"),
)
_PATCHED = "_gemma4_profile_untimed"


def untimed(original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a runner's ``profile_run``) inside ``metrics.unrecorded``."""

    @functools.wraps(original)
    def profile_run(*args: Any, **kwargs: Any) -> Any:
        with unrecorded():
            return original(*args, **kwargs)

    setattr(profile_run, _PATCHED, True)
    return profile_run


def install() -> list[str]:
    """Wraps every importable runner's ``profile_run`` once; returns the classes wrapped
    (``module.Class``)."""
    wrapped = []
    for module, cls in RUNNERS:
        try:
            runner = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            continue
        original = runner.__dict__.get("profile_run")
        if original is None or getattr(original, _PATCHED, False):
            continue
        runner.profile_run = untimed(original)
        wrapped.append(f"{module}.{cls}")
    if not wrapped:
        logger.info("gemma4_batched_encoder: no profile_run found; its encoder calls are recorded")
    return wrapped
