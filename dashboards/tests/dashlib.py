"""Helpers shared by the dashboard/rule tests (the root conftest.py has the server fixtures).

A plain module, not a conftest: pytest puts this folder on sys.path (rootdir-relative
"prepend" import mode), so the tests `import dashlib`.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

DASHBOARDS_DIR = Path(__file__).resolve().parents[1]
REPO = DASHBOARDS_DIR.parent
RULES_DIR = DASHBOARDS_DIR / "rules"
RULE_TESTS_DIR = RULES_DIR / "tests"

# Grafana's own variables, and what the tests substitute for them when evaluating queries.
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range", "__range_s", "__all"}


def load_module(name: str) -> ModuleType:
    """Import dashboards/<name>.py (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(
        f"dashboards_{name}", DASHBOARDS_DIR / f"{name}.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "dashboards_generate", DASHBOARDS_DIR / "generate.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def dashboard_paths() -> list[Path]:
    return sorted(DASHBOARDS_DIR.glob("*.json"))


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in dashboard_paths()}


def iter_panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])


def iter_targets(dash: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in iter_panels(dash):
        for t in panel.get("targets", []):
            yield panel, t


_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def variables_in(expr: str) -> set[str]:
    return set(_VAR.findall(expr))


def substitute(expr: str, rate_window: str = "5m") -> str:
    """Grafana-expand a dashboard query for evaluation: "All" (.*) for every template variable,
    a fixed window for $__rate_interval/$__interval/$__range."""
    out = expr
    for builtin in ("__rate_interval", "__interval", "__range"):
        out = out.replace(f"${builtin}", rate_window).replace(f"${{{builtin}}}", rate_window)
    return _VAR.sub(".*", out)
