"""Video cache keys from the container bytes (media/source_key.py, for vLLM before 0.27).

vLLM here is 0.32, which keys videos by their bytes itself, so `install` must leave it alone; the
0.20-0.26 code the patch targets is reproduced below from vLLM 0.26.0's VideoMediaIO.load_bytes
(three lines) around vLLM's real OpenCV loader, and hashed with vLLM's real MultiModalHasher.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest
from vllm.multimodal.hasher import MultiModalHasher
from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

import media as media_files
from gemma4_batched_encoder import media
from gemma4_batched_encoder.media import source_key


class VideoMediaIO026:
    """vLLM 0.26.0's VideoMediaIO as far as load_bytes goes (vllm/multimodal/video.py)."""

    def __init__(self, num_frames: int = 32, **kwargs: Any) -> None:
        self.num_frames = num_frames
        self.kwargs = kwargs
        self.video_loader = VIDEO_LOADER_REGISTRY.load("opencv")

    def load_bytes(self, data: bytes) -> tuple[np.ndarray, dict[str, Any]]:
        return self.video_loader.load_bytes(data, num_frames=self.num_frames, **self.kwargs)


KeyedHasher = source_key.keyed_hasher(MultiModalHasher)


@pytest.fixture
def keyed_load():
    enabled = {"on": True}
    load = source_key.keyed_load_bytes(VideoMediaIO026.load_bytes, lambda: enabled["on"])
    return load, enabled


def key(hasher: type[MultiModalHasher], video: object) -> str:
    return hasher.hash_kwargs("blake3", model_id="gemma4", video=video)  # 0.32's signature


def test_same_clip_same_key_and_every_input_of_the_frames_changes_it(keyed_load) -> None:
    load, _ = keyed_load
    clip = media_files.mp4_bytes(6, 320, 240, seed=1)
    first, second = load(VideoMediaIO026(), clip), load(VideoMediaIO026(), clip)
    assert first[0] is not second[0] and np.array_equal(first[0], second[0])
    assert key(KeyedHasher, first) == key(KeyedHasher, second)
    others = [
        load(VideoMediaIO026(), media_files.mp4_bytes(6, 320, 240, seed=2)),  # another clip
        load(VideoMediaIO026(num_frames=4), clip),  # another frame count
        load(VideoMediaIO026(fps=2), clip),  # another loader option
        (first[0], {**first[1], "fps": 99.0}),  # the metadata is still hashed as before
    ]
    keys = {key(KeyedHasher, first)} | {key(KeyedHasher, video) for video in others}
    assert len(keys) == 1 + len(others)


def test_a_key_is_not_the_stock_key_and_other_arrays_hash_as_stock(keyed_load) -> None:
    load, _ = keyed_load
    frames, meta = load(VideoMediaIO026(), media_files.mp4_bytes(6, 320, 240, seed=3))
    stock = key(MultiModalHasher, (frames, meta))
    assert key(KeyedHasher, (frames, meta)) != stock
    # Equal values in another array (not what the loader returned): hashed from the frames.
    assert key(KeyedHasher, (frames.copy(), meta)) == stock
    assert key(KeyedHasher, (frames[:3], meta)) == key(MultiModalHasher, (frames[:3], meta))


def test_disabled_loads_keep_the_stock_key(keyed_load) -> None:
    load, enabled = keyed_load
    enabled["on"] = False
    video = load(VideoMediaIO026(), media_files.mp4_bytes(4, 160, 120, seed=4))
    assert key(KeyedHasher, video) == key(MultiModalHasher, video)


def test_a_key_lives_only_as_long_as_its_array() -> None:
    frames = np.zeros((2, 4, 4, 3), dtype=np.uint8)
    source_key.remember(frames, b"digest")
    assert source_key.digest_of(frames) == b"digest"
    assert source_key.digest_of(frames.copy()) is None
    ident = id(frames)
    del frames
    gc.collect()
    assert ident not in source_key._keys


def test_the_digest_uses_vllms_configured_algorithm(monkeypatch: pytest.MonkeyPatch) -> None:
    io = VideoMediaIO026()
    blake = source_key.source_digest(io, b"clip")
    monkeypatch.setenv("VLLM_MM_HASHER_ALGORITHM", "sha256")
    sha = source_key.source_digest(io, b"clip")
    assert len(blake) == 32 and len(sha) == 32 and blake != sha


def test_install_leaves_a_vllm_that_keys_videos_by_bytes_alone() -> None:
    # vLLM 0.27+ wraps decoded videos with their bytes and hashes those itself.
    from vllm.multimodal.media.base import MediaWithBytes
    from vllm.multimodal.media.video import VideoMediaIO

    assert media.install()
    assert not source_key.install(media.fast_path_enabled)
    serialize = MultiModalHasher.__dict__["serialize_item"].__func__
    assert not getattr(serialize, "_gemma4_source_key", False)
    assert "_gemma4_source_key" not in VideoMediaIO.load_bytes.__dict__
    from vllm.multimodal.media import ImageMediaIO

    loaded = VideoMediaIO(ImageMediaIO()).load_bytes(media_files.mp4_bytes(2, 64, 48, seed=5))
    assert isinstance(loaded, MediaWithBytes)


def test_the_patch_targets_loaders_that_return_plain_tuples() -> None:
    from vllm.multimodal.media.video import VideoMediaIO

    assert source_key.keys_videos_by_bytes(VideoMediaIO)  # 0.32 here
    assert not source_key.keys_videos_by_bytes(VideoMediaIO026)  # 0.20-0.26's load_bytes
