"""uint8 pixel hand-off (`GEMMA4_MEDIA_UINT8=on`, issue 8): the API server sends the zero-padded
uint8 patches, the engine rebuilds stock's pixel values on the device.

Stock: the image processor emits `float32(u) * float32(rescale_factor)`, vLLM's processor context
casts floating outputs to the model dtype (`_postprocess_output`), msgspec carries them to the
engine core, which copies them to the device. With the switch on, the fast processor emits `u`
(a quarter of float32, half of bf16) and the plugin's model class computes
`(u.float() * float32(1/255)).to(model dtype)` on the device before anything reads the pixels:
the same single IEEE multiply and the same cast, so every value equals stock's.

Only the factor 1/255 (Gemma 4's) is handed off: `UINT8_SCALE` is the contract of both sides,
and the processor keeps float32 for any other factor. An engine batch can still mix uint8 items
with float ones (a request whose options the fast path does not cover, e.g. `do_normalize`), and
vLLM's `torch.stack`/`cat` would then promote the bytes to float unscaled; `install_batch_guard`
rescales the uint8 items of such a batch on the host first (same arithmetic).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import MutableMapping, Sequence
from typing import Any

import torch

from .log import logger

UINT8_SCALE = 1 / 255
PIXEL_KEYS = ("pixel_values", "pixel_values_videos")
_SCALE32 = float(torch.tensor(UINT8_SCALE, dtype=torch.float32))  # exact in a double
_PATCHED = "_gemma4_uint8_guard"


def to_stock_pixels(value: Any, dtype: torch.dtype) -> Any:
    """uint8 patches (a tensor, or a list/tuple of them) as stock's pixel values in `dtype`;
    anything else unchanged. Runs where the tensor lives (the device, in the engine)."""
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.uint8:
            return value
        return value.to(torch.float32).mul_(_SCALE32).to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(to_stock_pixels(v, dtype) for v in value)
    return value


def has_uint8(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.uint8
    if isinstance(value, (list, tuple)):
        return any(has_uint8(v) for v in value)
    return False


def restore(kwargs: MutableMapping[str, Any], dtype: torch.dtype) -> bool:
    """Replace uint8 pixel inputs in `kwargs` by stock's values; True if there were any."""
    found = False
    for key in PIXEL_KEYS:
        value = kwargs.get(key)
        if has_uint8(value):
            kwargs[key] = to_stock_pixels(value, dtype)
            found = True
    return found


def device_normalizes(vllm_config: Any) -> bool:
    """Whether this vLLM's model rescales the pixel values itself (vLLM 0.34+'s
    `mm_device_do_normalize`, on by default for Gemma 4): its processor then emits the uint8
    patches for every request and the model's `vision_input_norm` rescales them on the device,
    so uint8 values in the engine are not the hand-off's and must reach the model as they are
    (restoring them here would rescale every image twice)."""
    model_config = getattr(vllm_config, "model_config", None)
    mm_config = getattr(model_config, "multimodal_config", None)
    return bool(getattr(mm_config, "mm_device_do_normalize", False))


def handoff_blocker() -> str | None:
    """Why this install cannot take the uint8 hand-off (None: it can). Checked by the API
    server, which shares the engine's vLLM and environment.

    `GEMMA4_ENCODER_DISABLE` needs no check here: the plugin's `register()` then installs no
    media hooks at all (the hand-off lives in the fast processor; tested through vLLM's plugin
    loader in `test_disable_installs_no_media_hooks`). A bad `GEMMA4_ENCODER_*` value does reach
    here: `register()` leaves the model class stock but still installs the media hooks."""
    from .settings import Settings

    try:
        Settings.from_env()
    except ValueError:
        return "an invalid GEMMA4_ENCODER_* setting keeps the plugin's model class out"
    try:
        from vllm.model_executor.models.gemma4_mm import Gemma4ForConditionalGeneration
        from vllm.multimodal.inputs import BaseMultiModalField
    except ImportError as exc:
        return f"this vLLM lacks {exc.name or exc}"
    if not callable(getattr(BaseMultiModalField, "reduce_data", None)):
        return "this vLLM has no BaseMultiModalField.reduce_data (mixed-batch guard)"
    cls = Gemma4ForConditionalGeneration
    if hasattr(cls, "encoder_cudagraph_forward") and not hasattr(
        cls, "select_encoder_cudagraph_items"
    ):
        return "this vLLM's encoder CUDA graphs take inputs the plugin cannot rescale"
    return None


def unmix(elems: Sequence[Any]) -> Sequence[Any]:
    """`MultiModalFieldElem`s of one field with uint8 and floating tensors mixed: the uint8 ones
    rescaled to the floating dtype (what the processor would have cast them to); else as given."""
    tensors = [e.data for e in elems if isinstance(e.data, torch.Tensor)]
    floating = [t.dtype for t in tensors if t.is_floating_point()]
    if not floating or not any(t.dtype == torch.uint8 for t in tensors):
        return elems
    _log_mixed_once()
    return [
        dataclasses.replace(e, data=to_stock_pixels(e.data, floating[0]))
        if isinstance(e.data, torch.Tensor) and e.data.dtype == torch.uint8
        else e
        for e in elems
    ]


@functools.cache
def _log_mixed_once() -> None:
    logger.info(
        "gemma4_batched_encoder: an encoder batch mixes uint8 and float pixel values; "
        "its uint8 items are rescaled on the host (stock arithmetic)"
    )


def install_batch_guard() -> bool:
    """Wrap vLLM's `BaseMultiModalField.reduce_data` with `unmix` (engine process); True if in
    force. Never raises: a failure is logged and leaves vLLM as it is."""
    try:
        from vllm.multimodal.inputs import BaseMultiModalField

        original = BaseMultiModalField.reduce_data
        if getattr(original, _PATCHED, False):
            return True

        @functools.wraps(original)
        def reduce_data(self: Any, elems: Any, *args: Any, **kwargs: Any) -> Any:
            return original(self, unmix(elems), *args, **kwargs)

        setattr(reduce_data, _PATCHED, True)
        BaseMultiModalField.reduce_data = reduce_data  # type: ignore[method-assign]
        return True
    except Exception:
        logger.warning(
            "gemma4_batched_encoder: mixed uint8/float encoder batches not guarded", exc_info=True
        )
        return False
