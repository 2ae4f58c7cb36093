"""The run configuration as every output shows it: ``report.md``'s Configuration section,
``results.csv``'s ``config_*`` columns and ``compare``'s check that runs are like for like.

One flat mapping, drawn from a summary (its ``config``, ``criteria`` and top-level fields), with
each value as the CSV writes it, so a value read back from a ``results.csv`` compares equal to
the same value taken from a ``summary.json``. Secrets never get here: ``config_record`` drops
the API key and every URL goes through :func:`redact_url` (``slo_loadtest.credentials``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from slo_loadtest.credentials import redact_url

# (key, where it comes from): "config" (summary["config"]), "criteria", or the summary itself
KEYS: tuple[tuple[str, str], ...] = (
    ("target", "summary"),
    ("model", "summary"),
    ("workloads", "config"),
    ("rates", "config"),
    ("duration_s", "config"),
    ("warmup_s", "config"),
    ("request_timeout_s", "config"),
    ("connection_per_request", "config"),
    ("prompt_tokens", "config"),
    ("output_tokens", "config"),
    ("media_prompt_tokens", "config"),
    ("video_frames", "config"),
    ("video_width", "config"),
    ("video_height", "config"),
    ("video_fps", "config"),
    ("video_codec", "config"),
    ("image_width", "config"),
    ("image_height", "config"),
    ("images_per_request", "config"),
    ("unique_media", "config"),
    ("tokenizer", "config"),
    ("extra_body", "config"),
    ("seed", "config"),
    ("max_workers", "config"),
    ("search_beyond", "config"),
    ("slo_ms", "criteria"),
    ("min_achieved_ratio", "criteria"),
    ("max_error_ratio", "criteria"),
    ("max_dispatch_delay_ms", "criteria"),
    ("require_rate", "summary"),
    ("started_at", "config"),
)
CSV_PREFIX = "config_"
CSV_COLUMNS = [CSV_PREFIX + k for k, _ in KEYS] + ["tool_version"]

# What makes two runs comparable: the request each workload sends, how long and how it was
# measured, and what it was judged against. Not the target (before/after are usually two
# servers), the rates (compare shows every rate), the seed (new per run on purpose), the
# tokenizer's path or the client's worker count.
COMMON_KEYS = (
    "model", "duration_s", "warmup_s", "request_timeout_s", "connection_per_request",
    "output_tokens", "unique_media", "extra_body", "slo_ms", "min_achieved_ratio",
    "max_error_ratio", "max_dispatch_delay_ms",
)  # fmt: skip
WORKLOAD_KEYS = {
    "text": ("prompt_tokens",),
    "video": ("media_prompt_tokens", "video_frames", "video_width", "video_height", "video_fps",
              "video_codec"),
    "image": ("media_prompt_tokens", "image_width", "image_height", "images_per_request"),
}  # fmt: skip


def cell(v: Any) -> str:
    """A value as results.csv writes it (the one formatting, so both sources compare equal)."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.4f}".rstrip("0").rstrip(".") if v == v else ""
    if isinstance(v, list | tuple):
        return ",".join(cell(x) for x in v)
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True, separators=(",", ":")) if v else ""
    return str(v)


def flat(summary: Mapping[str, Any]) -> dict[str, str]:
    """key -> value as a CSV cell ('' where the run did not record it)."""
    config = summary.get("config") or {}
    criteria = summary.get("criteria") or {}
    out: dict[str, str] = {}
    for key, src in KEYS:
        source = {"config": config, "criteria": criteria}.get(src, summary)
        v = source.get(key)
        if key == "target":
            v = redact_url(str(v or config.get("target") or ""))
        elif key == "model":
            v = v or config.get("model")
        elif key == "require_rate":
            v = v or None
        out[key] = cell(v)
    # the version that ran the sweep (kept through analyze), else the one that wrote the summary
    tool = config.get("tool_version") or (summary.get("tool") or {}).get("version")
    out["tool_version"] = cell(tool)
    return out


def csv_cells(summary: Mapping[str, Any]) -> dict[str, str]:
    """The ``config_*`` and ``tool_version`` cells of every results.csv row."""
    f = flat(summary)
    return {CSV_PREFIX + k: f[k] for k, _ in KEYS} | {"tool_version": f["tool_version"]}


def from_csv_row(row: Mapping[str, Any]) -> dict[str, str] | None:
    """The flat configuration from a results.csv row; None for a CSV without config columns."""
    if not any(str(k).startswith(CSV_PREFIX) for k in row if k):
        return None
    out = {k: str(row.get(CSV_PREFIX + k) or "") for k, _ in KEYS}
    out["tool_version"] = str(row.get("tool_version") or "")
    return out


def compared_keys(workloads: list[str]) -> list[str]:
    keys = list(COMMON_KEYS)
    for w in workloads:
        keys += [k for k in WORKLOAD_KEYS.get(w, ()) if k not in keys]
    return keys


def differences(
    configs: Mapping[str, Mapping[str, str] | None], workloads: list[str]
) -> dict[str, dict[str, str]]:
    """key -> {label: value} for each compared key whose recorded values differ. A run that
    did not record a key (older versions lacked some) is left out of that key's check."""
    out: dict[str, dict[str, str]] = {}
    for key in compared_keys(workloads):
        values = {
            label: c[key] for label, c in configs.items() if c is not None and c.get(key, "") != ""
        }
        if len(set(values.values())) > 1:
            out[key] = values
    return out


def _s(v: str, unit: str = "") -> str:
    return f"{v}{unit}" if v else "not recorded"


def markdown_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(setting, value) rows of report.md's Configuration section."""
    f = flat(summary)
    workloads = f["workloads"].split(",") if f["workloads"] else []
    rows = [
        ("target", f"`{f['target']}`" if f["target"] else "not recorded"),
        ("model", f"`{f['model']}`" if f["model"] else "not recorded"),
        ("workloads", _s(f["workloads"].replace(",", ", "))),
        ("rates (req/s)", _s(f["rates"].replace(",", ", "))),
        ("duration per rate", _s(f["duration_s"], " s")),
        ("warm-up (inside the duration, not measured)", _s(f["warmup_s"], " s")),
        ("request timeout", _s(f["request_timeout_s"], " s")),
        (
            "connections",
            {"True": "a new one per request", "False": "keep-alive"}.get(
                f["connection_per_request"], "not recorded"
            ),
        ),
        ("output tokens (every request)", _s(f["output_tokens"])),
    ]
    if "text" in workloads or not workloads:
        rows.append(("text prompt tokens", _s(f["prompt_tokens"])))
    if {"video", "image"} & set(workloads) or not workloads:
        rows.append(("text tokens beside the media", _s(f["media_prompt_tokens"])))
    if "video" in workloads or not workloads:
        video = (
            f"{f['video_frames']} frames, {f['video_width']}x{f['video_height']} at "
            f"{f['video_fps']} fps, {f['video_codec'] or 'mpeg4 (codec not recorded)'}"
            if f["video_frames"]
            else "not recorded"
        )
        rows.append(("video", video))
    if "image" in workloads or not workloads:
        image = (
            f"{f['images_per_request']} x {f['image_width']}x{f['image_height']} JPEG a request"
            if f["image_width"]
            else "not recorded"
        )
        rows.append(("images", image))
    rows += [
        (
            "media and text",
            {"True": "unique per request", "False": "the same in every request"}.get(
                f["unique_media"], "not recorded"
            ),
        ),
        ("tokenizer", f"`{f['tokenizer']}`" if f["tokenizer"] else "none (one-token words)"),
        ("extra request body", f"`{f['extra_body']}`" if f["extra_body"] else "none"),
        ("seed", _s(f["seed"])),
        ("load-generator workers", _s(f["max_workers"])),
        (
            "search beyond the last rate",
            {"True": "yes", "False": "no"}.get(f["search_beyond"], "not recorded"),
        ),
        ("SLO: p95 total latency", _s(f["slo_ms"], " ms")),
        (
            "other criteria",
            f"achieved >= {f['min_achieved_ratio']} x target, errors <= {f['max_error_ratio']} "
            f"of requests, p95 dispatch delay <= {f['max_dispatch_delay_ms']} ms"
            if f["min_achieved_ratio"]
            else "not recorded",
        ),
        ("required rate", _s(f["require_rate"], " req/s") if f["require_rate"] else "none"),
        ("guidellm", _s(str(summary.get("guidellm_version") or ""))),
        ("slo-loadtest", _s(f["tool_version"])),
        ("started", _s(f["started_at"])),
        ("summary written", _s(str(summary.get("created_at") or ""))),
    ]
    return rows
