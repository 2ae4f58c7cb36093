"""What vLLM 0.34 changed for the plugin, on its own code: pixel values that arrive as uint8 and
are rescaled by the model's input norm (`mm_device_do_normalize`, 0.34's default), the CUDA-graph
forward on those buffers, and the towers the override leaves alone. Run by test_vllm_overlays.py in
the 0.34 overlay, together with test_vllm_adapter.py (float inputs); never collected in the
main run (vLLM 0.32 has none of this)."""

from __future__ import annotations

import g4helpers as H
import pytest
import torch
from test_vllm_adapter import counter, cpu_memory_info, image_input, models, same, video_input  # noqa: F401
from vllm.model_executor.models.gemma4_mm import Gemma4ForConditionalGeneration as Upstream

from gemma4_batched_encoder import vllm_model
from gemma4_batched_encoder.metrics import get_metrics
from gemma4_batched_encoder.settings import Settings
from gemma4_batched_encoder.versions import Layout

DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


def device_norm() -> torch.nn.Module:
    """0.34's input norm as it builds it for Gemma 4 (the processor rescales by 1/255, no
    mean/std), running its native forward: what vLLM's CPU platform dispatches (a GPU runs the
    same arithmetic as a Triton kernel)."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fusion.mm_input_norm import FusedMMInputNorm

    with set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device="cpu"))):
        norm = FusedMMInputNorm([0.0] * 3, [1.0] * 3, 1 / 255)
    norm._forward_method = norm.forward_native
    return norm


def as_uint8(pixel_values: torch.Tensor) -> torch.Tensor:
    # arbitrary bytes in the valid patches; the padding rows stay 0 as the processor pads them
    return (pixel_values.float() * 255).round().clamp(0, 255).to(torch.uint8)


def uint8_models(dtype: torch.dtype):
    stock, plugin = models(dtype)
    stock.vision_input_norm = plugin.vision_input_norm = device_norm()
    plugin._g4_device_norm = True  # what __init__ reads from such a vLLM config
    return stock, plugin


def test_installed_vllm_is_034s_layout() -> None:
    assert vllm_model.LAYOUT is Layout.LOCAL
    assert hasattr(vllm_model.Gemma4ForConditionalGeneration, "_process_video_input_local")


@DTYPES
def test_uint8_pixel_values_identical_to_stock(dtype: torch.dtype) -> None:
    stock, plugin = uint8_models(dtype)
    calls = get_metrics().calls
    vi = video_input([H.FRAME_480P] * 4 + [H.FRAME_720P] * 2, [2, 2, 2], dtype)
    vi["pixel_values_videos"] = as_uint8(vi["pixel_values_videos"])
    before = counter(calls, path="plugin")
    got = plugin.embed_multimodal(**vi, video_num_soft_tokens=[[63, 63], [63, 63], [66, 66]])
    assert counter(calls, path="plugin") == before + 1  # the override ran, no fallback
    assert same(got, Upstream._process_video_input(stock, vi))
    ii = image_input([H.image(70), H.image(280), H.image(140, 0.5)], dtype)
    ii["pixel_values"] = [as_uint8(p) for p in ii["pixel_values"]]
    assert same(plugin._process_image_input(ii), Upstream._process_image_input(stock, ii))
    # and the bytes were rescaled once: the float values they stand for give the same embeddings
    floats = dict(vi, pixel_values_videos=vi["pixel_values_videos"].float().mul(1 / 255).to(dtype))
    plain, _ = models(dtype)
    assert same(got, Upstream._process_video_input(plain, floats))


def test_graph_forward_embeds_the_uint8_buffers_as_stock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's CUDA-graph forward (per-item pooler GEMMs) on 0.34's uint8 replay buffers:
    upstream's `_embed_patches`, and its output equal to upstream's forward here."""
    pooled: list[int] = []  # the plugin's own pooler ran (a fallback would run stock's)
    real_pool = vllm_model.pool_exact
    monkeypatch.setattr(
        vllm_model, "pool_exact", lambda *a, **k: pooled.append(1) or real_pool(*a, **k)
    )
    dtype = torch.float32
    stock, plugin = uint8_models(dtype)
    vi = video_input([H.FRAME_480P] * 3, [3], dtype)
    pixel_values = as_uint8(vi["pixel_values_videos"])
    position_ids = vi["pixel_position_ids_videos"]
    tokens = pixel_values.shape[1] // H.K**2
    valid = (position_ids != -1).all(-1).reshape(3, tokens, H.K**2).any(-1)
    inputs = {
        "pixel_values": pixel_values,
        "pixel_position_ids": position_ids,
        "gather_indices": valid.reshape(-1).nonzero().squeeze(-1),
    }
    want = Upstream.encoder_cudagraph_forward(stock, inputs)
    got = plugin.encoder_cudagraph_forward(inputs)
    assert pooled == [1]
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)  # fp32: the pooler GEMM's order


def test_a_quantized_tower_keeps_stock() -> None:
    """0.34 feeds input_proj the model dtype where the tower's patch embedder casts to the
    weight's (a quantized tower's storage dtype): the override stays out there."""
    dtype = torch.bfloat16
    _, plugin = models(dtype)
    plugin.vision_tower.patch_embedder.input_proj.weight.data = (
        plugin.vision_tower.patch_embedder.input_proj.weight.data.float()
    )
    assert vllm_model._inactive_reason(plugin, Settings()) == "quantized vision tower"
    _, plain = models(dtype)
    assert vllm_model._inactive_reason(plain, Settings()) is None


def test_034_has_only_model_runner_v2_and_the_range_buffer_hooks_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """0.34 removed V1 (no gpu_model_runner module, no `use_v2_model_runner`): the graph-safe
    range buffer installs V2's hooks whatever the config (before: nothing, and FULL graphs
    dropped Gemma 4's image ranges)."""
    import vllm.v1.attention.backends.triton_attn as triton_attn
    import vllm.v1.worker.gpu.model_runner as runner_module
    from vllm.config import DeviceConfig, VllmConfig
    from vllm.v1.worker.gpu.model_states.default import DefaultModelState

    import gemma4_batched_encoder.engine_graph_ranges as G

    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    assert not G._has_v1_runner() and not hasattr(VllmConfig, "use_v2_model_runner")
    assert G.runs_model_runner_v2(config) is True
    for owner, name in [
        (DefaultModelState, "prepare_attn"),
        (runner_module.GPUModelRunner, "execute_model"),
        (runner_module, "dispatch_cg_and_sync_dp"),
        (triton_attn, "compute_mm_prefix_range_tensor"),
    ]:
        monkeypatch.setattr(owner, name, getattr(owner, name))
    assert G.install(4, config) is True
    assert getattr(runner_module.dispatch_cg_and_sync_dp, G._PATCHED)
    assert getattr(DefaultModelState.prepare_attn, G._PATCHED)
