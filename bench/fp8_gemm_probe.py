"""Fast mode's float8 GEMMs: cuBLASLt (``torch._scaled_mm``, what fast mode runs) against the
Triton GEMM of ``fp8_gemm.py`` under several launches, on E4B's four layer GEMMs at 16 videos'
rows; then the MLP middle both ways: cuBLASLt's gate/up GEMM + the GELU x up + quantize kernel
against the Triton GEMM with GELU x up in its epilogue + a quantize-only kernel; and the Q/K/V
GEMM + the norm/rotary kernel against the Triton GEMM with both in its epilogue; and the down
GEMM after a quantize kernel against the Triton GEMM quantizing its input itself. Prints a table,
writes JSON. CUDA only (GPU milliseconds between CUDA events, medians).

    PYTHONPATH=plugin/src python3 bench/fp8_gemm_probe.py --out $OUT/fp8-gemm-probe.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch

from gemma4_batched_encoder import launch_config
from gemma4_batched_encoder.bench import event_ms
from gemma4_batched_encoder.fp8_gemm import (
    fp8_gemm,
    fp8_gemm_gelu_amax,
    fp8_gemm_qkv,
    fp8_gemm_quant_a,
    fp8_gemm_reference,
    interleave_gate_up,
    qkv_pair_order,
)
from gemma4_batched_encoder.fp8_quant import gelu_mul_quant, quant_rows, quantize_rows
from gemma4_batched_encoder.qkv_kernel import qkv_norm_rope

# E4B's vision layer: hidden 768, 12 heads of 64, MLP 3,072 (N, K of each GEMM)
SHAPES = {"qkv": (2304, 768), "o": (768, 768), "gate_up": (6144, 768), "down": (768, 3072)}
# (block_m, block_n, block_k, stages, warps) and the rest of fp8_gemm's launch keys
LAUNCHES: list[tuple[tuple[int, ...], dict[str, int]]] = [
    ((128, 128, 128, 4, 8), {}),
    ((128, 128, 128, 4, 8), {"tma": 1}),
    ((128, 128, 128, 3, 4), {"tma": 1}),  # the twenty-third sitting's fastest epilogue launch
    ((128, 128, 128, 4, 4), {"tma": 1}),
    ((128, 128, 128, 3, 4), {}),
    ((128, 128, 128, 3, 4), {"tma": 1, "group_m": 16}),
    ((128, 128, 128, 3, 4), {"tma": 1, "group_m": 4}),
    ((128, 256, 128, 3, 8), {"tma": 1}),
    ((128, 256, 64, 4, 8), {"tma": 1}),
    ((256, 128, 128, 3, 8), {"tma": 1}),
    ((64, 256, 128, 4, 4), {"tma": 1}),
    ((128, 64, 128, 4, 4), {"tma": 1}),
    ((128, 256, 128, 3, 8), {}),  # the fastest plain q/k/v, o and down launch
    # persistent (TMA), its tile and K loops one pipeline (flatten), warp-specialized
    ((128, 128, 128, 3, 4), {"persistent": 1}),
    ((128, 128, 128, 3, 4), {"persistent": 1, "flatten": 1}),
    ((128, 256, 128, 3, 8), {"persistent": 1, "flatten": 1}),
    ((128, 128, 128, 3, 4), {"persistent": 1, "warp_specialize": 1}),
    ((128, 256, 128, 3, 8), {"persistent": 1, "warp_specialize": 1}),
]


def median_ms(fn, repeats: int) -> float:
    return statistics.median(event_ms(fn, warmup=3, repeats=repeats))


def launch_dict(cfg: tuple[tuple[int, ...], dict[str, int]]) -> dict[str, int]:
    (bm, bn, bk, stages, warps), rest = cfg
    return {"block_m": bm, "block_n": bn, "block_k": bk, "group_m": 8, "stages": stages,
            "warps": warps, **rest}  # fmt: skip


def each_launch(measure: Callable[[dict[str, int]], dict]) -> list[dict]:
    """``measure(launch)`` for every launch in LAUNCHES, each row with its launch; a launch that
    fails (one that does not compile: shared memory, a Triton without the option) is recorded
    with its error and the sweep goes on."""
    rows = []
    for cfg in LAUNCHES:
        launch = launch_dict(cfg)
        try:
            rows.append({"launch": launch, **measure(launch)})
        except Exception as e:
            rows.append({"launch": launch, "error": f"{type(e).__name__}: {str(e)[:200]}"})
    return rows


def max_rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    return ((got.float() - ref).abs().max() / ref.abs().max()).item()


def fastest(rows: list[dict]) -> dict | None:
    timed = [r for r in rows if "ms" in r]
    return min(timed, key=lambda r: r["ms"]) if timed else None


def gemm_row(m: int, n: int, k: int, repeats: int) -> dict:
    """One GEMM shape: cuBLASLt against every Triton launch, on the same random rows."""
    dev = torch.device("cuda")
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.03
    xq, xs = quantize_rows(x)
    wq, ws = quantize_rows(w)
    ws_t = ws.t().contiguous()
    ref = fp8_gemm_reference(xq, xs, wq, ws)

    def cublas() -> torch.Tensor:
        return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws_t, out_dtype=torch.bfloat16)

    def measure(launch: dict[str, int]) -> dict:
        out = fp8_gemm(xq, xs, wq, ws, launch=launch)
        run = lambda: fp8_gemm(xq, xs, wq, ws, launch=launch)  # noqa: E731
        return {"max_rel": max_rel(out, ref), "ms": median_ms(run, repeats)}

    entry = {
        "cublas_ms": median_ms(cublas, repeats),
        "cublas_max_rel": max_rel(cublas(), ref),
        "triton": each_launch(measure),
    }
    entry["tflops_cublas"] = 2 * m * n * k / entry["cublas_ms"] / 1e9
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=54432, help="16 videos of 6 480p frames")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--epilogues-only",
        action="store_true",
        help="skip the plain GEMMs' table (the twenty-third sitting's); only the GEMMs with "
        "epilogues against cuBLASLt + the kernels they replace",
    )
    parser.add_argument(
        "--write",
        metavar="JSON",
        type=Path,
        help="enter the fastest epilogue launches (gemm_gelu, gemm_qkv) under this device's "
        "name in this launch table (the plugin's: plugin/src/gemma4_batched_encoder/"
        "fast_launch.json); the entry's other kernels stay",
    )
    args = parser.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    m = args.rows
    result: dict = {"device": torch.cuda.get_device_name(dev), "rows": m, "gemms": {}}
    print(f"{'gemm':8} {'cuBLASLt ms':>11} {'best triton ms':>14}  launch")
    for name, (n, k) in SHAPES.items() if not args.epilogues_only else ():
        entry = gemm_row(m, n, k, args.repeats)
        result["gemms"][name] = entry
        best = fastest(entry["triton"])
        best_ms = best["ms"] if best else float("nan")
        print(f"{name:8} {entry['cublas_ms']:11.3f} {best_ms:14.3f}  {best and best['launch']}")

    mid, h = mlp_middle(m, args.repeats)
    result["mlp_middle"] = mid
    best = fastest(mid["fused"])
    print(f"MLP middle: stock {mid['stock_ms']:.3f} ms; fused, fastest launch: {best}")
    print(f"quantize-only kernel {mid['quant_only_ms']:.3f} ms")
    result["down"] = down_chain(h, args.repeats)
    best = fastest(result["down"]["fused"])
    print(f"down: stock {result['down']['stock_ms']:.3f} ms; quantizing in the GEMM: {best}")
    result["qkv_epilogue"] = qkv_epilogue(m, args.repeats)
    best = fastest(result["qkv_epilogue"]["fused"])
    print(f"Q/K/V: stock {result['qkv_epilogue']['stock_ms']:.3f} ms; fused, fastest: {best}")
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    gelu, qkv = fastest(mid["fused"]), fastest(result["qkv_epilogue"]["fused"])
    if args.write and gelu and qkv:
        launches = {"gemm_gelu": gelu["launch"], "gemm_qkv": qkv["launch"]}
        down = fastest(result["down"]["fused"])
        if down:
            launches["gemm_down"] = down["launch"]
        launch_config.enter(args.write, dev, launches)
        print(f"entered in {args.write}: {launches}")


def mlp_middle(m: int, repeats: int) -> tuple[dict, torch.Tensor]:
    """[M, 768] -> float8 rows of gelu(gate) * up and their scales: cuBLASLt's gate/up GEMM +
    the GELU x up + quantize kernel against the Triton GEMM with GELU x up in its epilogue + the
    quantize-only kernel; also the GEMM alone and with its rows' maxima. Returns the rows' bf16
    GELU x up (the down projection's input) too."""
    dev = torch.device("cuda")
    n, k = SHAPES["gate_up"]
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.03
    xq, xs = quantize_rows(x)
    wq, ws = quantize_rows(w)
    ws_t = ws.t().contiguous()
    wiq, wis = quantize_rows(interleave_gate_up(w))

    def stock() -> tuple[torch.Tensor, torch.Tensor]:
        gu = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws_t, out_dtype=torch.bfloat16)
        return gelu_mul_quant(gu)

    sq, ss = stock()
    ref = sq.float() * ss

    def measure(launch: dict[str, int]) -> dict:
        def gemm() -> torch.Tensor:
            return fp8_gemm(xq, xs, wiq, wis, gelu_mul=True, launch=launch)

        fq, fs = quant_rows(gemm())
        return {
            "max_rel_vs_stock": max_rel(fq.float() * fs, ref),
            "ms": median_ms(lambda: quant_rows(gemm()), repeats),
            "gemm_only_ms": median_ms(gemm, repeats),
            # the same GEMM also gathering its rows' maxima (merged-triton-fp8-gemms)
            "gemm_amax_ms": median_ms(
                lambda: fp8_gemm_gelu_amax(xq, xs, wiq, wis, launch=launch), repeats
            ),
        }

    out: dict = {"stock_ms": median_ms(stock, repeats), "fused": each_launch(measure)}
    h = fp8_gemm(xq, xs, wiq, wis, gelu_mul=True)
    out["quant_only_ms"] = median_ms(lambda: quant_rows(h), repeats)
    return out, h


def down_chain(h: torch.Tensor, repeats: int) -> dict:
    """The down projection of GELU x up's bf16 rows ``h``: the quantize kernel + cuBLASLt's
    float8 GEMM against the Triton GEMM quantizing each A tile in registers from the rows'
    maxima (``fp8_gemm_quant_a``: the same float8 bytes, checked here)."""
    dev = h.device
    n, k = SHAPES["down"]
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.03
    wq, ws = quantize_rows(w)
    ws_t = ws.t().contiguous()
    amax = h.float().abs().amax(-1)

    def stock() -> torch.Tensor:
        hq, hs = quant_rows(h)
        return torch._scaled_mm(hq, wq.t(), scale_a=hs, scale_b=ws_t, out_dtype=torch.bfloat16)

    ref = stock().float()

    def measure(launch: dict[str, int]) -> dict:
        got = fp8_gemm_quant_a(h, amax, wq, ws, launch=launch)
        same = fp8_gemm(*quant_rows(h), wq, ws, launch=launch)
        return {
            "equal_to_quantized_first": torch.equal(got, same),
            "max_rel_vs_stock": max_rel(got, ref),
            "ms": median_ms(lambda: fp8_gemm_quant_a(h, amax, wq, ws, launch=launch), repeats),
        }

    return {"stock_ms": median_ms(stock, repeats), "fused": each_launch(measure)}


def qkv_epilogue(m: int, repeats: int, heads: int = 12, dim: int = 64) -> dict:
    """cuBLASLt's Q/K/V GEMM + the norm/rotary kernel against the GEMM with them in its epilogue
    (q and k in ``qkv_pair_order``; compared after putting them back in the layer's order)."""
    dev = torch.device("cuda")
    hd, k = heads * dim, SHAPES["qkv"][1]
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(3 * hd, k, device=dev, dtype=torch.bfloat16) * 0.03
    qn, kn = (torch.rand(dim, device=dev, dtype=torch.bfloat16) + 0.5 for _ in range(2))
    angles = torch.randn(m, dim, device=dev) * 20
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    order = torch.tensor(qkv_pair_order(dim), device=dev)
    back = torch.argsort(order)
    wp = w.view(3, heads, dim, k).clone()
    wp[0], wp[1] = wp[0][:, order], wp[1][:, order]
    xq, xs = quantize_rows(x)
    wq, ws = quantize_rows(w)
    ws_t = ws.t().contiguous()
    wpq, wps = quantize_rows(wp.reshape(3 * hd, k))

    def stock() -> tuple[torch.Tensor, ...]:
        qkv = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws_t, out_dtype=torch.bfloat16)
        return qkv_norm_rope(qkv.view(1, m, -1), cos[None], sin[None], qn, kn, heads, 1e-6)

    def fused(launch: dict[str, int]) -> torch.Tensor:
        return fp8_gemm_qkv(
            xq, xs, wpq, wps, cos, sin, qn[order], kn[order], heads, 1e-6, launch=launch
        )

    sq, sk, sv = (t.reshape(m, heads, dim).float() for t in stock())

    def measure(launch: dict[str, int]) -> dict:
        f = fused(launch).float().view(3, m, heads, dim)
        return {
            "max_abs_vs_stock": [
                (f[0][..., back] - sq).abs().max().item(),
                (f[1][..., back] - sk).abs().max().item(),
                (f[2] - sv).abs().max().item(),
            ],
            "ms": median_ms(lambda: fused(launch), repeats),
        }

    return {"stock_ms": median_ms(stock, repeats), "fused": each_launch(measure)}


if __name__ == "__main__":
    main()
