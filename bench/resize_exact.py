"""Can a frame be resized on the GPU with stock's pixels? The processor's antialiased bicubic
resize of uint8 frames as integer tensor ops, on any device, checked against torchvision's CPU
resize (issue 8: the API server's decode, colour conversion and resize are most of its CPU time
a video; bench/yuv_rgb_exact.py does the colour conversion the same way).

    python bench/resize_exact.py [--device cuda] [--out results.json]

Prints one JSON object and exits 1 on any difference: per case (the Gemma 4 processor's own
targets for common frame and image sizes at several soft-token budgets, then random sizes,
upscales and one-axis resizes included) the bytes compared against `tvF.resize` on the CPU; on a
GPU also torchvision's own resize there (float32, rounded: not stock's bytes) and the times of
one 6-frame 854x480 video's resize (its frames in interleaved memory, as the processor holds
them): CPU (stock, this process's torch threads) and this recipe on the device.

Stock Gemma 4 resizes every image and video frame with `tvF.resize(uint8, BICUBIC,
antialias=True)`. On the CPU, torchvision hands uint8 straight to ATen's native uint8 kernel
(`_upsample_bicubic2d_aa`, Pillow's fixed-point algorithm): separable, width first, then height;
float64 filter weights (Keys' cubic, a = -0.5, stretched by the scale when downsampling), each
row normalised, quantised to int16 with one precision for the whole axis; every pass sums
`pixel * weight` in int32 from `1 << (precision - 1)`, shifts right by the precision and clamps
to 0..255, so the width pass's output is uint8 again before the height pass.

Integer sums do not depend on order or device, so the same weights through the same integer
ops reproduce the CPU's bytes on a GPU, where torchvision would resize in float32 and round
(other bytes). This is the step that lets a frame be resized on the GPU with stock's pixels,
after the decode (bench/yuv_rgb_exact.py covers FFmpeg's colour conversion the same way): issue
8's API-server CPU time is mostly decode, colour conversion and this resize. The weights below
follow ATen's `_compute_indices_min_size_weights_aa` and `_compute_index_ranges_int16_weights`
(UpSampleKernel.cpp) step by step, in Python floats (IEEE double, as there).

    resize_bicubic_aa_uint8(frames, (height, width))   # uint8 [..., C, H, W] on any device
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from byte_diff import byte_diff

from gemma4_batched_encoder.media.fast_processor import ResizeParams, resize_target

_A = -0.5  # Keys' cubic, as ATen's antialiased bicubic filter
_TAPS = 4  # bicubic's interpolation size


def _cubic(x: float) -> float:
    x = abs(x)
    if x < 1.0:
        return ((_A + 2) * x - (_A + 3)) * x * x + 1
    if x < 2.0:
        return ((_A * x - 5 * _A) * x + 8 * _A) * x - 4 * _A
    return 0.0


def axis_weights(in_size: int, out_size: int) -> tuple[list[int], list[list[int]], int]:
    """(first input index, int16 weights, precision) for each output position of one axis."""
    scale = in_size / out_size  # area_pixel_compute_scale, align_corners=False, no scale given
    support = _TAPS * 0.5 * scale if scale >= 1.0 else _TAPS * 0.5
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    starts: list[int] = []
    rows: list[list[float]] = []
    wt_max = 0.0
    for i in range(out_size):
        center = scale * (i + 0.5)
        xmin = max(int(center - support + 0.5), 0)  # int(): C++'s truncation toward zero
        xsize = min(int(center + support + 0.5), in_size) - xmin
        w = [_cubic((j + xmin - center + 0.5) * invscale) for j in range(xsize)]
        total = 0.0
        for v in w:
            total += v
        if total != 0.0:
            w = [v / total for v in w]
            wt_max = max(wt_max, *w)
        starts.append(xmin)
        rows.append(w)
    precision = 0
    while precision < 22 and int(0.5 + wt_max * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    unit = 1 << precision
    quantised = [
        [int(-0.5 + v * unit) if v * unit < 0 else int(0.5 + v * unit) for v in w] for w in rows
    ]
    return starts, quantised, precision


@functools.lru_cache(maxsize=256)
def _axis_tensors(
    in_size: int, out_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """[out, taps] input indices and int32 weights (rows padded with index 0, weight 0), built
    once per axis size and device: a video's frames share them, and a timed call pays no host
    loop or host-to-device copy for them."""
    starts, weights, precision = axis_weights(in_size, out_size)
    taps = max(len(w) for w in weights)
    index = torch.zeros(out_size, taps, dtype=torch.long)
    weight = torch.zeros(out_size, taps, dtype=torch.int32)
    for o, (start, w) in enumerate(zip(starts, weights, strict=True)):
        index[o, : len(w)] = torch.arange(start, start + len(w))
        weight[o, : len(w)] = torch.tensor(w, dtype=torch.int32)
    return index.to(device), weight.to(device), precision


def _resample_last_dim(x: torch.Tensor, out_size: int) -> torch.Tensor:
    """One separable pass over the last dimension: uint8 in, uint8 out."""
    index, weight, precision = _axis_tensors(x.shape[-1], out_size, x.device)
    acc = torch.full(
        (*x.shape[:-1], out_size), 1 << (precision - 1), dtype=torch.int32, device=x.device
    )
    for t in range(index.shape[1]):  # a loop over taps keeps the temporaries at one output's size
        acc += x[..., index[:, t]].to(torch.int32) * weight[:, t]
    return (acc >> precision).clamp_(0, 255).to(torch.uint8)


def resize_bicubic_aa_uint8(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 [..., C, H, W] resized to `size` = (height, width), byte for byte as torchvision's
    `resize(frames, size, BICUBIC, antialias=True)` computes it on the CPU."""
    if frames.dtype != torch.uint8:
        raise TypeError(f"uint8 frames expected, got {frames.dtype}")
    height, width = size
    if (frames.shape[-2], frames.shape[-1]) == (height, width):
        return frames
    out = frames
    if out.shape[-1] != width:  # width first, as ATen
        out = _resample_last_dim(out, width)
    if out.shape[-2] != height:
        out = _resample_last_dim(out.transpose(-1, -2), height).transpose(-1, -2)
    return out.contiguous()


# (height, width) of frames and images a server sees; targets from the processor's own function
SIZES = [(480, 640), (480, 854), (720, 1280), (1080, 1920), (900, 320), (336, 432), (64, 2000)]
BUDGETS = [70, 140, 280, 560, 1120]  # Gemma 4's soft-token budgets (70: video frames)


def _params(budget: int) -> ResizeParams:
    return ResizeParams(resample=None, patch_size=16, pooling_kernel_size=3, max_soft_tokens=budget)


def processor_targets() -> list[tuple[tuple[int, int], tuple[int, int]]]:
    cases = []
    for budget in BUDGETS:
        for size in SIZES:
            target = resize_target(*size, _params(budget))
            if target != size:
                cases.append((size, target))
    return cases


def random_sizes(n: int, seed: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    rng = np.random.default_rng(seed)
    cases = [((480, 854), (480, 592)), ((480, 854), (336, 854)), ((16, 16), (400, 3))]
    for _ in range(n):
        h, w, oh, ow = (int(v) for v in rng.integers(3, 700, 4))
        cases.append(((h, w), (oh, ow)))
    return cases


def _frames(h: int, w: int, count: int, seed: int) -> torch.Tensor:
    """Noise on half the frames, smooth ramps (the clamps rarely bite) on the others."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        if i % 2 == 0:
            out.append(rng.integers(0, 256, (3, h, w), dtype=np.uint8))
        else:
            yy, xx = np.mgrid[0:h, 0:w]
            ramps = [xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), (xx + yy) % 256]
            out.append(np.stack(ramps).astype(np.uint8))
    return torch.from_numpy(np.stack(out))


def _stock(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    import torchvision.transforms.v2.functional as tvF
    from torchvision.transforms import InterpolationMode

    return tvF.resize(frames, list(size), interpolation=InterpolationMode.BICUBIC, antialias=True)


def _ms(fn: Callable[[], object], device: torch.device, repeats: int = 10) -> dict[str, float]:
    fn()
    walls, cpus = [], []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        walls.append((time.perf_counter() - w0) * 1e3)
        cpus.append((time.process_time() - c0) * 1e3)
    return {"wall_ms": float(np.median(walls)), "cpu_ms": float(np.median(cpus))}


def check(device: torch.device, frames: int, random_cases: int, seed: int) -> dict:
    results = []
    for k, (size, target) in enumerate(processor_targets() + random_sizes(random_cases, seed)):
        x = _frames(*size, frames, seed + k)
        try:
            ref = _stock(x, target)
        except RuntimeError as e:  # ATen's own kernel refuses a few tiny sizes
            results.append(
                {"size": list(size), "target": list(target), "stock_error": str(e)[:200]}
            )
            continue
        row = {"size": list(size), "target": list(target)}
        row.update(byte_diff(resize_bicubic_aa_uint8(x.to(device), target), ref))
        if device.type != "cpu":  # torchvision on this device: float32 inside, then rounded
            row["torchvision_here"] = byte_diff(_stock(x.to(device), target), ref)
        results.append(row)
    compared = [r for r in results if "max_abs_diff" in r]
    report: dict = {
        "device": str(device),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cases": len(compared),
        "identical": all(r["max_abs_diff"] == 0 for r in compared),
        "results": results,
    }
    # interleaved memory, as the processor holds a video's frames (channels-last views)
    video = _frames(480, 854, 6, seed).permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    target = resize_target(480, 854, _params(70))  # the SLO clip's frames
    report["timing_6x854x480"] = {
        "target": list(target),
        "stock_cpu": _ms(lambda: _stock(video, target), torch.device("cpu")),
    }
    if device.type != "cpu":
        on_device = video.to(device)
        report["timing_6x854x480"]["recipe_" + device.type] = _ms(
            lambda: resize_bicubic_aa_uint8(on_device, target), device
        )
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--frames", type=int, default=2, help="frames per case")
    parser.add_argument("--random-cases", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = check(torch.device(args.device), args.frames, args.random_cases, args.seed)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if report["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
