"""Where one video request's API-server time goes, as vLLM runs it: decode (vLLM's OpenCV loader)
then vLLM's multimodal processor `apply`, with the plugin's media fast path installed, one torch
thread (as the fast path runs it), a cProfile of 10 requests grouped by stage.

    .venv/bin/python bench/media_request_profile.py --model .cache/models/e4b-vision \
        --out bench/results/media/cpu-2core-request-profile.txt

--model: any Gemma 4 model directory (only its config, tokenizer and processor are read; build
one with `local/build_model.py --vision e4b --text tiny --out DIR`). Needs vLLM (CPU build here).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import media_stages as ms

# (label, function name as pstats shows it, a part of its file name): cumulative ms per request.
# Nested wrappers share names (vLLM's and the plugin's read_frames/apply), so the outermost
# (largest) cumulative time of a name in that file counts.
STAGES = (
    ("decode, whole (open + frame-count check + read)", "decode_opencv", "video_decoders"),
    ("  frame-count cross-check (seek to end and back)", "get_video_metadata", "video_decoders"),
    ("  read the sampled frames", "read_frames", "video_decoders"),
    ("processor apply, whole", "apply", "processing/processor.py"),
    ("  HF processor calls", "call_hf_processor", "processing/context.py"),
    ("    image processor (fast path)", "preprocess_uint8", "fast_processor.py"),
    ("      bicubic resize", "_upsample_bicubic2d_aa", "~"),
    ("    tokenizer", "_encode_plus", "tokenization_utils_tokenizers.py"),
    ("  multimodal hashing (blake3 of the frames)", "_get_mm_hashes", "processing/processor.py"),
)


def main() -> None:
    args, bench = ms.fast_path_bench(__doc__.splitlines()[0], reps=10)
    mp4 = ms.realistic_mp4(0, 6, 854, 480)

    def request() -> float:
        start = time.perf_counter()
        bench.apply(bench.decode(mp4))
        return (time.perf_counter() - start) * 1000

    for _ in range(3):
        request()
    median = statistics.median(request() for _ in range(15))
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.reps):
        request()
    profile.disable()
    stats = pstats.Stats(profile)

    def cumulative(name: str, file_part: str) -> float:
        found = [
            cum
            for (file, _, func), (_, _, _, cum, _) in stats.stats.items()  # type: ignore[attr-defined]
            if file_part in file and (func == name or func.endswith(f".{name}>"))
        ]
        return max(found, default=0.0)

    lines = [
        f"one 6-frame 854x480 mp4v request, decode + vLLM processor apply, one torch thread: "
        f"median {median:.1f} ms over 15 (unprofiled); cProfile of {args.reps} requests, "
        "cumulative ms per request (profiling adds overhead):",
        "",
    ]
    for label, name, file_part in STAGES:
        lines.append(f"{label:52s} {1000 * cumulative(name, file_part) / args.reps:6.1f} ms")
    text = "\n".join(lines)
    print(text)
    if args.out:
        buf = io.StringIO()
        pstats.Stats(profile, stream=buf).sort_stats("tottime").print_stats(20)
        args.out.write_text(text + "\n\n" + buf.getvalue())


if __name__ == "__main__":
    main()
