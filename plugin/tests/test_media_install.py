"""install() in this process: vLLM's real Gemma 4 processor gives stock tensors with the fast path,
and the stage histogram records where the stages run."""

from __future__ import annotations

import base64
import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import media as media_files
from gemma4_batched_encoder import media

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def vllm_processor(tiny_model: Path):
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    assert media.install()
    config = ModelConfig(
        model=str(tiny_model), limit_mm_per_prompt={"audio": 0}, mm_processor_cache_gb=0
    )
    processor = MULTIMODAL_REGISTRY.create_processor(config)
    yield processor
    media.set_fast_path(media.fast_path_requested())


def apply(processor, mm_data: dict) -> dict:
    from vllm.multimodal.processing.context import TimingContext
    from vllm.multimodal.processing.inputs import ProcessorInputs

    tokenizer = processor.info.get_tokenizer()
    tokens = "".join(
        "<|video|>" if m == "video" else "<|image|>" for m in mm_data for _ in mm_data[m]
    )
    prompt = tokenizer.encode(f"look {tokens} describe", add_special_tokens=False)
    items = processor.info.get_data_parser().parse_mm_data(mm_data)
    return processor.apply(ProcessorInputs(prompt, items), TimingContext())


def stock_and_fast(processor, mm_data: dict) -> tuple[dict, dict]:
    media.set_fast_path(False)
    stock = apply(processor, mm_data)
    media.set_fast_path(True)
    fast = apply(processor, mm_data)
    return stock, fast


def assert_same_mm_kwargs(stock: dict, fast: dict) -> None:
    assert stock["prompt_token_ids"] == fast["prompt_token_ids"]
    for modality, items in stock["mm_kwargs"].items():
        for want, got in zip(items, fast["mm_kwargs"][modality], strict=True):
            assert set(want.keys()) == set(got.keys())
            for key in want:
                a, b = want[key].data, got[key].data
                if isinstance(a, torch.Tensor):
                    assert a.dtype == b.dtype and torch.equal(a, b), key
                else:
                    assert a == b, key


def decoded_video(frames: int, width: int, height: int, seed: int):
    from vllm.multimodal.media.image import ImageMediaIO
    from vllm.multimodal.media.video import VideoMediaIO

    payload = base64.b64encode(media_files.mp4_bytes(frames, width, height, seed=seed)).decode()
    return VideoMediaIO(ImageMediaIO(), num_frames=32).load_base64("video/mp4", payload).media


@pytest.mark.parametrize(
    ("frames", "width", "height"), [(6, 640, 480), (3, 854, 480), (8, 320, 568), (2, 160, 90)]
)
def test_vllm_video_tensors_identical(vllm_processor, frames: int, width: int, height: int) -> None:
    video = decoded_video(frames, width, height, seed=frames)
    stock, fast = stock_and_fast(vllm_processor, {"video": [video]})
    assert_same_mm_kwargs(stock, fast)
    assert stock["mm_kwargs"]["video"][0]["pixel_values_videos"].data.shape[0] == frames


def test_vllm_two_videos_and_images_identical(vllm_processor) -> None:
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((240, 320), (77, 500))]
    videos = [decoded_video(4, 640, 480, seed=11), decoded_video(2, 1280, 720, seed=12)]
    stock, fast = stock_and_fast(vllm_processor, {"image": images, "video": videos})
    assert_same_mm_kwargs(stock, fast)


def test_install_is_idempotent_and_per_process() -> None:
    assert media.install()
    assert media.install()
    assert media.process_role() == "frontend"
    process = multiprocessing.current_process()
    name = process.name
    try:
        for engine_name in ("EngineCore", "EngineCore_DP1", "VllmWorker-0"):
            process.name = engine_name
            assert media.process_role() == "engine"
    finally:
        process.name = name


def test_env_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, want in (("0", False), ("1", True), ("", True), ("off", False), ("bogus", True)):
        monkeypatch.setenv(media.ENV_FAST_PATH, value)
        assert media.fast_path_requested() is want
    for value, want in (("0", 0), ("1", 1), ("4", 4), ("x", 1), ("-2", 1)):
        monkeypatch.setenv(media.ENV_TORCH_THREADS, value)
        assert media.media_torch_threads() == want


def test_limited_torch_threads_restores() -> None:
    before = torch.get_num_threads()
    with media.limited_torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with media.limited_torch_threads(0):
        assert torch.get_num_threads() == before


def stage_samples(metric_name: str, suffix: str, *labels: str) -> dict[Any, float]:
    """This process's samples of a stage metric ending in `suffix`, keyed by `labels`' values."""
    from prometheus_client import REGISTRY

    out: dict[Any, float] = {}
    for metric in REGISTRY.collect():
        if metric.name == metric_name:
            for sample in metric.samples:
                if sample.name.endswith(suffix):
                    key = tuple(sample.labels[k] for k in labels)
                    out[key[0] if len(key) == 1 else key] = sample.value
    return out


def histogram_counts() -> dict[str, float]:
    return stage_samples(media.stages.METRIC_NAME, "_count", "stage")


def test_stage_metrics_recorded(vllm_processor) -> None:
    before = histogram_counts()
    video = decoded_video(6, 640, 480, seed=21)  # load_base64 -> base64_decode + video_decode
    apply(vllm_processor, {"video": [video]})  # mm_processor + image_processor
    after = histogram_counts()
    for stage in (
        media.stages.BASE64,
        media.stages.VIDEO_DECODE,
        media.stages.MM_PROCESSOR,
        media.stages.IMAGE_PROCESSOR,
    ):
        assert after.get(stage, 0) >= before.get(stage, 0) + 1, stage
    buckets = media.stages.BUCKETS
    assert buckets[0] == 0.0005 and buckets[-1] == 2.0


def test_dummy_inputs_record_no_stage(vllm_processor) -> None:
    """vLLM's warm-up and profiling (get_dummy_mm_inputs: the largest items, hundreds of ms a
    call) leave the stage histograms alone; the next real call is recorded again."""
    before = histogram_counts()
    threads_before = thread_seconds()
    dummy = vllm_processor.get_dummy_mm_inputs({"image": 1, "video": 1})
    assert dummy["mm_kwargs"]["video"]  # the processor did run on a dummy video
    assert histogram_counts() == before
    assert thread_seconds() == threads_before
    apply(vllm_processor, {"video": [decoded_video(2, 320, 240, seed=22)]})
    after = histogram_counts()
    assert after[media.stages.MM_PROCESSOR] == before.get(media.stages.MM_PROCESSOR, 0) + 1


def thread_seconds() -> dict[tuple[str, str], float]:
    return stage_samples(media.stages.THREAD_METRIC_NAME, "_total", "stage", "state")


def test_limited_torch_threads_leaves_other_threads_alone() -> None:
    """The limit is per calling thread: an engine thread in the same process keeps its count."""
    import threading

    if torch.get_num_threads() < 2:
        torch.set_num_threads(2)
    ready, go = threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def other() -> None:
        torch.ones(100_000).sum()  # torch initialises this thread's OpenMP count on first use
        seen["before"] = torch.get_num_threads()
        ready.set()
        go.wait(30)
        seen["during"] = torch.get_num_threads()

    thread = threading.Thread(target=other)
    thread.start()
    ready.wait(30)
    with media.limited_torch_threads(1):
        assert torch.get_num_threads() == 1
        go.set()
        thread.join(30)
    assert seen["during"] == seen["before"] >= 2


def test_wrappers_pass_any_signature_through() -> None:
    """vLLM 0.26's inherited `_apply_hf_processor_main(prompt, mm_items, ...)` (prompt first,
    keyword or positional) must reach the original unchanged; vLLM 0.26 is not installed here,
    so a class with that signature stands in for it."""

    class Prompt1st:
        def _apply_hf_processor_main(self, prompt, mm_items, hf_kwargs, tokenization_kwargs=None):
            return (prompt, mm_items, hf_kwargs, tokenization_kwargs)

        def load_bytes(self, data, *, num_frames=32):
            return (data, num_frames)

        def load_base64(self, media_type, data):
            return self.load_bytes(base64.b64decode(data))

    main = media.timed_processor_main(Prompt1st._apply_hf_processor_main, threads=1)
    obj = Prompt1st()
    assert main(obj, "p", "m", {"a": 1}) == ("p", "m", {"a": 1}, None)
    assert main(obj, prompt="p", mm_items="m", hf_kwargs={}, tokenization_kwargs={"t": 1}) == (
        "p",
        "m",
        {},
        {"t": 1},
    )
    Prompt1st.load_bytes = media.timed_load_bytes(Prompt1st.load_bytes)
    load_base64 = media.timed_load_base64(Prompt1st.load_base64)
    assert load_base64(obj, "video/mp4", base64.b64encode(b"xyz").decode()) == (b"xyz", 32)
    assert load_base64(obj, media_type="video/mp4", data="") == (b"", 32)
    assert Prompt1st.load_bytes(obj, b"q", num_frames=4) == (b"q", 4)


def test_video_frames_reach_the_processor_as_arrays_with_the_fast_path(
    vllm_processor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the fast path on, vLLM's video branch gets zero-copy ArrayFrames (and the fast image
    processor takes them); with it off, real PIL images. The tensors are equal either way
    (test_vllm_video_tensors_identical)."""
    from PIL import Image
    from vllm.model_executor.models import gemma4_mm

    from gemma4_batched_encoder.media import fast_processor, frames

    assert isinstance(gemma4_mm.PILImage, frames.PILImageShim)
    stock_and_fast(vllm_processor, {"video": [decoded_video(2, 320, 240, seed=30)]})  # self-check
    made: list[type] = []
    fromarray = gemma4_mm.PILImage.fromarray

    def spy(obj, mode=None):
        made.append(type(result := fromarray(obj, mode)))
        return result

    monkeypatch.setattr(gemma4_mm.PILImage, "fromarray", spy)
    fast_calls: list[int] = []
    preprocess = fast_processor.preprocess_uint8

    def counting(images, **kwargs):
        fast_calls.append(len(images))
        return preprocess(images, **kwargs)

    monkeypatch.setattr(fast_processor, "preprocess_uint8", counting)
    video = decoded_video(5, 640, 480, seed=31)
    stock, fast = stock_and_fast(vllm_processor, {"video": [video]})
    assert made == [Image.Image] * 5 + [frames.ArrayFrame] * 5
    assert fast_calls == [5]  # the fast processor handled the array frames, not stock code
    assert_same_mm_kwargs(stock, fast)


def test_array_frame_behaves_like_pil_for_size_only() -> None:
    from gemma4_batched_encoder.media import frames

    rgb = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    frame = frames.as_frame(rgb)
    assert frame.size == (6, 4)  # PIL's (width, height)
    assert np.shares_memory(frame, rgb)  # no copy
    assert frame[1:].size == 3 * 6 * 3 and (frame + 1).size == 4 * 6 * 3  # derived: plain
    assert torch.equal(torch.from_numpy(frame), torch.from_numpy(rgb))
    shim = frames.PILImageShim(lambda: True)
    assert isinstance(shim.fromarray(rgb), frames.ArrayFrame)
    assert not isinstance(shim.fromarray(rgb[..., 0]), frames.ArrayFrame)  # grey: real PIL
    assert not isinstance(frames.PILImageShim(lambda: False).fromarray(rgb), frames.ArrayFrame)
    assert shim.new("RGB", (2, 2)).size == (2, 2)  # everything else is PIL.Image
    # the processor's tensor for a frame: pil_to_tensor's values *and* memory layout (the stock
    # code resizes each frame as given; another layout could take another kernel)
    from PIL import Image
    from torchvision.transforms.v2 import functional as tvF

    want = tvF.pil_to_tensor(Image.fromarray(rgb))
    got = frames.frame_tensor(frame)
    assert torch.equal(got, want) and got.stride() == want.stride()


def test_one_failing_patch_leaves_the_others_in_force() -> None:
    """A patch that raises (a changed upstream) is logged, and the other media patches still
    apply: here the array-frame patch fails and the stage timers and decode threads are in."""
    import subprocess
    import sys

    code = """
import logging, sys
from gemma4_batched_encoder import media
from gemma4_batched_encoder.media import decode, frames
from gemma4_batched_encoder.vllm_modules import VIDEO_IO_MODULES, first_attr

def broken(enabled):
    raise RuntimeError("upstream changed")

frames.install = broken
records = []
handler = logging.Handler()
handler.emit = records.append
log = logging.getLogger("vllm.gemma4_batched_encoder.media")
log.addHandler(handler)
log.setLevel(logging.INFO)
assert media.install()
video_io = first_attr(VIDEO_IO_MODULES, "VideoMediaIO")[1]
assert getattr(video_io.load_bytes, "_gemma4_media_patched", False), "timers missing"
assert getattr(decode.find_mixin().open_video_capture, "_gemma4_decode_threads", False)
assert media.fast_path_enabled()
messages = [r.getMessage() for r in records]
assert any("video frames stay PIL images" in m for m in messages), messages
assert any("video frames as arrays off" in m for m in messages), messages
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]


def test_frame_call_skips_the_dummy_prompt_with_the_same_tensors(
    vllm_processor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the fast path on, vLLM's per-video processor call is answered by the image processor
    alone once its self-check passed: the tokenizer never sees the dummy prompt, and every tensor
    vLLM hands on equals stock's."""
    from gemma4_batched_encoder.media import frame_call

    monkeypatch.setattr(frame_call, "_verdicts", {})
    short: list[int] = []
    image_only = frame_call.image_only

    def counting(processor, kwargs):
        short.append(len(kwargs["images"]))
        return image_only(processor, kwargs)

    monkeypatch.setattr(frame_call, "image_only", counting)
    texts: list[str] = []
    tokenizer_call = type(vllm_processor.info.get_tokenizer()).__call__

    def spy(self, text=None, *args, **kwargs):
        texts.extend(text if isinstance(text, list) else [text])
        return tokenizer_call(self, text, *args, **kwargs)

    monkeypatch.setattr(type(vllm_processor.info.get_tokenizer()), "__call__", spy)
    video = decoded_video(4, 854, 480, seed=41)
    media.set_fast_path(False)
    stock = apply(vllm_processor, {"video": [video]})
    media.set_fast_path(True)
    first = apply(vllm_processor, {"video": [video]})  # self-check: full call + short path
    assert short == [4] and list(frame_call._verdicts.values()) == [True]
    texts.clear()
    second = apply(vllm_processor, {"video": [video]})
    assert short == [4, 4]
    dummy = "\t" + vllm_processor.info.get_hf_processor().image_token
    assert texts and not any(t and t.startswith(dummy) for t in texts), texts
    assert_same_mm_kwargs(stock, first)
    assert_same_mm_kwargs(stock, second)


def test_frame_call_self_check_keeps_the_full_call_on_a_difference(
    vllm_processor, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gemma4_batched_encoder.media import frame_call

    monkeypatch.setattr(frame_call, "_verdicts", {})
    image_only = frame_call.image_only
    calls: list[int] = []

    def off_by_one_ulp(processor, kwargs):
        calls.append(1)
        out = image_only(processor, kwargs)
        pixels = out["pixel_values"]
        out["pixel_values"] = torch.nextafter(pixels, pixels + 1)
        return out

    monkeypatch.setattr(frame_call, "image_only", off_by_one_ulp)
    video = decoded_video(3, 640, 480, seed=43)
    stock, fast = stock_and_fast(vllm_processor, {"video": [video]})
    assert list(frame_call._verdicts.values()) == [False] and calls == [1]
    again = apply(vllm_processor, {"video": [video]})
    assert calls == [1]  # not asked again: the full call stays for this processor and kwargs
    assert_same_mm_kwargs(stock, fast)
    assert_same_mm_kwargs(stock, again)


def test_frame_call_only_matches_the_video_branch_call(tiny_model: Path) -> None:
    from PIL import Image
    from transformers import AutoProcessor

    from gemma4_batched_encoder.media import frame_call, frames

    processor = AutoProcessor.from_pretrained(tiny_model)
    rgb = np.zeros((48, 64, 3), dtype=np.uint8)
    arrays = [frames.as_frame(rgb), frames.as_frame(rgb)]
    dummy = ("\t" + processor.image_token) * 2
    assert frame_call.is_frame_call(processor, (), {"images": arrays, "text": dummy})
    assert not frame_call.is_frame_call(processor, (arrays,), {"text": dummy})  # positional
    assert not frame_call.is_frame_call(processor, (), {"images": arrays, "text": dummy + "x"})
    assert not frame_call.is_frame_call(processor, (), {"images": arrays[:1], "text": dummy})
    pil = [Image.fromarray(rgb)] * 2
    assert not frame_call.is_frame_call(processor, (), {"images": pil, "text": dummy})
    plain = [rgb, rgb]  # arrays that are not the branch's frames
    assert not frame_call.is_frame_call(processor, (), {"images": plain, "text": dummy})
