"""Video frames reach the Gemma 4 processor as arrays, not PIL images: same tensors, no round trip.

vLLM's Gemma 4 video branch (`Gemma4MultiModalProcessor._apply_hf_processor_main` in
vllm/model_executor/models/gemma4_mm.py, the same lines in 0.20 through 0.33) turns every decoded
frame into a PIL image (`PILImage.fromarray`: a copy), reads `img.size` for the soft-token count,
and hands the PIL frames to transformers, which copies them back into arrays. On one core that
round trip is ~9 ms of a 6-frame 854x480 video's ~30 ms (bench/MEDIA.md).

With the media fast path on, the module's `PILImage` name is pointed at a shim whose `fromarray`
returns the frame itself, viewed as an `ArrayFrame`: a zero-copy uint8 [H, W, 3] array that
answers `.size` the way PIL does, (width, height), for that one line of vLLM. The processor's
`process_image` then turns an ArrayFrame into exactly the tensor `tvF.pil_to_tensor` makes of the
PIL image (the HWC bytes viewed as CHW, not made contiguous): transformers' own numpy branch
copies each frame twice (`.contiguous()` before and after the permute), which made plain arrays
slower than PIL frames, and hands on another memory layout, which the stock code's resize could
treat differently. Same values, same layout, so the same kernels and bits downstream
(tests/test_media_install.py compares both through vLLM's real processor). Anything else
(other modes, dtypes, shapes, the fast path off) gets the real PIL image.

Patch ledger: `vllm.model_executor.models.gemma4_mm.PILImage` (module attribute) and
transformers `Gemma4ImageProcessor.process_image` (ArrayFrame only). Drop once vLLM passes
decoded frames through without PIL.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image


class ArrayFrame(np.ndarray):
    """A decoded RGB frame that reports PIL's `.size` = (width, height); views of it do not."""

    _pil_size: tuple[int, int] | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self._pil_size = None  # slices, ufunc results, copies: plain array semantics

    @property  # type: ignore[override]
    def size(self) -> Any:
        if self._pil_size is not None:
            return self._pil_size
        return int(np.prod(self.shape))


def as_frame(array: np.ndarray) -> ArrayFrame:
    frame = array.view(ArrayFrame)
    frame._pil_size = (array.shape[1], array.shape[0])
    return frame


def is_rgb_frame(obj: Any, mode: str | None) -> bool:
    return (
        mode is None
        and type(obj) is np.ndarray
        and obj.dtype == np.uint8
        and obj.ndim == 3
        and obj.shape[-1] == 3
    )


class PILImageShim:
    """Stands in for the `PIL.Image` module inside gemma4_mm: only `fromarray` differs."""

    def __init__(self, enabled: Callable[[], bool]) -> None:
        self._enabled = enabled

    def fromarray(self, obj: Any, mode: str | None = None) -> Any:
        if self._enabled() and is_rgb_frame(obj, mode):
            return as_frame(obj)
        return Image.fromarray(obj) if mode is None else Image.fromarray(obj, mode)

    def __getattr__(self, name: str) -> Any:
        return getattr(Image, name)


def frame_tensor(frame: ArrayFrame) -> torch.Tensor:
    """What `tvF.pil_to_tensor(Image.fromarray(frame))` returns, without the two copies."""
    return torch.from_numpy(np.asarray(frame)).permute(2, 0, 1)


def _process_image_taking_frames(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def process_image(self: Any, *args: Any, **kwargs: Any) -> Any:
        # transformers calls it per image as partial(process_image, **options)(image)
        if (
            len(args) == 1
            and isinstance(args[0], ArrayFrame)
            and kwargs.get("device") is None
            and kwargs.get("input_data_format") is None
        ):
            return frame_tensor(args[0])  # RGB already: convert_to_rgb is a no-op for it too
        return original(self, *args, **kwargs)

    process_image._gemma4_frames = True  # type: ignore[attr-defined]
    return process_image


def patch_processor() -> bool:
    """Let `Gemma4ImageProcessor.process_image` take ArrayFrames (transformers only, no vLLM)."""
    try:
        from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
    except ImportError:
        return False
    process_image = getattr(Gemma4ImageProcessor, "process_image", None)
    if process_image is None:
        return False
    if not getattr(process_image, "_gemma4_frames", False):
        Gemma4ImageProcessor.process_image = _process_image_taking_frames(process_image)
    return True


def install(enabled: Callable[[], bool]) -> bool:
    """Point gemma4_mm's `PILImage` at the shim; False where this vLLM or transformers differs."""
    try:
        from vllm.model_executor.models import gemma4_mm
    except ImportError:
        return False
    current = getattr(gemma4_mm, "PILImage", None)
    if isinstance(current, PILImageShim):
        return True
    if current is not Image:
        return False  # not the code this was written against: leave it alone
    if not patch_processor():
        return False  # ArrayFrames would take transformers' slower numpy branch
    gemma4_mm.PILImage = PILImageShim(enabled)
    return True
