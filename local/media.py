"""Small, deterministic media for requests: PNG images and mp4 videos as data URLs.

Used by the end-to-end tests and the demo's smoke requests (the load test pre-generates its own
media in slo_loadtest). Every call with a different seed gives different pixels, so no cache in
the server can answer from an earlier request.
"""

from __future__ import annotations

import base64
import io
import tempfile
from pathlib import Path

import cv2
import numpy as np
from PIL import Image


def _noise(height: int, width: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)


def png_bytes(width: int = 64, height: int = 48, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(_noise(height, width, seed)).save(buf, format="PNG")
    return buf.getvalue()


def mp4_bytes(
    frames: int = 2,
    width: int = 64,
    height: int = 48,
    fps: int = 2,
    seed: int = 0,
    fourcc: str = "mp4v",
) -> bytes:
    """An mp4 of `frames` noise frames: MPEG-4 Part 2 (`mp4v`, which vLLM's OpenCV loader
    decodes) or another codec OpenCV's writer has here (`VP90`; pip's OpenCV has no H.264
    encoder)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v.mp4"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (width, height))
        if not writer.isOpened():
            raise RuntimeError(f"OpenCV cannot write {fourcc} mp4 here")
        for i in range(frames):
            writer.write(_noise(height, width, seed * 1000 + i))
        writer.release()
        return path.read_bytes()


def data_url(mime: str, payload: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(payload).decode()}"


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def video_part(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}
