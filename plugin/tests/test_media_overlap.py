"""The decode overlap (GEMMA4_MEDIA_OVERLAP_THREADS): frames prepared while the video decodes give
vLLM's real processor exactly the stock tensors, are really taken (counted), and anything that
does not match them exactly is computed as before."""

from __future__ import annotations

import io

import cv2
import numpy as np
import pytest
import torch
from test_media_install import apply, assert_same_mm_kwargs, decoded_video, vllm_processor

import media as media_files
from gemma4_batched_encoder import media
from gemma4_batched_encoder.media import overlap

__all__ = ["vllm_processor"]  # the fixture, shared with test_media_install


def counts() -> dict[str, float]:
    from prometheus_client import REGISTRY

    out = {"prepared": 0.0, "missed": 0.0}
    for family in REGISTRY.collect():
        if family.name == overlap.METRIC_NAME:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[sample.labels["result"]] = sample.value
    return out


def delta(before: dict[str, float]) -> dict[str, float]:
    return {k: v - before[k] for k, v in counts().items()}


@pytest.fixture
def overlapping(vllm_processor):
    """The overlap on (2 threads) with the fast path, parameters learnt from one video."""
    frames = overlap.install(2)
    assert frames is not None
    media.set_fast_path(True)
    apply(vllm_processor, {"video": [decoded_video(2, 320, 240, seed=99)]})
    assert frames.params is not None and frames.params.max_soft_tokens == 70
    yield frames
    overlap.uninstall(forget=True)
    media.set_fast_path(media.fast_path_requested())


def stock_of(processor, mm_data: dict) -> dict:
    media.set_fast_path(False)
    try:
        return apply(processor, mm_data)
    finally:
        media.set_fast_path(True)


@pytest.mark.parametrize(
    ("frames", "width", "height"),
    [(6, 854, 480), (3, 1280, 720), (8, 320, 568), (2, 160, 90), (5, 33, 17)],
)
def test_prepared_frames_give_stock_tensors(
    vllm_processor, overlapping, frames: int, width: int, height: int
) -> None:
    before = counts()
    video = decoded_video(frames, width, height, seed=frames + width)  # decoded: prepared
    assert overlapping.waiting() == frames
    fast = apply(vllm_processor, {"video": [video]})
    assert delta(before) == {"prepared": frames, "missed": 0}  # the overlap really answered
    assert overlapping.waiting() == 0
    assert_same_mm_kwargs(stock_of(vllm_processor, {"video": [video]}), fast)


def test_videos_and_images_in_one_request(vllm_processor, overlapping) -> None:
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((240, 320), (480, 854))]
    videos = [decoded_video(4, 854, 480, seed=1), decoded_video(2, 640, 360, seed=2)]
    before = counts()
    fast = apply(vllm_processor, {"image": images, "video": videos})
    assert delta(before)["prepared"] == 6  # video frames only: images have their own budget
    assert_same_mm_kwargs(stock_of(vllm_processor, {"image": images, "video": videos}), fast)


def test_a_frame_changed_after_decode_is_computed(vllm_processor, overlapping) -> None:
    video = decoded_video(3, 854, 480, seed=7)
    frames, _ = video
    # pixel (1, 1) is off the lookup key's sample grid: the key matches, the full check must not
    frames[1, 1, 1, 0] ^= 0xFF
    before = counts()
    fast = apply(vllm_processor, {"video": [video]})
    assert delta(before) == {"prepared": 2, "missed": 1}
    assert overlapping.waiting() == 1  # the frame as decoded: no input matches it any more
    assert_same_mm_kwargs(stock_of(vllm_processor, {"video": [video]}), fast)


def test_a_failing_worker_is_computed(vllm_processor, overlapping, monkeypatch) -> None:
    def broken(bgr, params):
        raise RuntimeError("worker failed")

    monkeypatch.setattr(overlap, "prepare", broken)
    video = decoded_video(4, 640, 480, seed=8)
    before = counts()
    fast = apply(vllm_processor, {"video": [video]})
    assert delta(before) == {"prepared": 0, "missed": 4}
    assert overlapping.waiting() == 0
    assert_same_mm_kwargs(stock_of(vllm_processor, {"video": [video]}), fast)


def test_nothing_is_prepared_before_the_parameters_are_known(vllm_processor) -> None:
    overlap.uninstall(forget=True)
    frames = overlap.install(1)
    assert frames is not None and frames.params is None
    try:
        media.set_fast_path(True)
        decoded_video(3, 320, 240, seed=4)
        assert frames.waiting() == 0
    finally:
        overlap.uninstall(forget=True)
        media.set_fast_path(media.fast_path_requested())


def test_off_without_the_fast_path(vllm_processor, overlapping) -> None:
    media.set_fast_path(False)
    decoded_video(3, 320, 240, seed=5)
    assert overlapping.waiting() == 0


def test_waiting_frames_are_bounded() -> None:
    frames = overlap.FrameOverlap(1, max_frames=4)
    frames.learn(overlap.ResizeParams(3, 16, 3, 70))  # bicubic, Gemma 4's patch and pooling
    rng = np.random.default_rng(0)
    for _ in range(10):
        frames.submit(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
    assert frames.waiting() == 4


def test_other_budgets_are_not_learnt() -> None:
    frames = overlap.FrameOverlap(1)
    frames.learn(overlap.ResizeParams(None, 16, 3, 280))
    assert frames.params is None


def test_the_pool_converts_as_the_loader_does() -> None:
    rng = np.random.default_rng(4)
    params = overlap.ResizeParams(3, 16, 3, 70)
    for h, w in ((480, 854), (17, 33), (720, 1280)):
        bgr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        loader = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        assert np.array_equal(overlap.prepare(bgr, params).rgb, loader)
        swapped = overlap.prepare(bgr, params, to_rgb=overlap.swap_to_rgb)
        assert np.array_equal(swapped.rgb, loader)
        assert np.array_equal(swapped.patches, overlap.prepare(bgr, params).patches)


def test_bgr_key_is_the_rgb_key_of_the_converted_frame() -> None:
    rng = np.random.default_rng(1)
    for h, w in ((480, 854), (17, 33), (1, 1), (720, 1280)):
        bgr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        assert overlap.bgr_key(bgr) == overlap.rgb_key(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))


def test_retrieve_gives_a_new_array_each_time() -> None:
    """The pool reads a retrieved frame while the loader decodes the next: OpenCV must not
    reuse the array it returned."""
    cap = cv2.VideoCapture()
    data = media_files.mp4_bytes(3, 160, 90, seed=3)

    cap.open(io.BytesIO(data), cv2.CAP_FFMPEG, [])
    assert cap.grab()
    ok, first = cap.retrieve()
    kept = first.copy()
    assert ok and cap.grab()
    ok, second = cap.retrieve()
    assert ok and not np.shares_memory(first, second)
    assert np.array_equal(first, kept)


def test_hwc_view_of_processor_inputs() -> None:
    rgb = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    chw = torch.from_numpy(rgb).permute(2, 0, 1)
    assert np.array_equal(overlap.hwc_view(chw), rgb)
    assert overlap.hwc_view(chw.float()) is None
    assert overlap.hwc_view(torch.zeros(4, 2, 2, dtype=torch.uint8)) is None


def test_frames_sharing_a_lookup_key_each_find_their_own() -> None:
    """A still scene: frames equal on the sample grid, different elsewhere."""
    frames = overlap.FrameOverlap(1)
    params = overlap.ResizeParams(3, 16, 3, 70)  # bicubic, Gemma 4's patch and pooling sizes
    frames.learn(params)
    rng = np.random.default_rng(2)
    base = rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)
    bgrs = []
    for k in range(3):
        bgr = base.copy()
        bgr[1, 1, 0] = k  # off the 16 x 16 sample grid
        bgrs.append(bgr)
        frames.submit(bgr)
    assert len({overlap.bgr_key(b) for b in bgrs}) == 1
    target = overlap.prepare(bgrs[0], params).target
    for bgr in reversed(bgrs):  # taken in another order than prepared
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        got = frames.take(torch.from_numpy(rgb).permute(2, 0, 1), params, target)
        assert got is not None
        assert np.array_equal(got, overlap.prepare(bgr, params).patches)
    assert frames.waiting() == 0
