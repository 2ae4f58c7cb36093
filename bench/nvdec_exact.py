"""Can NVDEC hand the encoder stock's pixels? Issue 8's decode off the CPU, checked before any
loader is built. GPU host only (PyNvVideoCodec, which vLLM 0.26 ships; `h200.sh host` runs it).

    python bench/nvdec_exact.py [--out results.json]

For each clip (the SLO clip's MPEG-4 Part 2 and H.264, several contents), against what vLLM's
loader reads (`cv2.VideoCapture`'s frames) and FFmpeg's decoded planes (PyAV):
- `planes`: NVDEC's NV12 output (OutputColorType.NATIVE, host memory) against FFmpeg's yuv420p;
- `converted`: those planes through bench/yuv_rgb_exact.py's swscale recipe on the GPU, against
  OpenCV's frames (what a plugin loader would hand on);
- `vllm_rgb`: NVDEC's own RGB conversion (OutputColorType.RGB, what vLLM 0.26's
  `pynvvideocodec` backend uses), against OpenCV's frames;
and the time a clip takes: OpenCV's decode (wall = CPU), NVDEC's first decode to device memory
(wall and this process's CPU), then `--warm-repeats` more with a new decoder each (its creation
timed apart), the conversion on the GPU. Prints one JSON object; exits 1 when
PyNvVideoCodec or CUDA is missing (the check has not run), 0 otherwise: differences are
results here, not failures.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from byte_diff import byte_diff
from yuv_rgb_exact import content, encode, planes, stock_frames, yuv420p_to_bgr

CLIPS = [  # (codec, width, height, content); 854x480 and 6 frames: the SLO clip's
    ("mpeg4", 854, 480, "noise"),
    ("mpeg4", 854, 480, "gradient"),
    ("h264", 854, 480, "noise"),
    ("h264", 854, 480, "gradient"),
    ("h264", 1280, 720, "blocks"),
]


def _host_nv12(frame, width: int, height: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Y, U, V of a host-memory NV12 frame (Y rows, then interleaved U/V rows at half height)."""
    size = frame.framesize()
    buf = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(frame.GetPtrToPlane(0)))
    buf = buf.copy()
    if size != width * height * 3 // 2:
        raise ValueError(f"NV12 frame of {size} bytes for {width}x{height}: pitched or not NV12")
    y = buf[: width * height].reshape(height, width)
    uv = buf[width * height :].reshape(height // 2, width)
    return y, uv[:, 0::2], uv[:, 1::2]


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """fn()'s result, its wall ms and this process's CPU ms, CUDA synchronised at both ends."""
    torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    torch.cuda.synchronize()
    return (
        out,
        round((time.perf_counter() - wall) * 1e3, 3),
        round((time.process_time() - cpu) * 1e3, 3),
    )


def _check_clip(nvc, result: dict, width: int, height: int, frames: int, warm_repeats: int) -> None:
    """Fills `result` as it goes: what was measured before a failure is kept."""
    kind = result["content"]
    data = encode(result["codec"], [content(kind, height, width, i) for i in range(frames)])
    t0 = time.perf_counter()
    stock = stock_frames(data)  # BGR
    cv2_ms = (time.perf_counter() - t0) * 1e3
    ffmpeg_planes = planes(data)
    result["frames"] = len(stock)
    result["opencv_decode_ms"] = round(cv2_ms, 2)
    with tempfile.NamedTemporaryFile(suffix=".mp4") as f:  # SimpleDecoder takes a path
        f.write(data)
        f.flush()
        index = list(range(len(stock)))
        native = nvc.SimpleDecoder(
            f.name, use_device_memory=False, output_color_type=nvc.OutputColorType.NATIVE
        )
        nv12 = [_host_nv12(fr, width, height) for fr in native.get_batch_frames_by_index(index)]
        if len(nv12) != len(stock):
            result["nvdec_frames"] = len(nv12)  # zip(strict=True) below then names the mismatch
        result["planes"] = [
            {name: byte_diff(a, b) for name, a, b in zip("YUV", mine, ref, strict=True)}
            for mine, ref in zip(nv12, ffmpeg_planes, strict=True)
        ]
        converted, result["convert_gpu_ms"], _ = _timed(
            lambda: [
                yuv420p_to_bgr(*(torch.from_numpy(np.ascontiguousarray(p)).cuda() for p in yuv))
                for yuv in nv12
            ]
        )
        result["converted"] = [
            byte_diff(c.cpu().numpy(), s) for c, s in zip(converted, stock, strict=True)
        ]
        rgb = nvc.SimpleDecoder(
            f.name, use_device_memory=True, output_color_type=nvc.OutputColorType.RGB
        )
        decoded, result["nvdec_decode_ms"], result["nvdec_decode_cpu_ms"] = _timed(
            lambda: [torch.from_dlpack(fr) for fr in rgb.get_batch_frames_by_index(index)]
        )
        result["vllm_rgb"] = [
            byte_diff(d.cpu().numpy()[..., ::-1], s) for d, s in zip(decoded, stock, strict=True)
        ]
        # The cold figures above include whatever the decoder defers to its first call (the
        # eighteenth sitting: 52-58 ms and as much CPU a clip). Now the process is warm: each
        # repeat creates a decoder (timed apart) and decodes the same clip.
        for _ in range(warm_repeats):
            again, create_ms, create_cpu_ms = _timed(
                lambda: nvc.SimpleDecoder(
                    f.name, use_device_memory=True, output_color_type=nvc.OutputColorType.NATIVE
                )
            )
            frames_back, decode_ms, decode_cpu_ms = _timed(
                lambda d=again: d.get_batch_frames_by_index(index)
            )
            result.setdefault("warm", []).append(
                {
                    "create_ms": create_ms,
                    "create_cpu_ms": create_cpu_ms,
                    "decode_ms": decode_ms,
                    "decode_cpu_ms": decode_cpu_ms,
                    "frames": len(frames_back),
                }
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=6)
    parser.add_argument(
        "--warm-repeats", type=int, default=3, help="decodes of each clip after the first"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    try:
        import PyNvVideoCodec as nvc
    except ImportError as e:
        raise SystemExit(f"nvdec_exact: PyNvVideoCodec is not installed ({e}); not run") from e
    if not torch.cuda.is_available():
        raise SystemExit("nvdec_exact: no CUDA device; not run")
    report = {"pynvvideocodec": getattr(nvc, "__version__", "?"), "clips": []}
    for codec, width, height, kind in CLIPS:
        result = {"codec": codec, "size": f"{width}x{height}", "content": kind}
        report["clips"].append(result)
        try:
            _check_clip(nvc, result, width, height, args.frames, args.warm_repeats)
        except Exception as e:  # one clip's failure (e.g. a codec NVDEC refuses) is a result
            result["error"] = repr(e)
            # the eighteenth sitting got a bare IndexError on one clip: say where it came from
            result["where"] = traceback.format_exc(limit=-3).splitlines()[-8:]
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
