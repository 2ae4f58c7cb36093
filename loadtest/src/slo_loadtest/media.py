"""Pre-generated media: mp4 videos (MPEG-4 Part 2 through OpenCV's ``VideoWriter``, or H.264
through PyAV's libx264, which pip's OpenCV lacks) and JPEG images.

Each row gets its own content, seeded by the row index, so neither vLLM's multimodal processor
cache nor its encoder cache can hide the vision encoder's work. Content is a smooth gradient with
a few shapes and the row id written on it: cheap to encode and small, yet unique to the byte.
Generation runs before a rate starts (never while guidellm is sending), in a process pool.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np


def _frame(key: int, t: int, width: int, height: int, seed: int) -> np.ndarray:
    import cv2

    rng = np.random.default_rng([seed, key, t])
    base = rng.integers(0, 256, size=3)
    # the gradient is drawn small and scaled up: full-size float maths would dominate the cost
    sh, sw = max(2, height // 8), max(2, width // 8)
    ys = np.linspace(0, 1, sh, dtype=np.float32)[:, None]
    xs = np.linspace(0, 1, sw, dtype=np.float32)[None, :]
    small = np.empty((sh, sw, 3), dtype=np.uint8)
    for c in range(3):
        w = rng.uniform(-120, 120, size=2)
        small[..., c] = np.clip(base[c] + w[0] * xs + w[1] * ys, 0, 255).astype(np.uint8)
    img = cv2.resize(small, (width, height), interpolation=cv2.INTER_LINEAR)
    for _ in range(3):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        r = int(rng.integers(max(2, min(width, height) // 16), max(3, min(width, height) // 4)))
        color = tuple(int(v) for v in rng.integers(0, 256, size=3))
        cv2.circle(img, (x0, y0), r, color, thickness=-1)
    scale = max(0.3, height / 240)
    cv2.putText(
        img,
        f"{key}/{t}",
        (4, max(12, height // 3)),
        cv2.FONT_HERSHEY_SIMPLEX,
        scale,
        (255, 255, 255),
        max(1, int(scale * 2)),
    )
    return img


def _write_mpeg4(
    tmp: Path, key: int, frames: int, width: int, height: int, fps: float, seed: int
) -> None:
    import cv2

    writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write mp4 at {tmp} ({width}x{height})")
    try:
        for t in range(frames):
            writer.write(_frame(key, t, width, height, seed))
    finally:
        writer.release()


def write_h264(
    dest: Path | BinaryIO, frames: Iterable[np.ndarray], fps: float, preset: str | None = None
) -> None:
    """An H.264 mp4 (yuv420p: even sizes) of these uint8 BGR frames, through PyAV's libx264;
    ``preset``: libx264's speed preset (None: its default)."""
    from fractions import Fraction

    import av

    with av.open(dest if not isinstance(dest, Path) else str(dest), "w", format="mp4") as out:
        stream = None
        for picture in frames:
            if stream is None:
                stream = out.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
                stream.height, stream.width = picture.shape[:2]
                stream.pix_fmt = "yuv420p"
                if preset:
                    stream.options = {"preset": preset}
            for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="bgr24")):
                out.mux(packet)
        if stream is not None:
            for packet in stream.encode():  # flush the encoder's delayed frames
                out.mux(packet)


def _write_h264(
    tmp: Path, key: int, frames: int, width: int, height: int, fps: float, seed: int
) -> None:
    # fast to write; the decoder's work does not depend on the preset's search effort
    pictures = (_frame(key, t, width, height, seed) for t in range(frames))
    write_h264(tmp, pictures, fps, preset="veryfast")


_WRITERS = {"mpeg4": _write_mpeg4, "h264": _write_h264}
VIDEO_CODECS = tuple(_WRITERS)  # --video-codec's choices


def write_video(
    path: Path,
    key: int,
    frames: int,
    width: int,
    height: int,
    fps: float,
    seed: int,
    codec: str = "mpeg4",
) -> Path:
    if codec not in _WRITERS:
        raise ValueError(f"unknown video codec {codec!r}; choose from {', '.join(VIDEO_CODECS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    _WRITERS[codec](tmp, key, frames, width, height, fps, seed)
    if not tmp.exists() or tmp.stat().st_size == 0:
        raise RuntimeError(f"no {codec} video was written to {tmp}")
    os.replace(tmp, path)
    return path


def write_image(path: Path, key: int, width: int, height: int, seed: int) -> Path:
    import cv2

    path.parent.mkdir(parents=True, exist_ok=True)
    ok, buf = cv2.imencode(".jpg", _frame(key, 0, width, height, seed))
    if not ok:
        raise RuntimeError(f"OpenCV cannot encode a JPEG of {width}x{height}")
    tmp = path.with_name(path.stem + ".tmp" + path.suffix)
    tmp.write_bytes(buf.tobytes())
    os.replace(tmp, path)
    return path


def video_frame_count(path: Path) -> int:
    import cv2

    cap = cv2.VideoCapture(str(path))
    try:
        n = 0
        while True:
            ok, _ = cap.read()
            if not ok:
                return n
            n += 1
    finally:
        cap.release()


@dataclass(frozen=True)
class VideoSpec:
    """What every video of a dataset shares (the row key makes each one's content)."""

    frames: int
    width: int
    height: int
    fps: float
    seed: int
    codec: str = "mpeg4"


def _video_job(args: tuple[Path, int, VideoSpec]) -> Path:
    path, key, s = args
    return write_video(path, key, s.frames, s.width, s.height, s.fps, s.seed, s.codec)


def _image_job(args: tuple[Path, int, int, int, int]) -> Path:
    return write_image(*args)


def _workers(n_jobs: int) -> int:
    return max(1, min(os.cpu_count() or 1, 8, n_jobs))


def write_videos(jobs: Iterable[tuple[Path, int]], spec: VideoSpec) -> list[Path]:
    """Write one video per (path, key), skipping files that already exist."""
    todo = [(p, k, spec) for p, k in jobs if not p.exists()]
    return _run(_video_job, todo)


def write_images(
    jobs: Iterable[tuple[Path, int]], width: int, height: int, seed: int
) -> list[Path]:
    todo = [(p, k, width, height, seed) for p, k in jobs if not p.exists()]
    return _run(_image_job, todo)


def _run(fn, todo: list) -> list[Path]:  # type: ignore[no-untyped-def]
    if len(todo) < 16:
        return [fn(a) for a in todo]
    with ProcessPoolExecutor(max_workers=_workers(len(todo))) as pool:
        return list(pool.map(fn, todo, chunksize=8))
