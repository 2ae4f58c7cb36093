"""One video request's API-server time (vLLM's decode, then its Gemma 4 processor `apply`) with the
decode overlap off and on (`GEMMA4_MEDIA_OVERLAP_THREADS` 1 and 2), side by side in one run, on
the chart's media settings (fast path, uint8 hand-off, 2 frame threads, one torch thread): wall
and process CPU time per request, the tensors compared with torch.equal on every repetition.

    .venv/bin/python bench/media_overlap.py --out bench/results/media/cpu-2core-overlap.json

Each repetition runs every variant once, in turn, so drift in the machine's load hits all alike.
--model: a Gemma 4 model directory (config, tokenizer and processor only; default: the local
stack's tiny model, whose vision config has E4B's patch size and pooling).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "local"))
import media_stages as ms

VARIANTS = {"overlap off": 0, "overlap 1 thread": 1, "overlap 2 threads": 2}


def clips() -> dict[str, bytes]:
    from slo_loadtest.media import write_video

    with tempfile.TemporaryDirectory() as tmp:
        slo = write_video(Path(tmp) / "v.mp4", 1, frames=6, width=854, height=480, fps=2, seed=0)
        out = {"SLO clip: 6 frames 854x480 (slo-loadtest's)": slo.read_bytes()}
    out["textured: 6 frames 854x480"] = ms.realistic_mp4(0, 6, 854, 480)
    out["textured: 6 frames 1280x720"] = ms.realistic_mp4(1, 6, 1280, 720)
    out["textured: 16 frames 854x480"] = ms.realistic_mp4(2, 16, 854, 480)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.model is None:
        import stack

        args.model = stack.ensure_model()

    import torch
    import vllm

    from gemma4_batched_encoder.media import fast_processor, overlap

    torch.set_num_threads(1)
    bench = ms.Bench(args.model)
    bench.media.set_fast_path(True)
    bench.media.set_uint8(True)
    fast_processor.set_frame_threads(2)

    def run(mp4: bytes, threads: int) -> tuple[float, float, Any]:
        if threads:
            overlap.install(threads)
        else:
            overlap.uninstall()
        wall, cpu = time.perf_counter(), time.process_time()
        out = bench.apply(bench.video_io.load_bytes(mp4))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return wall * 1000, cpu * 1000, ms.mm_item(out)["pixel_values_videos"].data

    results: dict[str, Any] = {}
    mismatches = 0
    for clip, mp4 in clips().items():
        for threads in (*VARIANTS.values(), 0):  # warm-up; the last off run re-learns nothing
            run(mp4, threads)
        overlap.install(1)
        run(mp4, 1)  # parameters learnt
        samples: dict[str, dict[str, list[float]]] = {v: {"wall": [], "cpu": []} for v in VARIANTS}
        for _ in range(args.reps):
            reference = None
            for name, threads in VARIANTS.items():
                wall, cpu, pixels = run(mp4, threads)
                samples[name]["wall"].append(wall)
                samples[name]["cpu"].append(cpu)
                if reference is None:
                    reference = pixels
                elif not torch.equal(reference, pixels):
                    mismatches += 1
        results[clip] = {
            name: {k: round(statistics.median(v), 2) for k, v in s.items()}
            for name, s in samples.items()
        }
    overlap.uninstall()
    report = {
        "command": "bench/media_overlap.py " + " ".join(sys.argv[1:]),
        "vllm": vllm.__version__,
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} CPUs",
        "reps": args.reps,
        "median_ms_per_request": results,
        "mismatches": mismatches,
    }
    lines = ["median ms per request (decode + processor apply), wall / process CPU"]
    lines.append("| clip | " + " | ".join(VARIANTS) + " |")
    lines.append("|---" * (len(VARIANTS) + 1) + "|")
    for clip, by_variant in results.items():
        cells = [f"{v['wall']:.1f} / {v['cpu']:.1f}" for v in by_variant.values()]
        lines.append(f"| {clip} | " + " | ".join(cells) + " |")
    lines.append(f"tensors differing from 'overlap off': {mismatches}")
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    if mismatches:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
