"""What a kernel boundary costs inside a CUDA graph, and which kernels fast mode's ops issue.

Fast mode's 16-video pass replays ~272 kernels whose sum is ~1.1 ms shorter than the replay
(twenty-second sitting). On a GPU:
1. a graph of N tiny kernels (one-element adds) and one of N tiny memsets, replayed: the time per
   node, i.e. what each kernel boundary costs when the kernels themselves are negligible;
2. the kernels one call of each op of a float8 merged layer issues at 16 videos' rows (the four
   float8 GEMMs through ``torch._scaled_mm``, SDPA on [B, H, L, D]), from the profiler: names and
   counts, so the 81 memsets of the pass can be placed.

    PYTHONPATH=plugin/src python bench/graph_boundaries.py --out boundaries.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from gemma4_batched_encoder.bench import event_ms

ROWS, HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE = 54432, 768, 12, 64, 3072  # 16 videos, E4B
ITEMS, LENGTH = 96, 567


def _replay_ms(graph: torch.cuda.CUDAGraph, repeats: int = 20) -> float:
    return statistics.median(event_ms(graph.replay, 3, repeats))


def _graph_of(step: Callable[[], object], nodes: int) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(nodes):
            step()
    return graph


def boundary_costs(nodes: int) -> dict:
    """Microseconds a node for tiny kernels and tiny memsets replayed from one graph."""
    one = torch.zeros(1, device="cuda")
    small = torch.zeros(256, device="cuda")
    out = {}
    for name, step in (("add_1_element", lambda: one.add_(1)), ("memset_1kb", small.zero_)):
        ms = _replay_ms(_graph_of(step, nodes))
        out[name] = {
            "nodes": nodes,
            "replay_ms": round(ms, 4),
            "us_a_node": round(ms * 1e3 / nodes, 3),
        }
    return out


def _kernels(fn: Callable[[], object]) -> dict[str, int]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = Counter(
        e.name[:100] for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    )
    return dict(names)


def op_kernels() -> dict:
    """Kernel names and counts of one call of each op of a float8 merged layer."""
    x = torch.randn(ROWS, HIDDEN, device="cuda").to(torch.float8_e4m3fn)
    wide = torch.randn(ROWS, INTERMEDIATE, device="cuda").to(torch.float8_e4m3fn)
    scale = torch.ones(ROWS, 1, device="cuda")
    out = {}
    for name, n, src in (
        ("qkv", 3 * HIDDEN, x),
        ("o", HIDDEN, x),
        ("gate_up", 2 * INTERMEDIATE, x),
        ("down", HIDDEN, wide),
    ):
        w = torch.randn(n, src.shape[1], device="cuda").to(torch.float8_e4m3fn)
        w_scale = torch.ones(1, n, device="cuda")
        out[f"scaled_mm_{name}"] = _kernels(
            lambda src=src, w=w, w_scale=w_scale: torch._scaled_mm(
                src, w.t(), scale_a=scale, scale_b=w_scale, out_dtype=torch.bfloat16
            )
        )
    q, k, v = (
        torch.randn(ITEMS, LENGTH, HEADS, HEAD_DIM, device="cuda")
        .to(torch.bfloat16)
        .transpose(1, 2)
        for _ in range(3)
    )
    out["sdpa"] = _kernels(lambda: F.scaled_dot_product_attention(q, k, v, scale=1.0))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--out")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("graph_boundaries: needs CUDA")
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    result["boundaries"] = boundary_costs(args.nodes)
    result["op_kernels"] = op_kernels()
    for name, row in result["boundaries"].items():
        print(f"{name:<16} {row['us_a_node']:7.3f} us a node ({row['nodes']} nodes)")
    for op, kernels in result["op_kernels"].items():
        print(f"{op:<18} " + "; ".join(f"{n} x{c}" for n, c in kernels.items()))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
