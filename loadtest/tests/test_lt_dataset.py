"""Datasets and media: enough rows, unique per row (or identical for the cache-hit variant),
real decodable mp4s with the asked-for frames, prompts sized with a local tokenizer."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import cv2
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from slo_loadtest.config import WorkloadShape
from slo_loadtest.dataset import DatasetWriter, rows_needed
from slo_loadtest.media import video_frame_count
from slo_loadtest.prompts import PromptBuilder

SMALL = WorkloadShape(
    prompt_tokens=50,
    video_frames=2,
    video_width=64,
    video_height=48,
    image_width=64,
    image_height=48,
)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _digest(p: str) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def test_rows_cover_rate_times_duration() -> None:
    assert rows_needed(20, 30) >= 600 and rows_needed(1, 5) >= 5


def test_video_rows_are_unique_real_mp4s(tmp_path: Path) -> None:
    w = DatasetWriter(tmp_path, SMALL, seed=3)
    a = w.write("video", 2, 3, "r2")
    b = w.write("video", 1, 3, "r1")
    rows = _rows(a.path) + _rows(b.path)
    assert len(_rows(a.path)) == rows_needed(2, 3)
    assert all(r["output_tokens_count"] == 10 for r in rows)
    assert len({_digest(r["video"]) for r in rows}) == len(rows), "media repeats across rows"
    assert len({r["prompt"] for r in rows}) == len(rows)
    cap = cv2.VideoCapture(rows[0]["video"])
    ok, frame = cap.read()
    cap.release()
    assert ok and frame.shape == (48, 64, 3)
    assert video_frame_count(Path(rows[0]["video"])) == 2


def test_default_video_is_six_frames_480p(tmp_path: Path) -> None:
    w = DatasetWriter(tmp_path, WorkloadShape(), seed=3)
    row = _rows(w.write("video", 1, 1, "r1").path)[0]
    cap = cv2.VideoCapture(row["video"])
    assert (cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (854, 480)
    cap.release()
    assert video_frame_count(Path(row["video"])) == 6


def _codec(path: str) -> str:
    import av

    with av.open(path) as f:
        return f.streams.video[0].codec_context.name


def test_h264_videos_are_real_h264_mp4s_opencv_reads(tmp_path: Path) -> None:
    shape = dataclasses.replace(SMALL, video_codec="h264", video_frames=6)
    w = DatasetWriter(tmp_path, shape, seed=3)
    rows = _rows(w.write("video", 2, 1, "r2").path)
    assert all("-h264-" in Path(r["video"]).name for r in rows)  # never an mpeg4 file's name
    assert {_codec(r["video"]) for r in rows} == {"h264"}
    assert len({_digest(r["video"]) for r in rows}) == len(rows)
    # every frame comes back (the encoder's delayed frames are flushed), at the asked-for size
    assert video_frame_count(Path(rows[0]["video"])) == 6
    cap = cv2.VideoCapture(rows[0]["video"])
    ok, frame = cap.read()
    cap.release()
    assert ok and frame.shape == (48, 64, 3)
    mpeg4 = DatasetWriter(tmp_path, SMALL, seed=3).write("video", 1, 1, "m")
    assert _codec(_rows(mpeg4.path)[0]["video"]) == "mpeg4"


def test_cache_hit_variant_repeats_one_row(tmp_path: Path) -> None:
    shape = WorkloadShape(**{**SMALL.__dict__, "unique_media": False})
    rows = _rows(DatasetWriter(tmp_path, shape, seed=3).write("video", 2, 3, "r2").path)
    assert len({_digest(r["video"]) for r in rows}) == 1
    assert len({r["prompt"] for r in rows}) == 1


def test_image_rows(tmp_path: Path) -> None:
    one = _rows(DatasetWriter(tmp_path / "1", SMALL, seed=3).write("image", 1, 2, "r1").path)
    assert Path(one[0]["image"]).suffix == ".jpg"
    shape = WorkloadShape(**{**SMALL.__dict__, "images_per_request": 3})
    many = _rows(DatasetWriter(tmp_path / "3", shape, seed=3).write("image", 1, 2, "r1").path)
    parts = many[0]["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "image_url", "image_url"]
    assert parts[1]["image_url"]["url"].startswith("data:image/jpeg;base64,")


def test_prompts_without_a_tokenizer_are_about_n_words() -> None:
    b = PromptBuilder(500, seed=1)
    text = b.build(7)
    assert 495 <= len(text.split()) <= 505
    assert b.build(7) == text and b.build(8) != text
    assert b.build(7, unique=False) == b.build(8, unique=False)


def _word_tokenizer(path: Path) -> Path:
    vocab = {"<unk>": 0, "<bos>": 1} | {f"w{i}": i + 2 for i in range(300)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<bos>"
    ).save_pretrained(path)
    return path


def test_prompts_with_a_local_tokenizer_are_exact(tmp_path: Path) -> None:
    tok_dir = _word_tokenizer(tmp_path / "tok")
    b = PromptBuilder(120, seed=1, tokenizer_path=tok_dir)
    assert b.exact and all(w.startswith("w") for w in b.words)  # English would be <unk>
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    for row in range(5):
        assert len(t.encode(b.build(row), add_special_tokens=False)) == 120
