"""Parsing and checking of user input, before anything runs.

Each function raises ``ValueError`` with a message meant for a human; the CLI turns it into a
``click.BadParameter`` that names the flag.
"""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import urlsplit

from slo_loadtest.config import WORKLOAD_KINDS
from slo_loadtest.credentials import redact_url, scrub
from slo_loadtest.media import VIDEO_CODECS

MAX_RATES = 200

# Request body keys slo-loadtest (through guidellm) sets itself: they define the workload's shape
# (the model, the prompt, streaming and its usage reports, the output length), so an extra body
# may not replace them.
RESERVED_BODY_KEYS: tuple[str, ...] = (
    "model",
    "messages",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "ignore_eos",
    "stop",
)


def parse_rates(text: str) -> tuple[float, ...]:
    """Parse '1,2,5', '1..20', '1..20:2', or a mix ('1,2,5..10:5'). Rates are req/s, > 0,
    finite, strictly increasing after sorting, no duplicates."""
    text = (text or "").strip()
    if not text:
        raise ValueError("no rates given; use e.g. '1,2,5' or '1..20'")
    rates: list[float] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise ValueError(f"empty item in rate list {text!r}")
        if ".." in part:
            rng, _, step_s = part.partition(":")
            lo_s, _, hi_s = rng.partition("..")
            lo, hi = _number(lo_s, part), _number(hi_s, part)
            step = _number(step_s, part) if step_s else 1.0
            if step <= 0:
                raise ValueError(f"range step must be > 0 in {part!r}")
            if hi < lo:
                raise ValueError(f"range end is below its start in {part!r}")
            n = math.floor((hi - lo) / step + 1e-9)
            if n + 1 > MAX_RATES:
                raise ValueError(f"range {part!r} gives more than {MAX_RATES} rates")
            rates.extend(round(lo + i * step, 6) for i in range(n + 1))
        else:
            rates.append(_number(part, part))
    for r in rates:
        if not math.isfinite(r) or r <= 0:
            raise ValueError(f"rate {r:g} is not a positive number of requests per second")
    if len(set(rates)) != len(rates):
        raise ValueError(f"duplicate rates in {text!r}")
    if len(rates) > MAX_RATES:
        raise ValueError(f"more than {MAX_RATES} rates")
    return tuple(sorted(rates))


def _number(s: str, where: str) -> float:
    try:
        value = float(s.strip())
    except ValueError:
        raise ValueError(f"{s.strip()!r} in {where!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{s.strip()!r} in {where!r} is not a finite number")
    return value


def parse_workloads(text: str) -> tuple[str, ...]:
    items = tuple(w.strip().lower() for w in (text or "").split(",") if w.strip())
    if not items:
        raise ValueError(f"no workloads given; choose from {', '.join(WORKLOAD_KINDS)}")
    bad = [w for w in items if w not in WORKLOAD_KINDS]
    if bad:
        raise ValueError(
            f"unknown workload(s) {', '.join(bad)}; choose from {', '.join(WORKLOAD_KINDS)}"
        )
    if len(set(items)) != len(items):
        raise ValueError(f"duplicate workloads in {text!r}")
    return items


def check_video_codec(name: str) -> str:
    codec = (name or "").strip().lower()
    if codec not in VIDEO_CODECS:
        raise ValueError(f"unknown video codec {name!r}; choose from {', '.join(VIDEO_CODECS)}")
    return codec


def check_target(url: str) -> str:
    """An http(s) URL with a host; returns it without a trailing slash. Messages never quote
    its credentials (``user:password@`` is shown as ``***@``)."""
    url = (url or "").strip()
    if not url:
        raise ValueError("a target URL is required, e.g. http://127.0.0.1:8000")
    shown = scrub(url)
    try:
        parsed = urlsplit(url)
    except ValueError:
        raise ValueError(f"{shown!r} is not a valid URL") from None
    if parsed.scheme not in ("http", "https"):
        raise ValueError(f"{shown!r} is not an http:// or https:// URL")
    if not parsed.hostname:
        raise ValueError(f"{shown!r} has no host")
    try:
        port = parsed.port
    except ValueError:
        raise ValueError(f"{shown!r} has an invalid port") from None
    if port == 0:
        raise ValueError(f"{shown!r} has an invalid port 0")
    if parsed.query or parsed.fragment:
        # the API paths are appended to the target; a query (often a token) would end up in
        # the middle of every request URL, and in guidellm's files
        raise ValueError(
            f"{redact_url(url)!r}: a query or fragment is not supported in the target URL "
            "(credentials: http://user:password@host or --api-key)"
        )
    return url.rstrip("/")


def check_positive(value: float, what: str) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a positive number, got {value:g}")
    return value


def check_slo_ms(value: float) -> float:
    check_positive(value, "the SLO")
    if value > 3_600_000:
        raise ValueError(f"the SLO of {value:g} ms is more than an hour; it is in milliseconds")
    return value


def check_ratio(value: float, what: str) -> float:
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise ValueError(f"{what} must be between 0 and 1, got {value:g}")
    return value


def parse_extra_body(text: str) -> dict[str, Any]:
    """A JSON object to merge into every request body ('' means none), e.g.
    ``{"skip_special_tokens": false}``. Keys slo-loadtest controls are refused."""
    text = (text or "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:  # JSONDecodeError, or NaN/Infinity
        raise ValueError(
            f"{_clip(text)} is not valid JSON ({exc}); give a JSON object, e.g. "
            """'{"skip_special_tokens": false}'"""
        ) from None
    if not isinstance(value, dict):
        raise ValueError(
            f"must be a JSON object ({{...}}), got a JSON {_json_kind(value)}: {_clip(text)}"
        )
    reserved = [k for k in value if k in RESERVED_BODY_KEYS]
    if reserved:
        raise ValueError(
            f"{', '.join(repr(k) for k in reserved)} {'is' if len(reserved) == 1 else 'are'} set "
            "by slo-loadtest itself (they fix the workload's model, prompt, streaming and output "
            "length) and cannot be overridden; use --model, --output-tokens and the workload "
            f"options instead (refused keys: {', '.join(RESERVED_BODY_KEYS)})"
        )
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def _clip(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
