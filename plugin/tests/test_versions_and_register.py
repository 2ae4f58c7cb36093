"""Version gate, idempotent registration, and the entry point as vLLM loads it."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
from torch import nn

from gemma4_batched_encoder import plugin
from gemma4_batched_encoder.versions import (
    Layout,
    detect_layout,
    gate,
    parse_version,
    version_supported,
    vllm_version,
)


class SerialUpstream(nn.Module):
    """Shaped like vLLM 0.20's Gemma 4 encoder methods."""

    def _process_image_input(self, image_input):
        vt = self.vision_tower
        pv = pp = None
        return [self.embed_vision(inputs_embeds=vt(pv, pp, output_length=1).last_hidden_state)]

    def _process_video_input(self, video_input):
        vt = self.vision_tower
        pv = pp = None
        out = vt(pv, pp, output_length=1)
        return [self.embed_vision(inputs_embeds=out.last_hidden_state)]

    def embed_multimodal(self, **kwargs):
        return []


class LocalUpstream(nn.Module):
    """Shaped like vLLM 0.34's: per-rank bodies, patches embedded with the input norm."""

    def _embed_patches(self, pixel_values, pixel_position_ids, padding_positions):
        pixel_values = self.vision_input_norm(pixel_values.reshape(-1, 3), self.model_dtype)
        embedder = self.vision_tower.patch_embedder
        return embedder.input_proj(2 * (pixel_values - 0.5))

    def _process_image_input(self, image_input):
        return self._process_image_input_local(image_input)

    def _process_image_input_local(self, image_input):
        vt = self.vision_tower
        embeds = self._embed_patches(None, None, None)
        pooled, _ = vt.pooler(hidden_states=vt.encoder(inputs_embeds=embeds))
        return [self.embed_vision(inputs_embeds=pooled)]

    _process_video_input = _process_image_input
    _process_video_input_local = _process_image_input_local

    def embed_multimodal(self, **kwargs):
        return []


class LocalUpstreamChanged(LocalUpstream):
    def _embed_patches(self, pixel_values, pixel_position_ids, padding_positions):
        return self.vision_tower.patch_embedder.input_proj(pixel_values)  # no input norm


class UnknownUpstream(nn.Module):
    def _process_image_input(self, image_input):
        return self.new_encoder(image_input)

    def _process_video_input(self, video_input):
        return self.new_encoder(video_input)

    def embed_multimodal(self, **kwargs):
        return []


def test_detect_layouts():
    from vllm.model_executor.models.gemma4_mm import Gemma4ForConditionalGeneration

    # `make test`: vLLM 0.32 (batched); test_vllm_overlays.py runs it on 0.33's and 0.34's code
    installed = Layout.LOCAL if parse_version(vllm_version()) >= (0, 34) else Layout.BATCHED
    assert detect_layout(Gemma4ForConditionalGeneration) is installed
    assert detect_layout(SerialUpstream) is Layout.SERIAL
    assert detect_layout(LocalUpstream) is Layout.LOCAL
    assert detect_layout(LocalUpstreamChanged) is None
    assert detect_layout(UnknownUpstream) is None
    assert detect_layout(nn.Module) is None


def test_unrecognised_code_logs_one_clear_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.gemma4_batched_encoder"):
        assert gate(UnknownUpstream, "0.40.0") is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "does not recognise" in warnings[0].getMessage()
    assert "stock encoder stays" in warnings[0].getMessage()


def test_recognised_code_in_range_is_silent(caplog):
    with caplog.at_level(logging.WARNING, logger="vllm.gemma4_batched_encoder"):
        assert gate(SerialUpstream, "0.21.1") is Layout.SERIAL
    assert not caplog.records


def test_version_parsing():
    assert parse_version("0.32.0+cpu") == (0, 32)
    assert parse_version("0.20.0rc1") == (0, 20)
    assert version_supported("0.20.0") and version_supported("0.34.0")
    assert not version_supported("0.19.1") and not version_supported("0.35.0")


def test_register_is_idempotent(monkeypatch):
    from vllm import ModelRegistry

    monkeypatch.delenv("GEMMA4_ENCODER_DISABLE", raising=False)
    monkeypatch.setattr(plugin, "_registered", False)
    plugin.register()
    first = ModelRegistry.models["Gemma4ForConditionalGeneration"]
    plugin.register()
    assert ModelRegistry.models["Gemma4ForConditionalGeneration"] is first
    assert (first.module_name, first.class_name) == (
        "gemma4_batched_encoder.vllm_model",
        "Gemma4ForConditionalGeneration",
    )


def test_entry_points_declared():
    general = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert general.get("gemma4_batched_encoder") == "gemma4_batched_encoder.plugin:register"
    stat = {ep.name: ep.value for ep in entry_points(group="vllm.stat_logger_plugins")}
    assert (
        stat.get("gemma4_latency")
        == "gemma4_batched_encoder.latency_metrics:Gemma4LatencyStatLogger"
    )


LOAD = """
from vllm.plugins import load_general_plugins
from vllm import ModelRegistry
load_general_plugins(); load_general_plugins()
cls = ModelRegistry._try_load_model_cls("Gemma4ForConditionalGeneration")
print("CLASS", cls.__module__, cls.__name__)
"""


@pytest.mark.parametrize(
    ("env", "module"),
    [
        ({}, "gemma4_batched_encoder.vllm_model"),
        ({"GEMMA4_ENCODER_DISABLE": "1"}, "vllm.model_executor.models.gemma4_mm"),
        ({"VLLM_PLUGINS": ""}, "vllm.model_executor.models.gemma4_mm"),
    ],
    ids=["enabled", "disabled_by_env", "vllm_plugins_empty"],
)
def test_vllm_loads_entry_point(env, module):
    """vLLM's own plugin loader (as in each of its processes) resolves the architecture."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("GEMMA4_", "VLLM_PLUG"))}
    full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", LOAD], env=full_env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"CLASS {module} Gemma4ForConditionalGeneration" in proc.stdout


def test_bad_env_value_does_not_register(monkeypatch):
    monkeypatch.setenv("GEMMA4_ENCODER_MODE", "turbo")
    monkeypatch.setattr(plugin, "_registered", False)
    plugin.register()  # logs, does not raise
    assert not plugin._registered


HOOKS = """
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.multimodal.video import VIDEO_LOADER_REGISTRY
from vllm.multimodal.media.video import VideoMediaIO
from vllm.multimodal.video_decoders import opencv
from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor
hooks = {
    "video_guard": getattr(VideoMediaIO.load_bytes, "_gemma4_media_guard", False),
    "fast_processor": getattr(Gemma4ImageProcessor._preprocess, "_gemma4_media_patched", False),
    "count_check": getattr(opencv.decode_opencv, "_gemma4_count_check", False),
}
print("HOOKS", sorted(k for k, v in hooks.items() if v))
"""


@pytest.mark.parametrize(
    ("env", "hooks"),
    [
        ({}, ["count_check", "fast_processor", "video_guard"]),
        ({"GEMMA4_ENCODER_DISABLE": "1"}, []),
        ({"GEMMA4_ENCODER_DISABLE": "1", "GEMMA4_ENCODER_MODE": "bogus"}, []),
    ],
    ids=["enabled", "disabled", "disabled_with_bad_value"],
)
def test_disable_installs_no_media_hooks(env, hooks):
    """GEMMA4_ENCODER_DISABLE=1 is stock vLLM: neither the encoder nor any media hook (video
    payload guard, fast processor, count check) is installed by vLLM's own plugin loader."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("GEMMA4_", "VLLM_PLUG"))}
    full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-c", HOOKS], env=full_env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"HOOKS {hooks}" in proc.stdout, proc.stdout[-2000:]
