"""Plugin test setup: import the package from plugin/src and the shared builders from here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
for path in (HERE.parent / "src", HERE):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


@pytest.fixture
def vllms_own_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's own `CompilationConfig.resolve_cudagraph_mode_and_sizes` for the test (the plugin's
    `watch_resolution` wraps it for the process), put back afterwards."""
    from vllm.config.compilation import CompilationConfig

    name = "resolve_cudagraph_mode_and_sizes"
    own = vars(CompilationConfig)[name]
    monkeypatch.setattr(CompilationConfig, name, getattr(own, "__wrapped__", own))
