"""vLLM general-plugin entry point (``vllm.general_plugins`` / ``gemma4_batched_encoder``).

vLLM calls ``register()`` in every process it starts (API server, engine core, workers), possibly
more than once. For the encoder it only records a lazy ``module:Class`` string, so nothing heavy
(CUDA, the model module) is imported here; the version gate runs when vLLM first imports the
model class. It also calls the ``install()`` of the package's media hooks (``media_guard``,
``media``), which decide per process whether they apply. ``GEMMA4_ENCODER_DISABLE=1`` skips
all of it: vLLM then runs as if this general plugin were not installed.
"""

from __future__ import annotations

from .log import logger
from .settings import Settings, disabled_by_env

ARCHITECTURE = "Gemma4ForConditionalGeneration"
MODEL_CLASS = "gemma4_batched_encoder.vllm_model:Gemma4ForConditionalGeneration"

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    try:
        # Disabled means stock vLLM: no encoder override and no media hooks either, read first
        # so that a bad value elsewhere (the branch below installs the hooks) cannot undo it.
        if disabled_by_env():
            logger.info(
                "gemma4_batched_encoder: disabled by GEMMA4_ENCODER_DISABLE; stock encoder and "
                "media path in use"
            )
            return
        Settings.from_env()  # checks every other variable
    except ValueError:
        _registered = False
        logger.warning(
            "gemma4_batched_encoder: bad environment setting; encoder not registered",
            exc_info=True,
        )
        _install_media_hooks()  # the media switches are read (and checked) on their own
        return
    _register_encoder()
    _install_media_hooks()


def _register_encoder() -> None:
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, MODEL_CLASS)
    logger.info("gemma4_batched_encoder: registered %s -> %s", ARCHITECTURE, MODEL_CLASS)


def _install_media_hooks() -> None:
    """Media-side hooks that live in this package (issue 8's fast path, the video payload
    guard); each installs itself only where it applies and must never stop vLLM from starting."""
    for module in ("media_guard", "media"):
        try:
            __import__(f"{__package__}.{module}", fromlist=["install"]).install()
        except Exception:
            logger.warning("gemma4_batched_encoder: %s.install() failed", module, exc_info=True)
