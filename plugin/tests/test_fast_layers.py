"""Fast mode's merged-weight layers (fast_layers.py): the layer's own arithmetic, and kept out
where the tower is not the structure they assume."""

from __future__ import annotations

import logging

import g4helpers as H
import pytest
import torch
from test_bit_identity import COMPOSITIONS

from gemma4_batched_encoder import Settings, fast_layers
from gemma4_batched_encoder.encoder import BatchedVisionEncoder
from gemma4_batched_encoder.fast_layers import MergedLayers, Unsupported
from gemma4_batched_encoder.fused import FusedLayers

STOCK_FAST = Settings(mode="fast", cuda_graphs=False, fused="off")


def _max_rel_diff(out: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    assert [o.shape for o in out] == [r.shape for r in ref]
    return max(((o - r).abs().max() / r.abs().max()).item() for o, r in zip(out, ref, strict=True))


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_merged_layers_compute_what_the_stock_layers_compute(compiled):
    # fp32: only the rounding order may differ (merged GEMMs, fused elementwise chains).
    tower = H.tower(torch.float32, seed=3)
    pvs, pps = H.batch(COMPOSITIONS["images_and_videos"], torch.float32, seed=3)
    ref = BatchedVisionEncoder(tower, STOCK_FAST).encode(pvs, pps)
    enc = BatchedVisionEncoder(
        tower, Settings(mode="fast", cuda_graphs=False, fused="on", fast_kernels="merged")
    )
    layers = enc.fast_layers(torch.device("cpu"), torch.float32)
    assert isinstance(layers, MergedLayers)
    if not compiled:
        layers.call = fast_layers._layer
    out = enc.encode(pvs, pps)
    assert _max_rel_diff(out, ref) < 1e-5


def test_merged_layers_are_far_from_a_wrong_layer():
    # The comparison above can fail: dropping one layer's MLP moves the output by far more.
    tower = H.tower(torch.float32, seed=3)
    pvs, pps = H.batch(COMPOSITIONS["one_video"], torch.float32, seed=3)
    ref = BatchedVisionEncoder(tower, STOCK_FAST).encode(pvs, pps)
    merged = MergedLayers(tower, compile=False)
    merged.weights[0]["down"] = torch.zeros_like(merged.weights[0]["down"])
    enc = BatchedVisionEncoder(tower, Settings(mode="fast", cuda_graphs=False, fused="on"))
    enc._fast_layers[(torch.device("cpu"), torch.float32)] = merged
    assert _max_rel_diff(enc.encode(pvs, pps), ref) > 1e-2


def test_clipped_linears_keep_the_compiled_stock_layers(caplog):
    tower = H.tower(torch.float32, seed=4, use_clipped_linears=True)
    with pytest.raises(Unsupported, match="clipped"):
        MergedLayers(tower)
    enc = BatchedVisionEncoder(
        tower, Settings(mode="fast", cuda_graphs=False, fused="on", fast_kernels="merged")
    )
    with caplog.at_level(logging.WARNING, logger="vllm.gemma4_batched_encoder"):
        layers = enc.fast_layers(torch.device("cpu"), torch.float32)
    assert isinstance(layers, FusedLayers)
    assert "GEMMA4_ENCODER_FAST_KERNELS=merged unsupported here (clipped linears)" in caplog.text


def test_fast_kernels_setting(monkeypatch):
    monkeypatch.delenv("GEMMA4_ENCODER_FAST_KERNELS", raising=False)
    assert Settings.from_env().fast_kernels == "merged-triton"
    monkeypatch.setenv("GEMMA4_ENCODER_FAST_KERNELS", "Merged-Triton")
    assert Settings.from_env().fast_kernels == "merged-triton"
    monkeypatch.setenv("GEMMA4_ENCODER_FAST_KERNELS", "fp8")
    with pytest.raises(ValueError, match="GEMMA4_ENCODER_FAST_KERNELS='fp8'"):
        Settings.from_env()


_KERNEL_CHECK = """
import json, torch
import g4helpers as H
from test_bit_identity import COMPOSITIONS
from gemma4_batched_encoder import Settings
from gemma4_batched_encoder.encoder import BatchedVisionEncoder
from gemma4_batched_encoder.qkv_kernel import qkv_norm_rope, qkv_norm_rope_reference, triton_usable
torch.manual_seed(0)
out = {"usable": triton_usable(torch.zeros(1)), "kernel": {}}
for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    b, n, h, d = 2, 37, 3, 16  # 74 rows: one full block of 64 and a masked one
    qkv, cos, sin = (torch.randn(b, n, w).to(dt) for w in (3 * h * d, d, d))
    qw, kw = torch.randn(d).to(dt), torch.randn(d).to(dt)
    got = qkv_norm_rope(qkv, cos, sin, qw, kw, h, 1e-6)
    ref = qkv_norm_rope_reference(qkv, cos, sin, qw, kw, h, 1e-6)
    out["kernel"][name] = [((g.float() - r.float()).abs().max() / r.abs().max()).item()
                           for g, r in zip(got, ref, strict=True)]
tower = H.tower(torch.float32, seed=3)
pvs, pps = H.batch(COMPOSITIONS["images_and_videos"], torch.float32, seed=3)
stock = Settings(mode="fast", cuda_graphs=False, fused="off")
ref = BatchedVisionEncoder(tower, stock).encode(pvs, pps)
enc = BatchedVisionEncoder(
    tower, Settings(mode="fast", cuda_graphs=False, fused="on", fast_kernels="merged-triton"))
got = enc.encode(pvs, pps)
out["encoder"] = max(((g - r).abs().max() / r.abs().max()).item() for g, r in zip(got, ref))
print(json.dumps(out))
"""


def test_the_triton_qkv_kernel_computes_the_layers_norms_and_rotary():
    # The kernel itself, run by triton's CPU interpreter (read when triton.jit decorates: a
    # fresh process): against the layer's ops, alone and inside the merged layers.
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(tests), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-c", _KERNEL_CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["usable"]
    assert max(result["kernel"]["fp32"]) < 1e-6
    assert max(result["kernel"]["bf16"]) < 2e-2  # one rounding where bf16 eager has several
    assert result["encoder"] < 1e-5
