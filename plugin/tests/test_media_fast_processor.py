"""The media fast path gives tensors torch.equal to stock transformers' Gemma 4 image processor."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor

from gemma4_batched_encoder.media import fast_processor

STOCK = Gemma4ImageProcessor._preprocess
# install() (other tests in this session) replaces the class method with a timed wrapper; the
# stock function stays reachable through __wrapped__.
while hasattr(STOCK, "__wrapped__"):
    STOCK = STOCK.__wrapped__


def processors() -> tuple[Gemma4ImageProcessor, Gemma4ImageProcessor]:
    """(stock, fast): same defaults as E4B (patch 16, pooling 3, bicubic, 1/255)."""
    stock = Gemma4ImageProcessor()
    stock._preprocess = types.MethodType(STOCK, stock)  # type: ignore[method-assign]
    fast = Gemma4ImageProcessor()
    fast_fn = fast_processor.make_fast_preprocess(STOCK, lambda: True)
    fast._preprocess = types.MethodType(fast_fn, fast)  # type: ignore[method-assign]
    return stock, fast


def assert_same(images: list, soft_tokens: int, **options: object) -> None:
    stock, fast = processors()
    want = stock(images=images, max_soft_tokens=soft_tokens, return_tensors="pt", **options)
    got = fast(images=images, max_soft_tokens=soft_tokens, return_tensors="pt", **options)
    assert set(want.keys()) == set(got.keys())
    for key in want:
        assert want[key].dtype == got[key].dtype, key
        assert want[key].shape == got[key].shape, key
        assert torch.equal(want[key], got[key]), key


def textured(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Smooth gradients plus noise: resize rounding sees both flat and busy regions."""
    yy, xx = np.mgrid[0:height, 0:width]
    smooth = np.stack([xx * 255 // max(1, width - 1), yy * 255 // max(1, height - 1), xx ^ yy], -1)
    noise = rng.integers(-40, 40, (height, width, 3))
    return np.clip(smooth + noise, 0, 255).astype(np.uint8)


def test_rescale_matches_torch_for_every_byte() -> None:
    values = torch.arange(256, dtype=torch.uint8)
    factor = Gemma4ImageProcessor().rescale_factor
    want = values * factor
    got = torch.from_numpy(fast_processor.rescale_exact(values.numpy(), factor))
    assert want.dtype == got.dtype == torch.float32
    assert torch.equal(want, got)


@pytest.mark.parametrize("soft_tokens", [70, 140, 280])
@pytest.mark.parametrize("seed", range(8))
def test_random_videos(seed: int, soft_tokens: int) -> None:
    """Frames of one size, as vLLM hands a video's frames to the image processor."""
    rng = np.random.default_rng(seed * 1000 + soft_tokens)
    frames = int(rng.integers(1, 9))
    height, width = int(rng.integers(24, 800)), int(rng.integers(24, 800))
    video = textured(rng, height, width)
    clip = [np.roll(video, 7 * i, axis=1) for i in range(frames)]
    assert_same(clip, soft_tokens)


@pytest.mark.parametrize("soft_tokens", [70, 140, 280, 560, 1120])
def test_mixed_sizes_aspect_ratios_and_modes(soft_tokens: int) -> None:
    """Several sizes in one call (grouping must keep the order) and PIL modes HF converts."""
    rng = np.random.default_rng(soft_tokens)
    sizes = [(480, 640), (720, 1280), (33, 900), (900, 40), (336, 432), (17, 17), (1000, 333)]
    images: list = [textured(rng, h, w) for h, w in sizes]
    images.append(Image.fromarray(textured(rng, 200, 150)))
    images.append(Image.fromarray(textured(rng, 120, 160)[..., 0], mode="L"))
    rgba = np.concatenate([textured(rng, 90, 100), rng.integers(0, 256, (90, 100, 1), np.uint8)], 2)
    images.append(Image.fromarray(rgba, mode="RGBA"))
    images.append(textured(rng, 480, 640))  # same size as the first, not adjacent to it
    assert_same(images, soft_tokens)


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_every_aten_resize_kernel_gives_stocks_bytes(capability: str) -> None:
    """The fast path resizes a call's frames as one batch, stock one frame at a time: with ATen's
    generic and AVX2 uint8 kernels too (every other test runs this machine's, AVX-512), the
    bytes are stock's. (The GPU host's CPU may pick another one.)"""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    case = f"{__file__}::test_mixed_sizes_aspect_ratios_and_modes"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", case],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "5 passed" in proc.stdout


def test_no_resize_needed_keeps_every_value() -> None:
    """336x432 is a fixed point at 70 soft tokens: pure rescale/patchify/pad of all bytes."""
    rng = np.random.default_rng(3)
    image = rng.permutation(np.resize(np.arange(256, dtype=np.uint8), 336 * 432 * 3))
    assert_same([image.reshape(336, 432, 3)] * 2, 70)


def outcome(processor: Gemma4ImageProcessor, images: list) -> object:
    try:
        out = processor(images=images, max_soft_tokens=70, return_tensors="pt")
    except Exception as exc:
        return (type(exc), str(exc))
    return {key: value.tolist() for key, value in out.items()}


@pytest.mark.parametrize("shape", [(1, 1, 3), (2, 3000, 3), (4000, 3, 3), (5, 5, 3)])
def test_degenerate_inputs_behave_like_stock(shape: tuple[int, int, int]) -> None:
    """Tiny and extreme inputs give stock's result or stock's error, never a different one."""
    image = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    stock, fast = processors()
    assert outcome(stock, [image]) == outcome(fast, [image])


def test_unsupported_options_fall_back_to_stock() -> None:
    image = textured(np.random.default_rng(0), 96, 128)  # fits the patch grid unresized
    for options in (
        {"do_normalize": True, "image_mean": 0.5, "image_std": 0.5},
        {"do_resize": False},
        {},
    ):
        stock, fast = processors()
        want = stock(images=[image], max_soft_tokens=70, return_tensors="pt", **options)
        got = fast(images=[image], max_soft_tokens=70, return_tensors="pt", **options)
        assert torch.equal(want["pixel_values"], got["pixel_values"])
    assert not fast_processor.supports([torch.zeros(3, 4, 4)], True, False)  # float input
    assert not fast_processor.supports([torch.zeros(3, 4, 4, dtype=torch.uint8)], False, True)
    assert not fast_processor.supports([torch.zeros(3, 4, 4, dtype=torch.uint8)], True, True)


@pytest.mark.parametrize("soft_tokens", [70, 280, 1120])
def test_no_rescale_gives_stocks_uint8_patches(
    soft_tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.34+ asks the processor for no rescale by default (`mm_device_do_normalize`: the
    model rescales on the device): stock then emits uint8 patches, and so does the fast path."""
    runs: list[int] = []
    real = fast_processor.preprocess_uint8

    def counted(*args, **kwargs):
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(fast_processor, "preprocess_uint8", counted)
    rng = np.random.default_rng(soft_tokens + 5)
    video = textured(rng, 480, 854)
    images = [np.roll(video, 9 * i, axis=0) for i in range(6)] + [textured(rng, 77, 500)]
    assert_same(images, soft_tokens, do_rescale=False)
    assert runs, "the fast path fell back to stock"
    _, fast = processors()
    out = fast(images=images, max_soft_tokens=soft_tokens, return_tensors="pt", do_rescale=False)
    assert out["pixel_values"].dtype == torch.uint8
    # with the uint8 hand-off switched on as well, the values stay the raw bytes (no rescale)
    fast_fn = fast_processor.make_fast_preprocess(STOCK, lambda: True, lambda: True)
    both = Gemma4ImageProcessor()
    both._preprocess = types.MethodType(fast_fn, both)  # type: ignore[method-assign]
    again = both(images=images, max_soft_tokens=soft_tokens, return_tensors="pt", do_rescale=False)
    assert torch.equal(again["pixel_values"], out["pixel_values"])


def test_self_check_passes_here() -> None:
    fast = fast_processor.make_fast_preprocess(STOCK, lambda: True)
    assert fast_processor.self_check(STOCK, fast)


def test_self_check_catches_a_difference() -> None:
    def off_by_one(self, images, *args, **kwargs):
        out = STOCK(self, images, *args, **kwargs)
        out["pixel_values"] = out["pixel_values"] + 1e-7
        return out

    assert not fast_processor.self_check(STOCK, off_by_one)


def test_self_check_runs_the_fast_path_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """install() checks before its switch is set, so the default must force the fast path on
    (it once compared stock with itself)."""
    real = fast_processor.preprocess_uint8

    def off(*args, **kwargs):
        pixel_values, positions, soft_tokens = real(*args, **kwargs)
        return pixel_values + 1e-7, positions, soft_tokens

    assert fast_processor.self_check(STOCK)
    monkeypatch.setattr(fast_processor, "preprocess_uint8", off)
    assert not fast_processor.self_check(STOCK)


@pytest.fixture
def frame_threads(monkeypatch: pytest.MonkeyPatch):
    """Set GEMMA4_MEDIA_FRAME_THREADS's effect for one test; record which threads did the work."""
    import threading

    workers: list[str] = []
    real = fast_processor._process_rows

    def recording(*args, **kwargs):
        workers.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(fast_processor, "_process_rows", recording)
    before = fast_processor.frame_threads()

    def use(threads: int) -> list[str]:
        fast_processor.set_frame_threads(threads)
        workers.clear()
        return workers

    yield use
    fast_processor.set_frame_threads(before)


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_frame_threads_split_the_frames_and_keep_the_tensors(frame_threads, threads: int) -> None:
    rng = np.random.default_rng(threads)
    video = textured(rng, 480, 854)
    clip = [np.roll(video, 5 * i, axis=0) for i in range(7)]  # 7 frames: uneven chunks
    images = [*clip, textured(rng, 720, 1280), textured(rng, 720, 1280), textured(rng, 50, 60)]
    workers = frame_threads(threads)
    assert_same(images, 70)
    pool = [name for name in workers if name.startswith("gemma4-frames")]
    assert pool, workers  # the frames really went to other threads
    # One chunk per thread for the 7 frames, and the calling thread always takes one.
    assert len(workers) == min(threads, 7) + min(threads, 2) + 1


def test_frame_threads_keep_the_uint8_patches(frame_threads) -> None:
    rng = np.random.default_rng(5)
    frames = [torch.from_numpy(textured(rng, 480, 640)).permute(2, 0, 1) for _ in range(6)]
    kwargs = dict(
        do_resize=True,
        resample=Gemma4ImageProcessor().resample,
        rescale_factor=1 / 255,
        patch_size=16,
        max_soft_tokens=70,
        pooling_kernel_size=3,
        rescale=False,
    )
    one = fast_processor.preprocess_uint8(frames, threads=1, **kwargs)
    three = fast_processor.preprocess_uint8(frames, threads=3, **kwargs)
    assert one[0].dtype == three[0].dtype == torch.uint8
    assert all(torch.equal(a, b) for a, b in zip(one[:2], three[:2], strict=True))
    assert one[2] == three[2]


@pytest.mark.parametrize(("raw", "want"), [(None, 1), ("3", 3), ("0", 1), ("two", 1)])
def test_frame_threads_setting(monkeypatch: pytest.MonkeyPatch, raw: str | None, want: int) -> None:
    from gemma4_batched_encoder import media

    if raw is None:
        monkeypatch.delenv(media.ENV_FRAME_THREADS, raising=False)
    else:
        monkeypatch.setenv(media.ENV_FRAME_THREADS, raw)
    assert media.media_frame_threads() == want
