"""GEMMA4_ENGINE_TORCH_THREADS: parsed with the other settings; torch's intra-op thread count set
once, at model construction, in the process that runs the model (off by default; auto: 1 where
vLLM does not set it itself), and never on a CPU platform."""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

import g4helpers as H
import pytest
import torch
from torch import nn

from gemma4_batched_encoder import engine_threads, vllm_model
from gemma4_batched_encoder.engine_threads import ENV, set_engine_torch_threads
from gemma4_batched_encoder.settings import Settings

LOGGER = "vllm.gemma4_batched_encoder"


@pytest.fixture(autouse=True)
def restore_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
    assert torch.get_num_threads() == before


def other_count() -> int:
    """A thread count different from the current one (so that setting it is observable)."""
    return 1 if torch.get_num_threads() != 1 else 2


# -- settings -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "want"),
    [(None, 0), ("", 0), ("  ", 0), ("auto", None), ("AUTO", None), ("off", 0),
     ("0", 0), ("4", 4)],
)  # fmt: skip
def test_setting_parses(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, raw)
    assert Settings.from_env().engine_torch_threads == want


def test_setting_defaults_to_off():
    # auto made the H200 server slower at the SLO rate (settings.py); it stays an option.
    assert Settings().engine_torch_threads == 0


@pytest.mark.parametrize("raw", ["four", "-1", "2.5", "1e3"])
def test_bad_setting_raises_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv(ENV, raw)
    with pytest.raises(ValueError, match=ENV):
        Settings.from_env()


# -- the function -------------------------------------------------------------------------------
def test_sets_torch_threads_off_cpu_and_nothing_else(caplog):
    old, want = torch.get_num_threads(), other_count()
    interop, env = torch.get_num_interop_threads(), dict(os.environ)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert set_engine_torch_threads(want, on_cpu_platform=False) is True
    assert torch.get_num_threads() == want
    assert torch.get_num_interop_threads() == interop
    assert dict(os.environ) == env
    lines = [r.getMessage() for r in caplog.records if ENV in r.getMessage()]
    assert len(lines) == 1
    assert f"{old} -> {want}" in lines[0]


def test_leaves_threads_alone_on_cpu(caplog):
    old = torch.get_num_threads()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert set_engine_torch_threads(other_count(), on_cpu_platform=True) is False
    assert torch.get_num_threads() == old
    lines = [r.getMessage() for r in caplog.records if ENV in r.getMessage()]
    assert len(lines) == 1
    assert "CPU platform" in lines[0]


@pytest.mark.parametrize("on_cpu", [False, True])
def test_zero_leaves_threads_alone_silently(caplog, on_cpu):
    old = torch.get_num_threads()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert set_engine_torch_threads(0, on_cpu_platform=on_cpu) is False
    assert torch.get_num_threads() == old
    assert not [r for r in caplog.records if ENV in r.getMessage()]


def test_auto_sets_one_thread_where_vllm_does_not(monkeypatch, caplog):
    monkeypatch.setattr(engine_threads, "vllm_sets_threads_itself", lambda: False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert set_engine_torch_threads(None, on_cpu_platform=False) is True
    assert torch.get_num_threads() == 1
    assert any("2 -> 1" in r.getMessage() and "auto" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("omp", "vllm_does_it"), [("3", False), (None, True)])
def test_auto_leaves_threads_to_omp_num_threads_or_to_vllm(monkeypatch, omp, vllm_does_it):
    monkeypatch.setattr(engine_threads, "vllm_sets_threads_itself", lambda: vllm_does_it)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    torch.set_num_threads(2)
    assert set_engine_torch_threads(None, on_cpu_platform=False) is False
    assert torch.get_num_threads() == 2


def test_auto_is_silent_on_cpu(monkeypatch, caplog):
    monkeypatch.setattr(engine_threads, "vllm_sets_threads_itself", lambda: False)
    old = torch.get_num_threads()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert set_engine_torch_threads(None, on_cpu_platform=True) is False
    assert torch.get_num_threads() == old
    assert not [r for r in caplog.records if ENV in r.getMessage()]


def test_this_vllm_sets_its_serving_threads_itself():
    # vLLM 0.32 (here) has set_torch_threads_for_runtime; 0.20-0.26 do not (read in their wheels).
    assert engine_threads.vllm_sets_threads_itself()


# -- called from the model class's constructor ---------------------------------------------------
def construct_plugin_model(monkeypatch):
    """The plugin's model class built through its own __init__, upstream's replaced by a stub
    that only provides the vision tower (no vLLM config, no weights)."""

    def upstream_init(self, *, vllm_config, prefix=""):
        nn.Module.__init__(self)
        self.vision_tower = H.tower(torch.float32)

    monkeypatch.setattr(vllm_model._Upstream, "__init__", upstream_init)
    # The constructor's engine patches change vLLM classes: restored after each test.
    from vllm.multimodal.inputs import BaseMultiModalField, PlaceholderRange

    for cls, attr in (
        (PlaceholderRange, "extract_embeds_range"),
        (BaseMultiModalField, "reduce_data"),
    ):
        monkeypatch.setattr(cls, attr, vars(cls)[attr])
    config = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.float32))
    return vllm_model.Gemma4ForConditionalGeneration(vllm_config=config)


@pytest.mark.parametrize("on_cpu", [False, True])
def test_model_construction_applies_the_setting(monkeypatch, on_cpu):
    monkeypatch.setenv(ENV, str(other_count()))
    monkeypatch.setattr(vllm_model.current_platform, "is_cpu", lambda: on_cpu)
    calls = []
    real = engine_threads.set_engine_torch_threads
    monkeypatch.setattr(
        vllm_model, "set_engine_torch_threads", lambda n, c: calls.append((n, c)) or real(n, c)
    )
    old, want = torch.get_num_threads(), other_count()
    model = construct_plugin_model(monkeypatch)
    assert calls == [(want, on_cpu)]
    assert torch.get_num_threads() == (old if on_cpu else want)
    assert model._g4 is not None  # the encoder runtime is unaffected


@pytest.mark.parametrize("vllm_does_it", [True, False])
def test_model_construction_with_auto(monkeypatch, vllm_does_it):
    monkeypatch.setenv(ENV, "auto")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(vllm_model.current_platform, "is_cpu", lambda: False)
    monkeypatch.setattr(engine_threads, "vllm_sets_threads_itself", lambda: vllm_does_it)
    torch.set_num_threads(2)
    construct_plugin_model(monkeypatch)
    assert torch.get_num_threads() == (2 if vllm_does_it else 1)


def test_a_failing_engine_patch_leaves_the_encoder_override(monkeypatch, caplog):
    from gemma4_batched_encoder import engine_mm_batching, engine_mm_ranges

    def broken(*args):
        raise RuntimeError("vLLM moved a class")

    batching = []
    monkeypatch.setattr(engine_mm_ranges, "install", broken)
    monkeypatch.setattr(engine_mm_batching, "install", lambda *a: batching.append(a))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        model = construct_plugin_model(monkeypatch)
    assert "GEMMA4_ENGINE_ASYNC_RANGES not applied" in caplog.text
    assert batching  # the next patch still ran
    assert model._g4 is not None and "plugin setup failed" not in caplog.text
