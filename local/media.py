"""Small, deterministic media for requests: PNG images and mp4 videos as data URLs.

Used by the end-to-end tests and the demo's smoke requests (the load test pre-generates its own
media in slo_loadtest). Every call with a different seed gives different pixels, so no cache in
the server can answer from an earlier request.
"""

from __future__ import annotations

import io

from PIL import Image

# One generator for the tests, the demo and the image's warm-up (which cannot import local/).
from gemma4_batched_encoder.noise_media import data_url, mp4_bytes, noise

__all__ = ["data_url", "image_part", "mp4_bytes", "png_bytes", "video_part"]


def png_bytes(width: int = 64, height: int = 48, seed: int = 0) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(noise(height, width, seed)).save(buf, format="PNG")
    return buf.getvalue()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def video_part(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}
