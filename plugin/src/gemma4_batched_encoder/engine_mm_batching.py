"""vLLM's batching of multimodal tensors done on the GPU (``GEMMA4_ENGINE_GPU_BATCHING``, opt-in).

Before each encoder call vLLM's model runner merges the scheduled items' tensors per field
(``BaseMultiModalField.reduce_data``): a ``torch.concat`` (flat fields: Gemma 4's pixel values)
or ``torch.stack`` (batched fields) into a fresh pinned CPU buffer, then one copy to the GPU. The
items already sit in pinned memory (the engine's message decoder pins them on CUDA hosts), so
the CPU copy only serves to make one transfer out of several, and it runs on the engine core's
main thread: 28% of it at 40 video req/s on the H200 with torch's 16 threads, 5% with one (vLLM
0.20.0, eighth and ninth sittings). Here each item is copied to the GPU as it is (non-blocking)
and the field's own ``_reduce_data`` merges them there: the same code on device tensors (vLLM
0.32 already accepts device-side items there), so the same tensor, without the CPU pass.

Taken only where the stock call would copy to an accelerator with pinning, for several items,
all plain CPU tensors of one dtype and of one field type that does not keep its data on the CPU;
everything else goes to vLLM's code unchanged (mixed uint8/float batches to it and to the uint8
hand-off's guard, `pixels.install_batch_guard`, which may wrap this or be wrapped by it). Not
measured on a GPU yet, hence opt-in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .log import logger

ENV = "GEMMA4_ENGINE_GPU_BATCHING"
_PATCHED = "_gemma4_gpu_batching"


def on_accelerator(device: Any) -> bool:
    """Whether ``device`` names an accelerator (a replaceable predicate: the tests run on CPU)."""
    if device is None:
        return False
    return torch.device(device).type not in ("cpu", "meta")


def gpu_reduce(stock: Callable[..., Any]) -> Callable[..., Any]:
    """``BaseMultiModalField.reduce_data``, merging on the target device where it may."""

    @functools.wraps(stock)
    def reduce_data(
        self: Any, elems: list[Any], *, device: Any = None, pin_memory: bool = False
    ) -> Any:
        data = [elem.data for elem in elems]
        if (
            pin_memory
            and len(elems) > 1
            and on_accelerator(device)
            and not getattr(self, "keep_on_cpu", False)
            and len({type(elem.field) for elem in elems}) == 1
            and all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in data)
            and len({t.dtype for t in data}) == 1  # mixed uint8/float: pixels.py's guard's
        ):
            return self._reduce_data(
                [t.to(device, non_blocking=True) for t in data], pin_memory=False
            )
        return stock(self, elems, device=device, pin_memory=pin_memory)

    setattr(reduce_data, _PATCHED, True)
    return reduce_data


def install(enabled: bool, on_cpu_platform: bool) -> bool:
    """Wrap ``BaseMultiModalField.reduce_data`` once; never on a CPU platform (nothing to move)."""
    if not enabled or on_cpu_platform:
        return False
    try:
        from vllm.multimodal.inputs import BaseMultiModalField
    except ImportError:
        return False
    stock = vars(BaseMultiModalField).get("reduce_data")
    if stock is None or getattr(stock, _PATCHED, False):
        return False
    BaseMultiModalField.reduce_data = gpu_reduce(stock)
    logger.info("gemma4_batched_encoder: multimodal tensors are batched on the GPU (%s=1)", ENV)
    return True
