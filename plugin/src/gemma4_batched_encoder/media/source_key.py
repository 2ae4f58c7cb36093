"""A decoded video's cache key from its container bytes, not its frames (vLLM before 0.27).

vLLM keys every multimodal item by a hash (blake3 by default) of the item as the processor sees
it: for a video on 0.20-0.26 that is the decoded frames, 7.4 MB for 6 frames of 854x480, 1.4 ms
of one core on the H200 host and ~2 ms on a 2-core CPU per video, more for longer or larger clips
(bench/MEDIA.md). vLLM 0.27+ hashes the container
bytes instead when they are smaller (`MediaWithBytes` in vllm/multimodal/hasher.py); this is the
same idea for the older versions, which return a plain `(frames, metadata)` tuple.

With the media fast path on, `VideoMediaIO.load_bytes` remembers, for the frames array it
returns, a digest of what determines those frames: the container bytes, the loader class, the
frame count asked for and the loader's other options (`--media-io-kwargs`). The hasher then feeds
that digest in place of the frames; the metadata (frame indices, fps, ...) and everything else in
the key are hashed as before. Decoding is deterministic (FFmpeg's decoders are exact whatever the
thread count, see `decode`), so equal digests mean equal frames; a different clip or option gives
a different key. The digest uses vLLM's configured algorithm (`VLLM_MM_HASHER_ALGORITHM`).

Keys change, values do not: nothing the model receives differs. A key only lives as long as its
array (a weak reference), so an array's id reused later cannot inherit one.

Patch ledger: `VideoMediaIO.load_bytes` and `MultiModalHasher.serialize_item`
(vllm/multimodal/hasher.py), only where `load_bytes` does not wrap its result in `MediaWithBytes`
(0.20-0.26: vllm/multimodal/media/video.py or video.py). Drop with vLLM 0.26 support.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

_TAG = b"gemma4_batched_encoder.video-source.v1"
_PATCHED = "_gemma4_source_key"

_lock = threading.Lock()
_keys: dict[int, tuple[weakref.ref[np.ndarray], bytes]] = {}


def _new_hasher() -> Any:
    """vLLM's digest before 0.27: `VLLM_MM_HASHER_ALGORITHM`, blake3 (default), sha256, sha512."""
    algorithm = os.environ.get("VLLM_MM_HASHER_ALGORITHM", "blake3").strip().lower()
    if algorithm == "blake3":
        from blake3 import blake3

        return blake3()
    return hashlib.new(algorithm)


def _loader_name(loader: Any) -> str:
    cls = loader if isinstance(loader, type) else type(loader)
    return f"{cls.__module__}.{cls.__qualname__}"


def source_digest(io: Any, data: bytes) -> bytes:
    """Digest of what decides `io.load_bytes(data)`'s frames: options, loader, bytes."""
    options = repr(
        (
            _loader_name(getattr(io, "video_loader", None)),
            getattr(io, "num_frames", None),
            sorted((str(k), repr(v)) for k, v in (getattr(io, "kwargs", None) or {}).items()),
        )
    ).encode()
    hasher = _new_hasher()
    for chunk in (_TAG, options, len(data).to_bytes(8, "little"), data):
        hasher.update(len(chunk).to_bytes(8, "little"))
        hasher.update(chunk)
    return hasher.digest()


def remember(frames: np.ndarray, digest: bytes) -> None:
    key = id(frames)

    def forget(ref: weakref.ref[np.ndarray]) -> None:
        with _lock:
            if _keys.get(key, (None,))[0] is ref:
                del _keys[key]

    with _lock:
        _keys[key] = (weakref.ref(frames, forget), digest)


def digest_of(obj: object) -> bytes | None:
    """The remembered digest of this very array, else None."""
    entry = _keys.get(id(obj))
    if entry is None or entry[0]() is not obj:
        return None
    return entry[1]


def keyed_load_bytes(original: Callable[..., Any], enabled: Callable[[], bool]) -> Any:
    def load_bytes(self: Any, data: bytes, *args: Any, **kwargs: Any) -> Any:
        result = original(self, data, *args, **kwargs)
        # Only vLLM's plain (frames, metadata) tuple; 0.27+ wraps it with the bytes itself.
        if (
            enabled()
            and not args
            and not kwargs
            and isinstance(data, bytes | bytearray)
            and isinstance(result, tuple)
            and len(result) == 2
            and type(result[0]) is np.ndarray
        ):
            remember(result[0], source_digest(self, bytes(data)))
        return result

    return load_bytes


def keyed_serialize_item(original: Callable[[Any, object], Any]) -> Any:
    def serialize_item(cls: Any, obj: object) -> Any:
        digest = digest_of(obj) if type(obj) is np.ndarray else None
        if digest is not None:
            # Through the original's bytes branch, so each version frames it its own way.
            return original(cls, _TAG + digest)
        return original(cls, obj)

    return serialize_item


def keyed_hasher(hasher: type) -> type:
    """A subclass of vLLM's MultiModalHasher that keys remembered videos by their digest, leaving
    the class itself alone (benchmarks and tests; `install` patches the class in place)."""
    serialize = keyed_serialize_item(hasher.__dict__["serialize_item"].__func__)
    return type(f"Keyed{hasher.__name__}", (hasher,), {"serialize_item": classmethod(serialize)})


def keys_videos_by_bytes(video_io: type) -> bool:
    """vLLM 0.27+ returns the decoded video wrapped with its bytes (`MediaWithBytes`)."""
    try:
        return "MediaWithBytes" in inspect.getsource(video_io.load_bytes)
    except (OSError, TypeError):
        return True  # cannot tell: leave vLLM's keys alone


def install(enabled: Callable[[], bool]) -> bool:
    """Patch vLLM where its video loader returns plain tuples; False where nothing applies."""
    from ..vllm_modules import VIDEO_IO_MODULES, first_attr

    try:
        from vllm.multimodal.hasher import MultiModalHasher
    except ImportError:
        return False
    found = first_attr(VIDEO_IO_MODULES, "VideoMediaIO")
    if found is None:
        return False
    video_io = found[1]
    if keys_videos_by_bytes(video_io):
        return False  # vLLM 0.27+ does this itself
    hasher_fn = MultiModalHasher.__dict__.get("serialize_item")
    if not isinstance(hasher_fn, classmethod):
        return False
    if getattr(hasher_fn.__func__, _PATCHED, False):
        return True
    load = functools.wraps(video_io.load_bytes)(keyed_load_bytes(video_io.load_bytes, enabled))
    serialize = functools.wraps(hasher_fn.__func__)(keyed_serialize_item(hasher_fn.__func__))
    setattr(load, _PATCHED, True)
    setattr(serialize, _PATCHED, True)
    video_io.load_bytes = load
    MultiModalHasher.serialize_item = classmethod(serialize)
    return True
