"""Bad media gets a clear 4xx and the server keeps serving the next request."""

from __future__ import annotations

import base64

import httpx
import pytest
from test_serving import assert_ten_tokens, chat

import media

pytestmark = pytest.mark.e2e

TEXT = {"type": "text", "text": "describe"}
WAV = base64.b64encode(b"RIFF0000WAVE").decode()


def _video(payload: str) -> list[dict]:
    return [TEXT, media.video_part(payload)]


def _png_part(seed: int) -> dict:
    return media.image_part(media.data_url("image/png", media.png_bytes(seed=seed)))


def _big_png() -> bytes:
    # 4200 x 4200 = 17.6 Mpx, over the entrypoint's VLLM_MAX_IMAGE_PIXELS (16.7 Mpx); one flat
    # colour, so the PNG itself is tiny.
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4200, 4200), (10, 20, 30)).save(buf, format="PNG")
    return buf.getvalue()


CASES = {
    "malformed base64 video": (_video("data:video/mp4;base64,@@not*base64@@"), "base64"),
    "text file sent as video": (
        _video(media.data_url("video/mp4", b"this is not a video\n" * 50)),
        "video",
    ),
    "png sent as video": (
        _video(media.data_url("video/mp4", media.png_bytes(32, 32))),
        "video",
    ),
    "image over the pixel limit": (
        [TEXT, media.image_part(media.data_url("image/png", _big_png()))],
        "VLLM_MAX_IMAGE_PIXELS",
    ),
    "more images than the limit": (
        [TEXT, *(_png_part(s) for s in range(5))],
        "at most 4 image",
    ),
    "audio while audio is off": (
        [TEXT, {"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}],
        "audio",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_bad_media_is_rejected_and_server_keeps_serving(vllm_server, case):
    content, expected = CASES[case]
    resp = chat(vllm_server, content)
    assert 400 <= resp.status_code < 500, f"{case}: {resp.status_code} {resp.text[:300]}"
    message = resp.json()["error"]["message"]
    assert expected.lower() in message.lower(), f"{case}: unclear message: {message}"
    # the next valid request is served
    url = media.data_url("image/png", media.png_bytes(seed=99))
    assert_ten_tokens(chat(vllm_server, [TEXT, media.image_part(url)]))
    assert httpx.get(f"{vllm_server.url}/health", timeout=10).status_code == 200
