"""The float8 GEMMs with fused epilogues (fp8_gemm.py) and the quantize-only kernel after the
GELU one (fp8_quant.quant_rows), each against the same math in torch, under several launches;
the Q/K/V epilogue also against the layer's own ops on the unpermuted weight; then inside the
float8 layers (CPU). Prints one JSON object.

    python plugin/tests/fp8_gemm_check.py                # CPU: Triton's interpreter
    python plugin/tests/fp8_gemm_check.py --device cuda  # GPU: the compiled kernels

Triton 3.7's interpreter converts to float8 with a masked mantissa (fp8_kernel_check.py): a
rounding that carries into the next binade, or a tie, can land one float8 step from torch's.
``quant_rows`` therefore reports how many elements differ and by how many steps; on a GPU the
hardware conversion must give torch's bytes.
"""

from __future__ import annotations

import json

from kernel_check_cli import device_from_argv

# (block_m, block_n, block_k, tma, persistent): a part-masked last row block, K in several blocks,
# pointer and TMA loads, persistent programs (4 in the interpreter, each several tiles)
LAUNCHES = [(32, 64, 32, 0, 0), (32, 32, 64, 1, 0), (64, 128, 128, 0, 0), (32, 64, 64, 1, 1)]


def _rel(a, b) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def main() -> None:
    device_type = device_from_argv(__doc__.splitlines()[0])
    import torch

    from gemma4_batched_encoder.fp8_gemm import (
        fp8_gemm,
        fp8_gemm_gelu_amax,
        fp8_gemm_qkv,
        fp8_gemm_qkv_reference,
        fp8_gemm_quant_a,
        fp8_gemm_reference,
        interleave_gate_up,
        qkv_pair_order,
    )
    from gemma4_batched_encoder.fp8_quant import quant_rows, quantize_rows
    from gemma4_batched_encoder.qkv_kernel import qkv_norm_rope_reference, triton_usable

    device = torch.device(device_type)
    torch.manual_seed(0)
    out: dict = {"device": device_type, "usable": triton_usable(torch.zeros(1, device=device))}
    m, k, heads, dim = 70, 128, 2, 64
    x = (torch.randn(m, k) * torch.logspace(-2, 2, m)[:, None]).to(device)
    w = (torch.randn(3 * heads * dim, k) * torch.logspace(-1, 1, k)[None, :] * 0.05).to(device)
    xq, xs = quantize_rows(x)

    def launch(cfg: tuple[int, ...]) -> dict[str, int]:
        keys = ("block_m", "block_n", "block_k", "tma", "persistent")
        # 4 warps, 2 stages: small tiles that compile on a GPU as in the interpreter
        return dict(zip(keys, cfg, strict=True)) | {"group_m": 2, "warps": 4, "stages": 2}

    # plain, and GELU x up on interleaved gate/up rows, fp32 out: only the K sums' order differs
    wq, ws = quantize_rows(w)
    ref = fp8_gemm_reference(xq, xs, wq, ws)
    out["plain"] = [
        _rel(fp8_gemm(xq, xs, wq, ws, torch.float32, launch=launch(c)), ref) for c in LAUNCHES
    ]
    # column scales as _scaled_mm takes them ([1, N]) give the same
    out["plain_row_scale"] = _rel(fp8_gemm(xq, xs, wq, ws.t(), torch.float32), ref)
    wi = interleave_gate_up(w)
    wiq, wis = quantize_rows(wi)
    ref = fp8_gemm_reference(xq, xs, wiq, wis, gelu_mul=True)
    gate, up = fp8_gemm_reference(xq, xs, wq, ws).chunk(2, dim=-1)  # un-interleaved weights
    out["gelu_mul_vs_chunks"] = _rel(ref, torch.nn.functional.gelu(gate, approximate="tanh") * up)
    out["gelu_mul"] = [
        _rel(fp8_gemm(xq, xs, wiq, wis, torch.float32, True, launch(c)), ref) for c in LAUNCHES
    ]
    got = fp8_gemm(xq, xs, wiq, wis, torch.bfloat16, True)
    out["gelu_mul_bf16"] = {"dtype": str(got.dtype), "rel": _rel(got, ref)}

    # GELU x up with its rows' maxima gathered by atomics, and the down GEMM quantizing those
    # bf16 rows tile by tile: the same bytes as the quantize kernel + float8 GEMM between them
    w2q, w2s = quantize_rows(torch.randn(96, 3 * heads * dim // 2, device=device) * 0.05)
    out["gelu_amax"], out["quant_a"] = [], []
    for c in LAUNCHES:
        h = fp8_gemm(xq, xs, wiq, wis, torch.bfloat16, True, launch(c))
        h2, amax = fp8_gemm_gelu_amax(xq, xs, wiq, wis, torch.bfloat16, launch(c))
        out["gelu_amax"].append(torch.equal(h2, h) and torch.equal(amax, h.float().abs().amax(-1)))
        ref = fp8_gemm(*quant_rows(h), w2q, w2s, torch.float32, launch=launch(c))
        out["quant_a"].append(torch.equal(fp8_gemm_quant_a(h, amax, w2q, w2s, torch.float32,
                                                           launch(c)), ref))  # fmt: skip
    # the check can fail: maxima a tenth too large quantize other bytes
    wrong = fp8_gemm_quant_a(h, amax * 1.1, w2q, w2s, torch.float32)
    out["quant_a_wrong_amax"] = _rel(wrong, ref)

    # Q/K/V with the norms and rotary: q and k rows in pair order, against the layer's ops on
    # the weight in its own order (the same float8 rows and scales, put back)
    order = torch.tensor(qkv_pair_order(dim), device=device)
    back = torch.argsort(order)
    qn, kn = (torch.rand(dim, device=device) + 0.5 for _ in range(2))
    angles = torch.randn(m, dim, device=device) * 10
    cos, sin = angles.cos(), angles.sin()
    wp = w.view(3, heads, dim, k).clone()
    wp[0], wp[1] = wp[0][:, order], wp[1][:, order]
    wpq, wps = quantize_rows(wp.reshape(-1, k))
    rope = (cos, sin, qn[order], kn[order], heads, 1e-6)
    ref = fp8_gemm_qkv_reference(xq, xs, wpq, wps, *rope, torch.float32)
    out["qkv"] = [
        _rel(fp8_gemm_qkv(xq, xs, wpq, wps, *rope, torch.float32, launch(c)), ref) for c in LAUNCHES
    ]
    nat_q = wpq.view(3, heads, dim, k).clone()
    nat_s = wps.view(3, heads, dim, 1).clone()
    nat_q[0], nat_q[1] = nat_q[0][:, back], nat_q[1][:, back]
    nat_s[0], nat_s[1] = nat_s[0][:, back], nat_s[1][:, back]
    gemm = fp8_gemm_reference(xq, xs, nat_q.reshape(-1, k), nat_s.reshape(-1, 1))
    lq, lk, lv = qkv_norm_rope_reference(gemm[None], cos[None], sin[None], qn, kn, heads, 1e-6)
    got = fp8_gemm_qkv(xq, xs, wpq, wps, *rope, torch.float32).view(3, m, heads, dim)
    out["qkv_vs_layer"] = [
        _rel(got[0][..., back], lq[0]),
        _rel(got[1][..., back], lk[0]),
        _rel(got[2], lv[0]),
    ]
    scores = torch.einsum("mhd,nhd->hmn", got[0], got[1])
    out["scores_vs_layer"] = _rel(scores, torch.einsum("mhd,nhd->hmn", lq[0], lk[0]))
    # the check can fail: the weight in the layer's order (q and k not paired) is far off
    wrong = fp8_gemm_qkv(xq, xs, wq, ws, *rope, torch.float32).view(3, m, heads, dim)
    out["qkv_unpaired_weight"] = _rel(wrong[0][..., back], lq[0])
    got = fp8_gemm_qkv(xq, xs, wpq, wps, *rope, torch.bfloat16)
    out["qkv_bf16"] = {"dtype": str(got.dtype), "shape": list(got.shape), "rel": _rel(got, ref)}

    # quantize-only rows (3,072 wide as E4B's MLP middle; 96: a masked block)
    out["quant_rows"] = {}
    for width in (96, 3072):
        t = (torch.randn(9, width) * torch.logspace(-3, 2, 9)[:, None]).bfloat16().to(device)
        q, s = quant_rows(t)
        rq, rs = quantize_rows(t)
        r = rq.float()
        # the interpreter's carries (fp8_kernel_check.py): half the reference, a power of two
        carry = (q.float() * 2 == r) & (r != 0) & (torch.frexp(r).mantissa.abs() == 0.5)
        # other differences in float8 steps (3 mantissa bits: a step is 1/8 to 1/16 of |r|)
        steps = ((q.float() - r).abs() / (r.abs() / 8).clamp(min=2**-9))[~carry]
        out["quant_rows"][str(width)] = {
            "scales_equal": torch.equal(s, rs),
            "bytes_equal": torch.equal(q.view(torch.uint8), rq.view(torch.uint8)),
            "carries": int(carry.sum()),
            "max_steps_besides_carries": steps.max().item(),
        }

    if device_type == "cpu":  # inside the float8 layers
        import g4helpers as H

        from gemma4_batched_encoder import Settings, fast_layers
        from gemma4_batched_encoder.encoder import BatchedVisionEncoder

        tower = H.tower(torch.float32, seed=3)
        pvs, pps = H.batch(H.INTERPRETED_MIX, torch.float32, seed=3)
        stock = Settings(mode="fast", cuda_graphs=False, fused="off")
        ref_out = BatchedVisionEncoder(tower, stock).encode(pvs, pps)
        for kernels in ("merged-triton-fp8-epilogues", "merged-triton-fp8-gemms"):
            settings = Settings(mode="fast", cuda_graphs=False, fused="on", fast_kernels=kernels)
            enc = BatchedVisionEncoder(tower, settings)
            layers = enc.fast_layers(device, torch.float32)
            out["encoder_layers"] = type(layers).__name__
            layers.call_epilogues = fast_layers._layer_epilogues  # eager
            got_out = enc.encode(pvs, pps)
            out["encoder_" + kernels.rsplit("-", 1)[1]] = max(
                ((a - b).norm() / b.norm()).item() for a, b in zip(got_out, ref_out, strict=True)
            )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
