"""The vLLM subclass against the real upstream vLLM methods, on real towers (CPU).

The model objects carry only what the encoding methods read (tower, projection, config, dtype);
everything they run is real upstream vLLM and plugin code. Failures injected here are real
exceptions raised inside the plugin path by inconsistent inputs.
"""

from __future__ import annotations

from dataclasses import fields, replace

import g4helpers as H
import pytest
import torch
from vllm.model_executor.models.gemma4_mm import Gemma4ForConditionalGeneration as Upstream

from gemma4_batched_encoder import vllm_model
from gemma4_batched_encoder.metrics import EncoderMetrics, get_metrics
from gemma4_batched_encoder.runtime import EncoderRuntime
from gemma4_batched_encoder.settings import Settings
from gemma4_batched_encoder.versions import Layout, parse_version, vllm_version

Plugin = vllm_model.Gemma4ForConditionalGeneration


@pytest.fixture(autouse=True)
def cpu_memory_info(monkeypatch):
    # Upstream (0.23+) asks the accelerator for free memory; this CUDA-build torch has no driver.
    try:
        torch.accelerator.get_memory_info()
    except Exception:
        monkeypatch.setattr(torch.accelerator, "get_memory_info", lambda *a: (8 << 30, 16 << 30))


def models(dtype, settings=None, active=True):
    vt = H.tower(dtype)
    stock = H.host_model(Upstream, vt, dtype)
    plugin = H.host_model(Plugin, vt, dtype)
    plugin.embed_vision = stock.embed_vision
    plugin._g4 = EncoderRuntime(vt, settings or Settings(), active, "test")
    plugin._g4_video_tokens = None
    return stock, plugin


def video_input(media, frame_counts, dtype, seed=0):
    pvs, pps = H.batch(media, dtype, seed=seed)
    return {
        "pixel_values_videos": torch.stack(pvs),
        "pixel_position_ids_videos": torch.stack(pps),
        "video_frame_counts": torch.tensor(frame_counts),
    }


def image_input(media, dtype, seed=0):
    pvs, pps = H.batch(media, dtype, seed=seed)
    return {"pixel_values": pvs, "pixel_position_ids": pps}


def counter(metric, **labels) -> float:
    m = metric.labels(**labels) if labels else metric
    return m._value.get()


def same(a, b):
    return len(a) == len(b) and all(
        x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b, strict=True)
    )


def test_layout_detected_for_installed_vllm():
    # `make test`: vLLM 0.32 (batched); test_vllm_overlays.py runs it on 0.33's and 0.34's code
    minor = parse_version(vllm_version())
    assert vllm_model.LAYOUT is (Layout.LOCAL if minor >= (0, 34) else Layout.BATCHED)
    assert Plugin.__name__ == Upstream.__name__ == "Gemma4ForConditionalGeneration"
    assert issubclass(Plugin, Upstream)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_video_and_image_paths_identical_to_stock(dtype):
    stock, plugin = models(dtype)
    vi = video_input([H.FRAME_480P] * 4 + [H.FRAME_720P] * 2, [2, 2, 2], dtype)
    assert same(plugin._process_video_input(vi), Upstream._process_video_input(stock, vi))
    ii = image_input([H.image(70), H.image(280), H.image(140, 0.5)], dtype)
    assert same(plugin._process_image_input(ii), Upstream._process_image_input(stock, ii))


def test_embed_multimodal_uses_host_token_counts_and_counts_call():
    dtype = torch.bfloat16
    stock, plugin = models(dtype)
    media = [H.FRAME_480P] * 3 + [H.FRAME_720P] * 3
    vi = video_input(media, [3, 3], dtype)
    tokens = [[63, 63, 63], [66, 66, 66]]
    before = counter(get_metrics().calls, path="plugin")
    out = plugin.embed_multimodal(**vi, video_num_soft_tokens=tokens)
    assert counter(get_metrics().calls, path="plugin") == before + 1
    assert same(out, Upstream._process_video_input(stock, vi))


def test_runtime_error_falls_back_to_stock_and_is_counted():
    dtype = torch.bfloat16
    stock, plugin = models(dtype)
    vi = video_input([H.FRAME_480P] * 2, [2], dtype)
    fallbacks = get_metrics().fallbacks
    before = counter(fallbacks, reason="ValueError")
    stock_before = counter(get_metrics().calls, path="stock")
    # Token counts that cannot be right make encode_frames raise inside the plugin path.
    out = plugin.embed_multimodal(**vi, video_num_soft_tokens=[[71, 71]])
    assert counter(fallbacks, reason="ValueError") == before + 1
    assert counter(get_metrics().calls, path="stock") == stock_before + 1
    assert same(out, Upstream._process_video_input(stock, vi))


def test_disabled_runtime_runs_stock_only():
    dtype = torch.float32
    stock, plugin = models(dtype, settings=replace(Settings(), disabled=True))
    assert not plugin._g4.active
    plugin._g4.encoder.encode = None  # would raise TypeError if the plugin path were taken
    vi = video_input([H.FRAME_480P] * 2, [2], dtype)
    before = counter(get_metrics().fallbacks, reason="TypeError")
    assert same(plugin._process_video_input(vi), Upstream._process_video_input(stock, vi))
    assert counter(get_metrics().fallbacks, reason="TypeError") == before


def test_shadow_verify_counts_checks_and_mismatches():
    dtype = torch.bfloat16
    m = get_metrics()
    stock, plugin = models(dtype, settings=replace(Settings(), verify_every=1))
    vi = video_input([H.FRAME_480P] * 3, [3], dtype)
    checks, mism = counter(m.verify_checks), counter(m.verify_mismatches)
    plugin._process_video_input(vi)
    assert counter(m.verify_checks) == checks + 1
    assert counter(m.verify_mismatches) == mism
    # fast mode is not bitwise: the shadow check catches it and the stock result is served
    stock, fast = models(dtype, settings=replace(Settings(), verify_every=1, mode="fast"))
    vi = video_input([H.FRAME_480P] * 3, [3], dtype, seed=1)
    out = fast._process_video_input(vi)
    assert counter(m.verify_checks) == checks + 2
    assert counter(m.verify_mismatches) == mism + 1
    assert same(out, Upstream._process_video_input(stock, vi))


def test_serial_layout_projects_per_item(monkeypatch):
    """0.20-0.22 project each frame on its own: the adapter reproduces that grouping."""
    dtype = torch.float32
    stock, plugin = models(dtype)
    monkeypatch.setattr(vllm_model, "LAYOUT", Layout.SERIAL)
    vi = video_input([H.FRAME_480P] * 4, [1, 3], dtype)
    out = plugin._process_video_input(vi)
    vt, ev = stock.vision_tower, stock.embed_vision
    want = []
    for start, n in ((0, 1), (1, 3)):
        frames = []
        for i in range(start, start + n):
            pv = vi["pixel_values_videos"][i : i + 1]
            pp = vi["pixel_position_ids_videos"][i : i + 1]
            with torch.inference_mode():
                soft = vt(pv, pp).last_hidden_state
                frames.append(ev(inputs_embeds=soft.unsqueeze(0)).squeeze(0))
        want.append(torch.cat(frames))
    assert same(out, want)


def test_encoder_cudagraph_forward_override_matches_upstream_on_cpu():
    """vLLM's own encoder-graph entry point, with the per-item pooler GEMMs, on padded buffers."""
    dtype = torch.bfloat16
    stock, plugin = models(dtype)
    pvs, pps = H.batch([H.FRAME_480P, H.FRAME_720P, H.FRAME_FULL], dtype, seed=5)
    tokens = [63, 66, 70]
    gather = torch.cat([torch.arange(n) + i * 70 for i, n in enumerate(tokens)])
    inputs = {
        "pixel_values": torch.stack(pvs),
        "pixel_position_ids": torch.stack(pps),
        "gather_indices": gather,
    }
    with torch.inference_mode():
        got = plugin.encoder_cudagraph_forward(inputs)
        want = Upstream.encoder_cudagraph_forward(stock, inputs)
    assert got.shape == (sum(tokens), 48)
    assert torch.equal(got, want)


def test_plugin_setup_failure_leaves_stock_methods(monkeypatch):
    """A broken environment at model construction must not take the model down."""
    dtype = torch.float32
    stock, plugin = models(dtype)
    plugin._g4 = None  # what __init__ leaves when the runtime cannot be built
    vi = video_input([H.FRAME_480P] * 2, [2], dtype)
    assert same(plugin.embed_multimodal(**vi), Upstream._process_video_input(stock, vi))
    ii = image_input([H.image(70)], dtype)
    assert same(plugin._process_image_input(ii), Upstream._process_image_input(stock, ii))


def test_encoder_cudagraph_forward_error_falls_back_to_stock(monkeypatch):
    """An error inside the override runs upstream's forward and is counted, as on the other
    overridden paths (a fault injected into the plugin's pooler)."""
    dtype = torch.bfloat16
    stock, plugin = models(dtype)
    pvs, pps = H.batch([H.FRAME_480P, H.FRAME_720P], dtype, seed=6)
    gather = torch.cat([torch.arange(63), torch.arange(66) + 70])
    inputs = {
        "pixel_values": torch.stack(pvs),
        "pixel_position_ids": torch.stack(pps),
        "gather_indices": gather,
    }

    def broken_pool(*args, **kwargs):
        raise RuntimeError("pooler failed")

    monkeypatch.setattr(vllm_model, "pool_exact", broken_pool)
    fallbacks = get_metrics().fallbacks
    before = counter(fallbacks, reason="RuntimeError")
    with torch.inference_mode():
        got = plugin.encoder_cudagraph_forward(inputs)
        want = Upstream.encoder_cudagraph_forward(stock, inputs)
    assert torch.equal(got, want)
    assert counter(fallbacks, reason="RuntimeError") == before + 1


def test_encoder_cudagraph_forward_error_during_capture_is_raised(monkeypatch):
    """Inside vLLM's CUDA-graph capture an error in the override is raised, not served by
    upstream's forward: the plugin's kernels before the error are in the graph already, so a
    fallback would be captured beside them and every replay would run the encoder twice. (A CPU
    cannot capture: the capture state and the fault are injected.)"""
    dtype = torch.bfloat16
    _, plugin = models(dtype)
    pvs, pps = H.batch([H.FRAME_480P], dtype, seed=7)
    inputs = {
        "pixel_values": torch.stack(pvs),
        "pixel_position_ids": torch.stack(pps),
        "gather_indices": torch.arange(63),
    }

    def broken_pool(*args, **kwargs):
        raise RuntimeError("pooler failed")

    def upstream_called(*args, **kwargs):
        raise AssertionError("upstream's forward ran inside the capture")

    monkeypatch.setattr(vllm_model, "pool_exact", broken_pool)
    monkeypatch.setattr(Upstream, "encoder_cudagraph_forward", upstream_called)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    fallbacks = get_metrics().fallbacks
    before = counter(fallbacks, reason="RuntimeError")
    with torch.inference_mode(), pytest.raises(RuntimeError, match="pooler failed"):
        plugin.encoder_cudagraph_forward(inputs)
    assert counter(fallbacks, reason="RuntimeError") == before  # nothing ran stock


class BrokenMetric:
    """A metrics backend that fails on every update (fault injection: the error path)."""

    def labels(self, **labels):
        return self

    def inc(self, *args):
        raise OSError("metrics file gone")

    observe = set = inc


def test_metric_errors_never_fail_the_call(caplog):
    """Fallback and shadow verification record metrics; when recording fails, the request is
    still answered (with the stock result where it would be) and the error logged once."""
    dtype = torch.bfloat16
    broken = EncoderMetrics(**{f.name: BrokenMetric() for f in fields(EncoderMetrics)})
    vi = video_input([H.FRAME_480P] * 2, [2], dtype)
    with caplog.at_level("WARNING", logger="vllm.gemma4_batched_encoder"):
        # the plugin path fails (impossible token counts): the stock result, no exception
        stock, plugin = models(dtype)
        plugin._g4.metrics = broken
        want = Upstream._process_video_input(stock, vi)
        assert same(plugin.embed_multimodal(**vi, video_num_soft_tokens=[[71, 71]]), want)
        # shadow verification, equal and (fast mode) mismatching: served as without the error
        stock, exact = models(dtype, settings=replace(Settings(), verify_every=1))
        exact._g4.metrics = broken
        assert same(exact._process_video_input(vi), want)
        stock, fast = models(dtype, settings=replace(Settings(), verify_every=1, mode="fast"))
        fast._g4.metrics = broken
        assert same(fast._process_video_input(vi), want)
        assert same(fast._process_video_input(vi), want)  # a second time: no second log
    for runtime in (plugin._g4, exact._g4, fast._g4):
        assert "metrics" in runtime._logged
    logged = [r for r in caplog.records if "recording metrics failed" in r.getMessage()]
    assert len(logged) == 3  # once per runtime (model), not once per call
