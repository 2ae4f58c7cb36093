"""Fast mode's hand-written kernels under other launches, and where a served call's time goes.

On a GPU (torch + triton + transformers, no vLLM), E4B vision dims, bf16, 6-frame 480p videos
(21x27 patches a frame, as ``encoder_kernel_profile.py``):
1. ``gelu_mul_quant`` (fp8_quant.py) for rows a program x warps: time and bandwidth, and whether
   every launch gives the default launch's bytes (it must: amax is exact in any order);
2. ``qkv_norm_rope`` (qkv_kernel.py) for row blocks x warps x one program per head or per row
   block (all heads: the rows' cos/sin read once), and at the first count with each head as four
   quarter loads: time, and the largest difference from the default launch;
3. ``add_norm_quant`` (fp8_quant.py; ``merged-triton-fp8-norms``) for rows a program x warps:
   time, bandwidth, and whether the launch gives the default's bytes (the row sums' order may
   differ with the launch);
4. attention as the merged layer calls it (SDPA on q/k/v transposed from [B, L, H, D]) per SDPA
   backend, and with contiguous [B, H, L, D] inputs;
5. the whole fast pass as served (``merged-triton-fp8``, CUDA graphs, the frames' token counts
   from the host) with the launches in the source (the table as committed) and the fastest
   launches found above, each without and with the fused norms
   (``merged-triton-fp8-norms``): wall time side by side in one process, and a profile of
   each call's CPU span against its kernels (the time the GPU waits, the kernel count, the
   longest gaps).

    PYTHONPATH=plugin/src python bench/fast_kernel_tune.py --out tune.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugin" / "src"))

from gemma4_batched_encoder import fast_layers, fp8_quant, launch_config, qkv_kernel
from gemma4_batched_encoder import synthetic as S
from gemma4_batched_encoder.bench import event_ms, timed
from gemma4_batched_encoder.encoder import BatchedVisionEncoder
from gemma4_batched_encoder.inputs import count_valid_patches
from gemma4_batched_encoder.settings import Settings

FRAME_GRID = (21, 27)  # 480p after the processor's resize: 567 valid patches of 630
FRAMES = 6  # a video's frames (--frames)
# "cpu" (with TRITON_INTERPRET=1 and --preset tiny) only checks that the script runs
DEVICE = "cuda"


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def gpu_ms(fn: Callable[[], object], warmup: int = 5, repeats: int = 20) -> float:
    """Median GPU time of ``fn`` (CUDA events around each call)."""
    if DEVICE != "cuda":  # the script's own check: one untimed-quality run
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return statistics.median(event_ms(fn, warmup, repeats))


def _sweep(
    keys: tuple[str, ...],
    launches: list[tuple],
    run: Callable[..., object],
    moved: int,
    compare: Callable[[object], dict],
) -> list[dict]:
    """Each launch: its settings, median GPU ms, TB/s over ``moved`` bytes and ``compare`` of its
    output; a launch that fails here (a compile error) is recorded and the others still run."""
    out = []
    for launch in launches:
        row: dict = dict(zip(keys, launch, strict=True))
        try:
            got = run(*launch)
            ms = gpu_ms(lambda a=launch: run(*a))
        except Exception as e:  # any failure of one launch
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        else:
            row.update(ms=round(ms, 4), tb_s=round(moved / ms / 1e9, 2), **compare(got))
        out.append(row)
    return out


ROW_KEYS = ("rows", "warps")


def tune_gelu_quant(rows_total: int, width: int) -> list[dict]:
    gate_up = (torch.randn(rows_total, 2 * width, device=DEVICE) * 3).to(torch.bfloat16)
    ref_q, ref_s = fp8_quant._launch_gelu_mul_quant(gate_up)
    launches = [(r, w) for r in (1, 2, 4) for w in (4, 8, 16)] + [(8, 8), (8, 16)]

    def same(got) -> dict:
        q, s = got
        return {
            "same_bytes": torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8))
            and torch.equal(s, ref_s)
        }

    def run(*launch):
        return fp8_quant._launch_gelu_mul_quant(gate_up, *launch)

    moved = rows_total * 2 * width * 2 + rows_total * (width + 4)  # bytes read + written
    return _sweep(ROW_KEYS, launches, run, moved, same)


def tune_norm_quant(rows_total: int, width: int) -> list[dict]:
    """Residual add + RMS norm + quantize (merged-triton-fp8-norms), with a branch as in every
    call but the first layer's."""
    x, branch = (torch.randn(rows_total, width, device=DEVICE).to(torch.bfloat16) for _ in "xb")
    bw, nw = (torch.rand(width, device=DEVICE).to(torch.bfloat16) + 0.5 for _ in "bn")
    ref = fp8_quant._launch_add_norm_quant(x, branch, bw, nw, 1e-6)
    launches = [(r, w) for r in (1, 2, 4, 8, 16) for w in (1, 2, 4, 8)]

    def same(got) -> dict:
        return {
            "same_bytes": torch.equal(got[0], ref[0])
            and torch.equal(got[1].view(torch.uint8), ref[1].view(torch.uint8))
            and torch.equal(got[2], ref[2])
        }

    def run(*launch):
        return fp8_quant._launch_add_norm_quant(x, branch, bw, nw, 1e-6, *launch)

    moved = rows_total * width * (2 + 2 + 2 + 1) + rows_total * 4  # x, branch in; x, q, scale out
    return _sweep(ROW_KEYS, launches, run, moved, same)


def tune_qkv(
    items: int, length: int, heads: int, dim: int, quarters: tuple[bool, ...] = (False, True)
) -> list[dict]:
    qkv = torch.randn(items, length, 3 * heads * dim, device=DEVICE).to(torch.bfloat16)
    angles = torch.rand(items, length, dim, device=DEVICE) * 6.28
    cos, sin = angles.cos(), angles.sin()
    qw, kw = torch.rand(dim, device=DEVICE) + 0.5, torch.rand(dim, device=DEVICE) + 0.5
    args = (qkv, cos, sin, qw.bfloat16(), kw.bfloat16(), heads, 1e-6)
    # the default launch: whole-row loads (the layer's own ops are the reference of verify)
    ref = qkv_kernel._launch_qkv_norm_rope(*args, None, None, None, False)
    launches = list(itertools.product((16, 32, 64, 128), (2, 4, 8), (False, True), quarters))

    def diff(got) -> dict:
        d = [(g.float() - r.float()).abs().max().item() for g, r in zip(got, ref, strict=True)]
        return {"max_abs_diff_vs_default": max(d)}

    def run(*launch):
        return qkv_kernel._launch_qkv_norm_rope(*args, *launch)

    moved = qkv.numel() * 2 * 2 + cos.numel() * 4 * 2  # q/k/v in and out, cos/sin once
    return _sweep(("block_m", "warps", "all_heads", "quarters"), launches, run, moved, diff)


def tune_attention(items: int, length: int, heads: int, dim: int) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (
        torch.randn(items, length, heads, dim, device=DEVICE).to(torch.bfloat16) for _ in range(3)
    )
    layouts = {
        "transposed [B, L, H, D]": [t.transpose(1, 2) for t in (q, k, v)],
        "contiguous [B, H, L, D]": [t.transpose(1, 2).contiguous() for t in (q, k, v)],
    }
    backends = {
        "default": None,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    out = []
    for layout, (qq, kk, vv) in layouts.items():
        for name, backend in backends.items():

            def call(qq=qq, kk=kk, vv=vv, backend=backend):
                if backend is None:
                    return F.scaled_dot_product_attention(qq, kk, vv, scale=1.0)
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qq, kk, vv, scale=1.0)

            try:
                ms = round(gpu_ms(call), 4)
            except RuntimeError as e:  # a backend that refuses these inputs
                ms = f"refused: {str(e).splitlines()[0][:120]}"
            out.append({"layout": layout, "backend": name, "ms": ms})
    return out


def _fastest(rows: list[dict], keys: tuple[str, ...], ok: Callable[[dict], bool]) -> dict:
    best = min((r for r in rows if "ms" in r and ok(r)), key=lambda r: r["ms"])
    return {k: best[k] for k in keys}


def _encoder(vt: torch.nn.Module, kernels: str = "merged-triton-fp8") -> BatchedVisionEncoder:
    settings = replace(
        Settings.from_env(), mode="fast", cuda_graphs=True, fused="on", fast_kernels=kernels
    )
    enc = BatchedVisionEncoder(vt, settings)
    layers = enc.fast_layers(torch.device(DEVICE), torch.bfloat16)
    if not isinstance(layers, fast_layers.MergedLayers):
        raise RuntimeError(f"{kernels} did not build here ({type(layers).__name__})")
    return enc


def _timeline(enc: BatchedVisionEncoder, call: Callable[[], object], calls: int) -> dict:
    """Each call's CPU span (inputs in, replay, output out, synchronize) against its kernels."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            with record_function("fast-call"):
                call()
                _sync()
    spans = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.name == "fast-call" and e.device_type == torch.autograd.DeviceType.CPU
    )
    kernels = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        # not the call's own range, which the profiler repeats on the GPU's timeline (the
        # twentieth sitting's "busy" counted it: twice the span)
        if e.device_type == torch.autograd.DeviceType.CUDA and e.name != "fast-call"
    )
    per_call = []
    for start, end in spans:
        ks = [k for k in kernels if start <= k[0] < end]
        if not ks:
            continue
        gaps = sorted(
            ((b[0] - a[1], a[2][:60], b[2][:60]) for a, b in itertools.pairwise(ks)), reverse=True
        )
        per_call.append(
            {
                "cpu_span_ms": (end - start) / 1e3,
                "first_kernel_after_ms": (ks[0][0] - start) / 1e3,
                "gpu_span_ms": (ks[-1][1] - ks[0][0]) / 1e3,
                "gpu_busy_ms": sum(k[1] - k[0] for k in ks) / 1e3,
                "kernels": len(ks),
                "gaps_over_5us": sum(1 for g in gaps if g[0] > 5),
                "gap_total_ms": sum(max(0.0, g[0]) for g in gaps) / 1e3,
                "longest_gaps_us": [[round(g[0], 1), g[1], g[2]] for g in gaps[:5]],
            }
        )
    keys = [k for k in per_call[0] if k != "longest_gaps_us"] if per_call else []
    summary = {k: round(statistics.median(c[k] for c in per_call), 3) for k in keys}
    summary["longest_gaps_us_last_call"] = per_call[-1]["longest_gaps_us"] if per_call else []
    return summary


def whole_pass(vt: torch.nn.Module, videos: int, variants: dict[str, dict]) -> list[dict]:
    media = [S.Media("frame", FRAME_GRID, 70)] * (videos * FRAMES)
    pvs, pps = S.make_batch(media, 3 * vt.config.patch_size**2, vt.config.pooling_kernel_size)
    pv = [x.to(DEVICE, torch.bfloat16) for x in pvs]
    pp = [x.to(DEVICE) for x in pps]
    k2 = vt.config.pooling_kernel_size**2
    hints = [c // k2 for c in count_valid_patches(pp)]  # as served: counts from the host
    rows = []
    for name, v in variants.items():
        with launch_config.overridden(v.get("launches", {})):
            enc = _encoder(vt, v.get("kernels", "merged-triton-fp8"))
            call = lambda enc=enc: enc.encode(pv, pp, hints)  # noqa: E731
            _, times = timed(call, DEVICE, 3, 10)
            rows.append(
                {
                    "variant": name,
                    "videos": videos,
                    "wall_ms": round(statistics.median(times), 3),
                    "wall_min_ms": round(min(times), 3),
                    "launches": {
                        k: launch_config.launch(k, torch.device(DEVICE))
                        for k in ("gelu_quant", "qkv", "norm_quant")
                    },
                    "kernels": v.get("kernels", "merged-triton-fp8"),
                    "timeline": _timeline(enc, call, 5),
                }
            )
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--preset", default="e4b")
    p.add_argument("--videos", default="16,1", help="video counts; the first picks the launches")
    p.add_argument("--frames", type=int, default=6, help="frames a video")
    p.add_argument(
        "--write",
        metavar="JSON",
        help="enter the fastest launches under this device's name in this launch table "
        "(the plugin's: plugin/src/gemma4_batched_encoder/fast_launch.json)",
    )
    args = p.parse_args()
    global DEVICE, FRAMES
    DEVICE, FRAMES = args.device, args.frames
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("fast_kernel_tune: needs CUDA")
    vt = S.build_vision_tower(
        S.vision_config_kwargs(args.preset, None), seed=0, dtype=torch.bfloat16, device=DEVICE
    )
    cfg = vt.config
    length = FRAME_GRID[0] * FRAME_GRID[1]
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    result: dict = {"device": name, "preset": args.preset, "torch": torch.__version__}
    counts = [int(v) for v in args.videos.split(",")]
    result["videos"] = counts
    for videos in counts:
        items = videos * FRAMES
        heads, dim = cfg.num_attention_heads, cfg.head_dim
        # the q/k/v kernel's quarter loads at the first count only: it picks the launches, and
        # the whole pass below times the picked ones at every count
        qkv_forms = (False, True) if videos == counts[0] else (False,)
        _section(
            result, f"gelu_quant_{videos}v", tune_gelu_quant, items * length, cfg.intermediate_size
        )
        _section(result, f"qkv_{videos}v", tune_qkv, items, length, heads, dim, qkv_forms)
        _section(result, f"norm_quant_{videos}v", tune_norm_quant, items * length, cfg.hidden_size)
        _section(result, f"attention_{videos}v", tune_attention, items, length, heads, dim)
    # the launches for the whole pass: the fastest at the first count (16 videos: the target
    # that is further off); the source's are the table as committed
    variants: dict[str, dict] = {
        "source launches": {},
        "source launches, fused norms (merged-triton-fp8-norms)": {
            "kernels": "merged-triton-fp8-norms"
        },
    }
    first_gelu, first_qkv = result.get(f"gelu_quant_{counts[0]}v"), result.get(f"qkv_{counts[0]}v")
    if isinstance(first_gelu, list) and isinstance(first_qkv, list):
        gelu = _fastest(first_gelu, ROW_KEYS, lambda r: r["same_bytes"])
        qkv = _fastest(first_qkv, ("block_m", "warps", "all_heads", "quarters"), lambda r: True)
        # all heads a program only from the first count's rows up when the smallest count's
        # fastest launch took one program a head (too few row blocks to fill the GPU there)
        last_qkv = result.get(f"qkv_{counts[-1]}v")
        small = (
            isinstance(last_qkv, list) and not _fastest(last_qkv, ("all_heads",), bool)["all_heads"]
        )
        qkv["all_heads_min_rows"] = counts[0] * FRAMES * length if qkv["all_heads"] and small else 0
        fastest = {"gelu_quant": gelu, "qkv": qkv}
        first_norm = result.get(f"norm_quant_{counts[0]}v")
        if isinstance(first_norm, list):
            # the launches that give the default's bytes (torch's, on the H200): the row sums'
            # order changes with some
            fastest["norm_quant"] = _fastest(first_norm, ROW_KEYS, lambda r: r["same_bytes"])
        variants["fastest launches"] = {"launches": fastest}
        variants["fastest launches, fused norms"] = {
            "launches": fastest,
            "kernels": "merged-triton-fp8-norms",
        }
        result["fastest_launches"] = fastest
    _section(result, "whole_pass", lambda: [r for n in counts for r in whole_pass(vt, n, variants)])
    _print(result)
    if args.write and "fastest_launches" in result:
        launch_config.enter(args.write, torch.device(DEVICE), result["fastest_launches"])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


def _section(result: dict, name: str, fn: Callable[..., object], *args: object) -> None:
    """One measurement; an error is recorded and the others still run (one device call)."""
    try:
        result[name] = fn(*args)
    except Exception as e:  # any failure of one section
        result[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        print(f"{name}: {result[name]['error']}", file=sys.stderr)


def _print(result: dict) -> None:
    """A short table (the JSON has every row); a section that failed prints its error."""

    def rows(name: str) -> list[dict]:
        section = result.get(name)
        return section if isinstance(section, list) else []

    counts = result["videos"]
    print(f"{'kernel launch (GPU ms)':<40}" + "".join(f"{str(n) + ' videos':>11}" for n in counts))
    labels = {
        "gelu_quant": ROW_KEYS,
        "qkv": ("block_m", "warps", "all_heads", "quarters"),
        "norm_quant": ROW_KEYS,
        "attention": ("backend", "layout"),
    }
    for kind, keys in labels.items():
        # a launch's row at each count (the later counts sweep fewer launches: "-")
        by_count = [{tuple(r[k] for k in keys): r for r in rows(f"{kind}_{n}v")} for n in counts]
        for launch in by_count[0]:
            label = kind + " " + " ".join(str(v)[:12] for v in launch)
            times = [str(c[launch].get("ms", "error")) if launch in c else "-" for c in by_count]
            print(f"{label:<40}" + "".join(f"{t:>11}" for t in times))
    for row in rows("whole_pass"):
        t = row["timeline"]
        print(
            f"{row['videos']:>2} videos, {row['variant']:<46} wall {row['wall_ms']:7.3f} ms; "
            f"GPU busy {t.get('gpu_busy_ms')} / span {t.get('gpu_span_ms')} ms, first kernel "
            f"{t.get('first_kernel_after_ms')} ms in, {t.get('kernels')} kernels"
        )


if __name__ == "__main__":
    main()
