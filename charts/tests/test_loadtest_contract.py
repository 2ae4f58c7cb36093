"""The chart's load-test Job and the one `slo-loadtest k8s start` creates
(loadtest/src/slo_loadtest/k8s.py) must stay the same pod: same script, container, labels,
environment names, volumes and security context, and the same Service name for a release. This
test fails when either side drifts."""

from __future__ import annotations

import sys

import pytest
from chartlib import ROOT, helm, render

sys.path.insert(0, str(ROOT / "loadtest" / "src"))
from slo_loadtest import k8s


def chart_job() -> dict:
    (job,) = [d for d in render("autoscaling-multi-replica") if d["kind"] == "Job" and
              "annotations" not in d["metadata"]]  # fmt: skip
    return job


def cli_job() -> dict:
    return k8s.loadtest_job(
        k8s.JobOptions(
            release="rel",
            namespace="serve",
            image="gemma4-loadtest:0.1.0",
            settings={"rates": "1..20"},
            results_claim="rel-gemma4-serving-loadtest-results",
            api_key_secret="vllm-api-key",
        )
    )


def test_same_script_container_and_mounts():
    chart = chart_job()["spec"]["template"]["spec"]
    cli = cli_job()["spec"]["template"]["spec"]
    (cc,) = chart["containers"]
    (lc,) = cli["containers"]
    assert cc["name"] == lc["name"] == k8s.CONTAINER
    assert lc["command"] == cc["command"]  # the script, line for line
    assert lc["volumeMounts"] == cc["volumeMounts"]
    assert lc["securityContext"] == cc["securityContext"]
    assert cli["securityContext"] == chart["securityContext"]
    assert cli["restartPolicy"] == chart["restartPolicy"] == "Never"
    assert {v["name"] for v in cli["volumes"]} == {v["name"] for v in chart["volumes"]}


def test_same_environment_and_labels():
    chart = chart_job()
    cli = cli_job()
    cenv = {e["name"]: e for e in chart["spec"]["template"]["spec"]["containers"][0]["env"]}
    lenv = {e["name"]: e for e in cli["spec"]["template"]["spec"]["containers"][0]["env"]}
    for name in ("SLO_LOADTEST_TARGET", "SLO_LOADTEST_OUT", "HOME", "MPLCONFIGDIR"):
        assert lenv[name] == cenv[name], name
    assert lenv["SLO_LOADTEST_API_KEY"] == cenv["SLO_LOADTEST_API_KEY"]
    fixed = ("app.kubernetes.io/name", "app.kubernetes.io/instance", k8s.COMPONENT_LABEL)
    chart_labels = chart["spec"]["template"]["metadata"]["labels"]
    cli_labels = cli["spec"]["template"]["metadata"]["labels"]
    assert {k: cli_labels[k] for k in fixed} == {k: chart_labels[k] for k in fixed}


@pytest.mark.parametrize("release", ["g4", "gemma4-serving-prod", "x" * 53])
def test_same_service_name(release):
    out = helm("template", release, str(ROOT / "charts" / "gemma4-serving"),
               "--show-only", "templates/service.yaml").stdout  # fmt: skip
    name = next(line.split(":", 1)[1].strip() for line in out.splitlines() if "name:" in line)
    assert k8s.fullname(release) == name


def test_every_setting_is_a_real_slo_loadtest_option():
    """Each SLO_LOADTEST_* variable the chart sets (defaults and every profile, both Jobs) is an
    environment variable `slo-loadtest run` reads; a typo would otherwise be ignored silently."""
    from slo_loadtest import cli

    known = {p.envvar for p in cli.run.params if p.envvar}
    assert "SLO_LOADTEST_RATES" in known
    from chartlib import PROFILES

    for profile in PROFILES:
        for doc in render(profile):
            if doc["kind"] != "Job":
                continue
            env = doc["spec"]["template"]["spec"]["containers"][0]["env"]
            names = {e["name"] for e in env if e["name"].startswith("SLO_LOADTEST_")}
            unknown = names - known - {"SLO_LOADTEST_OUT"}  # OUT: the script passes --out
            assert not unknown, f"{profile}: {sorted(unknown)} are not slo-loadtest run options"


def test_notes_fetch_command_parses_with_the_cli():
    """The `slo-loadtest k8s fetch ...` line NOTES.txt prints is accepted by the real CLI's
    option parser (parsed only; nothing talks to a cluster)."""
    import shlex

    from chartlib import install_dry_run

    from slo_loadtest import cli

    notes = install_dry_run()["info"]["notes"]
    (line,) = [ln.strip() for ln in notes.splitlines() if "slo-loadtest k8s fetch" in ln]
    argv = shlex.split(line)
    assert argv[:3] == ["slo-loadtest", "k8s", "fetch"]
    fetch = cli.cli.commands["k8s"].commands["fetch"]
    ctx = fetch.make_context("fetch", argv[3:])
    assert ctx.params["release"] == "rel"
    assert ctx.params["namespace"] == "serve"
