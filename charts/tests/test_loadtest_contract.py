"""The chart's load-test Job and the one `slo-loadtest k8s start` creates
(loadtest/src/slo_loadtest/k8s.py) must stay the same pod: same script, container, labels,
environment names, volumes and security context, and the same Service name for a release. This
test fails when either side drifts."""

from __future__ import annotations

import json
import re
import sys

import pytest
from chartlib import CHART, PROFILES, RELEASE, ROOT, helm, render

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
    # the Pushgateway group: <namespace>/<release> on both sides
    assert lenv["SLO_LOADTEST_PUSH_RELEASE"] == cenv["SLO_LOADTEST_PUSH_RELEASE"]
    assert cenv["SLO_LOADTEST_PUSH_RELEASE"]["value"] == "serve/rel"
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


EXTRA_BODY_VALUES = """
loadtest:
  job:
    enabled: true
  extraBody:
    skip_special_tokens: false
    temperature: 0
    chat_template_kwargs:
      enable_thinking: false
"""
EXTRA_BODY = {
    "skip_special_tokens": False,
    "temperature": 0,
    "chat_template_kwargs": {"enable_thinking": False},
}


def _loadtest_envs(docs: list[dict]) -> list[dict[str, str]]:
    jobs = [d for d in docs if d["kind"] == "Job"]
    return [
        {e["name"]: e.get("value") for e in j["spec"]["template"]["spec"]["containers"][0]["env"]}
        for j in jobs
    ]


def test_extra_body_value_becomes_the_variable_run_reads():
    """loadtest.extraBody (an object) reaches both Jobs as SLO_LOADTEST_EXTRA_BODY, JSON that
    `slo-loadtest run` parses back to the same object (and the same variable
    `slo-loadtest k8s start --extra-body` sets); without it the variable is absent."""
    from click.testing import CliRunner

    from slo_loadtest import cli
    from slo_loadtest.validation import parse_extra_body

    envs = _loadtest_envs(render("default", values=EXTRA_BODY_VALUES))
    assert len(envs) == 2  # the helm-test hook and the standalone Job
    for env in envs:
        assert parse_extra_body(env["SLO_LOADTEST_EXTRA_BODY"]) == EXTRA_BODY
    assert "SLO_LOADTEST_EXTRA_BODY" in {p.envvar for p in cli.run.params}
    r = CliRunner().invoke(
        cli.cli,
        ["k8s", "start", "--release", "rel", "--image", "i", "--dry-run", "--extra-body",
         json.dumps(EXTRA_BODY)],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    (cli_env,) = _loadtest_envs([json.loads(r.output)])
    assert parse_extra_body(cli_env["SLO_LOADTEST_EXTRA_BODY"]) == EXTRA_BODY
    for profile in PROFILES:
        for env in _loadtest_envs(render(profile)):
            assert "SLO_LOADTEST_EXTRA_BODY" not in env, profile


def test_extra_body_refuses_what_slo_loadtest_sets():
    """The chart refuses the same keys `slo-loadtest run --extra-body` refuses, with a message
    naming the value, and an extra body given twice (extraBody and a settings entry)."""
    from slo_loadtest.validation import RESERVED_BODY_KEYS

    tpl = (ROOT / "charts" / "gemma4-serving" / "templates" / "_loadtest.tpl").read_text()
    (line,) = [ln for ln in tpl.splitlines() if ln.startswith("{{- $reserved := list ")]
    assert tuple(re.findall(r'"([a-z_]+)"', line)) == RESERVED_BODY_KEYS
    for key in RESERVED_BODY_KEYS:
        proc = helm("template", RELEASE, str(CHART), "--set", f"loadtest.extraBody.{key}=1",
                    check=False)  # fmt: skip
        assert proc.returncode != 0, key
        assert f'loadtest.extraBody.{key}: slo-loadtest sets "{key}" itself' in proc.stderr
    for setting in ("loadtest.settings.extra_body=x", "loadtest.helmTest.settings.EXTRA_BODY=x"):
        proc = helm("template", RELEASE, str(CHART), "--set", "loadtest.extraBody.temperature=0",
                    "--set", setting, check=False)  # fmt: skip
        assert proc.returncode != 0 and "set it once, in loadtest.extraBody" in proc.stderr
