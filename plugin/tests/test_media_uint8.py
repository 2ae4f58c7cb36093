"""GEMMA4_MEDIA_UINT8: the processor's uint8 patches, rescaled by the plugin's model class, give the
encoder tensors `torch.equal` to the float path's, the whole way through vLLM's processor, msgspec,
batching and the model; a batch mixing both kinds is rescaled on the host, not promoted."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from test_media_install import apply, decoded_video, vllm_processor  # noqa: F401 (fixture)
from test_vllm_adapter import cpu_memory_info, models  # noqa: F401 (autouse fixture)
from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor

from gemma4_batched_encoder import media, pixels
from gemma4_batched_encoder.media import env, fast_processor

STOCK = Gemma4ImageProcessor._preprocess
while hasattr(STOCK, "__wrapped__"):  # install() wraps the class method (see the fast-path test)
    STOCK = STOCK.__wrapped__
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def processor(uint8: bool) -> Gemma4ImageProcessor:
    out = Gemma4ImageProcessor()
    fast = fast_processor.make_fast_preprocess(STOCK, lambda: True, lambda: uint8)
    out._preprocess = types.MethodType(fast, out)  # type: ignore[method-assign]
    return out


def stock_processor() -> Gemma4ImageProcessor:
    out = Gemma4ImageProcessor()
    out._preprocess = types.MethodType(STOCK, out)  # type: ignore[method-assign]
    return out


def assert_restores_stock(images: list, soft_tokens: int, **options: object) -> None:
    want = stock_processor()(images=images, max_soft_tokens=soft_tokens, return_tensors="pt")
    got = processor(True)(
        images=images, max_soft_tokens=soft_tokens, return_tensors="pt", **options
    )
    assert set(want.keys()) == set(got.keys())
    assert got["pixel_values"].dtype == torch.uint8
    assert got["pixel_values"].shape == want["pixel_values"].shape
    for key in set(want.keys()) - {"pixel_values"}:
        assert torch.equal(want[key], got[key]), key
    for dtype in DTYPES:  # vLLM casts stock's float32 to the model dtype in the API server
        restored = pixels.to_stock_pixels(got["pixel_values"], dtype)
        assert restored.dtype == dtype
        assert torch.equal(restored, want["pixel_values"].to(dtype)), dtype


def test_every_byte_restores_to_stock_arithmetic() -> None:
    assert Gemma4ImageProcessor().rescale_factor == pixels.UINT8_SCALE
    values = torch.arange(256, dtype=torch.uint8).repeat(3)
    want = values * Gemma4ImageProcessor().rescale_factor  # transformers' own rescale
    assert want.dtype == torch.float32
    for dtype in DTYPES:
        assert torch.equal(pixels.to_stock_pixels(values, dtype), want.to(dtype))
    as_list = pixels.to_stock_pixels([values, values.float()], torch.float32)
    assert torch.equal(as_list[0], want) and torch.equal(as_list[1], values.float())


@pytest.mark.parametrize("soft_tokens", [70, 140, 280, 560, 1120])
@pytest.mark.parametrize("seed", range(4))
def test_random_images_and_videos(seed: int, soft_tokens: int) -> None:
    rng = np.random.default_rng(seed * 7919 + soft_tokens)
    sizes = [(int(rng.integers(8, 900)), int(rng.integers(8, 900))) for _ in range(3)]
    sizes += [(480, 640), (40, 900), (900, 40)]  # fixed aspect-ratio extremes
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    assert_restores_stock(images, soft_tokens)
    frames = int(rng.integers(1, 9))
    height, width = sizes[0]
    first = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    assert_restores_stock([np.roll(first, 5 * i, axis=0) for i in range(frames)], soft_tokens)


def test_other_factor_or_options_stay_float32() -> None:
    image = np.random.default_rng(1).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    for options in ({"rescale_factor": 1 / 256}, {"do_normalize": True}):
        want = stock_processor()(images=[image], max_soft_tokens=70, return_tensors="pt", **options)
        got = processor(True)(images=[image], max_soft_tokens=70, return_tensors="pt", **options)
        assert got["pixel_values"].dtype == torch.float32, options
        assert torch.equal(want["pixel_values"], got["pixel_values"]), options


def test_switch_parsing_and_blockers(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, want in (("on", True), ("1", True), ("off", False), ("", False), ("maybe", False)):
        monkeypatch.setenv(env.ENV_UINT8, value)
        assert env.uint8_requested() is want, value
    monkeypatch.delenv(env.ENV_UINT8)
    assert not env.uint8_requested()  # off by default
    assert pixels.handoff_blocker() is None  # this vLLM takes it
    monkeypatch.setenv(env.ENV_UINT8, "on")
    fast_before = media.fast_path_enabled()
    try:
        media.set_fast_path(True)
        # a bad value: register() leaves the model class stock but installs the media hooks
        for name, bad in (("GEMMA4_ENCODER_MODE", "turbo"), ("GEMMA4_ENCODER_DISABLE", "maybe")):
            monkeypatch.setenv(name, bad)
            assert "invalid GEMMA4_ENCODER_" in (pixels.handoff_blocker() or ""), name
            assert not media._uint8_handoff(), name  # the stock class would get bytes: float32
            monkeypatch.delenv(name)
        assert media._uint8_handoff()
        media.set_fast_path(False)
        assert not media._uint8_handoff()  # the hand-off lives in the fast processor
    finally:
        media.set_fast_path(fast_before)


# -- through vLLM: processor, msgspec, batching, the plugin's model class ---------------------


def processed(processor, mm_data: dict, uint8: bool) -> dict:
    """mm items as the engine core receives them: processed here, through msgspec."""
    from vllm.multimodal.inputs import MultiModalKwargsItem
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    media.set_fast_path(True)
    media.set_uint8(uint8)
    try:
        out = apply(processor, mm_data)
    finally:
        media.set_uint8(False)
    decoder = MsgpackDecoder(MultiModalKwargsItem)
    return {
        modality: [decoder.decode(MsgpackEncoder().encode(item)) for item in items]
        for modality, items in out["mm_kwargs"].items()
    }


def batches(items: list[tuple[str, object]]) -> list[dict]:
    from vllm.multimodal.utils import group_and_batch_mm_kwargs

    return [kwargs for _, _, kwargs in group_and_batch_mm_kwargs(items)]


def assert_same_batch(want: dict, got: dict) -> None:
    assert set(want) == set(got)
    for key, a in want.items():
        b = got[key]
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), key
        elif isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
            assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True))
        else:
            assert a == b, key


def encoder_inputs(plugin, batch: dict) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """What the vision tower's patch embedder receives for `batch`, and the embeddings."""
    seen: list[torch.Tensor] = []
    hook = plugin.vision_tower.patch_embedder.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].clone())
    )
    try:
        out = plugin.embed_multimodal(**batch)
    finally:
        hook.remove()
    return seen, list(out)


@pytest.fixture(scope="module")
def mm_data() -> dict:
    rng = np.random.default_rng(9)
    sizes = ((240, 320), (77, 500), (240, 320))  # two of one size: stacked; one listed apart
    return {
        "image": [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes],
        "video": [decoded_video(4, 640, 480, seed=21), decoded_video(2, 320, 568, seed=22)],
    }


def test_encoder_receives_the_float_paths_tensors(vllm_processor, mm_data) -> None:  # noqa: F811
    off = processed(vllm_processor, mm_data, uint8=False)
    on = processed(vllm_processor, mm_data, uint8=True)
    dtype = off["image"][0]["pixel_values"].data.dtype  # the model dtype (bf16 here)
    assert dtype != torch.float32
    for modality, key in (("image", "pixel_values"), ("video", "pixel_values_videos")):
        assert all(item[key].data.dtype == torch.uint8 for item in on[modality])
        # a quarter of float32's bytes (half of bf16's) leave the API server
        assert on[modality][0][key].data.nbytes * 2 == off[modality][0][key].data.nbytes

    for modality in ("image", "video"):
        (want,) = batches([(modality, item) for item in off[modality]])
        (got,) = batches([(modality, item) for item in on[modality]])
        _, plugin = models(dtype)
        plugin._g4_pixel_dtype = dtype
        plugin.embed_multimodal(**want)  # first call: the plugin's own self-checks run too
        received_off, out_off = encoder_inputs(plugin, want)
        received_on, out_on = encoder_inputs(plugin, got)
        assert received_off and len(received_on) == len(received_off)
        for a, b in zip(received_off, received_on, strict=True):
            assert a.dtype == b.dtype == dtype and torch.equal(a, b)
        assert len(out_off) == len(out_on)
        assert all(torch.equal(a, b) for a, b in zip(out_off, out_on, strict=True))
        # and the float batch itself is what restoring the uint8 batch gives
        pixels.restore(got, dtype)
        assert_same_batch(want, got)


def test_vllm_encoder_graph_selection_restores(vllm_processor, mm_data) -> None:  # noqa: F811
    from vllm.model_executor.models.gemma4_mm import Gemma4ForConditionalGeneration as Upstream

    if not hasattr(Upstream, "select_encoder_cudagraph_items"):
        pytest.skip("this vLLM has no encoder CUDA graph hooks")
    off = processed(vllm_processor, mm_data, uint8=False)
    on = processed(vllm_processor, mm_data, uint8=True)
    dtype = off["image"][0]["pixel_values"].data.dtype
    stock, plugin = models(dtype)
    plugin._g4_pixel_dtype = dtype
    for modality in ("image", "video"):
        (want,) = batches([(modality, item) for item in off[modality]])
        (got,) = batches([(modality, item) for item in on[modality]])
        indices = [1, 0]
        expected = Upstream.select_encoder_cudagraph_items(stock, want, indices)
        assert_same_batch(expected, plugin.select_encoder_cudagraph_items(got, indices))


def test_mixed_batch_is_rescaled_not_promoted(
    vllm_processor,  # noqa: F811
    mm_data,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A float item (a request the fast path did not cover) batched with uint8 ones."""
    from vllm.multimodal.inputs import BaseMultiModalField

    off = processed(vllm_processor, mm_data, uint8=False)
    on = processed(vllm_processor, mm_data, uint8=True)
    cases = [
        ("image", [off["image"][0], on["image"][2]], [off["image"][0], off["image"][2]]),
        ("video", [off["video"][0], on["video"][0]], [off["video"][0], off["video"][0]]),
    ]
    monkeypatch.setattr(BaseMultiModalField, "reduce_data", BaseMultiModalField.reduce_data)
    key = {"image": "pixel_values", "video": "pixel_values_videos"}
    for modality, mixed, floats in cases:  # vLLM alone: the bytes are promoted, unscaled
        (got,) = batches([(modality, item) for item in mixed])
        (want,) = batches([(modality, item) for item in floats])
        assert not torch.equal(got[key[modality]], want[key[modality]])
    assert pixels.install_batch_guard()
    assert pixels.install_batch_guard()  # idempotent
    for modality, mixed, floats in cases:
        (got,) = batches([(modality, item) for item in mixed])
        (want,) = batches([(modality, item) for item in floats])
        assert_same_batch(want, got)
        (pure,) = batches([(modality, on[modality][0])] * 2)  # uint8 only: left for the device
        assert pure[key[modality]].dtype == torch.uint8


# -- vLLM 0.34+: the model rescales on the device itself (`mm_device_do_normalize`) ------------


@pytest.fixture(scope="module")
def no_rescale_processor(tiny_model):
    """vLLM's processor asked for no rescale: what vLLM 0.34+ asks by default, where
    `mm_device_do_normalize` (on for Gemma 4) forces do_rescale and do_normalize off
    (`MultiModalConfig.merge_mm_processor_kwargs`) and the model rescales on the device."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    config = ModelConfig(
        model=str(tiny_model),
        limit_mm_per_prompt={"audio": 0},
        mm_processor_cache_gb=0,
        mm_processor_kwargs={"do_rescale": False, "do_normalize": False},
    )
    return MULTIMODAL_REGISTRY.create_processor(config)


def _tensors(value: object) -> list[torch.Tensor]:
    return [value] if isinstance(value, torch.Tensor) else list(value)  # type: ignore[arg-type]


def test_device_normalize_gets_the_uint8_patches_untouched(
    no_rescale_processor,
    vllm_processor,  # noqa: F811
    mm_data,
) -> None:
    """Found reading vLLM 0.34.0: its processor emits uint8 for every request and the model
    rescales them (`_embed_patches` -> `vision_input_norm`); the plugin's model class rescaled
    every uint8 input it saw, so each image and video was rescaled twice. Where vLLM normalizes
    on the device the plugin leaves them alone, and 0.34's arithmetic on them (fp32
    `x * (1/255 / std) + (-mean / std)`, `FusedMMInputNorm.forward_native`, then the model
    dtype) gives the float path's tensors bit for bit."""
    off = processed(vllm_processor, mm_data, uint8=False)  # stock values, the model dtype
    raw = processed(no_rescale_processor, mm_data, uint8=False)
    dtype = off["image"][0]["pixel_values"].data.dtype
    _, plugin = models(dtype)
    plugin._g4_pixel_dtype = dtype
    weight = torch.tensor([1 / 255] * 3, dtype=torch.float32) / torch.ones(3)
    bias = -torch.zeros(3) / torch.ones(3)
    for modality, key in (("image", "pixel_values"), ("video", "pixel_values_videos")):
        assert all(item[key].data.dtype == torch.uint8 for item in raw[modality])
        (want,) = batches([(modality, item) for item in off[modality]])
        (got,) = batches([(modality, item) for item in raw[modality]])
        plugin._g4_device_norm = True
        kwargs = dict(got)
        plugin._g4_restore_pixels(kwargs)
        assert_same_batch(got, kwargs)  # left as they are: uint8, the model's own input
        for a, b in zip(_tensors(kwargs[key]), _tensors(want[key]), strict=True):
            x3 = a.reshape(-1, 3, a.shape[-1] // 3)  # 0.34's (patches, C, L) view
            normed = (x3 * weight.view(1, 3, 1) + bias.view(1, 3, 1)).reshape(a.shape).to(dtype)
            assert torch.equal(normed, b), modality
        plugin._g4_device_norm = False  # vLLM without device normalize: the hand-off's bytes
        kwargs = dict(got)
        plugin._g4_restore_pixels(kwargs)
        assert_same_batch(want, kwargs)


def test_device_normalize_is_read_from_vllms_config(no_rescale_processor) -> None:
    from types import SimpleNamespace as NS

    # vLLM 0.32 (installed here) has no such setting
    assert not pixels.device_normalizes(NS(model_config=no_rescale_processor.info.ctx.model_config))
    for on in (True, False):
        config = NS(model_config=NS(multimodal_config=NS(mm_device_do_normalize=on)))
        assert pixels.device_normalizes(config) is on
    assert not pixels.device_normalizes(NS(model_config=NS(multimodal_config=None)))
