"""vLLM's profile run is wrapped so that its encoder calls are not recorded (engine_profile.py);
the recording side is tested in test_encoder_metrics.py (the exposition fixture)."""

from __future__ import annotations

import importlib

import pytest

from gemma4_batched_encoder import engine_profile


@pytest.fixture
def runner(monkeypatch):
    """vLLM's (CPU build's) Model Runner V1 class, its profile_run restored afterwards."""
    cls = importlib.import_module("vllm.v1.worker.gpu_model_runner").GPUModelRunner
    monkeypatch.setattr(cls, "profile_run", cls.__dict__["profile_run"])
    return cls


def test_install_wraps_vllms_profile_run_once(runner):
    original = runner.__dict__["profile_run"]
    wrapped = engine_profile.install()
    assert "vllm.v1.worker.gpu_model_runner" in wrapped
    assert runner.profile_run is not original and runner.profile_run.__wrapped__ is original
    # the CPU runner inherits it: a CPU server's profile run is covered too
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    assert CPUModelRunner.profile_run is runner.profile_run
    assert "vllm.v1.worker.gpu_model_runner" not in engine_profile.install()  # not twice


def test_wrapped_profile_run_marks_its_thread_and_passes_through():
    seen = []

    def profile_run(self, randomize_inputs=False):
        seen.append((engine_profile.in_profile_run(), randomize_inputs))
        return "done"

    assert engine_profile.untimed(profile_run)(object(), randomize_inputs=True) == "done"
    assert seen == [(True, True)] and not engine_profile.in_profile_run()


def test_the_mark_is_cleared_when_the_profile_run_fails():
    def profile_run(self):
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        engine_profile.untimed(profile_run)(object())
    assert not engine_profile.in_profile_run()
