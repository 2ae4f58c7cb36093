"""Where one video request's API-server time goes, as vLLM runs it: decode (vLLM's OpenCV loader)
then vLLM's multimodal processor `apply`, with the plugin's media fast path installed, one torch
thread (as the fast path runs it), a cProfile of 10 requests grouped by stage.

    .venv/bin/python bench/media_request_profile.py --model .cache/models/e4b-vision \
        --out bench/results/media/cpu-2core-request-profile.txt

--model: any Gemma 4 model directory (only its config, tokenizer and processor are read; build
one with `local/build_model.py --vision e4b --text tiny --out DIR`). Needs vLLM (CPU build here);
runs on vLLM 0.26 and 0.32 (the STAGES table names each version's functions).
"""

from __future__ import annotations

import cProfile
import io
import logging
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import media_stages as ms

# (label, candidates): cumulative ms per request of the first candidate found in the profile.
# A candidate is (function name as pstats shows it, a part of its file name) or, to count only
# the calls from one caller, (name, file part, caller name, caller file part). Nested wrappers
# share names (vLLM's and the plugin's read_frames/apply), so the outermost (largest) cumulative
# time of a name in that file counts. Where the versions differ, 0.32's name comes first.
STAGES = (
    (
        "decode, whole (open + frame-count check + read)",
        (("decode_opencv", "video_decoders"), ("load_bytes", "multimodal/video.py")),
    ),
    (
        "  frame-count cross-check (0.27+: seek to end and back)",
        (("get_video_metadata", "video_decoders"),),
    ),
    (
        "  read the sampled frames",
        (("read_frames", "video_decoders"), ("read_frames", "multimodal/video.py")),
    ),
    ("processor apply, whole", (("apply", "processing/processor.py"),)),
    (
        "  _apply_hf_processor_main (plugin's mm_processor metric)",
        (
            ("_apply_hf_processor_main", "gemma4_mm.py"),
            ("_apply_hf_processor_main", "processing/processor.py"),
        ),
    ),
    ("  HF processor calls", (("call_hf_processor", "processing/context.py"),)),
    ("    image processor, whole call", (("__call__", "image_processing_utils.py"),)),
    ("      _preprocess (plugin's image_processor metric)", (("timed_preprocess", "media/"),)),
    ("      fast path (preprocess_uint8)", (("preprocess_uint8", "fast_processor.py"),)),
    ("        bicubic resize", (("_upsample_bicubic2d_aa", "~"),)),
    (
        "    Gemma4Processor.__call__ (the prompt; + frames w/o frame call)",
        (("__call__", "/processing_utils.py"),),
    ),
    ("      tokenizer", (("_encode_plus", "tokenization_utils_tokenizers.py"),)),
    (
        "      processor kwargs merge + typed-dict validation",
        (("_merge_kwargs", "/processing_utils.py"),),
    ),
    ("      create_mm_token_type_ids", (("create_mm_token_type_ids", "/processing_utils.py"),)),
    (
        "    cast of float outputs to the model dtype",
        (("_postprocess_output", "processing/context.py"),),
    ),
    (
        "  torch.cat of the videos' pixel values (gemma4_mm)",
        (
            ("<built-in method torch.cat>", "~", "_call_hf_processor", "gemma4_mm.py"),
            ("<built-in method torch.cat>", "~", "_apply_hf_processor_main", "gemma4_mm.py"),
        ),
    ),
    (
        "  multimodal hashing (blake3)",
        (("_get_mm_hashes", "processing/processor.py"), ("get_mm_hashes", "processing/inputs.py")),
    ),
    (
        "  prompt updates (video replacement tokens)",
        (("_get_mm_prompt_updates", "processing/processor.py"),),
    ),
    (
        "  applying them / placeholder search",
        (("_maybe_apply_prompt_updates", "processing/processor.py"),),
    ),
)
WINDOW, IMAGE = STAGES[4][0], STAGES[7][0]  # what the H200 sittings' metrics subtract


class _InstallLine(logging.Handler):
    """Keeps the plugin's 'gemma4 media: installed (...)' line: which fast-path parts are on."""

    line = "gemma4 media: installed line not seen (installed before this script?)"

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("gemma4 media: installed"):
            _InstallLine.line = message


def metrics() -> dict[str, float]:
    """Seconds summed so far in the plugin's `gemma4_media_preprocess_seconds` per stage."""
    from prometheus_client import REGISTRY

    return {
        stage: REGISTRY.get_sample_value("gemma4_media_preprocess_seconds_sum", {"stage": stage})
        or 0.0
        for stage in ("video_decode", "mm_processor", "image_processor")
    }


def main() -> None:
    import vllm
    import vllm.logger  # first: its logging set-up drops handlers added before it

    plugin_logger = logging.getLogger("vllm.gemma4_batched_encoder.media")
    plugin_logger.addHandler(_InstallLine())
    plugin_logger.setLevel(logging.INFO)  # vLLM 0.32 leaves it at WARNING
    args, bench = ms.fast_path_bench(__doc__.splitlines()[0], reps=10)
    mp4 = ms.realistic_mp4(0, 6, 854, 480)

    def request() -> float:
        start = time.perf_counter()
        # What the API server hands the processor: MediaWithBytes on 0.27+ (hashed from the mp4
        # bytes), the plain (frames, metadata) tuple on 0.26 (hashed from the frames).
        bench.apply(bench.video_io.load_bytes(mp4))
        return (time.perf_counter() - start) * 1000

    for _ in range(3):
        request()
    before = metrics()
    median = statistics.median([request() for _ in range(15)])
    unprofiled = {k: (v - before[k]) / 15 * 1000 for k, v in metrics().items()}
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.reps):
        request()
    profile.disable()
    stats = pstats.Stats(profile)
    entries = stats.stats  # type: ignore[attr-defined]

    def matches(key: tuple[str, int, str], name: str, file_part: str) -> bool:
        file, _, func = key
        return file_part in file and (func == name or func.endswith(f".{name}>"))

    def cumulative(name: str, file_part: str, *caller: str) -> float | None:
        found = []
        for key, (_, _, _, cum, callers) in entries.items():
            if not matches(key, name, file_part):
                continue
            if caller:  # only the time spent in calls from that caller
                edges = [v[3] for c, v in callers.items() if matches(c, *caller)]
                if not edges:
                    continue
                cum = sum(edges)
            found.append(cum)
        return max(found) if found else None

    per_request: dict[str, float] = {}
    for label, candidates in STAGES:
        found = (cumulative(*candidate) for candidate in candidates)
        per_request[label] = 1000 * next((c for c in found if c is not None), 0.0) / args.reps
    lines = [
        f"vLLM {vllm.__version__}; {_InstallLine.line}",
        f"one 6-frame 854x480 mp4v request, decode + vLLM processor apply, one torch thread: "
        f"median {median:.1f} ms over 15 (unprofiled); cProfile of {args.reps} requests, "
        "cumulative ms per request (profiling adds overhead):",
        "",
    ]
    lines += [f"{label:68s} {ms_:6.1f} ms" for label, ms_ in per_request.items()]
    lines.append(
        f"{'mm_processor metric minus image_processor metric':68s} "
        f"{per_request[WINDOW] - per_request[IMAGE]:6.1f} ms"
    )
    lines += [
        "",
        "the plugin's stage metrics over the 15 unprofiled requests (what the H200 sittings "
        "report; vLLM 0.26.0 there, 4 API servers under load: mm_processor 41.7 ms, "
        "image_processor 15.9 ms):",
        *(f"{stage:68s} {value:6.1f} ms" for stage, value in unprofiled.items()),
        f"{'mm_processor minus image_processor':68s} "
        f"{unprofiled['mm_processor'] - unprofiled['image_processor']:6.1f} ms",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        buf = io.StringIO()
        pstats.Stats(profile, stream=buf).sort_stats("tottime").print_stats(20)
        args.out.write_text(text + "\n\n" + buf.getvalue())


if __name__ == "__main__":
    main()
