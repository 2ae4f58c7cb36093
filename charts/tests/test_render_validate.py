"""helm lint --strict, helm template for every profile x Kubernetes version x Prometheus Operator
presence, every rendered object validated against the Kubernetes OpenAPI schemas (strict) and the
custom resources against the operators' schemas."""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import shutil
import subprocess

import kubernetes_validate
import pytest
import yaml
from chartlib import (
    API_VARIANTS,
    CHART,
    FULLNAME,
    KUBE_VERSIONS,
    NODE_DIR,
    PROFILES,
    TESTS,
    by_kind,
    helm,
    one,
    profile_file,
    render,
    render_text,
    require_tool,
)

CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "ScaledObject", "HTTPRoute"}
COMBOS = [(p, k, a) for p in PROFILES for k in KUBE_VERSIONS for a in API_VARIANTS]


def test_profiles_present():
    assert set(PROFILES) == {
        "default",
        "minimal",
        "autoscaling-multi-replica",
        "no-prometheus-operator",
        "vllm-default-graphs",
        "keda-slo-trigger",
    }


def test_lint_strict_defaults():
    proc = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("kube", KUBE_VERSIONS)
def test_lint_strict_profile(profile, kube):
    """Lint also runs Helm's deprecation checks against the given Kubernetes version."""
    args = ["lint", "--strict", str(CHART), "-f", str(profile_file(profile))]
    proc = helm(*args, "--kube-version", kube)
    assert "0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout


# kubernetes-validate re-reads its (large) schema files on every call; the files never change
# during a run, so read each once. Objects repeated across profiles are validated once.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents
)
_validated: dict[tuple[str, str], str | None] = {}


def kube_validate(doc: dict, version: str) -> str | None:
    key = (hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest(), version)
    if key not in _validated:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
            _validated[key] = None
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            _validated[key] = f"{doc['kind']}/{doc['metadata']['name']} at {path}: {err.message}"
    return _validated[key]


@pytest.mark.parametrize(("profile", "kube", "api"), COMBOS)
def test_rendered_objects_valid_for_kubernetes(profile, kube, api):
    docs = render(profile, kube, api)
    assert docs, "nothing rendered"
    errors = []
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue  # checked against the CRD schemas below
        err = kube_validate(doc, kube)
        if err:
            errors.append(err)
    assert not errors, "\n".join(errors)
    kinds = {d["kind"] for d in docs}
    unexpected = (
        kinds
        - CRD_KINDS
        - {
            "Deployment",
            "Service",
            "ServiceAccount",
            "PersistentVolumeClaim",
            "ConfigMap",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "Ingress",
            "HorizontalPodAutoscaler",
            "Job",
        }
    )
    assert not unexpected


def test_kubernetes_validation_is_strict():
    """Negative control: an unknown field in the pod spec is rejected, for both versions."""
    dep = copy.deepcopy(next(d for d in render() if d["kind"] == "Deployment"))
    dep["spec"]["template"]["spec"]["containers"][0]["gpuCount"] = 1
    for version in KUBE_VERSIONS:
        assert kube_validate(dep, version), "strict validation accepted an unknown field"


@pytest.fixture(scope="module")
def crd_results(tmp_path_factory):
    """One node process validates every rendered combination (loading the models takes ~2 s)."""
    node = require_tool(shutil.which("node"), "node")
    require_tool(
        NODE_DIR / "node_modules" / "@kubernetes-models" / "prometheus-operator", "npm models"
    )
    require_tool(NODE_DIR / "node_modules" / "@kubernetes-models" / "keda", "npm KEDA models")
    require_tool(
        NODE_DIR / "node_modules" / "@kubernetes-models" / "gateway-api", "npm Gateway API models"
    )
    tmp = tmp_path_factory.mktemp("crds")
    files = {}
    for profile, kube, api in COMBOS:
        path = tmp / f"{profile}-{kube}-{api}.yaml"
        path.write_text(render_text(profile, kube, api))
        files[(profile, kube, api)] = str(path)
    # negative controls: a ServiceMonitor whose endpoints is not a list, a PrometheusRule whose
    # rule has no expr, a ScaledObject without scaleTargetRef, an HTTPRoute whose backend port
    # is a name (the Gateway API wants the Service's port number)
    docs = render("autoscaling-multi-replica", "1.37.0", "operator") + by_kind(
        render("no-prometheus-operator", "1.37.0", "operator"), "HTTPRoute"
    )
    bad = []
    for doc in docs:
        d = copy.deepcopy(doc)
        if d["kind"] == "ServiceMonitor":
            d["spec"]["endpoints"] = "http"
        elif d["kind"] == "PrometheusRule":
            d["spec"]["groups"] = [{"name": "g", "rules": [{"record": "x"}]}]
        elif d["kind"] == "ScaledObject":
            del d["spec"]["scaleTargetRef"]
        elif d["kind"] == "HTTPRoute":
            d["spec"]["rules"][0]["backendRefs"][0]["port"] = "http"
        else:
            continue
        bad.append(d)
    # the SLO trigger (second trigger, keda-slo-trigger profile): a number where KEDA wants the
    # string map of trigger metadata, and an authenticationRef that is not an object
    slo = one(render("keda-slo-trigger", "1.37.0", "operator"), "ScaledObject")
    for suffix, broken in (
        ("slo-threshold", lambda t: t["metadata"].__setitem__("threshold", 0.1)),
        ("slo-authref", lambda t: t.__setitem__("authenticationRef", "prometheus-auth")),
    ):
        d = copy.deepcopy(slo)
        d["metadata"]["name"] += f"-{suffix}"
        broken(d["spec"]["triggers"][1])
        bad.append(d)
    (tmp / "bad.yaml").write_text(yaml.safe_dump_all(bad))
    files["bad"] = str(tmp / "bad.yaml")
    proc = subprocess.run(
        [node, str(TESTS / "validate_crds.mjs"), *files.values()],
        capture_output=True,
        text=True,
        timeout=60,
        env={"TOOLS_NODE_DIR": str(NODE_DIR), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    return {key: out[path] for key, path in files.items()}


@pytest.mark.parametrize(("profile", "kube", "api"), COMBOS)
def test_custom_resources_valid(crd_results, profile, kube, api):
    res = crd_results[(profile, kube, api)]
    assert not res["errors"], res["errors"]
    unknown_crds = [u for u in res["unknown"] if u["kind"] in CRD_KINDS]
    assert not unknown_crds
    rendered = {d["kind"] for d in render(profile, kube, api)} & CRD_KINDS
    assert {c["kind"] for c in res["checked"]} == rendered


def test_custom_resource_validation_rejects_broken_objects(crd_results):
    res = crd_results["bad"]
    assert {c["kind"] for c in res["checked"]} == CRD_KINDS
    assert {e["kind"] for e in res["errors"]} == CRD_KINDS, res
    errors = {e["name"]: e["error"] for e in res["errors"]}
    assert "triggers/1/metadata/threshold must be string" in errors[f"{FULLNAME}-slo-threshold"]
    assert "triggers/1/authenticationRef must be object" in errors[f"{FULLNAME}-slo-authref"]


def test_keda_slo_trigger_profile():
    """ci/keda-slo-trigger-values.yaml renders the ScaledObject with both triggers (validated
    against KEDA's CRD schema for every Kubernetes version and API variant by
    test_custom_resources_valid). The schema does not reject unknown fields, so the fields are
    asserted here: KEDA's prometheus trigger keys, string metadata, the shared address,
    authentication and extra metadata on both, the SLO threshold compared as a Value."""
    for kube in KUBE_VERSIONS:
        for api in API_VARIANTS:
            so = one(render("keda-slo-trigger", kube, api), "ScaledObject")
            load, slo = so["spec"]["triggers"]
            for t in (load, slo):
                assert set(t) == {"type", "name", "metricType", "metadata", "authenticationRef"}
                assert t["type"] == "prometheus"
                assert t["authenticationRef"] == {"name": "prometheus-auth"}
                assert all(isinstance(v, str) for v in t["metadata"].values()), t["metadata"]
                assert t["metadata"]["serverAddress"] == "https://prometheus.monitoring.svc:9090"
                assert t["metadata"]["authModes"] == "bearer"
                assert t["metadata"]["unsafeSsl"] == "false"
            assert (load["name"], load["metricType"], load["metadata"]["threshold"]) == (
                "load",
                "AverageValue",
                "6",
            )
            assert (slo["name"], slo["metricType"], slo["metadata"]["threshold"]) == (
                "slo",
                "Value",
                "0.1",
            )
            assert 'le="0.3"' in slo["metadata"]["query"]  # the 300 ms bucket, tpl-rendered
            assert f'service="{FULLNAME}"' in slo["metadata"]["query"]
            assert so["spec"]["minReplicaCount"] == 2 and so["spec"]["maxReplicaCount"] == 6


def test_monitoring_objects_follow_the_operator_api():
    with_op = render("default", api="operator")
    without = render("default", api="no-operator")
    assert len(by_kind(with_op, "ServiceMonitor")) == 1
    assert len(by_kind(with_op, "PrometheusRule")) == 1
    assert not by_kind(without, "ServiceMonitor")
    assert not by_kind(without, "PrometheusRule")


def test_packaged_chart_renders_the_same(tmp_path):
    """`helm package` follows the files/dashboards symlink: the packaged chart carries the real
    dashboards and rules (and no tests or generator code) and renders identically."""
    helm("package", str(CHART), "-d", str(tmp_path))
    (tgz,) = tmp_path.glob("gemma4-serving-*.tgz")
    listing = subprocess.run(["tar", "-tzf", str(tgz)], capture_output=True, text=True, check=True)
    names = listing.stdout.split()
    assert any(n.endswith(".json") and "/files/dashboards/" in n for n in names)
    shipped = [n.split("/files/dashboards/", 1)[1] for n in names if "/files/dashboards/" in n]
    assert all(n.endswith(".json") or n.startswith("rules/") for n in shipped), shipped
    assert not [n for n in shipped if n.endswith(".py") or "tests/" in n], shipped
    packaged = helm(
        "template",
        "rel",
        str(tgz),
        "--namespace",
        "serve",
        "--kube-version",
        "1.37.0",
        "--api-versions",
        "monitoring.coreos.com/v1",
        "-f",
        str(profile_file("default")),
    ).stdout
    assert packaged == render_text("default", "1.37.0", "operator")
