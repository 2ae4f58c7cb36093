"""The `slo-loadtest run` command line the subprocess tests start, as a user types it."""

from __future__ import annotations

import sys


def run_argv(target: str, *options: str) -> list[str]:
    """argv of `slo-loadtest run --target TARGET OPTIONS...`, with this interpreter."""
    return [sys.executable, "-m", "slo_loadtest.cli", "run", "--target", target, *options]
