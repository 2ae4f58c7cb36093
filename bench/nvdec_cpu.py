"""Does vLLM's own hardware video decode take CPU off the API server, or does it wait by spinning?

Issue 8's <= 5 ms of CPU a video needs the decode off the CPU. The nineteenth sitting timed
PyNvVideoCodec's SimpleDecoder called directly, a new decoder a clip: 44-49 ms of CPU for 47-61 ms
of wall a 6-frame clip (bench/nvdec_exact.py). vLLM 0.33 ships a NVDEC backend of its own
(`--media-io-kwargs '{"video": {"backend": "pynvvideocodec"}}'`: decoder slots reused across
requests, its own CUDA stream, frames copied to pinned host memory). This script times that
backend against vLLM's default (OpenCV) on the same bytes, through the same loader
(`VIDEO_LOADER_REGISTRY.load("opencv").load_bytes(..., backend=...)`), plugin not installed:

- wall and CPU time of the whole process (all its threads: what an API server pays) per video,
  after `--warmup` decodes (the decoder slot and CUDA context made), and the first decode apart;
- with CUDA's default scheduling (spin while the GPU works, as an API server's torch does) and
  with CU_CTX_SCHED_BLOCKING_SYNC set on the device's primary context before anything creates it
  (a wait then sleeps until the GPU signals);
- the frames against OpenCV's (NVDEC's colour conversion is not swscale's: bench/MEDIA.md);
- `opencv+plugin`: vLLM's OpenCV decode with the plugin's media fast path installed in the
  process, as the chart serves it (one FFmpeg thread, OpenCV's pool at one thread, the
  frame-count check beside the decode).

    python bench/nvdec_cpu.py [--reps 20] [--warmup 3] [--out results.json]

Clips: the SLO load test's (slo-loadtest's generator, 6 frames 854x480) as MPEG-4 Part 2 and as
H.264 (`--codecs`); a clip a backend refuses is reported with its error (vLLM 0.33's NVDEC
backend refuses the MPEG-4 Part 2 clip: thirtieth sitting). Each (backend, scheduling) runs in a
fresh child process: a context's scheduling flag is fixed when it is created. Needs vLLM 0.33+
(the backend's `backend=` argument) and, for NVDEC, PyNvVideoCodec and a CUDA device; a
configuration that cannot run is reported with its error, the others still run. Exits 1 only
when no clip decoded in any configuration.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CU_CTX_SCHED = {"default": None, "blocking": 0x04}  # cuda.h: CU_CTX_SCHED_BLOCKING_SYNC
# "opencv+plugin": vLLM's OpenCV decode with the plugin's media fast path installed in the process
# (media.install(): one FFmpeg thread, the frame-count check beside the decode), as the chart serves
CONFIGS = [
    ("opencv", "default"),
    ("opencv+plugin", "default"),
    ("pynvvideocodec", "default"),
    ("pynvvideocodec", "blocking"),
]
CODECS = ("mpeg4", "h264")


def _libcuda() -> ctypes.CDLL:
    lib = ctypes.CDLL("libcuda.so.1")
    _check(lib.cuInit(0), "cuInit")
    return lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def set_primary_context_flags(flags: int, device: int = 0) -> None:
    """Before torch or PyNvVideoCodec touch the device: their contexts are its primary one."""
    lib, dev = _libcuda(), ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    set_flags = (
        getattr(lib, "cuDevicePrimaryCtxSetFlags_v2", None) or lib.cuDevicePrimaryCtxSetFlags
    )
    _check(set_flags(dev, flags), "cuDevicePrimaryCtxSetFlags")


def primary_context_state(device: int = 0) -> dict[str, int]:
    lib, dev = _libcuda(), ctypes.c_int()
    _check(lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    flags, active = ctypes.c_uint(), ctypes.c_int()
    _check(
        lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)),
        "cuDevicePrimaryCtxGetState",
    )
    return {"flags": flags.value, "active": active.value}


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median": round(statistics.median(ordered), 3),
        "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
        "min": round(ordered[0], 3),
    }


def _time_clip(loader: Any, backend: str, data: bytes, reps: int, warmup: int) -> dict[str, Any]:
    """The first decode, then `reps` after `warmup`: wall and CPU ms, and the last frames."""
    import numpy as np

    walls, cpus, frames, first = [], [], None, {}
    for i in range(1 + warmup + reps):
        wall, cpu = time.perf_counter(), time.process_time()
        frames, _meta = loader.load_bytes(data, num_frames=32, backend=backend)
        wall, cpu = (time.perf_counter() - wall) * 1e3, (time.process_time() - cpu) * 1e3
        if i == 0:
            first = {"wall_ms": round(wall, 3), "cpu_ms": round(cpu, 3)}
        elif i > warmup:
            walls.append(wall)
            cpus.append(cpu)
    frames = np.asarray(frames)
    return {
        "first": first,
        "wall_ms": _stats(walls),
        "cpu_ms": _stats(cpus),
        "frames_shape": list(frames.shape),
        "frames": frames,
    }


def child(
    backend: str, sched: str, clips_dir: Path, codecs: list[str], reps: int, warmup: int
) -> dict[str, Any]:
    """One configuration in this (fresh) process: per clip, the first decode and the warm ones."""
    import numpy as np

    flags = CU_CTX_SCHED[sched]
    if flags is not None:
        set_primary_context_flags(flags)
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    name, backend = backend, backend.removesuffix("+plugin")
    if name != backend:
        from gemma4_batched_encoder import media

        if not media.install():
            raise RuntimeError("the plugin's media fast path did not install on this vLLM")
    loader = VIDEO_LOADER_REGISTRY.load("opencv")  # the loader class; the codec is `backend=`
    out: dict[str, Any] = {"backend": name, "sched": sched, "clips": {}}
    for codec in codecs:
        data = (clips_dir / f"{codec}.mp4").read_bytes()
        try:
            out["clips"][codec] = _time_clip(loader, backend, data, reps, warmup)
        except Exception as e:  # a clip the backend refuses is a result; the next still runs
            out["clips"][codec] = {"error": f"{type(e).__name__}: {e}"}
            continue
        np.save(clips_dir / f"{codec}-{name}-{sched}.npy", out["clips"][codec].pop("frames"))
    if backend == "pynvvideocodec":
        out["primary_context"] = primary_context_state()
        import torch

        free, total = torch.cuda.mem_get_info()
        out["device_memory_used_mib"] = round((total - free) / 2**20)  # the whole device's
    return out


def frame_diff(a, b) -> dict[str, Any]:
    import numpy as np

    if a.shape != b.shape:
        return {"shapes": [list(a.shape), list(b.shape)]}
    d = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return {
        "identical": bool(d.max() == 0),
        "max_abs": int(d.max()),
        "share_differing": round(float((d > 0).mean()), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--codecs", default=",".join(CODECS), help="comma-separated, of " + ", ".join(CODECS)
    )
    parser.add_argument(
        "--child", nargs=3, metavar=("BACKEND", "SCHED", "DIR"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    codecs = [c for c in args.codecs.split(",") if c]
    if not codecs or set(codecs) - set(CODECS):
        parser.error(f"--codecs: one or more of {', '.join(CODECS)}, got {args.codecs!r}")
    if args.child:
        backend, sched, clips_dir = args.child
        print(json.dumps(child(backend, sched, Path(clips_dir), codecs, args.reps, args.warmup)))
        return
    import numpy as np

    report: dict[str, Any] = {
        "host": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "reps": args.reps,
        "warmup": args.warmup,
        "configs": [],
    }
    try:
        import vllm

        report["vllm"] = vllm.__version__
    except ImportError as e:
        raise SystemExit(f"nvdec_cpu: vLLM is not installed ({e}); not run") from e
    sys.path.insert(0, str(Path(__file__).parent))
    from decode_breakdown import slo_clip  # the SLO clip as the other decode benchmarks make it

    with tempfile.TemporaryDirectory() as tmp:
        clips_dir = Path(tmp)
        for codec in codecs:
            (clips_dir / f"{codec}.mp4").write_bytes(slo_clip(codec))
        for backend, sched in CONFIGS:
            cmd = [
                sys.executable,
                __file__,
                "--reps",
                str(args.reps),
                "--warmup",
                str(args.warmup),
                "--codecs",
                ",".join(codecs),
                "--child",
                backend,
                sched,
                str(clips_dir),
            ]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if run.returncode != 0:
                report["configs"].append(
                    {
                        "backend": backend,
                        "sched": sched,
                        "error": run.stderr.strip().splitlines()[-6:],
                    }
                )
                continue
            result = json.loads(run.stdout.strip().splitlines()[-1])
            for codec, clip in result["clips"].items():
                ref = clips_dir / f"{codec}-opencv-default.npy"
                if backend != "opencv" and ref.exists() and "error" not in clip:
                    clip["vs_opencv"] = frame_diff(
                        np.load(clips_dir / f"{codec}-{backend}-{sched}.npy"), np.load(ref)
                    )
            report["configs"].append(result)
    ran = [
        c
        for c in report["configs"]
        if any("error" not in clip for clip in c.get("clips", {}).values())
    ]
    print(
        f"{'backend':16} {'sched':9} {'codec':6} {'wall ms':>8} {'CPU ms':>8} "
        f"{'first wall/CPU':>16}  frames vs OpenCV"
    )
    for c in report["configs"]:
        if "error" in c:
            last = c["error"][-1] if c["error"] else "?"
            print(f"{c['backend']:16} {c['sched']:9} error: {last}")
            continue
        for codec, clip in c["clips"].items():
            if "error" in clip:
                print(f"{c['backend']:16} {c['sched']:9} {codec:6} error: {clip['error']}")
                continue
            first = f"{clip['first']['wall_ms']:.1f}/{clip['first']['cpu_ms']:.1f}"
            diff = clip.get("vs_opencv", {})
            print(
                f"{c['backend']:16} {c['sched']:9} {codec:6} {clip['wall_ms']['median']:8.2f} "
                f"{clip['cpu_ms']['median']:8.2f} {first:>16}  {diff or '-'}"
            )
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    if not ran:
        sys.exit(1)


if __name__ == "__main__":
    main()
