"""The media fast path's decode-thread settings: vLLM's real OpenCV loader gives the same frames
with one FFmpeg thread as with its default, and with OpenCV's pool at one thread as at one per
core; the capture and the pool really get the settings; code this was not written against is
left alone."""

from __future__ import annotations

import os

import cv2
import numpy as np
import pytest

import media as media_files
from gemma4_batched_encoder import media
from gemma4_batched_encoder.media import decode


@pytest.fixture
def installed():
    assert media.install()
    mixin = decode.find_mixin()
    assert mixin is not None
    assert getattr(mixin.open_video_capture.__func__, "_gemma4_decode_threads", False)
    yield mixin
    media.set_fast_path(media.fast_path_requested())


def load(data: bytes):
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    frames, meta = VIDEO_LOADER_REGISTRY.load("opencv").load_bytes(data, num_frames=32)
    return np.asarray(frames), meta


@pytest.mark.parametrize(
    ("frames", "width", "height", "fourcc"),
    [(6, 854, 480, "mp4v"), (40, 320, 240, "mp4v"), (8, 640, 360, "VP90"), (3, 97, 55, "VP90")],
)
def test_same_frames_with_one_decode_thread(installed, frames, width, height, fourcc) -> None:
    data = media_files.mp4_bytes(frames, width, height, seed=frames, fourcc=fourcc)
    media.set_fast_path(False)
    stock, stock_meta = load(data)
    media.set_fast_path(True)
    fast, fast_meta = load(data)
    assert stock.shape[0] == min(frames, 32) and stock.dtype == np.uint8
    assert np.array_equal(stock, fast)
    assert stock_meta == fast_meta


def test_the_capture_gets_the_thread_count(installed) -> None:
    data = media_files.mp4_bytes(4, 320, 240, seed=2)
    media.set_fast_path(True)
    assert installed.open_video_capture(data).get(cv2.CAP_PROP_N_THREADS) == 1
    media.set_fast_path(False)
    default = installed.open_video_capture(data).get(cv2.CAP_PROP_N_THREADS)
    if (os.cpu_count() or 1) > 1:
        assert default > 1  # OpenCV's own default: one per core


def test_opencv_pool_runs_sequentially_with_the_same_frames(installed) -> None:
    # install() ran with the fast path requested (the default) and GEMMA4_MEDIA_CV2_THREADS unset
    assert cv2.getNumThreads() == 1
    data = media_files.mp4_bytes(6, 854, 480, seed=5)
    media.set_fast_path(True)
    try:
        cv2.setNumThreads(-1)  # OpenCV's default: one worker per core
        pooled = cv2.getNumThreads()
        wide, wide_meta = load(data)
    finally:
        assert decode.set_cv2_threads(1)
    one, one_meta = load(data)
    if (os.cpu_count() or 1) > 1:
        assert pooled > 1
    assert one.shape == (6, 480, 854, 3)
    assert np.array_equal(wide, one)
    assert wide_meta == one_meta


def test_undecodable_bytes_fail_as_before(installed) -> None:
    errors = []
    for fast in (False, True):
        media.set_fast_path(fast)
        with pytest.raises(Exception) as info:
            load(b"\x00\x00\x00\x18ftypmp42 this is not a video")
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


def test_env_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(decode.ENV_DECODE_THREADS, raising=False)
    assert decode.decode_threads() == 1
    for value, want in (("0", 0), ("1", 1), ("3", 3), (" 2 ", 2), ("x", 1), ("-1", 1)):
        monkeypatch.setenv(decode.ENV_DECODE_THREADS, value)
        assert decode.decode_threads() == want
    monkeypatch.delenv(decode.ENV_CV2_THREADS, raising=False)
    assert decode.cv2_threads() == 1
    for value, want in (("0", 0), ("4", 4), ("many", 1)):
        monkeypatch.setenv(decode.ENV_CV2_THREADS, value)
        assert decode.cv2_threads() == want
    before = cv2.getNumThreads()
    assert decode.set_cv2_threads(0) is False  # 0: OpenCV's own setting, untouched
    assert cv2.getNumThreads() == before


def test_unrecognised_open_and_zero_threads_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    class Changed:
        @staticmethod
        def get_cv2_video_api():
            return cv2.CAP_FFMPEG

        @classmethod
        def open_video_capture(cls, data: bytes):
            return ("upstream now does something else", data)

    before = Changed.__dict__["open_video_capture"]
    monkeypatch.setattr(decode, "find_mixin", lambda: Changed)
    assert decode.install(lambda: True, 1) is False
    assert decode.install(lambda: True, 0) is False
    assert Changed.__dict__["open_video_capture"] is before
    assert Changed.open_video_capture(b"x") == ("upstream now does something else", b"x")
