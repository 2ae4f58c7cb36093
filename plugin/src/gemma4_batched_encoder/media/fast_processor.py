"""A faster Gemma 4 image processor `_preprocess`; its tensors are `torch.equal` to stock's.

Stock transformers (`Gemma4ImageProcessor._preprocess`, TorchvisionBackend) runs per image: resize,
`image * rescale_factor` (a full-size float32 tensor), patchify (a permuted copy), pad (another
copy), then `torch.stack` (another). Each is a torch op that OpenMP parallelises over all cores of
the API server; on a shared CPU those small memory-bound ops stall in OpenMP barriers (measured:
0.1 ms alone, 15 ms median under load). Video frames reach this processor as separate images.

Here, for images of one size at once:
- resize: the same `tvF.resize` call (same kernel, same arithmetic) on a [N, C, H, W] batch; the
  antialiased bicubic kernel works per plane, so batching does not change any value;
- patchify in uint8 (1 byte per value instead of 4) with one numpy copy;
- rescale with one numpy multiply straight into the preallocated, zero-padded float32 output:
  `float32(x) * float32(rescale_factor)`, the same IEEE operation torch's `uint8 * float` does
  (checked for all 256 inputs at install time and in the tests). Rescale commutes with patchify
  and with zero padding (0 * s == 0), so the order change is exact;
- position ids from a cache.
With the uint8 hand-off on (`GEMMA4_MEDIA_UINT8`, `..pixels`) and Gemma 4's factor 1/255, the
patches are written as uint8 instead and the engine does the same multiply on the device.
numpy work is single-threaded, so it does not contend with other processes' OpenMP threads.
Anything unusual (normalisation on, non-uint8 input, odd channel counts) goes to the stock code.

`GEMMA4_MEDIA_FRAME_THREADS` (default 1: off) splits the frames of one size across that many
threads (the caller and a small pool; resize, patchify and rescale release the GIL), each with the
caller's torch thread count. The resize works per plane and every frame writes its own rows, so
the tensors are the same at any count; it shortens one video's processor call (latency), not its
CPU time.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torchvision.transforms.v2 import functional as tvF
from transformers.image_processing_utils import BatchFeature
from transformers.models.gemma4.image_processing_gemma4 import (
    _SUPPORTED_SOFT_TOKENS,
    get_aspect_ratio_preserving_size,
)

from ..pixels import UINT8_SCALE
from . import overlap
from .env import logger
from .overlap import ResizeParams


def rescale_exact(values: np.ndarray, factor: float, out: np.ndarray | None = None) -> np.ndarray:
    """`torch.from_numpy(values) * factor` for uint8 `values`, in numpy: float32 x float32."""
    return np.multiply(values, np.float32(factor), out=out, dtype=np.float32)


@functools.lru_cache(maxsize=64)
def position_ids(patch_height: int, patch_width: int, max_patches: int) -> torch.Tensor:
    """[max_patches, 2] (x, y) per patch, row-major, (-1, -1) for padding; read-only, cached."""
    pos = torch.full((max_patches, 2), -1, dtype=torch.int64)
    ys, xs = torch.meshgrid(torch.arange(patch_height), torch.arange(patch_width), indexing="ij")
    n = patch_height * patch_width
    pos[:n, 0] = xs.reshape(-1)
    pos[:n, 1] = ys.reshape(-1)
    return pos


def patchify(images: np.ndarray, patch_size: int) -> np.ndarray:
    """uint8 [N, C, H, W] images -> uint8 [N, n, p * p * C] patches (one numpy copy), in HF's
    `convert_image_to_patches` layout: (row, col) patches, each flattened as (py, px, channel)."""
    count, channels, height, width = images.shape
    ph, pw = height // patch_size, width // patch_size
    patches = images.reshape(count, channels, ph, patch_size, pw, patch_size)
    patches = np.ascontiguousarray(patches.transpose(0, 2, 4, 3, 5, 1))
    return patches.reshape(count, ph * pw, patch_size * patch_size * channels)


def write_patches(patches: np.ndarray, factor: float | None, out: np.ndarray, row: int) -> None:
    """`out[row, :n] = patches * factor` (factor None: the bytes as they are)."""
    if factor is None:
        out[row, : len(patches)] = patches
    else:
        rescale_exact(patches, factor, out=out[row, : len(patches)])


def patchify_rescale_into(
    images: np.ndarray,
    patch_size: int,
    factor: float | None,
    out: np.ndarray,
    rows: Sequence[int],
) -> int:
    """Patchify uint8 [N, C, H, W] images and write `patch * factor` (factor None: the bytes
    as they are) to `out[rows[i], :n]`; returns n, the patches per image."""
    patches = patchify(images, patch_size)
    for i, row in enumerate(rows):
        write_patches(patches[i], factor, out, row)
    return patches.shape[1]


def resize_target(height: int, width: int, params: ResizeParams) -> tuple[int, int]:
    """The processor's resize target for an image of this size (its own function)."""
    return get_aspect_ratio_preserving_size(
        height=height,
        width=width,
        patch_size=params.patch_size,
        max_patches=params.max_soft_tokens * params.pooling_kernel_size**2,
        pooling_kernel_size=params.pooling_kernel_size,
    )


def resize_batch(
    batch: np.ndarray, target: tuple[int, int] | None, params: ResizeParams
) -> np.ndarray:
    """uint8 [N, C, H, W] resized to `target` (None: as it is) with the stock call; the
    antialiased bicubic kernel works per plane, so the batch size does not change any value."""
    if target is None:
        return batch
    resized = tvF.resize(
        torch.from_numpy(batch), size=list(target), interpolation=params.resample, antialias=True
    )
    return resized.numpy()


_frame_threads = 1
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()


def set_frame_threads(threads: int) -> None:
    """Threads one call splits its same-size frames across (1 or less: the calling thread only)."""
    global _frame_threads
    _frame_threads = max(1, threads)


def frame_threads() -> int:
    return _frame_threads


def _executor(workers: int) -> ThreadPoolExecutor:
    """The shared pool, grown to `workers` threads when a call needs more."""
    global _pool, _pool_size
    with _pool_lock:
        if _pool is None or _pool_size < workers:
            old, _pool, _pool_size = _pool, ThreadPoolExecutor(workers, "gemma4-frames"), workers
            if old is not None:
                old.shutdown(wait=False)
        return _pool


def _chunks(rows: list[int], threads: int) -> list[list[int]]:
    """`rows` in at most `threads` contiguous, near-equal chunks."""
    return [c.tolist() for c in np.array_split(rows, max(1, min(threads, len(rows))))]


def _with_torch_threads(threads: int, fn: Callable[..., Any], *args: Any) -> Any:
    from . import limited_torch_threads  # the package imports this module lazily: no cycle

    with limited_torch_threads(threads):
        return fn(*args)


def _process_rows(
    images: Sequence[torch.Tensor],
    rows: list[int],
    target: tuple[int, int] | None,
    params: ResizeParams,
    factor: float | None,
    out: np.ndarray,
) -> int:
    """Resize (to `target`, if any), patchify and rescale these same-size images into their
    rows of `out`; returns the patches per image."""
    batch = np.stack([images[i].numpy() for i in rows])  # single-threaded copy
    resized = resize_batch(batch, target, params)
    return patchify_rescale_into(resized, params.patch_size, factor, out, rows)


def preprocess_uint8(
    images: Sequence[torch.Tensor],
    *,
    do_resize: bool,
    resample: Any,
    rescale_factor: float,
    patch_size: int,
    max_soft_tokens: int,
    pooling_kernel_size: int,
    rescale: bool = True,
    threads: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """pixel_values [N, max_patches, p*p*C] float32, position ids [N, max_patches, 2], soft tokens.

    `images` are uint8 [C, H, W] tensors (what TorchvisionBackend hands `_preprocess`).
    `rescale=False`: pixel_values are the uint8 patches, zero padded (the uint8 hand-off).
    `threads` > 1: the images of one size are split across that many threads.
    """
    max_patches = max_soft_tokens * pooling_kernel_size**2
    channels = int(images[0].shape[0])
    shape = (len(images), max_patches, patch_size * patch_size * channels)
    out = np.zeros(shape, np.float32 if rescale else np.uint8)
    positions = torch.empty((len(images), max_patches, 2), dtype=torch.int64)
    soft_tokens = [0] * len(images)

    groups: dict[tuple[int, ...], list[int]] = {}
    for i, image in enumerate(images):
        groups.setdefault(tuple(image.shape), []).append(i)
    factor = rescale_factor if rescale else None
    params = ResizeParams(resample, patch_size, pooling_kernel_size, max_soft_tokens)
    frames = overlap.active()
    if frames is not None:
        frames.learn(params)
    for shape, rows in groups.items():
        _, height, width = shape
        th, tw = resize_target(height, width, params) if do_resize else (height, width)
        target = (th, tw) if (th, tw) != (height, width) else None
        n = (th // patch_size) * (tw // patch_size)
        todo = rows
        if frames is not None and frames.params == params:
            # frames the decode overlap prepared: their patches as they are (same function)
            todo = []
            for row in rows:
                patches = frames.take(images[row], params, (th, tw))
                if patches is None:
                    todo.append(row)
                else:
                    write_patches(patches, factor, out, row)
        if todo:
            args = (target, params, factor, out)
            first, *rest = _chunks(todo, threads)
            if rest:
                torch_threads = torch.get_num_threads()
                pool = _executor(len(rest))
                futures = [
                    pool.submit(_with_torch_threads, torch_threads, _process_rows, images, c, *args)
                    for c in rest
                ]
                _process_rows(images, first, *args)
                for future in futures:
                    future.result()
            else:
                _process_rows(images, first, *args)
        pos = position_ids(th // patch_size, tw // patch_size, max_patches)
        for row in rows:
            positions[row] = pos
            soft_tokens[row] = n // pooling_kernel_size**2
    return torch.from_numpy(out), positions, soft_tokens


def supports(images: Sequence[Any], do_rescale: bool, do_normalize: bool) -> bool:
    """Whether the fast path reproduces stock exactly for these inputs and options.

    `do_rescale=False` (and no normalize) is what vLLM 0.34+ asks for by default
    (`mm_device_do_normalize`: the model rescales on the device); stock then emits the zero-padded
    uint8 patches, which the fast path makes too."""
    if not images or do_normalize:
        return False
    for image in images:
        if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8:
            return False
        if image.ndim != 3 or image.device.type != "cpu" or image.shape[0] != images[0].shape[0]:
            return False
    return True


@functools.cache
def _warn_factor_once(factor: float) -> None:
    logger.warning(
        "gemma4 media: rescale_factor=%r is not 1/255; float32 pixel values for these inputs "
        "(the uint8 hand-off carries only Gemma 4's factor)",
        factor,
    )


def handoff(uint8: Callable[[], bool], rescale_factor: float) -> bool:
    """Whether this call emits uint8: switch on and the factor the engine assumes."""
    if not uint8():
        return False
    if rescale_factor != UINT8_SCALE:
        _warn_factor_once(rescale_factor)
        return False
    return True


def make_fast_preprocess(
    stock: Callable[..., BatchFeature],
    enabled: Callable[[], bool],
    uint8: Callable[[], bool] = lambda: False,
) -> Callable[..., BatchFeature]:
    """A drop-in `Gemma4ImageProcessor._preprocess` that uses the fast path when it applies;
    with `uint8()` true its pixel_values are the uint8 patches (see `..pixels`)."""

    @functools.wraps(stock)
    def _preprocess(
        self: Any,
        images: list[torch.Tensor],
        do_resize: bool,
        resample: Any,
        do_rescale: bool,
        rescale_factor: float,
        do_normalize: bool,
        image_mean: Any,
        image_std: Any,
        return_tensors: Any,
        patch_size: int | None = None,
        max_soft_tokens: int | None = None,
        pooling_kernel_size: int | None = None,
        **kwargs: Any,
    ) -> BatchFeature:
        if (
            not enabled()
            or not do_resize  # without the resize, sizes need not fit the patch grid
            or max_soft_tokens not in _SUPPORTED_SOFT_TOKENS
            or patch_size is None
            or pooling_kernel_size is None
            or not supports(images, do_rescale, do_normalize)
        ):
            return stock(
                self,
                images,
                do_resize,
                resample,
                do_rescale,
                rescale_factor,
                do_normalize,
                image_mean,
                image_std,
                return_tensors,
                patch_size=patch_size,
                max_soft_tokens=max_soft_tokens,
                pooling_kernel_size=pooling_kernel_size,
                **kwargs,
            )
        pixel_values, positions, soft_tokens = preprocess_uint8(
            images,
            do_resize=do_resize,
            resample=resample,
            rescale_factor=rescale_factor,
            patch_size=patch_size,
            max_soft_tokens=max_soft_tokens,
            pooling_kernel_size=pooling_kernel_size,
            # no rescale asked (vLLM 0.34+'s device normalize): stock's own uint8 patches
            rescale=do_rescale and not handoff(uint8, rescale_factor),
            threads=_frame_threads,
        )
        data = {
            "pixel_values": pixel_values,
            "image_position_ids": positions,
            "num_soft_tokens_per_image": soft_tokens,
        }
        return BatchFeature(data=data, tensor_type=return_tensors)

    _preprocess._gemma4_media_fast = True  # type: ignore[attr-defined]
    return _preprocess


def self_check(
    stock: Callable[..., BatchFeature], fast: Callable[..., BatchFeature] | None = None
) -> bool:
    """Run stock and fast on a few small inputs here (this torch/torchvision); True if equal.

    `fast` defaults to the fast path forced on: one built with the process's switch would, at
    install time (switch not yet set), run stock code and compare stock with itself.
    Includes a 336x432 image, which Gemma 4 does not resize at 70 soft tokens, holding all 256
    byte values, so the rescale arithmetic is compared exhaustively.
    """
    import types

    from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor

    rng = np.random.default_rng(0)
    exact = rng.permutation(np.resize(np.arange(256, dtype=np.uint8), 336 * 432 * 3))
    cases: list[tuple[list[np.ndarray], int, dict[str, bool]]] = [
        ([exact.reshape(336, 432, 3)], 70, {}),
        ([rng.integers(0, 256, (90, 120, 3), dtype=np.uint8) for _ in range(2)], 70, {}),
        ([rng.integers(0, 256, (37, 200, 3), dtype=np.uint8)], 280, {}),
        # what vLLM 0.34+ asks for by default (the model rescales on the device)
        ([rng.integers(0, 256, (37, 200, 3), dtype=np.uint8)], 140, {"do_rescale": False}),
    ]
    if fast is None:
        fast = make_fast_preprocess(stock, lambda: True)
    # The reference runs `stock` itself, not the class's `_preprocess`: once install() has
    # patched the class, that is the fast path (the full test suite compared fast with fast).
    processor = Gemma4ImageProcessor()
    processor._preprocess = types.MethodType(stock, processor)  # type: ignore[method-assign]
    for images, soft_tokens, options in cases:
        kwargs = {"max_soft_tokens": soft_tokens, "return_tensors": "pt", **options}
        want = processor(images=images, **kwargs)
        patched = Gemma4ImageProcessor()
        patched._preprocess = types.MethodType(fast, patched)  # type: ignore[method-assign]
        got = patched(images=images, **kwargs)
        if set(want.keys()) != set(got.keys()):
            return False
        for key in want:
            a, b = want[key], got[key]
            if not (isinstance(a, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)):
                return False
    return True
