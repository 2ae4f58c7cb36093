"""vLLM general-plugin entry point (``vllm.general_plugins`` / ``gemma4_batched_encoder``).

vLLM calls ``register()`` in every process it starts (API server, engine core, workers), possibly
more than once. It only records a lazy ``module:Class`` string, so nothing heavy (CUDA, the model
module) is imported here; the version gate runs when vLLM first imports the model class.
"""

from __future__ import annotations

from .log import logger
from .settings import Settings

ARCHITECTURE = "Gemma4ForConditionalGeneration"
MODEL_CLASS = "gemma4_batched_encoder.vllm_model:Gemma4ForConditionalGeneration"

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    try:
        settings = Settings.from_env()
    except ValueError:
        logger.warning(
            "gemma4_batched_encoder: bad environment setting; plugin not registered", exc_info=True
        )
        return
    if settings.disabled:
        logger.info(
            "gemma4_batched_encoder: disabled by GEMMA4_ENCODER_DISABLE; stock encoder in use"
        )
        _registered = True
        return
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
    _registered = True
    logger.info("gemma4_batched_encoder: registered %s -> %s", ARCHITECTURE, MODEL_CLASS)
