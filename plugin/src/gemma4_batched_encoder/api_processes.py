"""What each API-server process has served, read from vLLM's multiprocess metrics directory.

With several API servers (`--api-server-count`) every process writes its own metric files into
PROMETHEUS_MULTIPROC_DIR (`counter_<pid>.db`, `histogram_<pid>.db`, ...) and /metrics sums them.
Read per process id, they tell how far the warm-up reached (warmup.py: a process that has never
served a request pays its first-time work on a user's; on this 2-core CPU a process's first text
took 40-176 ms against 19 and its first video 117-282 against 102, bench/README.md) and which
process took a request (bench/ttft_gap.py).
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client.multiprocess import MultiProcessCollector

# per process: sample name (a histogram's _count) and the labels it must have
PROCESS_COUNTS = {
    # vLLM's own, recorded by the API server when a request's first token goes out
    "requests": ("vllm:time_to_first_token_seconds_count", {}),
    # the plugin's media fast path, recorded when a video has been decoded
    "videos": ("gemma4_media_preprocess_seconds_count", {"stage": "video_decode"}),
}


def process_counts(directory: Path) -> dict[int, dict[str, float]]:
    """{pid: {"requests": n, "videos": n}} for every process that has served something; the
    engine core and an API server that has served nothing yet are left out."""
    files: dict[int, list[str]] = {}
    for path in Path(directory).glob("*.db"):
        pid = path.stem.rsplit("_", 1)[-1]
        if pid.isdigit():
            files.setdefault(int(pid), []).append(str(path))
    counts: dict[int, dict[str, float]] = {}
    for pid, paths in files.items():
        got = dict.fromkeys(PROCESS_COUNTS, 0.0)
        for family in MultiProcessCollector.merge(paths, accumulate=True):
            for sample in family.samples:
                for key, (name, labels) in PROCESS_COUNTS.items():
                    if sample.name == name and labels.items() <= sample.labels.items():
                        got[key] += sample.value
        if any(got.values()):
            counts[pid] = got
    return counts
