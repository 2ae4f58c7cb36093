"""The one source of defaults for a sweep.

Every CLI option of ``slo-loadtest run`` (and the Job entrypoint) takes its default and help text
from the fields below, and every field can be set through an environment variable named
``SLO_LOADTEST_<FIELD>`` (upper case), so a Kubernetes Job can be configured entirely through
``env``. Validation lives in :mod:`slo_loadtest.validation`.
"""

from __future__ import annotations

import os
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from slo_loadtest.credentials import split_userinfo

ENV_PREFIX = "SLO_LOADTEST_"
DEFAULT_RATES: tuple[float, ...] = tuple(float(r) for r in range(1, 21))
WORKLOAD_KINDS: tuple[str, ...] = ("text", "video", "image")


def default_max_workers() -> int:
    """guidellm starts 10 worker processes by default; on a small machine each start/stop then
    costs ~12 s and the workers fight the client for CPU. Use about the CPU count, at most 8."""
    return max(1, min(os.cpu_count() or 1, 8))


def _f(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help, **kw})


def _ff(factory: Any, help: str, **kw: Any) -> Any:
    return field(default_factory=factory, metadata={"help": help, **kw})


@dataclass(frozen=True)
class WorkloadShape:
    """What one request of each workload looks like."""

    prompt_tokens: int = 500
    output_tokens: int = 10
    media_prompt_tokens: int = 16
    video_frames: int = 6
    video_width: int = 854
    video_height: int = 480
    video_fps: float = 2.0
    video_codec: str = "mpeg4"
    image_width: int = 640
    image_height: int = 480
    images_per_request: int = 1
    unique_media: bool = True


@dataclass(frozen=True)
class Criteria:
    """When a rate passes. See :mod:`slo_loadtest.verdict`."""

    slo_ms: float = 300.0
    min_achieved_ratio: float = 0.95
    max_error_ratio: float = 0.01
    max_dispatch_delay_ms: float = 50.0


@dataclass(frozen=True)
class SweepConfig:
    target: str = _f(
        "",
        "OpenAI-compatible server, e.g. http://127.0.0.1:8000 (a /v1 suffix is ok); "
        "http://user:password@host:8000 sends HTTP Basic authentication (never written to disk).",
    )
    model: str = _f("", "Served model name; empty: the first model the server lists at /v1/models.")
    api_key: str = _f(
        "",
        "Bearer token for the server (better set through SLO_LOADTEST_API_KEY; never written "
        "to disk).",
    )
    extra_body: dict[str, Any] = _ff(  # noqa: RUF009 - a default_factory
        dict,
        "JSON object merged into every request body, e.g. '{\"skip_special_tokens\": false}' "
        "for a dummy-weight model that emits only special tokens. Keys slo-loadtest sets itself "
        "(model, messages, stream, max_tokens, ...) are refused.",
    )
    workloads: tuple[str, ...] = _f(
        ("text", "video"), "Comma list of workloads: text, video, image."
    )
    rates: tuple[float, ...] = _f(
        DEFAULT_RATES, "Constant rates in req/s: a list '1,2,5' or a range '1..20' or '1..20:2'."
    )
    duration_s: float = _f(30.0, "Max duration of each rate in seconds, warm-up included.")
    warmup_s: float = _f(5.0, "Warm-up at the start of each rate, excluded from the metrics (s).")
    step_timeout_s: float = _f(
        0.0,
        "Wall-time bound of one guidellm invocation (s); 0: duration + 2 x request timeout + 60.",
    )
    request_timeout_s: float = _f(30.0, "Read timeout of each request (s).")
    connection_per_request: bool = _f(
        False,
        "A new connection for every request (HTTP 'Connection: close'), as many independent "
        "clients would open, instead of the load generator's few keep-alive connections: vLLM "
        "with --api-server-count > 1 serves each connection in the process that accepted it, "
        "so a few kept-alive connections load its API servers unevenly.",
    )
    search_beyond: bool = _f(
        False, "After the last rate passes, search higher rates for the highest passing rate."
    )
    search_max_rate: float = _f(200.0, "Upper bound of --search-beyond (req/s).")
    search_step: float = _f(0.0, "First step of --search-beyond (req/s); 0: the last rate.")
    search_resolution: float = _f(1.0, "Stop bisecting when the bracket is this narrow (req/s).")
    slo_ms: float = _f(300.0, "SLO on p95 total request latency (ms).")
    min_achieved_ratio: float = _f(0.95, "A rate passes only if achieved/target >= this.")
    max_error_ratio: float = _f(
        0.01, "A rate passes only if errored/all requests <= this (0: no errors allowed)."
    )
    max_dispatch_delay_ms: float = _f(
        50.0,
        "Client kept up: p95 of guidellm's request dispatch delay must be <= this (ms).",
    )
    require_rate: float = _f(
        0.0, "Exit 1 unless every workload's highest passing rate is >= this (0: no requirement)."
    )
    prompt_tokens: int = _f(WorkloadShape.prompt_tokens, "Prompt tokens of a text request.")
    output_tokens: int = _f(WorkloadShape.output_tokens, "Output tokens of every request.")
    media_prompt_tokens: int = _f(
        WorkloadShape.media_prompt_tokens, "Text tokens sent beside the video/images."
    )
    video_frames: int = _f(WorkloadShape.video_frames, "Frames per video.")
    video_width: int = _f(WorkloadShape.video_width, "Video width (px); 480p is 854x480.")
    video_height: int = _f(WorkloadShape.video_height, "Video height (px).")
    video_fps: float = _f(WorkloadShape.video_fps, "Video frame rate written into the mp4.")
    video_codec: str = _f(
        WorkloadShape.video_codec,
        "Codec of the generated mp4s: mpeg4 (MPEG-4 Part 2, OpenCV's writer) or h264 (libx264 "
        "through PyAV; even width and height). Decoding costs the server differently, so match "
        "what the clients send.",
    )
    image_width: int = _f(WorkloadShape.image_width, "Image width (px).")
    image_height: int = _f(WorkloadShape.image_height, "Image height (px).")
    images_per_request: int = _f(WorkloadShape.images_per_request, "Images per image request.")
    unique_media: bool = _f(
        True, "Unique text and media per request (no cache hit); off: every row is the same."
    )
    tokenizer: str = _f("", "Local tokenizer directory to size prompts exactly (never downloaded).")
    max_workers: int = _ff(
        default_max_workers, "GUIDELLM__MAX_WORKER_PROCESSES for each guidellm run."
    )
    report_samples: int = _f(
        20, "Requests per status kept whole in each guidellm report (they carry the media)."
    )
    out: Path = _f(Path("slo-loadtest-results"), "Output directory.")  # noqa: RUF009
    data_dir: Path = _f(Path(""), "Where datasets and media go; empty: OUT/data.")  # noqa: RUF009
    pushgateway: str = _f("", "Pushgateway URL to push the summary to (empty: no push).")
    push_job: str = _f("slo_loadtest", "Pushgateway job name.")
    push_release: str = _f(
        "",
        "Pushgateway grouping label 'release' (the chart's Jobs set <namespace>/<release>), so "
        "sweeps of two releases do not replace each other's metrics; empty: no such label.",
    )
    seed: int = _f(
        0, "Seed of the generated prompts and media; 0: a new one per run (never a cache hit)."
    )

    @property
    def criteria(self) -> Criteria:
        return Criteria(
            slo_ms=self.slo_ms,
            min_achieved_ratio=self.min_achieved_ratio,
            max_error_ratio=self.max_error_ratio,
            max_dispatch_delay_ms=self.max_dispatch_delay_ms,
        )

    @property
    def shape(self) -> WorkloadShape:
        names = {f.name for f in fields(WorkloadShape)}
        return WorkloadShape(**{n: getattr(self, n) for n in names})

    @property
    def target_url(self) -> str:
        """The target without ``user:password@``: what guidellm and every output see."""
        return split_userinfo(self.target)[0]

    @property
    def target_authorization(self) -> str:
        """``Basic ...`` from the target's ``user:password@``, else ``""``."""
        return split_userinfo(self.target)[1]

    @property
    def authorization(self) -> str:
        """The ``Authorization`` header value of every request: HTTP Basic from the target's
        credentials, else ``Bearer <api key>``, else ``""`` (the CLI refuses both at once)."""
        if self.target_authorization:
            return self.target_authorization
        return f"Bearer {self.api_key}" if self.api_key else ""

    @property
    def effective_step_timeout_s(self) -> float:
        if self.step_timeout_s > 0:
            return self.step_timeout_s
        return self.duration_s + 2 * self.request_timeout_s + 60.0

    @property
    def effective_data_dir(self) -> Path:
        return self.data_dir if str(self.data_dir) not in ("", ".") else self.out / "data"

    def with_(self, **changes: Any) -> SweepConfig:
        return replace(self, **changes)


def env_var(name: str) -> str:
    return ENV_PREFIX + name.upper()


def field_default(name: str) -> Any:
    for f in fields(SweepConfig):
        if f.name == name:
            if f.default_factory is not MISSING:
                return f.default_factory()
            return f.default
    raise KeyError(name)


def field_help(name: str) -> str:
    for f in fields(SweepConfig):
        if f.name == name:
            return str(f.metadata.get("help", ""))
    raise KeyError(name)
