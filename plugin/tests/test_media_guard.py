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


def load(data: bytes):
    from vllm.multimodal.media.image import ImageMediaIO

    return video.VideoMediaIO(ImageMediaIO(), num_frames=32).load_bytes(data)


def unguarded(data: bytes):
    from vllm.multimodal.media.image import ImageMediaIO

    io = video.VideoMediaIO(ImageMediaIO(), num_frames=32)
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


def test_undecodable_payloads_are_still_explained():
    with pytest.raises(media_guard.InvalidVideoError, match=r"could not decode .*PNG image"):
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
