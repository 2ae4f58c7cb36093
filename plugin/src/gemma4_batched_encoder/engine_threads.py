"""Torch intra-op threads of the process that runs the model (``GEMMA4_ENGINE_TORCH_THREADS``).

With one GPU vLLM runs the model in the engine-core process (uniproc executor), which, unlike the
worker processes of its multiproc executor, vLLM 0.20-0.26 leaves at torch's default of one
intra-op thread per core; the engine core's CPU-side batching of multimodal pixel tensors
(``torch.concat`` in ``MultiModalFlatField._reduce_data``) then keeps that many OpenMP workers
spinning beside the API servers (measured on the H200: 34% of the engine's main thread at 40
video req/s, 7% with one thread). Later vLLM (``set_torch_threads_for_runtime``, 0.32 here) sets
one thread itself before profiling and compiling ("no steady-state CPU op benefits from
intra-op parallelism"), respecting an external ``OMP_NUM_THREADS``. ``auto`` does the same where
vLLM does not: at the construction of the plugin's model class, i.e. in the engine core (one GPU)
or the workers (several; vLLM 0.20 sets ``OMP_NUM_THREADS=1`` there already) and before anything
is compiled (dynamo guards on the thread count). API servers only resolve the model class (for
its processor) and never construct it.

Off by default since the eighth H200 sitting: served with ``auto`` (one engine thread), 35 video
req/s failed (median ITL 22 ms, p95 824 ms) where the seventh sitting's server (16 threads, no
start-up graph warm-up yet) passed (9.7 / 241 ms); one run each. With ``--max-num-batched-tokens
2560`` and LM graphs to 2560, ``auto`` kept up with 50 video req/s but failed every rate from 35
(eighth sitting) and ``off`` passed 35 and fell behind at 40 (ninth): one thread trades latency
for throughput.
"""

from __future__ import annotations

import os

import torch

from .log import logger

ENV = "GEMMA4_ENGINE_TORCH_THREADS"


def vllm_sets_threads_itself() -> bool:
    """Whether this vLLM drops the model's process to one torch thread for serving itself."""
    try:
        from vllm.utils import torch_utils
    except ImportError:
        return False
    return hasattr(torch_utils, "set_torch_threads_for_runtime")


def set_engine_torch_threads(threads: int | None, on_cpu_platform: bool) -> bool:
    """``torch.set_num_threads`` in this process, with one INFO line (old -> new).

    ``threads``: None = auto (1, unless ``OMP_NUM_THREADS`` is set or vLLM sets its own serving
    count), 0 = leave vLLM's choice (silently), N = N. On a CPU platform nothing changes (one
    INFO line when a count was asked for): vLLM's CPU worker binds its own OpenMP threads to
    cores. Touches nothing else (no environment, no inter-op threads). Returns whether the count
    was set."""
    if threads == 0:
        return False
    if on_cpu_platform:
        if threads is not None:
            logger.info(
                "gemma4_batched_encoder: %s=%d ignored: the model runs on a CPU platform, whose "
                "worker binds its own OpenMP threads",
                ENV,
                threads,
            )
        return False
    why = f"{ENV}={threads}"
    if threads is None:
        if "OMP_NUM_THREADS" in os.environ or vllm_sets_threads_itself():
            return False
        threads, why = 1, f"{ENV}=auto, as later vLLM does for serving"
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    logger.info(
        "gemma4_batched_encoder: torch intra-op threads %d -> %d in the model's process (pid %d; "
        "%s)",
        old,
        torch.get_num_threads(),
        os.getpid(),
        why,
    )
    return True
