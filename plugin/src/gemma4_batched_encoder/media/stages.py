"""Per-stage media preprocessing timing: `gemma4_media_preprocess_seconds{stage}`.

Beside the wall time, where the calling thread spent it:
`gemma4_media_preprocess_thread_seconds_total{stage,state}` with state
- `on_cpu`: the thread ran (its CPU time);
- `runnable`: it was ready but waited for a CPU (Linux run-queue delay,
  /proc/thread-self/schedstat): the host's CPUs are oversubscribed;
- `blocked`: the rest: waiting for the GIL, a lock or I/O, or for work on other threads.
That tells a stage made slow by CPU starvation from one made slow by the GIL (the fourth H200
sitting saw vLLM's processor grow from 18 to 55 ms under load and could not say why; the fifth,
with this, saw 2-8% waiting for a CPU at 4 or 8 API servers and 22-34% with torch_shm). Where
schedstat is missing, `runnable` stays 0 and its time counts as `blocked`.

Calls on dummy inputs are not recorded (`metrics.unrecorded`, around vLLM's
`get_dummy_mm_inputs`): each API server's start-up warm-up of vLLM 0.33 processes the largest
items the model allows (15-20 s an API server), and the thirtieth and thirty-first sittings
misread that in whole-run averages as a processor slowed by load (46 ms a video; 11 ms over the
sweeps themselves).

The metrics are created lazily, once per process, in the process where a stage runs (the API
server for everything measured here). With PROMETHEUS_MULTIPROC_DIR set (images/entrypoint.sh
sets it) every process's samples appear on vLLM's /metrics.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from ..metrics import recording, seconds_buckets
from ..procfs import run_queue_seconds

METRIC_NAME = "gemma4_media_preprocess_seconds"
THREAD_METRIC_NAME = "gemma4_media_preprocess_thread_seconds"  # a counter: exposed with _total
THREAD_STATES = ("on_cpu", "runnable", "blocked")
COUNT_CHECK_METRIC_NAME = "gemma4_media_frame_count_check"  # a counter: exposed with _total
# vLLM 0.27+'s frame-count check (media/count_check.py): not needed (the container and the decode
# vouch for the header), run and agreeing (beside the decode; after it where the decode stopped
# short of the last frame), or correcting the header.
COUNT_CHECK_OUTCOMES = ("skipped", "beside", "corrected")
# 0.5 ms .. 2 s: a 480p frame's resize is ~1 ms, a burst of videos in one API server ~1 s.
BUCKETS = seconds_buckets(0.0005, 2.0)

# Stage names (the `stage` label). Keep in sync with bench/MEDIA.md.
BASE64 = "base64_decode"  # data URL payload -> bytes (VideoMediaIO/ImageMediaIO.load_base64)
VIDEO_DECODE = "video_decode"  # mp4 bytes -> sampled RGB frames (vLLM's OpenCV loader)
IMAGE_PROCESSOR = "image_processor"  # Gemma 4 image processor: resize, rescale, patchify, pad
MM_PROCESSOR = "mm_processor"  # vLLM's whole Gemma 4 multimodal processor call (HF + tokens)

_lock = threading.Lock()
_metrics: dict[str, Any] = {}


def _once(name: str, make: Callable[[], Any]) -> Any:
    """The process's metric `name`, created on first use (prometheus_client forbids duplicates).
    Every media stage calls this: once created, no lock is taken."""
    metric = _metrics.get(name)
    if metric is not None:
        return metric
    with _lock:
        if name not in _metrics:
            _metrics[name] = make()
        return _metrics[name]


def histogram() -> Any:
    from prometheus_client import Histogram

    return _once(
        METRIC_NAME,
        lambda: Histogram(
            METRIC_NAME,
            "Gemma 4 media preprocessing time per stage (seconds).",
            ["stage"],
            buckets=BUCKETS,
        ),
    )


def thread_counter() -> Any:
    from prometheus_client import Counter

    return _once(
        THREAD_METRIC_NAME,
        lambda: Counter(
            THREAD_METRIC_NAME,
            "Gemma 4 media preprocessing: the calling thread's time per stage by state "
            "(on_cpu, runnable = waiting for a CPU, blocked = GIL, locks, I/O).",
            ["stage", "state"],
        ),
    )


def labelled_counter(name: str, documentation: str, label: str) -> Callable[[str], None]:
    """An increment for a one-label counter, created on first use; it never raises (metrics
    must never fail a request)."""

    def inc(value: str) -> None:
        with contextlib.suppress(Exception):
            from prometheus_client import Counter

            metric = _once(name, lambda: Counter(name, documentation, [label]))
            metric.labels(**{label: value}).inc()

    return inc


count_check = labelled_counter(
    COUNT_CHECK_METRIC_NAME,
    "Gemma 4 media: vLLM's video frame-count check by outcome (skipped = the mp4's sample table "
    "and the decode vouch for the header; beside = run beside the decode, or after it where the "
    "decode stopped short of the last frame; corrected = the header overstated the frames and "
    "vLLM's own decode ran).",
    "outcome",
)


def observe(stage: str, seconds: float) -> None:
    if not recording():
        return
    with contextlib.suppress(Exception):  # metrics must never fail a request
        histogram().labels(stage=stage).observe(seconds)


class ThreadClock(NamedTuple):
    """Wall, thread CPU and run-queue readings of the calling thread at one moment."""

    wall: float
    cpu: float
    run_queue: float | None

    @classmethod
    def now(cls) -> ThreadClock:
        return cls(time.perf_counter(), time.thread_time(), run_queue_seconds())

    def split(self, end: ThreadClock) -> tuple[float, dict[str, float]]:
        """Wall seconds from self to end, and their split by THREAD_STATES (sums to the wall)."""
        wall = end.wall - self.wall
        on_cpu = min(max(0.0, end.cpu - self.cpu), wall)
        runnable = 0.0
        if self.run_queue is not None and end.run_queue is not None:
            runnable = min(max(0.0, end.run_queue - self.run_queue), wall - on_cpu)
        return wall, {"on_cpu": on_cpu, "runnable": runnable, "blocked": wall - on_cpu - runnable}


def observe_since(stage: str, start: ThreadClock) -> float:
    """Record a stage that ran on this thread since `start`; returns its wall seconds."""
    wall, states = start.split(ThreadClock.now())
    if not recording():
        return wall
    observe(stage, wall)
    with contextlib.suppress(Exception):
        counter = thread_counter()
        for state, seconds in states.items():
            counter.labels(stage=stage, state=state).inc(seconds)
    return wall


@contextmanager
def timed(stage: str) -> Iterator[None]:
    start = ThreadClock.now()
    try:
        yield
    finally:
        observe_since(stage, start)
