"""Torch intra-op threads of the process that runs the model (``GEMMA4_ENGINE_TORCH_THREADS``).

With one GPU vLLM runs the model in the engine-core process (uniproc executor), which, unlike the
worker processes of its multiproc executor, vLLM 0.20 leaves at torch's default of one intra-op
thread per core; the engine core's CPU-side batching of multimodal pixel tensors (``torch.concat``
in ``MultiModalFlatField._reduce_data``) then keeps that many OpenMP workers spinning beside the
API servers. The plugin's model class calls ``set_engine_torch_threads`` from its constructor:
the API servers only resolve the model class (for its processor, ``get_model_architecture``) and
never construct it, so the setting reaches the engine core (one GPU) or the workers (several).
vLLM 0.32's GPU worker itself drops to one thread once the model is loaded
(``set_torch_threads_for_runtime``, unless ``OMP_NUM_THREADS`` is set), which overrides this.
"""

from __future__ import annotations

import os

import torch

from .log import logger

ENV = "GEMMA4_ENGINE_TORCH_THREADS"


def set_engine_torch_threads(threads: int, on_cpu_platform: bool) -> bool:
    """``torch.set_num_threads(threads)`` in this process, with one INFO line (old -> new).

    ``threads <= 0`` (the setting unset, empty or 0) leaves vLLM's choice and logs nothing. On a
    CPU platform nothing changes either (one INFO line says why): vLLM's CPU worker binds its own
    OpenMP threads to cores. Touches nothing else (no environment, no inter-op threads). Returns
    whether the count was set."""
    if threads <= 0:
        return False
    if on_cpu_platform:
        logger.info(
            "gemma4_batched_encoder: %s=%d ignored: the model runs on a CPU platform, whose "
            "worker binds its own OpenMP threads",
            ENV,
            threads,
        )
        return False
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    logger.info(
        "gemma4_batched_encoder: %s: torch intra-op threads %d -> %d in the model's process "
        "(pid %d)",
        ENV,
        old,
        torch.get_num_threads(),
        os.getpid(),
    )
    return True
