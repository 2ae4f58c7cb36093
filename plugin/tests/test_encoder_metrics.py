"""Metric names, types and labels as docs/architecture.md states them, in multi-process mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).parents[1] / "src")

SCRIPT = """
import torch
from dataclasses import replace
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from gemma4_batched_encoder import synthetic as S
from gemma4_batched_encoder.metrics import get_metrics
from gemma4_batched_encoder.runtime import EncoderRuntime
from gemma4_batched_encoder.settings import Settings

vt = S.build_vision_tower(S.vision_config_kwargs("tiny"))
rt = EncoderRuntime(vt, Settings(), True, "0.32.0")
assert get_metrics() is get_metrics()  # created once per process
pvs, pps = S.make_batch([S.Media("frame", (21, 27), 70)] * 2, 768, 3)
# vLLM's profile run (engine_profile.py): runs the plugin, records nothing
from gemma4_batched_encoder.metrics import unrecorded
with unrecorded():
    rt.begin_call(frames=2, images=0)
    rt.run(lambda a: rt.encoder.encode(*a), lambda a: [], (pvs, pps))
    rt.end_call()
rt.begin_call(frames=2, images=0)
rt.run(lambda a: rt.encoder.encode(*a), lambda a: [], (pvs, pps))
rt.end_call()
# CUDA graphs cannot be captured on a CPU: a stand-in runner reports what a GPU's would.
from types import SimpleNamespace
rt.encoder.graphs = SimpleNamespace(num_graphs=3, num_failed=1)
rt.begin_call(frames=0, images=1)
rt.run(lambda a: 1 / 0, lambda a: [], None)
rt.end_call()
registry = CollectorRegistry()
MultiProcessCollector(registry)
print(generate_latest(registry).decode())
"""


@pytest.fixture(scope="module")
def exposition(tmp_path_factory) -> str:
    mp = tmp_path_factory.mktemp("prom-mp")
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp), "PYTHONPATH": SRC}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def sample(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} {labels} in:\n{text}")


def test_info_gauge(exposition):
    assert "# TYPE gemma4_encoder_info gauge" in exposition
    value = sample(
        exposition, "gemma4_encoder_info", mode="exact", fast_kernels="none",
        cuda_graphs="false", vllm_version="0.32.0", plugin_version="0.1.0",
    )  # fmt: skip
    assert value == 1


def test_info_names_fast_modes_layers_in_force():
    # fast mode's layers are on the info gauge (exact and stock say "none"), and a change after
    # the first call (here: the compiled layers given up after a run-time failure) is reported
    script = (
        "import torch\n"
        "from prometheus_client import generate_latest\n"
        "from gemma4_batched_encoder import synthetic as S\n"
        "from gemma4_batched_encoder.runtime import EncoderRuntime\n"
        "from gemma4_batched_encoder.settings import Settings\n"
        "vt = S.build_vision_tower(S.vision_config_kwargs('tiny'))\n"
        "s = Settings(mode='fast', cuda_graphs=False, fused='on', fast_kernels='merged')\n"
        "rt = EncoderRuntime(vt, s, True, '0.32.0')\n"
        "print(generate_latest().decode())\n"
        # the compiled layers fail at run time: the encoder runs them eagerly from then on
        "layers = rt.encoder.fast_layers(torch.device('cpu'), torch.float32)\n"
        "def boom(*args, **kwargs): raise RuntimeError('compiled layers failed')\n"
        "layers.hidden = boom\n"
        "pvs, pps = S.make_batch([S.Media('frame', (6, 6), 4)], 3 * 16 * 16, 3)\n"
        "rt.begin_call(frames=1, images=0)\n"
        "rt.encoder.encode(pvs, pps)\n"
        "rt.end_call()\n"
        "print('-- after --')\n"
        "print(generate_latest().decode())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    proc = subprocess.run(
        [sys.executable, "-c", script], env={**env, "PYTHONPATH": SRC},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after = proc.stdout.split("-- after --")
    labels = {"mode": "fast", "cuda_graphs": "false", "vllm_version": "0.32.0"}
    assert sample(before, "gemma4_encoder_info", fast_kernels="merged", **labels) == 1
    assert sample(after, "gemma4_encoder_info", fast_kernels="eager", **labels) == 1
    assert sample(after, "gemma4_encoder_info", fast_kernels="merged", **labels) == 0


def test_a_rank_that_does_not_record_builds_no_timer_and_sets_no_info(monkeypatch):
    """A process that does not record (TP rank > 0) builds no CallTimer (CUDA events per call on
    a GPU) and never reaches the process's metrics, not even for the info gauge."""
    from gemma4_batched_encoder import metrics, runtime
    from gemma4_batched_encoder import synthetic as S
    from gemma4_batched_encoder.settings import Settings

    def forbidden(*args, **kwargs):
        raise AssertionError("used on a rank that does not record")

    monkeypatch.setattr(runtime, "records_metrics", lambda: False)
    monkeypatch.setattr(runtime, "CallTimer", forbidden)
    monkeypatch.setattr(runtime, "get_metrics", forbidden)
    monkeypatch.setattr(metrics, "get_metrics", forbidden)
    vt = S.build_vision_tower(S.vision_config_kwargs("tiny"))
    rt = runtime.EncoderRuntime(vt, Settings(cuda_graphs=False), True, "0.32.0")
    assert rt.timer is None and rt.metrics is metrics.NO_METRICS
    pvs, pps = S.make_batch([S.Media("frame", (6, 6), 4)], 3 * 16 * 16, 3)
    rt.begin_call(frames=1, images=0)
    rt.run(lambda a: rt.encoder.encode(*a), lambda a: [], (pvs, pps))
    rt.end_call()
    assert "metrics" not in rt._logged  # begin_call/end_call did not fail over the timer
    metrics.set_info("fast", True, "0.32.0", "0.1.0", metrics=metrics.NO_METRICS)


INFO_SCRIPT = """
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from gemma4_batched_encoder.metrics import set_info
set_info("fast", True, "0.32.0", "0.1.0", fast_kernels="merged")
set_info("fast", True, "0.32.0", "0.1.0", fast_kernels="eager")
set_info("fast", True, "0.32.0", "0.1.0", fast_kernels="eager")
registry = CollectorRegistry()
MultiProcessCollector(registry)
print(generate_latest(registry).decode())
"""


def test_info_change_in_multiprocess_mode_leaves_one_label_set_at_1(tmp_path):
    """vLLM serves /metrics from PROMETHEUS_MULTIPROC_DIR's files, where Gauge.clear() removes
    nothing: the replaced label set must read 0, the one in force 1."""
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": SRC}
    proc = subprocess.run(
        [sys.executable, "-c", INFO_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    labels = {"mode": "fast", "cuda_graphs": "true", "vllm_version": "0.32.0"}
    assert sample(proc.stdout, "gemma4_encoder_info", fast_kernels="eager", **labels) == 1
    assert sample(proc.stdout, "gemma4_encoder_info", fast_kernels="merged", **labels) == 0
    ones = [
        line
        for line in proc.stdout.splitlines()
        if line.startswith("gemma4_encoder_info{") and line.endswith(" 1.0")
    ]
    assert len(ones) == 1, ones


def test_calls_items_seconds_fallbacks(exposition):
    # one plugin call each, not two: the first ran inside vLLM's profile run
    assert sample(exposition, "gemma4_encoder_calls_total", path="plugin") == 1
    assert sample(exposition, "gemma4_encoder_calls_total", path="stock") == 1
    assert sample(exposition, "gemma4_encoder_items_per_call_count", kind="frame") == 1
    assert sample(exposition, "gemma4_encoder_items_per_call_sum", kind="frame") == 2
    assert sample(exposition, "gemma4_encoder_items_per_call_count", kind="image") == 1
    assert sample(exposition, "gemma4_encoder_seconds_count", path="plugin") == 1
    assert sample(exposition, "gemma4_encoder_seconds_bucket", path="plugin", le="+Inf") == 1
    assert 'gemma4_encoder_seconds_bucket{le="0.001",path="plugin"}' in exposition
    assert sample(exposition, "gemma4_encoder_fallbacks_total", reason="ZeroDivisionError") == 1
    assert "gemma4_encoder_verify_checks_total" in exposition
    assert "gemma4_encoder_verify_mismatches_total" in exposition
    assert sample(exposition, "gemma4_encoder_fused_layers") == 0  # auto: CUDA only


def test_cuda_graph_counts(exposition):
    assert "# TYPE gemma4_encoder_cuda_graphs gauge" in exposition
    assert sample(exposition, "gemma4_encoder_cuda_graphs", state="captured") == 3
    assert sample(exposition, "gemma4_encoder_cuda_graphs", state="failed") == 1


TP_SCRIPT = """
import sys
from gemma4_batched_encoder.metrics import records_metrics
before = records_metrics()  # no model-parallel groups yet (verify, bench): records
rank, port, tp, pp = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed.parallel_state import (
    init_distributed_environment, initialize_model_parallel,
)
with set_current_vllm_config(VllmConfig()):
    init_distributed_environment(
        world_size=2, rank=rank, local_rank=rank, backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{port}",
    )
    initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
from gemma4_batched_encoder import engine_graph_ranges
from gemma4_batched_encoder import synthetic as S
from gemma4_batched_encoder.runtime import EncoderRuntime
from gemma4_batched_encoder.settings import Settings
vt = S.build_vision_tower(S.vision_config_kwargs("tiny"))
rt = EncoderRuntime(vt, Settings(), True, "0.32.0")
pvs, pps = S.make_batch([S.Media("frame", (21, 27), 70)] * 2, 768, 3)
# vLLM's profile run (engine_profile.py): runs the plugin, records nothing
from gemma4_batched_encoder.metrics import unrecorded
with unrecorded():
    rt.begin_call(frames=2, images=0)
    rt.run(lambda a: rt.encoder.encode(*a), lambda a: [], (pvs, pps))
    rt.end_call()
rt.begin_call(frames=2, images=0)
rt.run(lambda a: rt.encoder.encode(*a), lambda a: [], (pvs, pps))
rt.run(lambda a: 1 / 0, lambda a: [], None)
rt.end_call()
engine_graph_ranges._count_refusal()
print("RECORDS", rank, before, records_metrics())
"""


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tensor", "pipeline"])
def test_model_parallel_ranks_record_once(tmp_path, tp, pp):
    """Two real model-parallel ranks (vLLM's own groups, gloo on the CPU) run the same encoder
    call and refuse the same step: only rank 0 records, so /metrics counts one, not one per rank.
    Tensor parallel: every rank runs the encoder. Pipeline parallel: vLLM runs it on the first
    stage only, but every stage's runner dispatches (and refuses) the step."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    mp = tmp_path / "prom-mp"
    mp.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp), "PYTHONPATH": SRC}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", TP_SCRIPT, str(rank), port, str(tp), str(pp)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        outs.append(out)
    assert "RECORDS 0 True True" in outs[0]
    assert "RECORDS 1 True False" in outs[1]
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(mp))
    text = generate_latest(registry).decode()
    assert sample(text, "gemma4_encoder_calls_total", path="stock") == 1  # the fallback's call
    assert sample(text, "gemma4_encoder_items_per_call_sum", kind="frame") == 2
    assert sample(text, "gemma4_encoder_fallbacks_total", reason="ZeroDivisionError") == 1
    assert sample(text, "gemma4_engine_full_graph_refusals_total") == 1
    assert sample(text, "gemma4_encoder_info", mode="exact", vllm_version="0.32.0") == 1
