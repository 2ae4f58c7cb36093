"""The video payload guard (`media_guard`) on vLLM's real VideoMediaIO: undecodable payloads get
a message naming what was sent; vLLM's own limit errors and MemoryError pass through unchanged
(the payload decoded, and their message is the real reason)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import media as media_files
from gemma4_batched_encoder import media, media_guard

video = pytest.importorskip("vllm.multimodal.media.video")


@pytest.fixture(autouse=True)
def installed():
    assert media_guard.install()
    yield
    media.set_fast_path(media.fast_path_requested())


def load(data: bytes, **io_kwargs):
    from vllm.multimodal.media.image import ImageMediaIO

    return video.VideoMediaIO(ImageMediaIO(), num_frames=32, **io_kwargs).load_bytes(data)


def unguarded(data: bytes, **io_kwargs):
    from vllm.multimodal.media.image import ImageMediaIO

    io = video.VideoMediaIO(ImageMediaIO(), num_frames=32, **io_kwargs)
    return inspect.unwrap(video.VideoMediaIO.load_bytes)(io, data)  # vLLM's own


@pytest.mark.parametrize("fast", [False, True], ids=["stock-decode", "fast-path"])
def test_vllms_pixel_limit_error_passes_through(monkeypatch, fast):
    media.install()
    media.set_fast_path(fast)
    monkeypatch.setenv("VLLM_MAX_IMAGE_PIXELS", "1000")
    data = media_files.mp4_bytes(2, 64, 48, seed=1)
    with pytest.raises(ValueError) as theirs:
        unguarded(data)
    with pytest.raises(ValueError) as ours:
        load(data)
    assert "VLLM_MAX_IMAGE_PIXELS" in str(theirs.value)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
    assert not isinstance(ours.value, media_guard.InvalidVideoError)


@pytest.mark.parametrize(
    ("io_kwargs", "message"),
    [
        ({"video_backend": "embedding_gemma2", "max_frames": 0}, "max_frames must be positive"),
        ({"backend": "opencv", "num_ffmpeg_threads": 2}, "is not supported by the 'opencv'"),
    ],
    ids=["max_frames_0", "option_of_another_codec"],
)
def test_vllms_request_errors_pass_through(io_kwargs, message):
    """vLLM's other ValueErrors about the request (--media-io-kwargs values here, no "exceed" in
    them) pass unchanged: the video is valid, and "could not decode" would blame it."""
    data = media_files.mp4_bytes(2, 64, 48, seed=3)
    with pytest.raises(ValueError, match=message) as theirs:
        unguarded(data, **io_kwargs)
    with pytest.raises(ValueError) as ours:
        load(data, **io_kwargs)
    assert type(ours.value) is type(theirs.value) and str(ours.value) == str(theirs.value)
    assert not isinstance(ours.value, media_guard.InvalidVideoError)


FAKE_VLLM = """
import numpy as np

def numpy_fails(self, data):
    frames = np.empty((2, 4, 4, 3))
    frames[0] = np.ones(5)

def vllm_raises(self, data):
    raise ValueError("frames_indices must be a list of integers")
"""


def test_a_valueerror_numpy_raises_in_vllms_code_is_still_wrapped(tmp_path):
    """Only a ``raise`` in vLLM's code passes: numpy failing inside a vLLM line (a frame that does
    not fit its buffer) is the payload's fault and gets the could-not-decode message."""
    path = tmp_path / "fake_vllm.py"
    path.write_text(FAKE_VLLM)
    scope = {"__name__": "vllm.multimodal.fake"}
    exec(compile(FAKE_VLLM, str(path), "exec"), scope)
    with pytest.raises(media_guard.InvalidVideoError, match=r"could not decode.*broadcast"):
        media_guard.guard_load_bytes(scope["numpy_fails"])(None, b"\x00" * 16)
    with pytest.raises(ValueError, match=r"^frames_indices must be a list of integers$"):
        media_guard.guard_load_bytes(scope["vllm_raises"])(None, b"\x00" * 16)


def test_undecodable_payloads_are_still_explained():
    # vLLM 0.32's OpenCV loader raises on a PNG; 0.33+'s decodes it to no frames
    png = r"(could not decode .*PNG image|PNG image gave no frames)"
    with pytest.raises(media_guard.InvalidVideoError, match=png):
        load(b"\x89PNG\r\n\x1a\n" + bytes(200))
    with pytest.raises(media_guard.InvalidVideoError, match="send an mp4"):
        load(b"this is not a video\n" * 50)
    frames = load(media_files.mp4_bytes(2, 64, 48, seed=2))[0]
    assert np.asarray(frames).shape == (2, 48, 64, 3)


def test_memory_error_passes_through():
    def load_bytes(self, data):
        # what numpy raises for a frame buffer it cannot allocate (no memory is taken)
        return np.empty((1 << 40, 1 << 20), dtype=np.uint8)

    with pytest.raises(MemoryError) as info:
        media_guard.guard_load_bytes(load_bytes)(None, b"\x00" * 16)
    assert not isinstance(info.value, media_guard.InvalidVideoError)
    assert "could not decode" not in str(info.value)


def test_a_valueerror_outside_vllm_naming_a_limit_is_still_wrapped():
    """Only vLLM's own limit errors pass: one raised by a decoder library is the payload's."""

    def load_bytes(self, data):
        raise ValueError("frame size exceeds what the decoder supports")

    with pytest.raises(media_guard.InvalidVideoError, match="could not decode"):
        media_guard.guard_load_bytes(load_bytes)(None, b"\x00" * 16)
