"""vLLM's processor `apply` for one video with the per-video processor call whole (stock) vs
answered by the image processor alone (media/frame_call.py), side by side in one run: the rest
of the fast path is on in both, one torch thread, the variants interleaved per repetition, and
every repetition's tensors compared with torch.equal.

    .venv/bin/python bench/media_frame_call.py --model .cache/models/e4b-vision \
        --out bench/results/media/cpu-2core-frame-call.json

--model: a Gemma 4 model directory (`local/build_model.py --vision e4b --text tiny --out DIR`).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import media_stages as ms

CLIPS = ((6, 854, 480), (6, 1280, 720), (16, 854, 480))


def main() -> None:
    args, bench = ms.fast_path_bench(__doc__.splitlines()[0], reps=30)
    from transformers.models.gemma4.processing_gemma4 import Gemma4Processor

    short_call = Gemma4Processor.__call__
    variants = {"whole call (stock)": short_call.__wrapped__, "image processor only": short_call}

    def apply(video: object) -> tuple[float, dict]:
        start = time.perf_counter()
        out = bench.apply(video)
        return (time.perf_counter() - start) * 1000, out

    def tensors(out: dict) -> list:
        item = out["mm_kwargs"]["video"][0]
        return [out["prompt_token_ids"]] + [item[k].data for k in sorted(item.keys())]

    rows = []
    try:
        for frames, width, height in CLIPS:
            video = bench.decode(ms.realistic_mp4(0, frames, width, height))
            times: dict[str, list[float]] = {name: [] for name in variants}
            mismatches = 0
            for rep in range(args.reps + 3):
                outs = []
                for name, call in variants.items():
                    Gemma4Processor.__call__ = call
                    elapsed, out = apply(video)
                    outs.append(tensors(out))
                    if rep >= 3:  # the first repetitions warm up (and run the self-check)
                        times[name].append(elapsed)
                a, b = outs
                same = a[0] == b[0] and all(
                    torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
                    for x, y in zip(a[1:], b[1:], strict=True)
                )
                mismatches += not same
            rows.append(
                {
                    "clip": f"{frames} frames {width}x{height} mp4v",
                    "median_ms": {k: statistics.median(v) for k, v in times.items()},
                    "p10_p90_ms": {
                        k: [statistics.quantiles(v, n=10)[0], statistics.quantiles(v, n=10)[-1]]
                        for k, v in times.items()
                    },
                    "mismatches": mismatches,
                }
            )
    finally:
        Gemma4Processor.__call__ = short_call
    names = list(variants)
    print(f"| clip | {' | '.join(names)} | saved | mismatches |")
    print("|---" * (len(names) + 3) + "|")
    for r in rows:
        med = r["median_ms"]
        cells = " | ".join(f"{med[n]:.1f}" for n in names)
        saved = med[names[0]] - med[names[1]]
        print(f"| {r['clip']} | {cells} | {saved:.1f} | {r['mismatches']} |")
    if args.out:
        result = {
            "tool": "bench/media_frame_call.py",
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "reps": args.reps,
            "torch_threads": 1,
            "rows": rows,
        }
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
