"""The frame-count check beside the decode (`media.count_check`): vLLM's real OpenCV loader gives
the same frames, metadata and indices with it as without, for short and long clips, sampled and
not, with frame recovery and an fps target; bad input fails with vLLM's own error; many videos
decoded at once in threads (vLLM's media pool) neither crash nor mix up; code this was not
written against is left alone."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import media as media_files
from gemma4_batched_encoder import media
from gemma4_batched_encoder.media import count_check

opencv = pytest.importorskip("vllm.multimodal.video_decoders.opencv")


@pytest.fixture
def installed():
    assert media.install()
    assert getattr(opencv.decode_opencv, "_gemma4_count_check", False)
    yield
    media.set_fast_path(media.fast_path_requested())


def load(data: bytes, **kwargs):
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    frames, meta = VIDEO_LOADER_REGISTRY.load("opencv").load_bytes(data, **kwargs)
    return np.asarray(frames), meta


def both(data: bytes, **kwargs):
    media.set_fast_path(False)
    stock = load(data, **kwargs)
    media.set_fast_path(True)
    return stock, load(data, **kwargs)


@pytest.mark.parametrize(
    ("frames", "width", "height", "fourcc", "kwargs"),
    [
        (6, 854, 480, "mp4v", {"num_frames": 32}),  # the SLO's clip: every frame
        (40, 320, 240, "mp4v", {"num_frames": 8}),  # sampled
        (40, 320, 240, "mp4v", {"num_frames": 32, "fps": 1}),  # an fps target
        (25, 160, 120, "mp4v", {"num_frames": 6, "frame_recovery": True}),
        (8, 640, 360, "VP90", {"num_frames": 32}),
        (3, 97, 55, "VP90", {"num_frames": -1}),
    ],
)
def test_same_frames_metadata_and_indices(installed, frames, width, height, fourcc, kwargs):
    data = media_files.mp4_bytes(frames, width, height, seed=frames, fourcc=fourcc)
    (stock, stock_meta), (fast, fast_meta) = both(data, **kwargs)
    assert stock.dtype == np.uint8 and stock.shape[0] >= 1
    assert np.array_equal(stock, fast)
    assert stock_meta == fast_meta  # includes the sampled frame indices and the source's count


def test_the_overlapped_decode_is_what_answers(installed):
    """Not vLLM's decode behind a swallowed error: the overlapped path itself returns the
    result, equal to vLLM's own `decode_opencv` field by field."""
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    loader_cls = VIDEO_LOADER_REGISTRY.load("opencv")
    target = opencv.VideoTargetMetadata(num_frames=32, fps=-1, max_duration=300)
    data = media_files.mp4_bytes(6, 854, 480, seed=11)
    ours = count_check._overlapped(opencv, loader_cls, data, target, {}, False)
    assert ours is not None
    theirs = opencv.decode_opencv.__wrapped__(loader_cls, data, target, {}, frame_recovery=False)
    frames, source, frame_idx, valid = ours
    assert np.array_equal(frames, theirs[0])
    assert (source, frame_idx, valid) == tuple(theirs[1:])


def test_bad_input_fails_with_vllms_error(installed, monkeypatch):
    not_a_video = b"\x00\x00\x00\x18ftypmp42 this is not a video"
    big = media_files.mp4_bytes(2, 640, 480, seed=1)
    for data, limit in ((not_a_video, None), (big, "1000")):
        if limit:  # an oversized frame: vLLM's pixel limit, checked before anything is decoded
            monkeypatch.setenv("VLLM_MAX_IMAGE_PIXELS", limit)
        errors = []
        for fast in (False, True):
            media.set_fast_path(fast)
            with pytest.raises(Exception) as info:
                load(data, num_frames=32)
            errors.append((type(info.value), str(info.value)))
        assert errors[0] == errors[1]


def test_concurrent_videos_in_threads(installed):
    """vLLM decodes a server's videos on a pool of 8 threads; each with its check thread."""
    clips = [media_files.mp4_bytes(6, 320, 240, seed=s) for s in range(4)]
    media.set_fast_path(False)
    expected = [load(c, num_frames=32)[0] for c in clips]
    media.set_fast_path(True)
    mismatches: list[int] = []

    def work(i: int) -> None:
        for _ in range(10):
            if not np.array_equal(load(clips[i], num_frames=32)[0], expected[i]):
                mismatches.append(i)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert mismatches == []


def test_the_check_is_vllms_on_its_own_capture(installed):
    data = media_files.mp4_bytes(7, 160, 120, seed=3)
    mixin = opencv.OpenCVVideoBackendMixin
    checked = count_check.checked_source(mixin, data)
    header = count_check.header_source(opencv, mixin.open_video_capture(data))
    assert checked == header and checked.total_frames_num == 7


def test_unrecognised_decode_left_alone(monkeypatch):
    def decode_opencv(loader_cls, data, target, sampling_kwargs, *, frame_recovery=False):
        return "upstream changed"

    monkeypatch.setattr(opencv, "decode_opencv", decode_opencv)
    assert count_check.install(lambda: True) is False
    assert opencv.decode_opencv is decode_opencv
