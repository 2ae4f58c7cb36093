"""Can a decoder that is not the stock loader's hand the encoder the same pixels? Step one, the
color conversion: vLLM's video loader reads frames with `cv2.VideoCapture`, whose FFmpeg
converts each decoded yuv420p frame to BGR with swscale. This reproduces that conversion from the
decoded planes with integer tensor ops (so on a GPU, after a hardware decode, too) and checks it
against OpenCV on clips of several codecs, sizes and contents.

    python bench/yuv_rgb_exact.py [--device cuda] [--out results.json]

Prints one JSON object (per case: frames compared, max |difference|, share of differing bytes)
and exits 1 on any difference. The decoded planes come from PyAV (another build of FFmpeg);
H.264's decoding is exact by its standard, so any conforming decoder (NVDEC included) yields the
same planes for an H.264 stream, and MPEG-4 Part 2's (the SLO clip's `mp4v`) is not: its inverse
DCT may differ between decoders within IEEE 1180's tolerance.

The arithmetic is swscale's x86 SIMD path for yuv420p -> bgr24 (libswscale/x86, `pmulhw`):
BT.601 coefficients of limited range (swscale's default, which OpenCV does not change), chroma
shared by each 2x2 block of pixels, each term a 16-bit multiply-high:
    y' = ((Y*8 - 128) * 9539) >> 16,  u' = U*8 - 1024,  v' = V*8 - 1024
    R = y' + (v' * 13075 >> 16),  G = y' + (u' * -3209 >> 16) + (v' * -6660 >> 16),
    B = y' + (u' * 16525 >> 16),  each clamped to 0..255
(the coefficients are swscale's 16.16 inverse table divided by 8 and rounded: cy = 76309 =
65536 * 255 / 219, crv = 104597, cbu = 132201, cgu = 25675, cgv = 53279).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np
import torch
from byte_diff import byte_diff

from gemma4_batched_encoder.media.decode import find_mixin
from gemma4_batched_encoder.noise_media import mp4_from_frames, noise
from slo_loadtest.media import write_h264

Y_COEFF, VR, UB, UG, VG = 9539, 13075, 16525, -3209, -6660


def _mulhi(a: torch.Tensor, c: int) -> torch.Tensor:
    return (a * c) >> 16  # pmulhw: the product's high 16 bits (floor)


def yuv420p_to_bgr(y: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """uint8 planes [H, W], [ceil(H/2), ceil(W/2)] x2 -> uint8 BGR [H, W, 3], as swscale."""
    h, w = y.shape
    yi = y.to(torch.int32)
    ui = u.to(torch.int32).repeat_interleave(2, 0).repeat_interleave(2, 1)[:h, :w]
    vi = v.to(torch.int32).repeat_interleave(2, 0).repeat_interleave(2, 1)[:h, :w]
    luma = _mulhi(yi * 8 - 128, Y_COEFF)
    uu, vv = ui * 8 - 1024, vi * 8 - 1024
    r = luma + _mulhi(vv, VR)
    g = luma + _mulhi(uu, UG) + _mulhi(vv, VG)
    b = luma + _mulhi(uu, UB)
    return torch.stack([b, g, r], dim=-1).clamp(0, 255).to(torch.uint8)


def content(kind: str, h: int, w: int, i: int) -> np.ndarray:
    """Frame i, BGR: noise, smooth gradients, or saturated blocks (the clamps' corners)."""
    if kind == "noise":
        return noise(h, w, seed=i)
    yy, xx = np.mgrid[0:h, 0:w]
    if kind == "gradient":
        ramps = [xx * 255 // max(w - 1, 1), yy * 255 // max(h - 1, 1), (xx + yy + 9 * i) % 256]
        return np.stack(ramps, axis=-1).astype(np.uint8)
    colors = np.array([[0, 0, 0], [255, 255, 255], [0, 0, 255], [0, 255, 0], [255, 0, 0]])
    return colors[((yy // 16) + (xx // 16) + i) % len(colors)].astype(np.uint8)


def encode(codec: str, frames: list[np.ndarray]) -> bytes:
    if codec == "mpeg4":  # the SLO clip's codec, through OpenCV's writer as the load test's
        return mp4_from_frames(frames)
    buf = io.BytesIO()  # H.264 as slo-loadtest writes it (pip's OpenCV has no H.264 encoder)
    write_h264(buf, frames, fps=2)
    return buf.getvalue()


def stock_frames(data: bytes) -> list[np.ndarray]:
    """What vLLM's loader reads: every frame of vLLM's own OpenCV open (BGR, before its swap to
    RGB), found as the plugin finds it in any vLLM version."""
    mixin = find_mixin()
    if mixin is None:
        raise SystemExit("yuv_rgb_exact: this vLLM has no OpenCVVideoBackendMixin")
    cap = mixin.open_video_capture(data)
    out = []
    while True:
        ok, frame = cap.read()
        if not ok:
            return out
        out.append(frame)


def planes(data: bytes) -> list[tuple[np.ndarray, ...]]:
    """The decoded yuv420p planes (Y, U, V), without the rows' padding."""
    import av

    out = []
    with av.open(io.BytesIO(data)) as container:
        for frame in container.decode(video=0):
            if frame.format.name != "yuv420p":
                raise ValueError(f"decoded as {frame.format.name}, not yuv420p")
            widths = (frame.width, (frame.width + 1) // 2, (frame.width + 1) // 2)
            out.append(
                tuple(
                    np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)[:, :width]
                    for plane, width in zip(frame.planes, widths, strict=True)
                )
            )
    return out


CASES = [  # (codec, width, height, content)
    ("mpeg4", 854, 480, "noise"),
    ("mpeg4", 854, 480, "gradient"),
    ("mpeg4", 640, 360, "blocks"),
    ("mpeg4", 1280, 720, "gradient"),
    ("h264", 854, 480, "noise"),
    ("h264", 854, 480, "gradient"),
    ("h264", 1280, 720, "blocks"),
    ("h264", 202, 114, "gradient"),  # a width that is no multiple of the SIMD's 8 or 16
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--frames", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    results = []
    for codec, w, h, kind in CASES:
        frames = [content(kind, h, w, i) for i in range(args.frames)]
        data = encode(codec, frames)
        stock, decoded = stock_frames(data), planes(data)
        if len(stock) != len(decoded):
            raise SystemExit(
                f"{codec} {w}x{h}: {len(stock)} frames from OpenCV, {len(decoded)} from PyAV"
            )
        got = [
            yuv420p_to_bgr(*(torch.from_numpy(p.copy()).to(device) for p in (y, u, v))).cpu()
            for y, u, v in decoded
        ]
        results.append(
            {
                "codec": codec,
                "size": f"{w}x{h}",
                "content": kind,
                "frames": len(stock),
                **byte_diff(torch.stack(got), np.stack(stock)),
            }
        )
    report = {
        "device": str(device),
        "identical": all(r["max_abs_diff"] == 0 for r in results),
        "cases": results,
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    sys.exit(0 if report["identical"] else 1)


if __name__ == "__main__":
    main()
