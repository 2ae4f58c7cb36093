"""Fast mode's merged-weight layers (fast_layers.py): the layer's own arithmetic, and kept out
where the tower is not the structure they assume."""

from __future__ import annotations

import logging

import g4helpers as H
import pytest
import torch
from test_bit_identity import COMPOSITIONS

from gemma4_batched_encoder import Settings, fast_layers, fp8_quant
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
        layers.call, layers._embed = fast_layers._layer, fast_layers._embed
    out = enc.encode(pvs, pps)
    assert enc._fast_layers[(torch.device("cpu"), torch.float32)] is layers  # ran, no fallback
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_merged_layers_embed_valid_patches_as_the_towers_embedder(dtype):
    # Valid patches only (fast mode slices the padding off): eagerly the embedder's own ops and
    # bits; compiled (one kernel for both table lookups and the adds), within rounding.
    tower = H.tower(dtype, seed=5)
    pvs, pps = H.batch(COMPOSITIONS["one_video"], dtype, seed=5)
    valid = int((pps[0] != -1).all(-1).sum())
    pv, pp = torch.stack(pvs)[:, :valid], torch.stack(pps)[:, :valid]
    with torch.no_grad():
        ref = tower.patch_embedder(pv, pp, torch.zeros(pp.shape[:2], dtype=torch.bool))
        layers = MergedLayers(tower)
        eager = fast_layers._embed(pv, pp, layers.embed_weight, layers.position_table)
        compiled = layers.embed(pv, pp)
    assert torch.equal(eager, ref)
    assert compiled.dtype == ref.dtype
    step = torch.finfo(dtype).eps * ref.abs().max()
    assert (compiled.float() - ref.float()).abs().max() <= 2 * step
    # and not trivially: a lookup of the other axis' table moves it by far more
    wrong = fast_layers._embed(pv, pp.flip(-1), layers.embed_weight, layers.position_table)
    assert (wrong.float() - ref.float()).abs().max() > 100 * step


def test_an_input_projection_that_is_not_plain_keeps_the_towers_embedder():
    tower = H.tower(torch.float32, seed=5)
    tower.patch_embedder.input_proj.bias = torch.nn.Parameter(torch.ones(tower.config.hidden_size))
    layers = MergedLayers(tower, compile=False)  # the encoder layers are still merged
    pv, pp = torch.zeros(1, 9, 3 * tower.config.patch_size**2), torch.zeros(1, 9, 2).long()
    assert layers.embed(pv, pp) is None  # fast_chunk then calls tower.patch_embedder


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
    # the metrics report the layers in force, not the unsupported choice
    assert enc.fast_kernels_in_force(torch.device("cpu")) == "stock"


def test_fast_kernels_in_force_names_what_runs():
    from dataclasses import replace

    tower = H.tower(torch.float32, seed=4)
    cpu = torch.device("cpu")
    base = Settings(mode="fast", cuda_graphs=False, fast_kernels="merged")
    assert BatchedVisionEncoder(tower, base).fast_kernels_in_force(cpu) == "eager"  # auto: CUDA
    compiled = BatchedVisionEncoder(tower, replace(base, compile_fast=True))
    assert compiled.fast_kernels_in_force(cpu) == "compiled-pass"
    enc = BatchedVisionEncoder(tower, replace(base, fused="on"))
    assert enc.fast_kernels_in_force(cpu) == "merged"  # before the first call: what it builds
    assert isinstance(enc.fast_layers(cpu, torch.float32), MergedLayers)
    assert enc.fast_kernels_in_force(cpu) == "merged"
    enc._fast_layers[(cpu, torch.float32)] = None  # as after a run-time failure
    assert enc.fast_kernels_in_force(cpu) == "eager"


def test_every_fast_kernels_choice_builds_its_layers():
    # the setting's names and the merged layers' switches are one list (fast_layers.CHOICES)
    from typing import get_args

    from gemma4_batched_encoder.settings import FastKernels

    assert set(get_args(FastKernels)) == {"stock", *fast_layers.CHOICES}


def test_fast_kernels_setting(monkeypatch):
    monkeypatch.delenv("GEMMA4_ENCODER_FAST_KERNELS", raising=False)
    assert Settings.from_env().fast_kernels == "merged-triton"
    monkeypatch.setenv("GEMMA4_ENCODER_FAST_KERNELS", "Merged-Triton")
    assert Settings.from_env().fast_kernels == "merged-triton"
    monkeypatch.setenv("GEMMA4_ENCODER_FAST_KERNELS", "merged-triton-fp8")
    assert Settings.from_env().fast_kernels == "merged-triton-fp8"
    monkeypatch.setenv("GEMMA4_ENCODER_FAST_KERNELS", "fp4")
    with pytest.raises(ValueError, match=r"GEMMA4_ENCODER_FAST_KERNELS='fp4'.*merged-triton-fp8"):
        Settings.from_env()


def test_the_fp8_gemm_is_the_product_of_its_dequantized_operands():
    # What _scaled_mm must compute with row scales for x and column scales for the weight: an
    # exchanged or transposed scale would give another product. bf16 out: one rounding.
    torch.manual_seed(0)
    x = torch.randn(3, 37, 64) * torch.logspace(-2, 2, 64)  # rows and columns of other ranges
    weight = torch.randn(48, 64) * torch.logspace(-1, 1, 48)[:, None]
    wq, w_scale = fp8_quant.quantize_rows(weight)
    w = {"m": wq, "m_scale": w_scale.t().contiguous()}
    xq, x_scale = fp8_quant.quantize_rows(x.reshape(-1, 64))
    expected = (xq.float() * x_scale) @ (wq.float() * w_scale).t()
    got = fast_layers._linear(x, w, "m").reshape(-1, 48)
    assert got.dtype == torch.float32
    assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-2
    # and quantizing is what changes the result (fp8 rounds at 1/16 relative)
    assert ((got - x.reshape(-1, 64) @ weight.t()).abs().max() / expected.abs().max()) > 1e-3


def test_fp8_layers_quantize_every_gemm_and_stay_near_the_stock_layers():
    tower = H.tower(torch.float32, seed=3)
    pvs, pps = H.batch(COMPOSITIONS["images_and_videos"], torch.float32, seed=3)
    ref = BatchedVisionEncoder(tower, STOCK_FAST).encode(pvs, pps)
    enc = BatchedVisionEncoder(
        tower,
        Settings(mode="fast", cuda_graphs=False, fused="on", fast_kernels="merged-triton-fp8"),
    )
    layers = enc.fast_layers(torch.device("cpu"), torch.float32)
    assert isinstance(layers, MergedLayers)
    for w in layers.weights:
        for name in fast_layers.GEMMS:
            assert w[name].dtype == torch.float8_e4m3fn
            assert w[name + "_scale"].shape == (1, w[name].shape[0])
    layers.call = fast_layers._layer  # eager: the compiled call is the same _layer
    out = enc.encode(pvs, pps)
    assert enc._fast_layers[(torch.device("cpu"), torch.float32)] is layers  # ran, no fallback
    # per item, relative to its norm: bf16 against fp32 is ~0.025 on this tower, fp8 ~0.13
    errors = [((o - r).norm() / r.norm()).item() for o, r in zip(out, ref, strict=True)]
    assert 1e-3 < max(errors) < 0.25, errors


def test_fused_norms_compute_what_the_fp8_layers_compute():
    """merged-triton-fp8-norms moves each residual add + norm + quantize into one op; where its
    Triton kernel does not run (this CPU without the interpreter) the op is the same torch ops,
    so the encoder's output is bit-identical to merged-triton-fp8's (the kernel itself:
    fp8_kernel_check.py)."""
    tower = H.tower(torch.float32, seed=3)
    pvs, pps = H.batch(COMPOSITIONS["images_and_videos"], torch.float32, seed=3)
    outs = []
    for kernels in ("merged-triton-fp8", "merged-triton-fp8-norms"):
        settings = Settings(mode="fast", cuda_graphs=False, fused="on", fast_kernels=kernels)
        enc = BatchedVisionEncoder(tower, settings)
        layers = enc.fast_layers(torch.device("cpu"), torch.float32)
        assert isinstance(layers, MergedLayers)
        assert layers.fused_norms == kernels.endswith("-norms")
        layers.call = fast_layers._layer  # eager
        outs.append(enc.encode(pvs, pps))
    assert all(torch.equal(a, b) for a, b in zip(*outs, strict=True))
    with pytest.raises(fast_layers.Unsupported, match="float8 GEMMs only"):
        MergedLayers(tower, triton_qkv=True, fused_norms=True)


def test_fp8_unavailable_keeps_the_compiled_stock_layers(monkeypatch, caplog):
    # e.g. a CUDA device before compute capability 8.9, which this machine cannot show
    monkeypatch.setattr(fast_layers, "fp8_gemm_error", lambda device: "no float8 GEMMs here")
    tower = H.tower(torch.float32, seed=4)
    enc = BatchedVisionEncoder(
        tower,
        Settings(mode="fast", cuda_graphs=False, fused="on", fast_kernels="merged-triton-fp8"),
    )
    with caplog.at_level(logging.WARNING, logger="vllm.gemma4_batched_encoder"):
        layers = enc.fast_layers(torch.device("cpu"), torch.float32)
    assert isinstance(layers, FusedLayers)
    assert "merged-triton-fp8 unsupported here (no float8 GEMMs here)" in caplog.text


_KERNEL_CHECK = """
import json, torch
import g4helpers as H
from gemma4_batched_encoder import Settings
from gemma4_batched_encoder.encoder import BatchedVisionEncoder
from gemma4_batched_encoder.qkv_kernel import (
    _launch_qkv_norm_rope, qkv_norm_rope, qkv_norm_rope_reference, triton_usable)
torch.manual_seed(0)
out = {"usable": triton_usable(torch.zeros(1)), "kernel": {}, "launches_equal": []}
for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
    b, n, h, d = 2, 37, 3, 16  # 74 rows: one full block of 64 and a masked one
    qkv, cos, sin = (torch.randn(b, n, w).to(dt) for w in (3 * h * d, d, d))
    qw, kw = torch.randn(d).to(dt), torch.randn(d).to(dt)
    got = qkv_norm_rope(qkv, cos, sin, qw, kw, h, 1e-6)
    ref = qkv_norm_rope_reference(qkv, cos, sin, qw, kw, h, 1e-6)
    out["kernel"][name] = [((g.float() - r.float()).abs().max() / r.abs().max()).item()
                           for g, r in zip(got, ref, strict=True)]
    # other launches (all heads a program, other row blocks): the same arithmetic, the same bits
    for block_m, all_heads in ((64, True), (16, True), (16, False)):
        alt = _launch_qkv_norm_rope(qkv, cos, sin, qw, kw, h, 1e-6, block_m, 2, all_heads)
        out["launches_equal"].append(all(torch.equal(a, g) for a, g in zip(alt, got)))
    # each head as four quarter loads: the same arithmetic but the norm's sum in another order
    quarters = [_launch_qkv_norm_rope(qkv, cos, sin, qw, kw, h, 1e-6, b, 2, a, True)
                for b, a in ((64, True), (16, False))]
    out["quarters"] = out.get("quarters", []) + [
        max(((g.float() - r.float()).abs().max() / r.abs().max()).item() for g, r in zip(alt, ref))
        for alt in quarters]
    out["quarters_launches_equal"] = out.get("quarters_launches_equal", []) + [
        all(torch.equal(a, b) for a, b in zip(*quarters))]
    # and it is another formulation, not the whole-row kernel again (fp32: the sum's order shows)
    out["quarters_differ"] = out.get("quarters_differ", []) + [
        not all(torch.equal(a, g) for a, g in zip(quarters[0], got))]
tower = H.tower(torch.float32, seed=3)
pvs, pps = H.batch(H.INTERPRETED_MIX, torch.float32, seed=3)
stock = Settings(mode="fast", cuda_graphs=False, fused="off")
ref = BatchedVisionEncoder(tower, stock).encode(pvs, pps)
enc = BatchedVisionEncoder(
    tower, Settings(mode="fast", cuda_graphs=False, fused="on", fast_kernels="merged-triton"))
got = enc.encode(pvs, pps)
out["encoder"] = max(((g - r).abs().max() / r.abs().max()).item() for g, r in zip(got, ref))
print(json.dumps(out))
"""


def _in_own_process(argv: list[str], **env: str) -> dict:
    """``python *argv`` (``-c CODE`` or a script) in a fresh Python with this folder importable;
    its last line, as JSON."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, **env}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_triton_qkv_kernel_computes_the_layers_norms_and_rotary():
    # The kernel itself, run by triton's CPU interpreter (read when triton.jit decorates: a
    # fresh process): against the layer's ops, alone and inside the merged layers.
    result = _in_own_process(["-c", _KERNEL_CHECK], TRITON_INTERPRET="1")
    assert result["usable"]
    assert max(result["kernel"]["fp32"]) < 1e-6
    assert max(result["kernel"]["bf16"]) < 2e-2  # one rounding where bf16 eager has several
    assert result["launches_equal"] == [True] * 6
    # the quarter loads (fp32, bf16; two launches each): as close to the layer's ops as the rows
    quarters = result["quarters"]
    assert max(quarters[:2]) < 1e-6 and max(quarters[2:]) < 2e-2
    assert result["quarters_launches_equal"] == [True, True]
    assert result["quarters_differ"][0]  # fp32 (bf16's rounding may hide the order)
    assert result["encoder"] < 1e-5


def test_the_triton_fp8_kernel_quantizes_gelu_times_up_per_row():
    # The kernel itself in triton's CPU interpreter, against the same math in torch and an fp64
    # GELU x up; then inside the float8 layers (fp8_kernel_check.py; on a GPU: --device cuda).
    from pathlib import Path

    result = _in_own_process([str(Path(__file__).with_name("fp8_kernel_check.py"))])
    assert result["usable"]
    assert set(result["kernel"]) == {"fp32-96", "bf16-96"}
    for k in result["kernel"].values():
        assert k["dtypes"] == ["torch.float8_e4m3fn", "torch.float32"]
        assert k["launches_equal"] == [True, True]
        assert k["shapes"] == [[6, 96], [6, 1]]
        assert k["finite"]
        assert k["scale_rel"] < 1e-5  # the same amax (fp32 GELU either way)
        assert k["equal"] > 0.97  # float8 values differ only where fp32 rounding crosses a tie
        # every element within half a float8 step of the top binade (32 of 448) of the row's amax
        assert k["error"] < 0.5 * 32 / 448 + 1e-3
    assert 1e-3 < result["encoder"] < 0.25  # as test_fp8_layers_quantize_every_gemm_...
    # residual add + norm + quantize (merged-triton-fp8-norms): three cases a dtype and width
    cases = result["norm_quant"]
    assert len(cases) == 9
    for key, k in cases.items():
        assert k["empty_when_no_branch"] and k["launches_equal"] == [True, True], key
        if key.startswith("fp32"):  # only the sums' order and rsqrt differ from eager
            assert k["stream_steps"] < 4 and k["scale_rel"] < 1e-5, key
            assert k["equal"] > 0.99 and k["dequant_rel"] < 1e-4, key
        else:  # the interpreter truncates to bf16 (a GPU rounds): a step or two of bf16
            assert k["stream_steps"] < 3 and k["scale_rel"] < 0.02, key
            assert k["equal"] > 0.85 and k["dequant_rel"] < 0.2, key
    assert 1e-3 < result["encoder_norms"] < 0.25


_VLLM_LINEARS = """
import json, tempfile, torch
import g4helpers as H
from test_bit_identity import COMPOSITIONS
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.model_executor.models.transformers.utils import recursive_replace_linear
from gemma4_batched_encoder import Settings
from gemma4_batched_encoder.encoder import BatchedVisionEncoder
from gemma4_batched_encoder import fast_layers
with set_current_vllm_config(VllmConfig()):
    init_distributed_environment(1, 0, "file://" + tempfile.mktemp(), 0, "gloo")
    initialize_model_parallel(1, 1)
    tower = H.tower(torch.float32, seed=3)
    pvs, pps = H.batch(COMPOSITIONS["images_and_videos"], torch.float32, seed=3)
    stock = Settings(mode="fast", cuda_graphs=False, fused="off")
    ref = BatchedVisionEncoder(tower, stock).encode(pvs, pps)
    weights = {k: v.clone() for k, v in tower.state_dict().items()}
    recursive_replace_linear(tower, None, prefix="vision_tower")  # what vLLM 0.32's model does
    tower.load_state_dict(weights)
    for m in tower.modules():  # as vLLM's loader does after loading; weights kept as on CUDA
        if hasattr(m, "quant_method"):
            m._cpu_skip_gemm_dispatch = True  # (on the CPU vLLM packs them away otherwise)
            m.quant_method.process_weights_after_loading(m)
    q = tower.encoder.layers[0].self_attn.q_proj
    enc = BatchedVisionEncoder(
        tower, Settings(mode="fast", cuda_graphs=False, fused="on", fast_kernels="merged"))
    key = (torch.device("cpu"), torch.float32)
    layers = enc.fast_layers(*key)  # eager: the compiled calls are the same functions
    layers.call, layers._embed = fast_layers._layer, fast_layers._embed
    got = enc.encode(pvs, pps)
print(json.dumps({
    "linear": type(getattr(q, "linear", q)).__name__,
    "layers": type(enc._fast_layers[key]).__name__,  # None had they failed and fallen back
    "diff": max(((g - r).abs().max() / r.abs().max()).item() for g, r in zip(got, ref)),
}))
"""


def test_merged_layers_take_the_linears_vllm_puts_in_the_tower():
    # vLLM 0.32 replaces the tower's nn.Linear with its ReplicatedLinear; before, fast mode fell
    # back to the compiled stock layers in the served model. Own process: it sets up vLLM's
    # (single-rank) model-parallel state, which the other tests must not see.
    result = _in_own_process(["-c", _VLLM_LINEARS])
    assert result["linear"] == "ReplicatedLinear"
    assert result["layers"] == "MergedLayers"
    assert result["diff"] < 1e-5
