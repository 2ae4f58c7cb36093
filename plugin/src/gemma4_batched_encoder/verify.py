"""``python -m gemma4_batched_encoder.verify``: the plugin vs the per-item stock tower, bit for bit.

Runs every requested batch size as its own call (batch size changes kernel choice) and every
call twice (on CUDA the first captures graphs, the second replays them). Prints JSON; exits 1
when any item differs in exact mode (or exceeds --tolerance in fast mode), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from dataclasses import replace
from typing import Any

import torch

from . import __version__
from .cli_common import (
    Parser,
    UsageError,
    add_common,
    composition,
    inputs,
    int_list,
    laid_out,
    load_tower,
    run_and_write,
)
from .encoder import BatchedVisionEncoder
from .pooling import pool_batched, pooling_weights
from .reference import encoded_buckets, serial_per_item
from .settings import Settings


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def _gather_pool(
    hidden: torch.Tensor, position_ids: torch.Tensor, length: int, k: int, fused: bool
) -> torch.Tensor:
    """Fixed-order pooling without a GEMM: each bin's k*k patches summed in ascending patch order
    (the order a sequential-K GEMM would use), fp32, with multiply-then-add or addcmul."""
    bins = pooling_weights(position_ids[None], length, k)[0].argmax(-1)  # [P]
    valid = (position_ids != -1).any(-1)
    p = torch.arange(bins.shape[0], device=bins.device)
    order = torch.argsort(torch.where(valid, bins, length) * bins.shape[0] + p)
    n_bins = int(valid.sum()) // (k * k)
    idx = order[: n_bins * k * k].reshape(n_bins, k * k)
    x = hidden.float()[idx]  # [bins, k*k, H]
    w = torch.tensor(1.0 / (k * k), dtype=torch.float32, device=hidden.device)
    acc = torch.zeros_like(x[:, 0])
    for j in range(k * k):
        acc = torch.addcmul(acc, x[:, j], w) if fused else acc + x[:, j] * w
    return acc


def pooler_alternatives(
    vt: torch.nn.Module, pvs: list[torch.Tensor], pps: list[torch.Tensor]
) -> dict[str, float]:
    """Max |diff| vs the per-item pooler, on the same encoder output, of one batched pooler GEMM
    (what the blog saw drift) and two fixed-order gather+sum formulations. Diagnostics only:
    whether this device shows the drift, and whether a GEMM-free order would have matched."""
    worst = {"naive_bmm": 0.0, "gather_mul_add": 0.0, "gather_addcmul": 0.0}
    k = vt.config.pooling_kernel_size
    root = vt.pooler.root_hidden_size
    with torch.inference_mode():
        for idx, pp, pad, hidden in encoded_buckets(vt, pvs, pps):
            length = pp.shape[1] // (k * k)
            batched = pool_batched(hidden, pp, pad, length, k, root).to(hidden.dtype)
            masked = hidden.masked_fill(pad.unsqueeze(-1), 0.0)
            for j in range(len(idx)):
                single, _ = vt.pooler(
                    hidden_states=hidden[j : j + 1],
                    pixel_position_ids=pp[j : j + 1],
                    padding_positions=pad[j : j + 1],
                    output_length=length,
                )
                single = single.to(hidden.dtype)
                d = _diff(batched[j : j + 1], single)
                worst["naive_bmm"] = max(worst["naive_bmm"], d)
                for name, fused in (("gather_mul_add", False), ("gather_addcmul", True)):
                    g = _gather_pool(masked[j], pp[j], length, k, fused)
                    g = (g.to(hidden.dtype).float() * root).to(hidden.dtype)
                    worst[name] = max(worst[name], _diff(g, single[0, : g.shape[0]]))
    return worst


def fp32_reference(vt: torch.nn.Module, pvs: list, pps: list) -> list[torch.Tensor]:
    """The per-item stock tower in fp32 (a copy of the same weights): the yardstick for how far
    any bf16/fp16 computation, stock included, is from the real-valued result."""
    vt32 = copy.deepcopy(vt).float()
    return serial_per_item(vt32, [p.float() for p in pvs], pps)


def run(args: argparse.Namespace) -> dict[str, Any]:
    vt = load_tower(args)
    noise_floor = args.noise_floor and args.dtype != "fp32"
    settings = replace(Settings.from_env(), mode=args.mode, cuda_graphs=args.cuda_graphs == "on")
    encoder = BatchedVisionEncoder(vt, settings)
    k = vt.config.pooling_kernel_size
    calls = []
    worst = 0.0
    worst_rel = 0.0
    all_equal = True
    for n, videos in enumerate(int_list(args.videos)):
        comp = composition(args, videos, k)
        if not comp.media:
            continue
        pvs, pps = inputs(args, comp, vt, seed=args.seed + 1000 + n)
        ref = serial_per_item(vt, pvs, pps)
        ref32 = fp32_reference(vt, pvs, pps) if noise_floor else None
        plugin_inputs = laid_out(args, pvs, pps)  # once, outside the timed calls
        runs = []
        for _ in range(2):
            t0 = time.perf_counter()
            out = encoder.encode(*plugin_inputs, mode=args.mode)
            if args.device == "cuda":
                torch.cuda.synchronize()
            runs.append((out, time.perf_counter() - t0))
        items = []
        for i, (m, r) in enumerate(zip(comp.media, ref, strict=True)):
            diffs = [_diff(o[i], r) for o, _ in runs]
            equal = all(o[i].shape == r.shape and torch.equal(o[i], r) for o, _ in runs)
            items.append(
                {
                    "index": i,
                    "kind": m.kind,
                    "grid": f"{m.grid[0]}x{m.grid[1]}",
                    "budget": m.budget,
                    "tokens": int(r.shape[0]),
                    "bit_identical": equal,
                    "max_abs_diff": max(diffs),
                    # scale-free: random-weight towers reach |values| in the thousands
                    "max_abs_ref": float(r.float().abs().max()),
                }
            )
            if ref32 is not None:
                # stock's own rounding error vs the plugin's, both against fp32
                items[-1]["stock_vs_fp32"] = _diff(r.float(), ref32[i])
                items[-1]["plugin_vs_fp32"] = max(_diff(o[i].float(), ref32[i]) for o, _ in runs)
        call_diff = max(it["max_abs_diff"] for it in items)
        call_rel = max(it["max_abs_diff"] / max(it["max_abs_ref"], 1e-30) for it in items)
        worst_rel = max(worst_rel, call_rel)
        call_equal = all(it["bit_identical"] for it in items)
        worst = max(worst, call_diff)
        all_equal &= call_equal
        call = {
            "videos": videos,
            "frames": comp.frames,
            "images": comp.images,
            "bit_identical": call_equal,
            "max_abs_diff": call_diff,
            "max_rel_diff": call_rel,
            "seconds_first": runs[0][1],
            "seconds_second": runs[1][1],
            "items": [it for it in items if not it["bit_identical"]]
            if args.mismatches_only
            else items,
        }
        if ref32 is not None:
            call["stock_vs_fp32"] = max(it["stock_vs_fp32"] for it in items)
            call["plugin_vs_fp32"] = max(it["plugin_vs_fp32"] for it in items)
        if args.pooler_drift:
            call["pooler_alternatives_max_abs_diff"] = pooler_alternatives(vt, pvs, pps)
        calls.append(call)
    return {
        "tool": "gemma4_batched_encoder.verify",
        "plugin_version": __version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "preset": None if args.config else args.preset,
        "config": args.config,
        "dtype": args.dtype,
        "mode": args.mode,
        "layout": args.layout,
        "cuda_graphs": encoder.graphs_active(torch.device(args.device)),
        "cuda_graphs_captured": encoder.graphs.num_graphs,
        "fused_layers": encoder.fused_in_use(),
        "seed": args.seed,
        "bit_identical": all_equal,
        "max_abs_diff": worst,
        "max_rel_diff": worst_rel,
        **(
            {
                "stock_vs_fp32": max(c["stock_vs_fp32"] for c in calls),
                "plugin_vs_fp32": max(c["plugin_vs_fp32"] for c in calls),
            }
            if noise_floor and calls
            else {}
        ),
        "calls": calls,
    }


def check(args: argparse.Namespace) -> None:
    """verify's own options (``cli_common.check_args`` checks the shared ones)."""
    if args.tolerance is not None and not (math.isfinite(args.tolerance) and args.tolerance >= 0):
        raise UsageError(f"--tolerance {args.tolerance}: must be a finite number >= 0")


def main(argv: list[str] | None = None) -> int:
    p = Parser(
        prog="python -m gemma4_batched_encoder.verify",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(p)
    p.add_argument(
        "--videos", default="1,2,4", help="videos per call; a comma list runs one call each"
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="fast mode: exit 1 if max_abs_diff exceeds this (default: report only)",
    )
    p.add_argument(
        "--mismatches-only",
        action="store_true",
        help="list only differing items (default: every item)",
    )
    p.add_argument(
        "--noise-floor",
        action="store_true",
        help="also run the stock tower in fp32 and report how far stock and the plugin each are "
        "from it (stock_vs_fp32, plugin_vs_fp32): the fair yardstick for fast mode",
    )
    p.add_argument(
        "--pooler-drift",
        action="store_true",
        help="also measure a naive one-GEMM batched pooler against the per-item pooler",
    )
    args = p.parse_args(argv)
    result = run_and_write(args, run, lambda r: json.dumps(r, indent=2), check)
    if result is None:
        return 2
    if args.mode == "exact":
        return 0 if result["bit_identical"] else 1
    if any(it["max_abs_diff"] == float("inf") for c in result["calls"] for it in c["items"]):
        return 1
    if args.tolerance is not None and result["max_abs_diff"] > args.tolerance:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
