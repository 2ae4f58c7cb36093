"""vLLM's profile run is wrapped so that its encoder calls are not recorded (engine_profile.py);
the recording side is tested in test_encoder_metrics.py (the exposition fixture). Also run on
vLLM 0.33's and 0.34's code (test_vllm_overlays.py): V1 and V2 there, V2 only on 0.34."""

from __future__ import annotations

import importlib

import pytest

from gemma4_batched_encoder import engine_profile
from gemma4_batched_encoder.metrics import recording


def runners() -> dict[str, type]:
    """This vLLM's runner classes that define profile_run, by ``module.Class``."""
    found = {}
    for module, cls in engine_profile.RUNNERS:
        try:
            runner = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            continue
        if "profile_run" in runner.__dict__:
            found[f"{module}.{cls}"] = runner
    return found


@pytest.fixture
def originals(monkeypatch):
    """Each runner's own profile_run, restored afterwards."""
    found = runners()
    for runner in found.values():
        monkeypatch.setattr(runner, "profile_run", runner.__dict__["profile_run"])
    return {name: runner.__dict__["profile_run"] for name, runner in found.items()}


def test_install_wraps_each_runners_profile_run_once(originals):
    assert originals, "no model runner with a profile_run in this vLLM"
    assert sorted(engine_profile.install()) == sorted(originals)
    for name, runner in runners().items():
        assert runner.profile_run.__wrapped__ is originals[name]
    assert engine_profile.install() == []  # not twice


def test_the_cpu_runner_inherits_a_wrapped_profile_run(originals):
    # the CPU runner this vLLM serves with (0.32's V1 subclass, 0.34's V2 one)
    for module in ("vllm.v1.worker.cpu_model_runner", "vllm.v1.worker.cpu.model_runner"):
        try:
            cpu_runner = importlib.import_module(module).CPUModelRunner
            break
        except ImportError:
            continue
    else:
        raise AssertionError("no CPUModelRunner in this vLLM")
    engine_profile.install()
    assert "profile_run" not in cpu_runner.__dict__
    assert cpu_runner.profile_run.__wrapped__ in originals.values()


def test_wrapped_profile_run_marks_its_thread_and_passes_through():
    seen = []

    def profile_run(self, randomize_inputs=False):
        seen.append((not recording(), randomize_inputs))
        return "done"

    assert engine_profile.untimed(profile_run)(object(), randomize_inputs=True) == "done"
    assert seen == [(True, True)] and recording()


def test_the_mark_is_cleared_when_the_profile_run_fails():
    def profile_run(self):
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        engine_profile.untimed(profile_run)(object())
    assert recording()
