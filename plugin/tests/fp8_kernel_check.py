"""Float8 fast mode's GELU x up + amax + quantize kernel (fp8_quant.py) against the same math in
torch and an fp64 reference, then inside the float8 layers. Prints one JSON object.

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

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).parent))  # g4helpers, test_bit_identity
    import torch

    from gemma4_batched_encoder.fp8_quant import (
        _launch_gelu_mul_quant,
        gelu_mul_quant,
        gelu_mul_quant_reference,
    )
    from gemma4_batched_encoder.qkv_kernel import triton_usable

    device = torch.device(args.device)
    torch.manual_seed(0)
    out: dict = {"device": args.device, "usable": triton_usable(torch.zeros(1, device=device))}
    out["kernel"] = {}
    for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        # 96 wide: a masked block of 128 (E4B's 3,072 on the GPU too); rows of other ranges, one 0
        for width in (96, 3072) if args.device == "cuda" else (96,):
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
    if args.device == "cpu":  # inside the float8 layers (the GPU's: bench/gpu/h200.sh fast-probe)
        import g4helpers as H
        from test_bit_identity import COMPOSITIONS

        from gemma4_batched_encoder import Settings, fast_layers
        from gemma4_batched_encoder.encoder import BatchedVisionEncoder

        tower = H.tower(torch.float32, seed=3)
        pvs, pps = H.batch(COMPOSITIONS["images_and_videos"], torch.float32, seed=3)
        stock = Settings(mode="fast", cuda_graphs=False, fused="off")
        ref = BatchedVisionEncoder(tower, stock).encode(pvs, pps)
        fp8 = Settings(mode="fast", cuda_graphs=False, fused="on", fast_kernels="merged-triton-fp8")
        enc = BatchedVisionEncoder(tower, fp8)
        enc.fast_layers(device, torch.float32).call = fast_layers._layer  # eager
        got = enc.encode(pvs, pps)
        pairs = zip(got, ref, strict=True)
        out["encoder"] = max(((a - b).norm() / b.norm()).item() for a, b in pairs)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
