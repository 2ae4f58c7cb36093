"""Probe for issue 3's `exact` fusion: can inductor fuse the tower's elementwise work and keep bits?

The Gemma 4 vision tower at scale is bound by unfused elementwise work (norms in fp32, rotary,
gelu, residuals; ../shared/notes/h200-encoder-baseline.md). This probe compiles each encoder
layer with inductor while keeping what inductor would compute differently from eager:

- ``torch._inductor.config.emulate_precision_casts``: bf16 intermediates are rounded after every
  op, as eager does (without it the fused MLP differs in ~half the elements on CPU);
- the RMSNorm's mean (a reduction: inductor sums in another order) and its ``pow(x, -0.5)``
  (eager runs rsqrt; inductor's CPU rsqrt differs) stay eager kernels, as custom ops inductor
  cannot look into. GEMMs and SDPA are aten calls in both.

It then runs the plugin's ``exact`` mode (CUDA graphs where on CUDA) on the same inputs before
and after, checks every item with ``torch.equal`` against the serial per-item tower, and prints
median times side by side. This probe made bench/results/h200/encoder-fusion/fusion-*.json and
led to the plugin's fused path (gemma4_batched_encoder/fused.py, whose norm it now borrows); the
plugin compiles differently (one function for all layers, dynamic shapes, the class left alone)
and is measured by ``gemma4_batched_encoder.bench --methods exact-graphs,exact-fused``.

    PYTHONPATH=plugin/src python bench/encoder_fusion_probe.py --preset e4b --device cuda \
        --videos 1,4,16 --check-images 4 --out fusion.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugin" / "src"))

from gemma4_batched_encoder import synthetic as S
from gemma4_batched_encoder.encoder import BatchedVisionEncoder
from gemma4_batched_encoder.fused import _norm_eager_reduction
from gemma4_batched_encoder.reference import serial_per_item
from gemma4_batched_encoder.settings import Settings


def fuse(vt: torch.nn.Module) -> None:
    import torch._dynamo
    import torch._inductor.config as inductor_config
    from transformers.models.gemma4 import modeling_gemma4

    if not hasattr(inductor_config, "emulate_precision_casts"):
        raise SystemExit("this torch has no inductor emulate_precision_casts")
    inductor_config.emulate_precision_casts = True
    torch._dynamo.config.cache_size_limit = max(64, torch._dynamo.config.cache_size_limit)
    modeling_gemma4.Gemma4RMSNorm._norm = _norm_eager_reduction
    for layer in vt.encoder.layers:
        layer.forward = torch.compile(layer.forward, dynamic=False)


def media(videos: int, frames: int, images: int, k: int) -> list[S.Media]:
    out = [S.Media("frame", (21, 27), 70)] * (videos * frames)
    budgets, aspects = (70, 140, 280), (1.333, 0.75, 1.0, 2.0)
    for i in range(images):
        b = budgets[i % 3]
        out.append(S.Media("image", S.grid_for_budget(b, k, aspects[i % 4]), b))
    return out


def timed(fn, cuda: bool, warmup: int, reps: int) -> tuple[list[torch.Tensor], float]:
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return out, statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="e4b")
    p.add_argument("--layers", type=int, default=0, help="override num_hidden_layers (0: preset)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--videos", default="1,4,16")
    p.add_argument("--frames", type=int, default=6)
    p.add_argument("--check-images", type=int, default=4, help="images beside the largest batch")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--out")
    args = p.parse_args()
    cuda = args.device == "cuda"
    kw = S.vision_config_kwargs(args.preset)
    if args.layers:
        kw["num_hidden_layers"] = args.layers
    vt = S.build_vision_tower(kw, seed=0, dtype=torch.bfloat16, device=args.device)
    k, dim = vt.config.pooling_kernel_size, 3 * vt.config.patch_size**2
    sizes = [int(v) for v in args.videos.split(",")]
    cases = []
    for n, videos in enumerate(sizes):
        images = args.check_images if videos == max(sizes) else 0
        pvs, pps = S.make_batch(media(videos, args.frames, images, k), dim, k, seed=1000 + n)
        pvs = [x.to(args.device, torch.bfloat16) for x in pvs]
        pps = [x.to(args.device) for x in pps]
        cases.append({"videos": videos, "images": images, "inputs": (pvs, pps)})
    settings = replace(Settings.from_env(), mode="exact", cuda_graphs=cuda)
    for case in cases:  # before fusion: the reference and the plugin as it is
        pvs, pps = case["inputs"]
        case["reference"] = serial_per_item(vt, pvs, pps)
        enc = BatchedVisionEncoder(vt, settings)
        out, case["exact_ms"] = timed(partial(enc.encode, pvs, pps), cuda, args.warmup, args.reps)
        case["exact_identical"] = all(map(torch.equal, out, case["reference"]))
    fuse(vt)
    for case in cases:
        pvs, pps = case["inputs"]
        t0 = time.perf_counter()
        eager = BatchedVisionEncoder(vt, replace(settings, cuda_graphs=False))
        first = eager.encode(pvs, pps)
        case["fused_first_call_s"] = round(time.perf_counter() - t0, 1)
        ref = case["reference"]
        case["fused_eager_identical"] = all(map(torch.equal, first, ref))
        case["fused_eager_differing_elements"] = sum(
            int((a != b).sum()) for a, b in zip(first, ref, strict=True)
        )
        case["fused_eager_max_abs_diff"] = max(
            float((a.float() - b.float()).abs().max()) for a, b in zip(first, ref, strict=True)
        )
        _, case["fused_eager_ms"] = timed(partial(eager.encode, pvs, pps), cuda, 1, args.reps)
        if cuda:
            enc = BatchedVisionEncoder(vt, settings)
            out, case["fused_graphs_ms"] = timed(partial(enc.encode, pvs, pps), cuda, 2, args.reps)
            case["fused_graphs_identical"] = all(map(torch.equal, out, ref))
    rows = [{k: v for k, v in c.items() if k not in ("inputs", "reference")} for c in cases]
    meta = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "preset": args.preset,
        "layers": vt.config.num_hidden_layers,
        "frames_per_video": args.frames,
        "frame_grid": "21x27 (630 patches, 70 soft tokens)",
    }
    print(json.dumps(meta))
    cols = ["videos", "images", "exact_ms", "fused_eager_ms", "fused_graphs_ms"]
    cols += ["exact_identical", "fused_eager_identical", "fused_graphs_identical"]
    cols += ["fused_eager_differing_elements", "fused_first_call_s"]
    print(" | ".join(cols))
    for r in rows:
        cells = (f"{r[c]:.2f}" if isinstance(r.get(c), float) else str(r.get(c, "-")) for c in cols)
        print(" | ".join(cells))
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    ok = all(r["fused_eager_identical"] and r.get("fused_graphs_identical", True) for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
