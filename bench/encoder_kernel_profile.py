"""Where one encoder call's GPU time goes, by kernel kind (torch.profiler, CUDA only).

Runs the plugin's encoder (``--mode``, the GEMMA4_ENCODER_* settings of the environment, CUDA
graphs off so that every kernel is seen; a replay runs the same kernels) on N 6-frame 480p
videos of the E4B tower, and prints GPU milliseconds per call by kind (GEMM, attention, Triton
(inductor-fused), other elementwise/reductions, copies) and the top kernels. Issue 3's `fast`
targets (1 / 16 videos <= 3 / 35 ms) need to know which of these dominates.

    PYTHONPATH=plugin/src python bench/encoder_kernel_profile.py --mode fast --videos 16
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugin" / "src"))

from gemma4_batched_encoder import synthetic as S
from gemma4_batched_encoder.encoder import BatchedVisionEncoder
from gemma4_batched_encoder.inputs import count_valid_patches
from gemma4_batched_encoder.settings import Settings

# First match wins: attention before GEMM, since cuDNN's flash attention kernel is named
# `..._sdpa_sm90_flash_fprop_wgmma_...` (the 2026-12-02 profiles, made before this order, count it
# as gemm).
KINDS = [
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|xmma|sm90_|sm100_|cublas", re.I)),
    ("triton", re.compile(r"^triton_", re.I)),
    ("copy", re.compile(r"copy|memcpy|memset|cat|fill", re.I)),
]


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "elementwise/other"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["exact", "fast"], default="fast")
    p.add_argument("--videos", type=int, default=16)
    p.add_argument("--frames", type=int, default=6)
    p.add_argument("--calls", type=int, default=5, help="profiled calls (after 3 warm-ups)")
    # all by default: the small kernels are what bounds one video's time (~680 launches a call)
    p.add_argument("--top", type=int, default=0, help="kernels kept in the JSON (0: all)")
    p.add_argument(
        "--token-counts",
        choices=("host", "device"),
        default="host",
        help="the frames' soft-token counts from the host, as vLLM serves them (default), or "
        "counted on the device inside each call (the profiles before the twentieth sitting: "
        "4 small kernels a frame more)",
    )
    p.add_argument("--out")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("encoder_kernel_profile: needs CUDA")
    vt = S.build_vision_tower(
        S.vision_config_kwargs("e4b", None), seed=0, dtype=torch.bfloat16, device="cuda"
    )
    media = [S.Media("frame", (21, 27), 70)] * (args.videos * args.frames)
    pvs, pps = S.make_batch(media, 3 * vt.config.patch_size**2, vt.config.pooling_kernel_size)
    pv = [x.to("cuda", torch.bfloat16) for x in pvs]
    pp = [x.to("cuda") for x in pps]
    settings = replace(Settings.from_env(), mode=args.mode, cuda_graphs=False)
    enc = BatchedVisionEncoder(vt, settings)
    k2 = vt.config.pooling_kernel_size**2
    hints = [c // k2 for c in count_valid_patches(pp)] if args.token_counts == "host" else None
    for _ in range(3):
        enc.encode(pv, pp, hints)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.calls):
            enc.encode(pv, pp, hints)
        torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            entry = per_kernel[ev.name]
            entry[0] += ev.device_time / 1000.0 / args.calls  # ms per call
            entry[1] += 1 / args.calls
    kinds: dict[str, float] = defaultdict(float)
    for name, (ms, _) in per_kernel.items():
        kinds[kind_of(name)] += ms
    total = sum(kinds.values())
    top = sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[: args.top or None]
    result = {
        "mode": args.mode,
        "fast_kernels": settings.fast_kernels,
        "fused": settings.fused,
        "videos": args.videos,
        "token_counts": args.token_counts,
        "frames": args.videos * args.frames,
        "gpu_ms_per_call": round(total, 3),
        "by_kind_ms": {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "kernels_per_call": round(sum(n for _, n in per_kernel.values())),
        "top": [
            {"name": n[:120], "ms": round(ms, 3), "launches": round(c, 1), "kind": kind_of(n)}
            for n, (ms, c) in top
        ],
    }
    print(
        f"{args.mode}/{settings.fast_kernels} {args.videos} videos: {total:.2f} GPU ms a call, "
        f"{result['kernels_per_call']} kernels; "
        + ", ".join(f"{k} {v:.2f}" for k, v in result["by_kind_ms"].items())
    )
    for t in result["top"][:8]:
        print(f"  {t['ms']:7.3f} ms x{t['launches']:<5} {t['kind']:<10} {t['name'][:70]}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
