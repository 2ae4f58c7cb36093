"""Float8 GEMMs with fused epilogues (fp8_gemm.py, ``merged-triton-fp8-epilogues``): the kernels
in Triton's interpreter against torch and the layer's own ops, the weights as they take them,
and the layers built on them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import g4helpers as H
import pytest
import torch
from test_bit_identity import COMPOSITIONS
from test_fast_layers import _in_own_process

from gemma4_batched_encoder import Settings, fast_layers
from gemma4_batched_encoder.encoder import BatchedVisionEncoder
from gemma4_batched_encoder.fast_layers import MergedLayers, Unsupported
from gemma4_batched_encoder.fp8_gemm import interleave_gate_up, qkv_pair_order

EPILOGUES = Settings(
    mode="fast", cuda_graphs=False, fused="on", fast_kernels="merged-triton-fp8-epilogues"
)


def test_the_triton_gemms_compute_their_epilogues():
    # fp8_gemm_check.py in a fresh process (TRITON_INTERPRET must be set before triton loads);
    # on a GPU: python plugin/tests/fp8_gemm_check.py --device cuda
    result = _in_own_process([str(Path(__file__).with_name("fp8_gemm_check.py"))])
    assert result["usable"]
    # fp32 out: only the order of the K sums differs from torch (four launches each)
    for name in ("plain", "gelu_mul", "qkv"):
        assert len(result[name]) == 4 and max(result[name]) < 1e-6, name
    assert result["plain_row_scale"] < 1e-6
    assert result["gelu_mul_vs_chunks"] < 1e-6  # interleaving gate/up rows changes nothing
    # the Q/K/V epilogue is the layer's norms and rotary, q and k in pair order; scores alike
    assert max(result["qkv_vs_layer"]) < 1e-6 and result["scores_vs_layer"] < 1e-6
    assert result["qkv_unpaired_weight"] > 0.1  # the comparison sees a wrong row order
    # bf16 out: the interpreter truncates where a GPU rounds (a step or two of bf16)
    assert result["gelu_mul_bf16"]["dtype"] == "torch.bfloat16"
    assert result["gelu_mul_bf16"]["rel"] < 0.01
    assert result["qkv_bf16"]["dtype"] == "torch.bfloat16"
    assert result["qkv_bf16"]["shape"] == [3, 70, 128]
    assert result["qkv_bf16"]["rel"] < 0.02
    for width, q in result["quant_rows"].items():
        assert q["scales_equal"], width
        # besides the interpreter's carries, at most one float8 step (its ties) from torch's
        assert q["max_steps_besides_carries"] <= 1.0, width
    # the GELU GEMM's row maxima and the down GEMM quantizing in registers: the same bytes as
    # the quantize kernel + float8 GEMM (every launch; here and compiled on a GPU)
    assert result["gelu_amax"] == [True] * 4 and result["quant_a"] == [True] * 4
    assert result["quant_a_wrong_amax"] > 0.01
    assert result["encoder_layers"] == "MergedLayers"
    for name in ("epilogues", "gemms"):  # as the other float8 layers
        assert 1e-3 < result["encoder_" + name] < 0.25, name


def test_the_weights_are_paired_and_interleaved_as_the_epilogues_take_them():
    tower = H.tower(torch.float32, seed=5)
    plain = MergedLayers(tower, triton_qkv=True, compile=False)
    layers = MergedLayers(
        tower, triton_qkv=True, compile=False, fp8=True, fused_norms=True, gemm_epilogues=True
    )
    order = torch.tensor(qkv_pair_order(plain.head_dim))
    assert sorted(order.tolist()) == list(range(plain.head_dim))
    for mine, ref in zip(layers.weights, plain.weights, strict=True):
        qkv = ref["qkv"].view(3, plain.heads, plain.head_dim, -1)
        paired = torch.cat([qkv[:2][:, :, order], qkv[2:]]).reshape(ref["qkv"].shape)
        for name, expected in (("qkv", paired), ("gate_up", interleave_gate_up(ref["gate_up"]))):
            assert mine[name].dtype == torch.float8_e4m3fn
            dequant = mine[name].float() * mine[name + "_scale"].t()
            assert ((dequant - expected).abs().max() / expected.abs().max()) < 0.07, name
        assert torch.equal(mine["q_norm"], ref["q_norm"][order])
        assert torch.equal(mine["k_norm"], ref["k_norm"][order])
    # rotate_half's partners side by side: quarter 0 with 1, 2 with 3 of the head
    assert qkv_pair_order(8) == [0, 2, 1, 3, 4, 6, 5, 7]


def test_the_epilogues_take_the_fused_norms_float8_rows():
    tower = H.tower(torch.float32, seed=4)
    with pytest.raises(Unsupported, match="fused norms"):
        MergedLayers(tower, triton_qkv=True, fp8=True, gemm_epilogues=True)
    with pytest.raises(Unsupported, match="maxima"):
        MergedLayers(tower, triton_qkv=True, fp8=True, fused_norms=True, quant_down=True)
    # the epilogue splits heads into pairs and quarters: a head dim of 12 is refused up front
    odd = H.tower(torch.float32, seed=4, head_dim=12)
    with pytest.raises(Unsupported, match="head dim 12"):
        MergedLayers(odd, triton_qkv=True, fp8=True, fused_norms=True, gemm_epilogues=True)
    MergedLayers(odd, triton_qkv=True, fp8=True, fused_norms=True)  # the other kernels take it


@pytest.mark.parametrize(
    ("kernels", "compiled"),
    [
        ("merged-triton-fp8-epilogues", False),
        ("merged-triton-fp8-epilogues", True),
        ("merged-triton-fp8-gemms", True),
    ],
)
def test_the_epilogue_layers_stay_near_the_stock_layers(kernels, compiled):
    # On this CPU without the interpreter the ops run their torch references (the kernels
    # themselves: the test above); compiled, inductor sees them as opaque ops (their fake impls)
    tower = H.tower(torch.float32, seed=3)
    pvs, pps = H.batch(COMPOSITIONS["images_and_videos"], torch.float32, seed=3)
    ref = BatchedVisionEncoder(tower, Settings(mode="fast", cuda_graphs=False, fused="off"))
    expected = ref.encode(pvs, pps)
    enc = BatchedVisionEncoder(tower, replace(EPILOGUES, fast_kernels=kernels))
    cpu = torch.device("cpu")
    layers = enc.fast_layers(cpu, torch.float32)
    assert isinstance(layers, MergedLayers) and layers.gemm_epilogues and layers.fused_norms
    assert layers.quant_down == kernels.endswith("-gemms")
    if not compiled:
        layers.call_epilogues = fast_layers._layer_epilogues
    out = enc.encode(pvs, pps)
    assert enc._fast_layers[(cpu, torch.float32)] is layers  # ran, no fallback
    assert enc.fast_kernels_in_force(cpu) == kernels
    errors = [((o - r).norm() / r.norm()).item() for o, r in zip(out, expected, strict=True)]
    assert 1e-3 < max(errors) < 0.25, errors


@pytest.mark.parametrize("kernels", ["merged-triton-fp8-epilogues", "merged-triton-fp8-gemms"])
def test_the_setting_names_the_epilogues(monkeypatch, kernels):
    monkeypatch.setenv("GEMMA4_ENCODER_FAST_KERNELS", kernels)
    assert Settings.from_env().fast_kernels == kernels


def test_the_ops_fake_impls_match_what_they_compute():
    # torch.compile plans the layer from the fake impls: shapes, dtypes and strides must agree
    from gemma4_batched_encoder.fp8_gemm import (
        gemm_gelu_mul,
        gemm_gelu_mul_amax,
        gemm_qkv,
        gemm_quant_a,
    )
    from gemma4_batched_encoder.fp8_quant import (
        add_norm_quant,
        gelu_mul_quant,
        quant_rows,
        quantize_rows,
    )
    from gemma4_batched_encoder.qkv_kernel import qkv_norm_rope

    torch.manual_seed(0)
    xq, xs = quantize_rows(torch.randn(10, 32))
    wq, ws = quantize_rows(torch.randn(96, 32))
    angles = torch.randn(10, 16)
    for op, args in (
        (gemm_gelu_mul, (xq, xs, wq, ws.t().contiguous(), torch.bfloat16)),
        (
            gemm_qkv,
            (
                xq,
                xs,
                wq,
                ws,
                angles.cos(),
                angles.sin(),
                *torch.ones(2, 16),
                2,
                1e-6,
                torch.float32,
            ),
        ),
        (quant_rows, (torch.randn(10, 48).bfloat16(),)),
        (gemm_gelu_mul_amax, (xq, xs, wq, ws, torch.bfloat16)),
        (gemm_quant_a, (torch.randn(10, 32).bfloat16(), torch.rand(10) + 1, wq, ws, torch.float32)),
        # fast mode's other float8 ops (fp8_quant.py), checked the same way
        (gelu_mul_quant, (torch.randn(10, 96).bfloat16(),)),
        (add_norm_quant, (*torch.randn(2, 10, 32).bfloat16(), torch.ones(32), None, 1e-6)),
        (add_norm_quant, (torch.randn(10, 32), None, None, torch.ones(32), 1e-6)),
        (
            qkv_norm_rope,
            (
                torch.randn(1, 10, 96),
                angles.cos()[None],
                angles.sin()[None],
                *torch.ones(2, 16),
                2,
                1e-6,
            ),
        ),
    ):
        torch.library.opcheck(op, args, test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
