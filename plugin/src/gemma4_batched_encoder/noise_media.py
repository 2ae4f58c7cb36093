"""Noise images and mp4 videos, as bytes and data URLs: every seed gives different pixels, so no
cache in a server can answer a request from an earlier one.

The warm-up (`warmup.py`, run inside the serving image) sends them; the local stack's tests and
demo use the same (local/media.py re-exports them). OpenCV comes with vLLM.
"""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

import numpy as np


def noise(height: int, width: int, seed: int) -> np.ndarray:
    """One uint8 [height, width, 3] frame of uniform noise."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)


def mp4_bytes(
    frames: int = 2,
    width: int = 64,
    height: int = 48,
    fps: float = 2,
    seed: int = 0,
    fourcc: str = "mp4v",
) -> bytes:
    """An mp4 of `frames` noise frames: MPEG-4 Part 2 (`mp4v`, which vLLM's OpenCV loader
    decodes) or another codec OpenCV's writer has here (`VP90`; pip's OpenCV has no H.264
    encoder)."""
    pictures = [noise(height, width, seed * 1000 + i) for i in range(frames)]
    return mp4_from_frames(pictures, fps=fps, fourcc=fourcc)


def mp4_from_frames(frames: list[np.ndarray], fps: float = 2, fourcc: str = "mp4v") -> bytes:
    """An mp4 of these uint8 [height, width, 3] BGR frames, written by OpenCV."""
    import cv2

    height, width = frames[0].shape[:2]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v.mp4"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (width, height))
        if not writer.isOpened():
            raise RuntimeError(f"OpenCV cannot write a {fourcc} mp4 of {width}x{height} here")
        try:
            for frame in frames:
                writer.write(frame)
        finally:
            writer.release()
        return path.read_bytes()


def jpeg_bytes(width: int = 64, height: int = 48, seed: int = 0) -> bytes:
    import cv2

    ok, buf = cv2.imencode(".jpg", noise(height, width, seed))
    if not ok:
        raise RuntimeError(f"OpenCV cannot encode a JPEG of {width}x{height}")
    return buf.tobytes()


def data_url(mime: str, payload: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(payload).decode()}"
