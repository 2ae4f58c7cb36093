"""``python -m gemma4_batched_encoder.verify``: the plugin vs the per-item stock tower, bit for bit.

Runs every requested batch size as its own call (batch size changes kernel choice) and every
call twice (on CUDA the first captures graphs, the second replays them). Prints JSON; exits 1
when any item differs in exact mode (or exceeds --tolerance in fast mode), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from typing import Any

import torch

from . import __version__
from .cli_common import add_common, composition, inputs, int_list, load_tower
from .encoder import BatchedVisionEncoder
from .pooling import pool_batched
from .reference import serial_per_item
from .settings import Settings


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def naive_pooler_drift(
    vt: torch.nn.Module, pvs: list[torch.Tensor], pps: list[torch.Tensor]
) -> float:
    """Max |diff| of one batched pooler GEMM vs per-item pooling on the same encoder output
    (what the blog saw drift): shows whether this device exposes the effect at all."""
    groups: dict[int, list[int]] = {}
    for i, pv in enumerate(pvs):
        groups.setdefault(pv.shape[0], []).append(i)
    worst = 0.0
    k = vt.config.pooling_kernel_size
    with torch.inference_mode():
        for idx in groups.values():
            pv = torch.stack([pvs[i] for i in idx])
            pp = torch.stack([pps[i] for i in idx])
            pad = (pp == -1).all(dim=-1)
            hidden = vt.encoder(
                inputs_embeds=vt.patch_embedder(pv, pp, pad),
                attention_mask=~pad,
                pixel_position_ids=pp,
            ).last_hidden_state
            length = pv.shape[1] // (k * k)
            batched = pool_batched(hidden, pp, pad, length, k, vt.pooler.root_hidden_size)
            for j in range(len(idx)):
                single, _ = vt.pooler(
                    hidden_states=hidden[j : j + 1],
                    pixel_position_ids=pp[j : j + 1],
                    padding_positions=pad[j : j + 1],
                    output_length=length,
                )
                worst = max(
                    worst, _diff(batched[j : j + 1].to(hidden.dtype), single.to(hidden.dtype))
                )
    return worst


def run(args: argparse.Namespace) -> dict[str, Any]:
    vt = load_tower(args)
    settings = replace(Settings.from_env(), mode=args.mode, cuda_graphs=args.cuda_graphs == "on")
    encoder = BatchedVisionEncoder(vt, settings)
    k = vt.config.pooling_kernel_size
    calls = []
    worst = 0.0
    all_equal = True
    for n, videos in enumerate(int_list(args.videos)):
        comp = composition(args, videos, k)
        if not comp.media:
            continue
        pvs, pps = inputs(args, comp, vt, seed=args.seed + 1000 + n)
        ref = serial_per_item(vt, pvs, pps)
        runs = []
        for _ in range(2):
            t0 = time.perf_counter()
            out = encoder.encode(pvs, pps, mode=args.mode)
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
                }
            )
        call_diff = max(it["max_abs_diff"] for it in items)
        call_equal = all(it["bit_identical"] for it in items)
        worst = max(worst, call_diff)
        all_equal &= call_equal
        call = {
            "videos": videos,
            "frames": comp.frames,
            "images": comp.images,
            "bit_identical": call_equal,
            "max_abs_diff": call_diff,
            "seconds_first": runs[0][1],
            "seconds_second": runs[1][1],
            "items": [it for it in items if not it["bit_identical"]]
            if args.mismatches_only
            else items,
        }
        if args.pooler_drift:
            call["naive_batched_pooler_max_abs_diff"] = naive_pooler_drift(vt, pvs, pps)
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
        "cuda_graphs": encoder.graphs_active(torch.device(args.device)),
        "cuda_graphs_captured": encoder.graphs.num_graphs,
        "seed": args.seed,
        "bit_identical": all_equal,
        "max_abs_diff": worst,
        "calls": calls,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
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
        "--pooler-drift",
        action="store_true",
        help="also measure a naive one-GEMM batched pooler against the per-item pooler",
    )
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available", file=sys.stderr)
        return 2
    try:
        result = run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if not result["calls"]:
        print("error: nothing to verify (no videos and no images)", file=sys.stderr)
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
