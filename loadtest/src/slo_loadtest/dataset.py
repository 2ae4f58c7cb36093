"""guidellm file datasets (jsonl), one per workload and rate, written before the rate runs.

What guidellm 0.8.1 does with these columns (read in its source and checked against a real
recording server in tests/test_guidellm_payload.py):

* ``prompt`` -> a ``{"type": "text"}`` content part of one user message;
* ``video`` (a local .mp4 path) -> the file's bytes as a ``video_url`` data URL
  (``data:video/mp4;base64,...``), no re-encoding;
* ``image`` (a local .jpg path) -> decoded and re-encoded as JPEG by PIL into an ``image_url`` data
  URL; several images go in a list;
* ``output_tokens_count`` -> ``max_completion_tokens`` with ``ignore_eos: true``, so every
  request produces exactly that many tokens.

A file dataset does not repeat: guidellm stops with ``requests_exhausted`` when rows run out, so
each rate gets ``ceil(rate x duration x 1.1) + 5`` rows, each with its own media and text (keys
are never reused within a sweep), unless ``unique_media`` is off (the cache-hit variant).
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from pathlib import Path

from slo_loadtest import media
from slo_loadtest.config import WorkloadShape
from slo_loadtest.prompts import PromptBuilder

MEDIA_PROMPT = "Describe what happens in the media in a few words."


def _data_url(path: Path) -> str:
    return "data:image/jpeg;base64," + base64.b64encode(path.read_bytes()).decode()


def rows_needed(rate: float, duration_s: float) -> int:
    return math.ceil(rate * duration_s * 1.1) + 5


@dataclass
class Dataset:
    workload: str
    path: Path
    rows: int
    first_key: int


class DatasetWriter:
    """Allocates unique row keys over a whole sweep and writes the jsonl and media files."""

    def __init__(
        self,
        root: Path,
        shape: WorkloadShape,
        seed: int,
        tokenizer: str | None = None,
    ) -> None:
        self.root = root
        self.shape = shape
        self.seed = seed
        self._next_key: dict[str, int] = {}
        self._text = PromptBuilder(shape.prompt_tokens, seed, tokenizer or None)
        self._media_text = PromptBuilder(shape.media_prompt_tokens, seed + 1, tokenizer or None)

    @property
    def exact_tokens(self) -> bool:
        return self._text.exact

    def write(self, workload: str, rate: float, duration_s: float, tag: str) -> Dataset:
        n = rows_needed(rate, duration_s)
        first = self._next_key.get(workload, 0)
        self._next_key[workload] = first + n
        unique = self.shape.unique_media
        keys = list(range(first, first + n)) if unique else [0] * n
        path = self.root / f"{workload}-{tag}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._write_media(workload, sorted(set(keys)))
        rows = [self._row(workload, k, unique) for k in keys]
        tmp = path.with_suffix(".tmp")
        with tmp.open("w") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        tmp.replace(path)
        return Dataset(workload=workload, path=path, rows=n, first_key=first)

    def _video_path(self, key: int) -> Path:
        s = self.shape
        codec = "" if s.video_codec == "mpeg4" else f"-{s.video_codec}"
        name = f"v{self.seed}-{s.video_width}x{s.video_height}-{s.video_frames}f{codec}-{key}.mp4"
        return self.root / "media" / name

    def _image_path(self, key: int, i: int) -> Path:
        s = self.shape
        name = f"i{self.seed}-{s.image_width}x{s.image_height}-{key}-{i}.jpg"
        return self.root / "media" / name

    def _write_media(self, workload: str, keys: list[int]) -> None:
        s = self.shape
        if workload == "video":
            spec = media.VideoSpec(
                s.video_frames, s.video_width, s.video_height, s.video_fps, self.seed, s.video_codec
            )
            media.write_videos([(self._video_path(k), k) for k in keys], spec)
        elif workload == "image":
            jobs = [
                (self._image_path(k, i), k * 1000 + i)
                for k in keys
                for i in range(s.images_per_request)
            ]
            media.write_images(jobs, s.image_width, s.image_height, self.seed)

    def _row(self, workload: str, key: int, unique: bool) -> dict[str, object]:
        s = self.shape
        if workload == "text":
            return {"prompt": self._text.build(key, unique), "output_tokens_count": s.output_tokens}
        text = self._media_text.build(key, unique) if s.media_prompt_tokens > 0 else MEDIA_PROMPT
        if workload == "video":
            p = self._video_path(key)
            return {
                "prompt": text,
                "video": str(p.resolve()),
                "output_tokens_count": s.output_tokens,
            }
        if workload == "image":
            paths = [self._image_path(key, i) for i in range(s.images_per_request)]
            if len(paths) == 1:
                return {
                    "prompt": text,
                    "image": str(paths[0].resolve()),
                    "output_tokens_count": s.output_tokens,
                }
            # guidellm 0.8.1 rejects a list in the image column ("Unsupported image type") and
            # reads image_N columns as turns, so several images go as a full OpenAI message.
            parts: list[dict[str, object]] = [{"type": "text", "text": text}]
            parts += [{"type": "image_url", "image_url": {"url": _data_url(p)}} for p in paths]
            return {
                "messages": [{"role": "user", "content": parts}],
                "output_tokens_count": s.output_tokens,
            }
        raise ValueError(f"unknown workload {workload!r}")
