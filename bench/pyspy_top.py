"""Where a process spent its time: the top functions of a py-spy raw (collapsed-stack) profile.

    py-spy record --pid PID --duration 20 --rate 100 --idle --threads --format raw --output e.txt
    python bench/pyspy_top.py e.txt --top 25 --out e-top.json

Prints two tables, each as % of all samples: *self* (the innermost frame: where the thread was
when sampled) and *inclusive* (every frame on the stack, counted once per sample: which call
trees hold the time). Frames are py-spy's `function (file:line)`; line numbers are dropped so a
function's samples add up. With `--threads`, also each thread's share and its top frames (an
idle thread waiting on a queue is told apart from the busy loop). Made for the H200 sittings'
question "where does vLLM's engine core spend its time at the rate where ITL breaks"
(bench/gpu/h200.sh profile).

    python bench/pyspy_top.py e.txt --thread MainThread \
        --below "execute_model (vllm/v1/worker/gpu_model_runner" --depth 3

splits one thread's samples by the calls under the innermost frame that starts with `--below`
(a frame is `function (file)`), as % of that thread's samples: which part of a step holds it.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_LINENO = re.compile(r":\d+\)$")


def parse(text: str) -> list[tuple[tuple[str, ...], int]]:
    """(frames outermost first, sample count) per line of py-spy's raw output."""
    stacks = []
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if not m:
            continue
        frames = tuple(_LINENO.sub(")", f.strip()) for f in m["stack"].split(";") if f.strip())
        stacks.append((frames, int(m["count"])))
    return stacks


def _thread(frames: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """Split off py-spy's `--threads` root frame ("thread (TID): NAME")."""
    if frames and frames[0].startswith("thread ("):
        return frames[0], frames[1:]
    return "", frames


def top(stacks: list[tuple[tuple[str, ...], int]], n: int = 20) -> dict[str, object]:
    """Top n functions by self and by inclusive share of all samples (percent); with
    `--threads` profiles also each thread's share and its own top self frames."""
    total = sum(count for _, count in stacks)
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    thread_own: dict[str, Counter[str]] = {}
    for stack, count in stacks:
        thread, frames = _thread(stack)
        if frames:
            own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
        if thread:
            threads[thread] += count
            thread_own.setdefault(thread, Counter())[frames[-1] if frames else "?"] += count

    def pct(counter: Counter[str], k: int = n) -> list[tuple[str, float]]:
        return [(f, 100.0 * c / total) for f, c in counter.most_common(k)] if total else []

    return {
        "samples": total,
        "self": pct(own),
        "inclusive": pct(inclusive),
        "threads": [
            {"thread": t, "share": share, "self": pct(thread_own[t], 8)}
            for t, share in pct(threads)
        ],
    }


def breakdown(
    stacks: list[tuple[tuple[str, ...], int]], thread: str, below: str, depth: int = 3
) -> list[tuple[str, float]]:
    """Samples of the threads whose name contains `thread`, grouped by the `depth` frames under
    the innermost frame starting with `below` (" > "-joined; "(not under ...)" and "(in ...)"
    for samples outside it or in it), as percent of those threads' samples, largest first."""
    paths: Counter[str] = Counter()
    for stack, count in stacks:
        name, frames = _thread(stack)
        if thread not in name:
            continue
        anchors = [i for i, frame in enumerate(frames) if frame.startswith(below)]
        if not anchors:
            paths[f"(not under {below})"] += count
            continue
        under = frames[anchors[-1] + 1 : anchors[-1] + 1 + depth]
        paths[" > ".join(f.split(" (")[0] for f in under) or f"(in {below})"] += count
    total = sum(paths.values())
    return [(path, 100.0 * c / total) for path, c in paths.most_common()] if total else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path, help="py-spy record --format raw output")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--out", type=Path, help="also write the tables as JSON")
    parser.add_argument("--thread", help="with --below: only threads whose name contains this")
    parser.add_argument("--below", help="split --thread's samples under this frame (prefix)")
    parser.add_argument("--depth", type=int, default=3, help="frames under --below to group by")
    args = parser.parse_args()
    if args.below:
        rows = breakdown(parse(args.raw.read_text()), args.thread or "", args.below, args.depth)
        if args.out:  # before printing: a reader that stops early (`| head`) must not lose it
            args.out.write_text(json.dumps(rows, indent=2))
        print(f"{args.raw}: threads '{args.thread or '*'}' under {args.below}")
        for path, share in rows[: args.top]:
            print(f"  {share:5.1f}%  {path}")
        return
    result = top(parse(args.raw.read_text()), args.top)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(f"{args.raw}: {result['samples']} samples")
    for kind in ("self", "inclusive"):
        print(f"  {kind}:")
        for frame, share in result[kind]:  # type: ignore[union-attr]
            print(f"    {share:5.1f}%  {frame}")
    for t in result["threads"]:  # type: ignore[union-attr]
        print(f"  thread {t['thread']}: {t['share']:.1f}%")
        for frame, share in t["self"]:
            print(f"    {share:5.1f}%  {frame}")


if __name__ == "__main__":
    main()
