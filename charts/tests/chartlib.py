"""Helpers for the chart tests: real helm (from .tools, see scripts/install-tools.sh), rendering
with caching, object lookup. Missing tools fail the tests with the command that installs them;
nothing is skipped."""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gemma4-serving"
TESTS = Path(__file__).resolve().parent
TOOLS = Path(os.environ.get("TOOLS_DIR", ROOT / ".tools"))
HELM = TOOLS / "bin" / "helm"
NODE_DIR = TOOLS / "node"
DASHBOARDS = ROOT / "dashboards"
RULES = DASHBOARDS / "rules"

INSTALL_HINT = "run `scripts/install-tools.sh` (installs helm, kubectl, npm validators, promtool)"

KUBE_VERSIONS = ("1.29.0", "1.37.0")
# Both variants serve the Gateway API (the no-prometheus-operator profile routes through it).
GATEWAY_API = "gateway.networking.k8s.io/v1/HTTPRoute"
API_VARIANTS: dict[str, tuple[str, ...]] = {
    "no-operator": (GATEWAY_API,),
    "operator": ("monitoring.coreos.com/v1", GATEWAY_API),
}
PROFILES = tuple(
    sorted(p.name.removesuffix("-values.yaml") for p in (CHART / "ci").glob("*-values.yaml"))
)
RELEASE = "rel"
NAMESPACE = "serve"
FULLNAME = f"{RELEASE}-gemma4-serving"

# the chart's default CUDA graph flags (values.yaml: maxNumBatchedTokens, attentionBackend,
# compilationConfig), rendered in this order between --api-server-count and extraArgs
GRAPH_PROFILE = (
    *("--max-num-batched-tokens", "2560"),
    *("--attention-backend", "TRITON_ATTN"),
    *("--compilation-config", '{"cudagraph_mode":"FULL","max_cudagraph_capture_size":2560}'),
)


def require_tool(path: Path | str | None, what: str) -> str:
    if path is None or not (Path(path).exists() or shutil.which(str(path))):
        pytest.fail(f"{what} not found ({path}): {INSTALL_HINT}", pytrace=False)
    return str(path)


def helm(*args: str, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
    require_tool(HELM, "helm 4")
    proc = subprocess.run(
        [str(HELM), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        env={**os.environ, "HELM_CACHE_HOME": str(TOOLS / "helm-cache")},
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def profile_file(profile: str) -> Path:
    return CHART / "ci" / f"{profile}-values.yaml"


_VALUES_DIR = Path(tempfile.mkdtemp(prefix="gemma4-chart-values-"))
atexit.register(shutil.rmtree, _VALUES_DIR, ignore_errors=True)


def values_file(text: str) -> Path:
    """A values file with this YAML text (for values --set cannot express)."""
    path = _VALUES_DIR / (hashlib.sha256(text.encode()).hexdigest()[:16] + ".yaml")
    path.write_text(text)
    return path


@functools.cache
def _render(
    chart: str,
    profile: str | None,
    kube_version: str,
    api_versions: tuple[str, ...],
    sets: tuple[str, ...],
    namespace: str,
    values: str,
) -> str:
    args = ["template", RELEASE, chart, "--namespace", namespace, "--kube-version", kube_version]
    if profile:
        args += ["-f", str(profile_file(profile))]
    if values:
        args += ["-f", str(values_file(values))]
    for api in api_versions:
        args += ["--api-versions", api]
    for s in sets:
        args += ["--set", s]
    return helm(*args).stdout


def render_text(
    profile: str | None = "default",
    kube_version: str = "1.37.0",
    api: str = "operator",
    sets: tuple[str, ...] = (),
    chart: Path = CHART,
    namespace: str = NAMESPACE,
    values: str = "",
) -> str:
    return _render(
        str(chart), profile, kube_version, API_VARIANTS[api], tuple(sets), namespace, values
    )


def render(
    profile: str | None = "default",
    kube_version: str = "1.37.0",
    api: str = "operator",
    sets: tuple[str, ...] = (),
    chart: Path = CHART,
    namespace: str = NAMESPACE,
    values: str = "",
) -> list[dict[str, Any]]:
    return _parse(render_text(profile, kube_version, api, sets, chart, namespace, values))


@functools.cache
def _parse(text: str) -> list[dict[str, Any]]:
    """Parsed documents (cached and shared: callers that change one deep-copy it first)."""
    return [d for d in yaml.load_all(text, Loader=yaml.CSafeLoader) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str, name_contains: str = "") -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if name_contains in d["metadata"]["name"]]
    assert len(found) == 1, f"expected one {kind} (*{name_contains}*), got {len(found)}"
    return found[0]


def deployment_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    dep = one(docs, "Deployment")
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    return container


def install_dry_run(*sets: str, profile: str | None = "default") -> dict[str, Any]:
    """`helm install --dry-run=client -o json`: the release as Helm would store it, with NOTES."""
    args = ["install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client"]
    args += ["-o", "json"]
    if profile:
        args += ["-f", str(profile_file(profile))]
    for s in sets:
        args += ["--set", s]
    return json.loads(helm(*args).stdout)
