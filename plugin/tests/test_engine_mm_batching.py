"""engine_mm_batching: vLLM's merge of multimodal tensors on the target device, same tensors.

No GPU here: `on_accelerator` is made to count this CPU as the target, so the new path runs the
field's own `_reduce_data` on "moved" tensors, and its result is compared with vLLM's (0.32's
real field classes, built as Gemma 4's processor output builds them)."""

from __future__ import annotations

import pytest
import torch
from vllm.multimodal.inputs import BaseMultiModalField, MultiModalFieldConfig

import gemma4_batched_encoder.engine_mm_batching as B

STOCK = vars(BaseMultiModalField)["reduce_data"]


@pytest.fixture
def patched(monkeypatch):
    """The wrapped reduce_data with this CPU counted as the accelerator. vLLM's own code is
    replaced by a recorder (its pinning needs CUDA): the tests see which path a call took."""
    calls = []

    def stock(self, elems, **kwargs):
        calls.append(kwargs)
        return "vllm"

    monkeypatch.setattr(BaseMultiModalField, "reduce_data", B.gpu_reduce(stock))
    monkeypatch.setattr(B, "on_accelerator", lambda device: device is not None)
    return calls


def _video_elems(sizes: list[int], seed: int = 0):
    # Gemma 4's videos: one flat field over all frames, split per video.
    g = torch.Generator().manual_seed(seed)
    data = torch.randn(sum(sizes), 630, 768, generator=g).to(torch.bfloat16)
    cfg = MultiModalFieldConfig.flat_from_sizes("video", torch.tensor(sizes))
    return cfg.build_elems("pixel_values_videos", data), data


def test_flat_fields_merge_on_the_device_to_the_stock_tensor(patched):
    elems, data = _video_elems([6, 6, 12, 6])
    want = STOCK(elems[0].field, elems, device="cpu", pin_memory=False)
    got = elems[0].field.reduce_data(elems, device="cpu", pin_memory=True)
    assert patched == []  # the new path, not vLLM's
    assert got.dtype == want.dtype and got.shape == want.shape == data.shape
    assert torch.equal(got, want) and torch.equal(got, data)


def test_batched_fields_and_uint8_patches_too(patched):
    g = torch.Generator().manual_seed(1)
    data = torch.randint(0, 256, (4, 2520, 768), generator=g, dtype=torch.uint8)
    elems = MultiModalFieldConfig.batched("image").build_elems("pixel_values", data)
    got = elems[0].field.reduce_data(list(elems), device="cpu", pin_memory=True)
    assert patched == []
    assert torch.equal(got, STOCK(elems[0].field, list(elems), device="cpu", pin_memory=False))
    assert torch.equal(got, data)


@pytest.mark.parametrize(
    ("case", "kwargs"),
    [
        ("one item", {"device": "cpu", "pin_memory": True}),
        ("no pinning (no CUDA host)", {"device": "cpu", "pin_memory": False}),
        ("no target device", {"device": None, "pin_memory": True}),
    ],
)
def test_everything_else_goes_to_vllms_code(patched, case, kwargs):
    elems, _ = _video_elems([6] if case == "one item" else [6, 6])
    assert elems[0].field.reduce_data(elems, **kwargs) == "vllm"
    assert patched == [kwargs]


def test_keep_on_cpu_fields_nested_data_and_mixed_dtypes_stay_with_vllm(patched):
    data = torch.arange(8).reshape(2, 4)
    elems = MultiModalFieldConfig.batched("image", keep_on_cpu=True).build_elems("grid", data)
    assert elems[0].field.reduce_data(list(elems), device="cpu", pin_memory=True) == "vllm"
    video, _ = _video_elems([6, 6])
    video[1] = type(video[1])(data=[video[1].data], field=video[1].field)  # a nested list
    assert video[0].field.reduce_data(video, device="cpu", pin_memory=True) == "vllm"
    mixed, _ = _video_elems([6, 6])  # a uint8 item beside a float one: the uint8 guard's case
    mixed[1] = type(mixed[1])(data=mixed[1].data.to(torch.uint8), field=mixed[1].field)
    assert mixed[0].field.reduce_data(mixed, device="cpu", pin_memory=True) == "vllm"
    assert len(patched) == 3


def test_install_once_off_and_never_on_a_cpu_platform(monkeypatch):
    monkeypatch.setattr(BaseMultiModalField, "reduce_data", STOCK)
    assert not B.install(False, on_cpu_platform=False)
    assert not B.install(True, on_cpu_platform=True)
    assert vars(BaseMultiModalField)["reduce_data"] is STOCK
    assert B.install(True, on_cpu_platform=False)
    assert getattr(vars(BaseMultiModalField)["reduce_data"], B._PATCHED)
    assert not B.install(True, on_cpu_platform=False)  # once


def test_on_accelerator():
    assert not B.on_accelerator(None) and not B.on_accelerator("cpu")
    assert not B.on_accelerator(torch.device("meta"))
    assert B.on_accelerator("cuda:0") and B.on_accelerator(torch.device("cuda", 1))
