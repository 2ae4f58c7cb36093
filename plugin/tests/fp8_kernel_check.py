"""Float8 fast mode's Triton kernels (fp8_quant.py): GELU x up + amax + quantize, and residual add
+ RMS norm + quantize, each against the same math in torch (and GELU x up against fp64), then
inside the float8 layers. Prints one JSON object.

    python plugin/tests/fp8_kernel_check.py                # CPU: Triton's interpreter
    python plugin/tests/fp8_kernel_check.py --device cuda  # GPU: the compiled kernel

On the CPU (test_fast_layers.py runs it in a subprocess: TRITON_INTERPRET must be set before
Triton loads) Triton 3.7's interpreter drops a rounding's carry into the next binade when it
converts to float8 (interpreter.py, _convert_float, masks the mantissa): 125.8 -> 64, not 128.
Such elements (the reference's a power of two, the kernel's half of it) are counted as
``carries`` and take the reference's value; any other difference still counts. On a GPU the
hardware conversion rounds correctly, so ``carries`` must be 0 there.
"""

from __future__ import annotations

import json

from kernel_check_cli import device_from_argv


def main() -> None:
    device_type = device_from_argv(__doc__.splitlines()[0])
    import torch

    from gemma4_batched_encoder.fp8_quant import (
        _launch_add_norm_quant,
        _launch_gelu_mul_quant,
        add_norm_quant,
        add_norm_quant_reference,
        gelu_mul_quant,
        gelu_mul_quant_reference,
    )
    from gemma4_batched_encoder.qkv_kernel import triton_usable

    device = torch.device(device_type)
    torch.manual_seed(0)
    out: dict = {"device": device_type, "usable": triton_usable(torch.zeros(1, device=device))}
    out["kernel"] = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        # 96 wide: a masked block of 128 (E4B's 3,072 on the GPU too); rows of other ranges, one 0
        for width in (96, 3072) if device_type == "cuda" else (96,):
            m = 6
            gu = torch.randn(m, 2 * width) * torch.logspace(-3, 2, m)[:, None]
            gu = gu.to(dt).to(device)
            gu[2] = 0
            q, s = gelu_mul_quant(gu)
            rq, rs = gelu_mul_quant_reference(gu)
            # other launches (4 rows a program, the last one part-masked; 2 rows): same bits
            launches_equal = [
                torch.equal(aq.view(torch.uint8), q.view(torch.uint8)) and torch.equal(a_s, s)
                for aq, a_s in (_launch_gelu_mul_quant(gu, r, w) for r, w in ((4, 4), (2, 8)))
            ]
            g, u = gu.double().chunk(2, dim=-1)
            exact = torch.nn.functional.gelu(g, approximate="tanh") * u
            amax = exact.abs().amax(-1, keepdim=True).clamp(min=1e-30)
            r = rq.float()
            carry = (q.float() * 2 == r) & (r != 0) & (torch.frexp(r).mantissa.abs() == 0.5)
            fixed = torch.where(carry, rq.view(torch.uint8), q.view(torch.uint8))
            q = fixed.view(torch.float8_e4m3fn)
            out["kernel"][f"{name}-{width}"] = {
                "carries": int(carry.sum()),
                "launches_equal": launches_equal,
                "dtypes": [str(q.dtype), str(s.dtype)],
                "shapes": [list(q.shape), list(s.shape)],
                "finite": bool(torch.isfinite(q.float()).all() and torch.isfinite(s).all()),
                "scale_rel": ((s.double() - rs.double()).abs() / rs.double()).max().item(),
                "equal": (q.float() == rq.float()).float().mean().item(),
                "error": ((q.double() * s.double() - exact).abs() / amax).max().item(),
            }
    out["norm_quant"] = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        # 96 wide: a masked block of 128; E4B's 768 in fp32 (and everywhere on a GPU); 7 rows:
        # the last block part-masked. Triton 3.7's interpreter truncates fp32 -> bf16 where a
        # GPU rounds to nearest, so on the CPU the bf16 rows differ by a step here and there.
        for width in (96, 768) if device_type == "cuda" or dt == torch.float32 else (96,):
            m = 7
            x = (torch.randn(m, width) * torch.logspace(-2, 2, m)[:, None]).to(dt).to(device)
            branch = (torch.randn(m, width) * 3).to(dt).to(device)
            bw, nw = (torch.rand(width).to(dt).to(device) + 0.5 for _ in range(2))
            for case, args_ in (
                ("branch", (x, branch, bw, nw)),
                ("no-branch", (x, None, None, nw)),
                ("no-weights", (x, branch, None, None)),
            ):
                s_, q, sc = add_norm_quant(*args_, 1e-6)
                rs, rq, rsc = add_norm_quant_reference(*args_, 1e-6)
                s_ = x if args_[1] is None else s_
                launches_equal = [
                    torch.equal(a[1].view(torch.uint8), q.view(torch.uint8))
                    and torch.equal(a[2], sc)
                    and (args_[1] is None or torch.equal(a[0], s_))
                    for a in (
                        _launch_add_norm_quant(*args_, 1e-6, r, w) for r, w in ((1, 1), (8, 8))
                    )
                ]
                # the stream: in units of the dtype's step at the row's largest value
                row = rs.float().abs().amax(-1, keepdim=True) * torch.finfo(dt).eps
                r = rq.float()  # the interpreter's float8 carries, as above
                carry = (q.float() * 2 == r) & (r != 0) & (torch.frexp(r).mantissa.abs() == 0.5)
                q = torch.where(carry, rq.view(torch.uint8), q.view(torch.uint8)).view(
                    torch.float8_e4m3fn
                )
                out["norm_quant"][f"{name}-{width}-{case}"] = {
                    "carries": int(carry.sum()),
                    "stream_steps": ((s_.float() - rs.float()).abs() / row).max().item(),
                    "empty_when_no_branch": args_[1] is not None
                    or add_norm_quant(*args_, 1e-6)[0].numel() == 0,
                    "scale_rel": ((sc.double() - rsc.double()).abs() / rsc.double()).max().item(),
                    "equal": (q.float() == rq.float()).float().mean().item(),
                    # dequantized rows against the reference's, over the row's amax
                    "dequant_rel": (
                        (q.double() * sc.double() - rq.double() * rsc.double()).abs().amax(-1)
                        / (rq.double() * rsc.double()).abs().amax(-1)
                    )
                    .max()
                    .item(),
                    "launches_equal": launches_equal,
                }
    if device_type == "cpu":  # inside the float8 layers (the GPU's: bench/gpu/h200.sh fast-probe)
        import g4helpers as H

        from gemma4_batched_encoder import Settings, fast_layers
        from gemma4_batched_encoder.encoder import BatchedVisionEncoder

        tower = H.tower(torch.float32, seed=3)
        pvs, pps = H.batch(H.INTERPRETED_MIX, torch.float32, seed=3)
        stock = Settings(mode="fast", cuda_graphs=False, fused="off")
        ref = BatchedVisionEncoder(tower, stock).encode(pvs, pps)
        fp8 = Settings(mode="fast", cuda_graphs=False, fused="on", fast_kernels="merged-triton-fp8")
        enc = BatchedVisionEncoder(tower, fp8)
        enc.fast_layers(device, torch.float32).call = fast_layers._layer  # eager
        got = enc.encode(pvs, pps)
        pairs = zip(got, ref, strict=True)
        out["encoder"] = max(((a - b).norm() / b.norm()).item() for a, b in pairs)
        norms = Settings(
            mode="fast", cuda_graphs=False, fused="on", fast_kernels="merged-triton-fp8-norms"
        )
        enc = BatchedVisionEncoder(tower, norms)
        layers = enc.fast_layers(device, torch.float32)
        assert layers.fused_norms
        layers.call = fast_layers._layer  # eager
        fused = enc.encode(pvs, pps)
        out["encoder_norms"] = max(
            ((a - b).norm() / b.norm()).item() for a, b in zip(fused, ref, strict=True)
        )
        out["norms_vs_fp8"] = max(
            ((a - b).norm() / b.norm()).item() for a, b in zip(fused, got, strict=True)
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
