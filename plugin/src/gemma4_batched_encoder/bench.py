"""``python -m gemma4_batched_encoder.bench``: vision-tower time per call, stock paths vs plugin.

Methods (same tower, same inputs per batch size):
  serial        vt(pv, pp) once per frame/image (vLLM 0.20-0.22)
  upstream      encoder batched, pooler + boolean-mask indexing per item (vLLM 0.23+)
  exact         plugin exact mode, eager, unfused
  exact-graphs  plugin exact mode replayed from CUDA graphs (CUDA only), unfused
  exact-fused   exact-graphs with the inductor-fused encoder layers (GEMMA4_ENCODER_FUSED=on)
  fast          plugin fast mode (CUDA graphs on CUDA; layers compiled per GEMMA4_ENCODER_FUSED)
Prints median milliseconds and ratios; ``--out`` writes everything as JSON. Each method's first
output is also checked bit for bit against ``serial``. Video-only rows give the plugin methods
each frame's soft-token count from the host, as vLLM does when serving (``--token-counts``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
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
from .inputs import count_valid_patches
from .reference import serial_per_item, upstream_batched
from .settings import Settings

METHODS = ("serial", "upstream", "exact", "exact-graphs", "exact-fused", "fast")


def timed(fn: Callable[[], Any], device: str, warmup: int, repeats: int) -> tuple[Any, list[float]]:
    """``fn``'s last output and the wall milliseconds of each timed call, synchronized on CUDA
    before and after each (this CLI's figures; the bench scripts time whole calls with it too)."""
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000.0)
    return out, times


def event_ms(fn: Callable[[], object], warmup: int, repeats: int) -> list[float]:
    """GPU milliseconds of each call of ``fn`` between two CUDA events (no host time: kernel
    launches and graph replays as the stream runs them). CUDA only."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def run(args: argparse.Namespace) -> dict[str, Any]:
    vt = load_tower(args)
    base = Settings.from_env()
    cuda = args.device == "cuda"
    methods = [m for m in args.methods.split(",") if m]
    # exact-fused gives the tower's norms their eager-kernel `_norm` (fused.py); fast mode's own
    # compiled layers are timed on an untouched copy so that they fuse the norms.
    fast_vt = copy.deepcopy(vt) if "exact-fused" in methods and "fast" in methods else vt
    encoders = {
        # The unfused columns stay unfused whatever GEMMA4_ENCODER_FUSED says (auto by default).
        "exact": BatchedVisionEncoder(
            vt, replace(base, mode="exact", cuda_graphs=False, fused="off")
        ),
        "exact-graphs": BatchedVisionEncoder(
            vt, replace(base, mode="exact", cuda_graphs=True, fused="off")
        ),
        "exact-fused": BatchedVisionEncoder(
            vt, replace(base, mode="exact", cuda_graphs=True, fused="on")
        ),
        "fast": BatchedVisionEncoder(fast_vt, replace(base, mode="fast", cuda_graphs=cuda)),
    }
    for graphs_only in ("exact-graphs", "exact-fused"):
        if not cuda and graphs_only in methods:
            methods.remove(graphs_only)  # graphs exist only on CUDA
    rows = []
    for n, videos in enumerate(int_list(args.videos)):
        comp = composition(args, videos, vt.config.pooling_kernel_size)
        pvs, pps = inputs(args, comp, vt, seed=args.seed + 1000 + n)
        fns: dict[str, Callable[[], Any]] = {
            "serial": partial(serial_per_item, vt, pvs, pps),
            "upstream": partial(upstream_batched, vt, pvs, pps),
        }
        # As served: vLLM hands the plugin each video frame's soft-token count from the host, and
        # none for images, whose valid patches are then counted on the device (a host transfer).
        hints = None
        if comp.images == 0 and args.token_counts == "host":
            k2 = vt.config.pooling_kernel_size**2
            hints = [c // k2 for c in count_valid_patches(pps)]  # untimed, once
        plugin_inputs = laid_out(args, pvs, pps)
        for name, enc in encoders.items():
            fns[name] = partial(enc.encode, *plugin_inputs, hints)
        reference = serial_per_item(vt, pvs, pps)
        row: dict[str, Any] = {
            "videos": videos,
            "frames": comp.frames,
            "images": comp.images,
            "token_counts": "host" if hints is not None else "device",
        }
        for m in methods:
            out, times = timed(fns[m], args.device, args.warmup, args.repeats)
            row[m] = {
                "median_ms": statistics.median(times),
                "min_ms": min(times),
                "times_ms": times,
                "bit_identical": all(
                    a.shape == b.shape and torch.equal(a, b)
                    for a, b in zip(out, reference, strict=True)
                ),
            }
        rows.append(row)
        print(_format_row(row, methods), file=sys.stderr, flush=True)
    return {
        "tool": "gemma4_batched_encoder.bench",
        "plugin_version": __version__,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "preset": None if args.config else args.preset,
        "config": args.config,
        "dtype": args.dtype,
        "frames_per_video": args.frames,
        "frame_grid": args.frame_grid,
        "layout": args.layout,
        "images": args.images,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "command": " ".join(sys.argv),
        "methods": methods,
        "rows": rows,
    }


def _format_row(row: dict[str, Any], methods: list[str]) -> str:
    cells = [f"{row['videos']:>6} {row['frames']:>6} {row['images']:>6}"]
    for m in methods:
        mark = "" if row[m]["bit_identical"] else "*"
        cells.append(f"{row[m]['median_ms']:>11.1f}{mark:1}")
    best = min(
        (row[m]["median_ms"] for m in methods if m.startswith("exact")), default=float("nan")
    )
    for ref in ("serial", "upstream"):
        if ref in methods:
            cells.append(f"{row[ref]['median_ms'] / best:>9.1f}x")
    return " ".join(cells)


def table(result: dict[str, Any]) -> str:
    methods = result["methods"]
    head = [f"{'videos':>6} {'frames':>6} {'images':>6}"] + [f"{m + ' ms':>12}" for m in methods]
    head += [f"{r + '/exact':>10}" for r in ("serial", "upstream") if r in methods]
    lines = [" ".join(head)] + [_format_row(r, methods) for r in result["rows"]]
    lines.append(
        f"median of {result['repeats']} runs after {result['warmup']} warm-ups; "
        "* = not bit-identical to serial; x/exact = ratio to the best exact variant"
    )
    return "\n".join(lines)


def check(args: argparse.Namespace) -> None:
    """bench's own options (``cli_common.check_args`` checks the shared ones)."""
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown or not methods:
        raise UsageError(f"--methods {args.methods!r}: choose from {','.join(METHODS)}")
    if args.warmup < 0:
        raise UsageError(f"--warmup {args.warmup}: must be >= 0")
    if args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats}: must be >= 1 (the median of the timed runs)")


def main(argv: list[str] | None = None) -> int:
    p = Parser(
        prog="python -m gemma4_batched_encoder.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(p)
    p.add_argument("--videos", default="1,2,4,8,16", help="videos per call, one row each")
    p.add_argument(
        "--methods", default=",".join(METHODS), help="comma list of " + ",".join(METHODS)
    )
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument(
        "--token-counts",
        choices=("host", "device"),
        default="host",
        help="plugin methods' valid-token counts for video-only rows: from the host, as vLLM "
        "passes them for video frames (default), or counted on the device (a host transfer "
        "inside the timed call, as for images and in the bench before 2026-12-03)",
    )
    args = p.parse_args(argv)
    return 2 if run_and_write(args, run, table, check) is None else 0


if __name__ == "__main__":
    sys.exit(main())
