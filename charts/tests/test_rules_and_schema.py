"""The chart ships dashboards/ and dashboards/rules/ through one symlink (no second copy), the
PrometheusRule carries exactly the rule files' groups, bad values are rejected by the schema with a
readable message, and NOTES.txt tells commands that match the rendered labels."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from chartlib import (
    CHART,
    FULLNAME,
    NAMESPACE,
    RELEASE,
    RULES,
    by_kind,
    helm,
    install_dry_run,
    one,
    render,
    require_tool,
)


def rule_files() -> list:
    """Rule files as the chart selects them: dashboards/rules/*.yaml with a top-level `groups:`
    (promtool unit-test files next to them are skipped)."""
    out = []
    for path in sorted(RULES.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        if isinstance(doc, dict) and "groups" in doc:
            out.append((path, doc))
    return out


def test_dashboards_are_a_symlink_not_a_copy():
    link = CHART / "files" / "dashboards"
    assert link.is_symlink(), "charts/gemma4-serving/files/dashboards must link to dashboards/"
    assert os.readlink(link) == "../../../dashboards"
    assert link.resolve() == RULES.parent.resolve()
    # nothing else under files/ may hold dashboards or rules
    others = [p for p in (CHART / "files").iterdir() if p.name != "dashboards"]
    assert not others, others


def generated_config() -> dict:
    spec = importlib.util.spec_from_file_location("generate", RULES.parent / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.CONFIG


def generated_target_selector() -> str:
    """dashboards/generate.py's CONFIG["vllm_target_selector"] (what the chart replaces)."""
    return generated_config()["vllm_target_selector"]


def generated_recorded_selector() -> str:
    """dashboards/generate.py's CONFIG["recorded_selector"] (what the chart replaces too)."""
    return generated_config()["recorded_selector"]


def release_scoped(groups: list, namespace: str = NAMESPACE, service: str = FULLNAME) -> list:
    """The rule files' groups as the chart ships them: the generic target matchers and the
    alerts' recorded-series matchers replaced by this release's namespace and service."""
    text = json.dumps(groups)
    release = json.dumps(f'namespace="{namespace}", service="{service}"')[1:-1]
    for generic in (generated_target_selector(), generated_recorded_selector()):
        text = text.replace(json.dumps(generic)[1:-1], release)
    return json.loads(text)


# Every series name a rule reads: the scraped families, up, and the recorded gemma4:* series.
SERIES_NAME = re.compile(
    r"(?<![A-Za-z0-9_:])(gemma4:[a-z0-9_:]+|gemma4_[a-z0-9_]+|vllm:[a-z0-9_]+|up)\b"
)


def unscoped_reads(expr: str, selector: str) -> list[str]:
    """Each read of a series in expr whose selector lacks `selector` (or that has none)."""
    bad = []
    for m in SERIES_NAME.finditer(expr):
        rest = expr[m.end() :]
        if not rest.startswith("{") or selector not in rest[1 : rest.index("}")]:
            bad.append(m.group(0) + rest[: rest.find("}") + 1 if rest.startswith("{") else 0])
    return bad


def test_prometheus_rule_groups_equal_the_rule_files():
    pr = one(render("default", api="operator"), "PrometheusRule")
    expected = release_scoped([g for _, doc in rule_files() for g in doc["groups"]])
    assert expected, "no rule files in dashboards/rules"
    assert pr["spec"]["groups"] == expected
    names = pr["metadata"]["annotations"]["gemma4-serving/rule-files"].split(",")
    assert names == [p.name for p, _ in rule_files()]


def test_runbook_url_points_every_alert_at_the_given_page():
    url = "https://wiki.example.com/ops/gemma4?space=sre&page=runbook"
    sets = (f"metrics.prometheusRule.runbookUrl={url}",)
    groups = one(render("default", api="operator", sets=sets), "PrometheusRule")["spec"]["groups"]
    expected = release_scoped([g for _, doc in rule_files() for g in doc["groups"]])
    alerts = 0
    for got, want in zip(groups, expected, strict=True):
        for got_rule, want_rule in zip(got["rules"], want["rules"], strict=True):
            if "alert" in want_rule:
                alerts += 1
                anchor = want_rule["annotations"]["runbook_url"].split("#")[1]
                assert anchor == want_rule["alert"].lower()
                assert got_rule["annotations"]["runbook_url"] == f"{url}#{anchor}"
                got_rule = {**got_rule, "annotations": want_rule["annotations"]}
            assert got_rule == want_rule  # nothing else changes
    assert alerts >= 5


def test_rendered_rules_pass_promtool(tmp_path):
    promtool = require_tool(shutil.which("promtool"), "promtool")
    pr = one(render("default", api="operator"), "PrometheusRule")
    path = tmp_path / "rendered-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": pr["spec"]["groups"]}, sort_keys=False))
    proc = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_target_alerts_watch_this_release_only(tmp_path):
    """Gemma4VllmTargetDown/Missing in the PrometheusRule select the release's namespace and
    Service, not a job-name pattern: with fullnameOverride (job = the Service name, matching no
    pattern), in annotations mode (job kubernetes-service-endpoints) and beside another team's
    vLLM they still fire for this release's targets and only for them (promtool, real engine)."""
    promtool = require_tool(shutil.which("promtool"), "promtool")
    pr = one(render("default", api="operator", sets=("fullnameOverride=g4",)), "PrometheusRule")
    exprs = [r["expr"] for g in pr["spec"]["groups"] for r in g["rules"]]
    assert not [e for e in exprs if generated_target_selector() in e]
    sel = f'namespace="{NAMESPACE}", service="g4"'
    assert f"up{{{sel}}} == 0\n" in exprs and f"absent(up{{{sel}}} == 1)\n" in exprs
    rules = tmp_path / "rendered.yaml"
    rules.write_text(yaml.safe_dump({"groups": pr["spec"]["groups"]}, sort_keys=False))
    ours = f'instance="10.0.0.1:8000", pod="g4-0", {sel}'
    other_vllm = 'job="vllm", namespace="team-b", service="vllm", instance="10.0.1.1:8000"'

    def case(series: list, alert: str, firing: list) -> dict:
        return {
            "interval": "1m",
            "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [
                {
                    "alertname": alert,
                    "eval_time": "20m",
                    "exp_alerts": [{"exp_labels": {"severity": "critical", **x}} for x in firing],
                }
            ],
        }

    tests = [
        # ServiceMonitor with fullnameOverride: job is the Service name "g4"
        case([(f'up{{job="g4", {ours}}}', "0x30")], "Gemma4VllmTargetDown", [{"job": "g4"}]),
        # annotations mode: the kubernetes-service-endpoints job, same namespace/service labels
        case(
            [(f'up{{job="kubernetes-service-endpoints", {ours}}}', "0x30")],
            "Gemma4VllmTargetDown",
            [{"job": "kubernetes-service-endpoints"}],
        ),
        # another team's vLLM down: not ours
        case([(f"up{{{other_vllm}}}", "0x30")], "Gemma4VllmTargetDown", []),
        # only another team's vLLM up: this release has no target, Missing fires
        case([(f"up{{{other_vllm}}}", "1x30")], "Gemma4VllmTargetMissing", [{}]),
        # ours up under a job name the old pattern never matched: not missing
        case([(f'up{{job="g4", {ours}}}', "1x30")], "Gemma4VllmTargetMissing", []),
    ]
    annotations = {
        r["alert"]: r["annotations"]
        for g in pr["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    for t in tests:  # firing alerts carry the target's labels and the expanded annotations
        test = t["alert_rule_test"][0]
        for exp in test["exp_alerts"]:
            if exp["exp_labels"].get("job"):
                labels = t["input_series"][0]["series"].split("{", 1)[1].rstrip("}")
                for kv in labels.split(", "):
                    k, v = kv.split("=", 1)
                    exp["exp_labels"][k] = v.strip('"')
            labels = exp["exp_labels"]
            exp["exp_annotations"] = {
                k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m, x=labels: x[m[1]], v)
                for k, v in annotations[test["alertname"]].items()
            }
    spec = tmp_path / "test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "tests": tests}))
    proc = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# Each rule-based alert and input series that fire it (fed by one scrape target's labels, {L}),
# with the time to look. Another team's vLLM and another release of this chart in the same
# namespace both have job names the plain files' pattern matches.
SCOPED_ALERTS = {
    "Gemma4EncoderFallbacks": (
        [('gemma4_encoder_fallbacks_total{L, pod="p-0", reason="oom"}', "0+1x40")],
        "30m",
    ),
    "Gemma4EncoderVerifyMismatch": (
        [('gemma4_encoder_verify_mismatches_total{L, pod="p-0"}', "0x4 1x36")],
        "10m",
    ),
    "Gemma4EncoderGraphCaptureFailed": (
        [('gemma4_encoder_cuda_graphs{L, pod="p-0", state="failed"}', "2x40")],
        "30m",
    ),
    "Gemma4VllmWaitingQueueGrowing": (
        [('vllm:num_requests_waiting{L, pod="p-0", model_name="gemma"}', "0+1x40")],
        "30m",
    ),
    "Gemma4MediaCpuStarved": (
        [
            (
                "gemma4_media_preprocess_thread_seconds_total"
                '{L, pod="p-0", stage="mm_processor", state="runnable"}',
                "0+3x40",
            ),
            ('gemma4_media_preprocess_seconds_sum{L, pod="p-0", stage="mm_processor"}', "0+10x40"),
        ],
        "30m",
    ),
    "Gemma4EngineThreadSaturated": (
        [
            ('gemma4_engine_thread_cpu_seconds_total{L, pod="p-0"}', "0+57x40"),
            ('gemma4_engine_thread_wait_seconds_total{L, pod="p-0"}', "0+2x40"),
        ],
        "30m",
    ),
    # every request slower than 300 ms, in the plugin's histogram or only in vLLM's own (the
    # SLO recording rules' fallback, which any vLLM exports)
    "Gemma4LatencySLOBudgetBurn": (
        [
            ('gemma4_request_e2e_latency_seconds_bucket{L, model_name="gemma", le="0.3"}', "0x90"),
            ('gemma4_request_e2e_latency_seconds_count{L, model_name="gemma"}', "0+60x90"),
        ],
        "60m",
    ),
    "Gemma4LatencySLOBudgetBurn/vllm-histogram": (
        [
            ('vllm:e2e_request_latency_seconds_bucket{L, model_name="gemma", le="0.3"}', "0x90"),
            ('vllm:e2e_request_latency_seconds_count{L, model_name="gemma"}', "0+60x90"),
        ],
        "60m",
    ),
}


def test_every_alert_watches_this_release_only(tmp_path):
    """Every alert of the PrometheusRule (and the SLO recording rules under the burn-rate alert)
    reads only this release's targets (namespace + service): the same series from another
    team's vLLM, or from another release of the chart in the same namespace, fire nothing, while
    this release's fire (promtool on the rendered rules; ALERTS read back by alert name)."""
    promtool = require_tool(shutil.which("promtool"), "promtool")
    pr = one(render("default", api="operator"), "PrometheusRule")
    groups = pr["spec"]["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    scoped = {a.split("/")[0] for a in SCOPED_ALERTS}
    assert alerts - scoped == {"Gemma4VllmTargetDown", "Gemma4VllmTargetMissing"}  # tested above
    selector = f'namespace="{NAMESPACE}", service="{FULLNAME}"'
    reads = 0
    for g in groups:  # every read of a series (scraped or recorded) carries the release's matchers
        for r in g["rules"]:
            name = r.get("alert") or r["record"]
            assert not unscoped_reads(r["expr"], selector), (name, r["expr"])
            reads += len(SERIES_NAME.findall(r["expr"]))
    burn = [r["expr"] for g in groups for r in g["rules"] if r.get("alert", "").endswith("Burn")]
    assert len(burn) == 4 and all(e.count(f"{{{selector}}}") == 2 for e in burn), burn
    assert reads > 40
    rules = tmp_path / "rendered.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    ours = f'job="g4", instance="10.0.0.1:8000", {selector}'
    foreign = [
        'job="vllm", instance="10.0.1.1:8000", namespace="team-b", service="vllm"',
        f'job="other-gemma4-serving", instance="10.0.0.2:8000", namespace="{NAMESPACE}", '
        'service="other-gemma4-serving"',
    ]
    tests = []
    for key, (series, at) in SCOPED_ALERTS.items():
        alert = key.split("/")[0]
        expr = f'max by (alertname) (ALERTS{{alertname="{alert}", alertstate="firing"}})'
        for targets, firing in (([ours], True), (foreign, False)):
            tests.append(
                {
                    "interval": "1m",
                    "input_series": [
                        {"series": s.replace("L", t, 1), "values": v}
                        for t in targets
                        for s, v in series
                    ],
                    "promql_expr_test": [
                        {
                            "expr": expr,
                            "eval_time": at,
                            "exp_samples": (
                                [{"labels": f'{{alertname="{alert}"}}', "value": 1}]
                                if firing
                                else []
                            ),
                        }
                    ],
                }
            )
    spec = tmp_path / "test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m",
                                    "tests": tests}))  # fmt: skip
    proc = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_two_releases_burn_rate_alerts_stay_apart(tmp_path):
    """Two releases of the chart in one Prometheus (same namespace), both PrometheusRules loaded
    (each release's SLO recording rules and alerts): release B's requests all miss the SLO,
    release A's all meet it. B's burn-rate alert fires; A's alert rules fire nothing (an alert
    reading the recorded gemma4:* series without the release's matchers would fire on B's burn,
    duplicating B's alert under A's rule). Each release's alert rules get a `rule_of` label here
    so that promtool can tell whose rule fired."""
    promtool = require_tool(shutil.which("promtool"), "promtool")
    files = []
    for name in ("a", "b"):
        pr = one(render("default", api="operator", sets=(f"fullnameOverride={name}",)),
                 "PrometheusRule")  # fmt: skip
        groups = pr["spec"]["groups"]
        for g in groups:
            for r in g["rules"]:
                if "alert" in r:
                    r["labels"] = {**r["labels"], "rule_of": name}
        path = tmp_path / f"release-{name}.yaml"
        path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        files.append(str(path))

    family = "gemma4_request_e2e_latency_seconds"
    series = []
    for service, fast in (("a", "0+60x90"), ("b", "0x90")):
        t = f'job="{service}", instance="{service}:8000", namespace="{NAMESPACE}"'
        t += f', service="{service}", model_name="gemma"'
        series += [
            {"series": f'{family}_bucket{{{t}, le="0.3"}}', "values": fast},
            {"series": f"{family}_count{{{t}}}", "values": "0+60x90"},
        ]
    firing = (
        "count by (rule_of, service) "
        '(ALERTS{alertname="Gemma4LatencySLOBudgetBurn", alertstate="firing"})'
    )
    recorded = "gemma4:request_e2e_slo_error_ratio:rate1h"
    labels = f'{recorded}{{model_name="gemma", namespace="{NAMESPACE}", service="%s"}}'
    test = {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            # both releases' recording rules ran: A's ratio 0, B's 1
            {"expr": recorded, "eval_time": "60m", "exp_samples": [
                {"labels": labels % "b", "value": 1},
                {"labels": labels % "a", "value": 0},
            ]},
            # only B's rule fires (its 1h/5m and 6h/30m windows), on B's series only
            {"expr": firing, "eval_time": "60m",
             "exp_samples": [{"labels": '{rule_of="b", service="b"}', "value": 2}]},
        ],
    }  # fmt: skip
    spec = tmp_path / "test.yaml"
    spec.write_text(yaml.safe_dump({"rule_files": files, "evaluation_interval": "1m",
                                    "tests": [test]}))  # fmt: skip
    proc = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rules_and_dashboards_follow_new_files(tmp_path):
    """A new dashboard or rule file appears in the chart with no chart change (symlink +
    Files.Glob), and Grafana's {{legend}} syntax passes through untouched."""
    chart = tmp_path / "gemma4-serving"
    shutil.copytree(CHART, chart, symlinks=True, ignore=shutil.ignore_patterns("dashboards"))
    dash = tmp_path / "dashboards"
    (dash / "rules").mkdir(parents=True)
    (chart / "files" / "dashboards").symlink_to("../../dashboards")
    board = '{"uid": "x1", "title": "X", "panels": [{"legendFormat": "{{pod}} {{ .Values }}"}]}\n'
    (dash / "x-board.json").write_text(board)
    rules = {
        "groups": [
            {
                "name": "x",
                "rules": [
                    {
                        "alert": "A",
                        "expr": "up == 0",
                        "annotations": {"summary": "{{ $labels.pod }} down"},
                    }
                ],
            }
        ]
    }
    (dash / "rules" / "x.yaml").write_text(yaml.safe_dump(rules))
    (dash / "rules" / "x-test.yaml").write_text("rule_files: [x.yaml]\ntests: []\n")
    docs = render("default", api="operator", chart=chart)
    (cm,) = [
        c for c in by_kind(docs, "ConfigMap") if "grafana_dashboard" in c["metadata"]["labels"]
    ]
    assert cm["data"] == {"x-board.json": board}
    assert cm["metadata"]["name"] == f"{FULLNAME}-dashboard-x-board"
    assert one(docs, "PrometheusRule")["spec"]["groups"] == rules["groups"]
    # no rule files: no PrometheusRule at all (an empty one would be rejected)
    (dash / "rules" / "x.yaml").unlink()
    docs = render("default", api="operator", chart=chart, sets=("nameOverride=norules",))
    assert not by_kind(docs, "PrometheusRule")


BAD_VALUES = [
    ("autoscaling.kind=vpa", "/autoscaling/kind", "value must be one of 'hpa', 'keda'"),
    ("autoscaling.enabled=true", "/autoscaling/keda/serverAddress", "minLength"),
    ("metrics.mode=prometheus", "/metrics/mode", "value must be one of"),
    (
        "metrics.prometheusRule.enabled=maybe",
        "/metrics/prometheusRule/enabled",
        "value must be one of",
    ),
    ("server.port=70000", "/server/port", "maximum"),
    ("replicaCount=-1", "/replicaCount", "minimum"),
    ("probes.startup.failureThreshold=0", "/probes/startup/failureThreshold", "minimum"),
    ("probes.readiness.path=health", "/probes/readiness/path", "does not match pattern"),
    (
        "securityContext.allowPrivilegeEscalation=true",
        "/securityContext/allowPrivilegeEscalation",
        "value must be false",
    ),
    ("securityContext.privileged=true", "/securityContext/privileged", "value must be false"),
    (
        "podSecurityContext.runAsNonRoot=false",
        "/podSecurityContext/runAsNonRoot",
        "value must be true",
    ),
    ("image.digest=latest", "/image/digest", "does not match pattern"),
    ("image.pullPolicy=Sometimes", "/image/pullPolicy", "value must be one of"),
    ("model.hfToken.value=hf_x", "/model/hfToken", "additional properties 'value' not allowed"),
    ("servre.port=1", "", "additional properties 'servre' not allowed"),
    ("resources.limits.memory=lots", "/resources/limits/memory", "does not match pattern"),
    (
        "metrics.serviceMonitor.interval=15sec",
        "/metrics/serviceMonitor/interval",
        "does not match pattern",
    ),
    ("autoscaling.minReplicas=0", "/autoscaling/minReplicas", "minimum"),
    (
        "metrics.prometheusRule.runbookUrl=wiki/page#x",
        "/metrics/prometheusRule/runbookUrl",
        "does not match pattern",
    ),
    ("loadtest.job.activeDeadlineSeconds=5", "/loadtest/job/activeDeadlineSeconds", "minimum"),
    ("loadtest.extraBody=5", "/loadtest/extraBody", "got number, want object"),
    ("loadtest.healthWaitSeconds=0", "/loadtest/healthWaitSeconds", "minimum"),
    ("loadtest.job.runId=Run_1", "/loadtest/job/runId", "does not match pattern"),
    ("loadtest.job.runId=" + "a" * 21, "/loadtest/job/runId", "maxLength"),
    ("loadtest.job.runId=-1", "/loadtest/job/runId", "minimum"),
    ("loadtest.job.ttlSecondsAfterFinished=-1", "/loadtest/job/ttlSecondsAfterFinished", "minimum"),
    ("loadtest.healthWaitSeconds=soon", "/loadtest/healthWaitSeconds", "got string, want integer"),
    ("server.pluginEnv.GEMMA4_X={a}", "/server/pluginEnv/GEMMA4_X", "got array"),
    ("ingress.hosts[0].paths[0].path=v1", "/ingress/hosts/0/paths/0/path", "does not match"),
    ("ingress.tls[0].hosts[0]=a", "/ingress/tls/0", "missing property 'secretName'"),
    (
        "modelCache.accessModes={ReadWriteSometimes}",
        "/modelCache/accessModes/0",
        "value must be one of",
    ),
    # --set turns true into a YAML boolean the API server would reject only at install time
    ("tolerations[0].value=true", "/tolerations/0/value", "got boolean, want string"),
    (
        "loadtest.tolerations[0].effect=NoSchedul",
        "/loadtest/tolerations/0/effect",
        "must be one of",
    ),
    ("tolerations[0].operater=Exists", "/tolerations/0", "additional properties 'operater'"),
]


def test_toleration_value_as_string_is_accepted():
    """The schema's way out for true/false values (its error message names --set-string)."""
    out = helm(
        "template",
        RELEASE,
        str(CHART),
        "--set-string",
        "tolerations[0].value=true",
        "--set",
        "tolerations[0].key=dedicated",
        "--set",
        "tolerations[0].operator=Equal",
    ).stdout
    assert 'value: "true"' in out or "value: 'true'" in out, out


@pytest.mark.parametrize(("setting", "path", "message"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_bad_values_rejected_with_readable_error(setting, path, message):
    proc = helm("template", RELEASE, str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0, f"{setting} was accepted"
    err = proc.stderr
    assert "values don't meet the specifications of the schema" in err
    assert f"at '{path}'" in err and message in err, err


def test_plugin_env_takes_only_the_plugins_variables():
    """server.pluginEnv is for GEMMA4_* switches; anything else belongs in server.extraEnv."""
    proc = helm(
        "template", RELEASE, str(CHART), "--set", "server.pluginEnv.HF_TOKEN=x", check=False
    )
    assert proc.returncode != 0, "a non-plugin variable was accepted"
    assert "'HF_TOKEN' does not match pattern '^GEMMA4_[A-Z0-9_]+$'" in proc.stderr, proc.stderr


CROSS_FIELD = [
    (
        (
            "autoscaling.enabled=true",
            "autoscaling.keda.serverAddress=http://p:9090",
            "autoscaling.minReplicas=5",
            "autoscaling.maxReplicas=2",
        ),
        "autoscaling.minReplicas (5) must be <= autoscaling.maxReplicas (2)",
    ),
    (
        ("podDisruptionBudget.maxUnavailable=null",),
        "podDisruptionBudget: set maxUnavailable or minAvailable",
    ),
    (("modelCache.enabled=false", "modelCache.existingClaim=w"), "modelCache.existingClaim is set"),
    (
        ("extraVolumes[0].name=tmp", "extraVolumes[0].emptyDir.medium=Memory"),
        'extraVolumes: "tmp" is the chart\'s own volume name',
    ),
    (
        ("server.extraVolumeMounts[0].name=ca", "server.extraVolumeMounts[0].mountPath=/ca"),
        'server.extraVolumeMounts: no volume named "ca"',
    ),
    (
        ("ingress.enabled=true", "networkPolicy.enabled=true"),
        "add the ingress controller's namespace to networkPolicy.ingressFrom",
    ),
    (
        ("progressDeadlineSeconds=600",),
        "progressDeadlineSeconds (600) is shorter than the startup probe's budget (1830 s",
    ),
    (
        ("loadtest.extraEnv[0].name=HEALTH_WAIT_SECONDS", "loadtest.extraEnv[0].value=5"),
        "loadtest.extraEnv: HEALTH_WAIT_SECONDS is set by the chart; "
        "use loadtest.healthWaitSeconds",
    ),
    # the /health wait must end before the deadline kills the pod (of each enabled Job)
    (
        ("loadtest.healthWaitSeconds=900",),
        "loadtest.healthWaitSeconds (900) must be below loadtest.helmTest.activeDeadlineSeconds "
        "(900): the deadline would kill the pod",
    ),
    (
        ("loadtest.helmTest.activeDeadlineSeconds=300",),
        "loadtest.healthWaitSeconds (600) must be below loadtest.helmTest.activeDeadlineSeconds "
        "(300)",
    ),
    (
        (
            "loadtest.helmTest.enabled=false",
            "loadtest.job.enabled=true",
            "loadtest.healthWaitSeconds=3600",
        ),
        "loadtest.healthWaitSeconds (3600) must be below loadtest.job.activeDeadlineSeconds (3600)",
    ),
]


@pytest.mark.parametrize(
    ("sets", "message"),
    CROSS_FIELD,
    ids=[
        "replicas",
        "pdb",
        "claim",
        "volume-name",
        "mount-volume",
        "ingress-netpol",
        "progress-deadline",
        "health-wait-env",
        "health-wait-default-deadline",
        "health-wait-short-deadline",
        "health-wait-standalone",
    ],
)
def test_cross_field_checks(sets, message):
    args = [a for s in sets for a in ("--set", s)]
    proc = helm("template", RELEASE, str(CHART), *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "sets",
    [
        (),  # the defaults: 600 s wait, 900 s hook deadline
        ("loadtest.job.enabled=true",),
        # a disabled Job's deadline does not matter
        ("loadtest.helmTest.enabled=false", "loadtest.job.enabled=true",
         "loadtest.healthWaitSeconds=1800"),
        ("loadtest.helmTest.activeDeadlineSeconds=1200", "loadtest.healthWaitSeconds=1199"),
    ],
)  # fmt: skip
def test_health_wait_below_the_deadlines_renders(sets):
    args = [a for s in sets for a in ("--set", s)]
    helm("template", RELEASE, str(CHART), *args)


def test_values_schema_is_generated_and_current():
    gen = CHART.parent / "gen_values_schema.py"
    proc = subprocess.run([sys.executable, str(gen), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_value_is_documented_in_the_schema():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(v, s, path):
        if "$ref" in s:
            s = schema["definitions"][s["$ref"].split("/")[-1]]
        if isinstance(v, dict) and "properties" in s and s.get("additionalProperties") is False:
            for key, sub in v.items():
                assert key in s["properties"], f"{path}.{key} missing from values.schema.json"
                walk(sub, s["properties"][key], f"{path}.{key}")

    walk(values, schema, "")


# ---- NOTES.txt ---------------------------------------------------------------------------


def label_selectors(text: str) -> list[dict[str, str]]:
    out = []
    for sel in re.findall(r"-l (\S+)", text):
        out.append(dict(kv.split("=", 1) for kv in sel.split(",")))
    return out


@pytest.mark.parametrize("profile", ["default", "autoscaling-multi-replica"])
def test_notes_commands_match_rendered_objects(profile):
    release = install_dry_run(profile=profile)
    notes = release["info"]["notes"]
    docs = [d for d in yaml.safe_load_all(release["manifest"]) if d]
    docs += [d for h in release.get("hooks", []) for d in yaml.safe_load_all(h["manifest"]) if d]
    selectors = label_selectors(notes)
    assert selectors
    pod_labels = [
        d["spec"]["template"]["metadata"]["labels"]
        for d in docs
        if d["kind"] in ("Deployment", "Job")
    ]
    cm_labels = [d["metadata"]["labels"] for d in docs if d["kind"] == "ConfigMap"]
    for sel in selectors:
        targets = cm_labels if "grafana_dashboard" in sel else pod_labels
        assert any(sel.items() <= labels.items() for labels in targets), f"-l {sel} matches nothing"
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for svc in re.findall(r"svc/(\S+)", notes):
        if not svc.startswith("<"):
            assert ("Service", svc) in names
    for dep in re.findall(r"deploy/(\S+)", notes):
        assert ("Deployment", dep) in names
    for ns in re.findall(r"-n (\S+)", notes):
        assert ns in (NAMESPACE, "monitoring")
    for uid in re.findall(r"/d/(\S+)", notes):
        assert any(
            f'"uid": "{uid}"' in c["data"][k] for c in by_kind(docs, "ConfigMap") for k in c["data"]
        )
    assert f"helm test {RELEASE} -n {NAMESPACE}" in notes
    assert f"slo-loadtest k8s fetch -n {NAMESPACE} --release {RELEASE}" in notes
    assert "/results" in notes and 'le="0.3"' in notes
    ingress = by_kind(docs, "Ingress")
    for rule in ingress[0]["spec"]["rules"] if ingress else []:
        for path in rule["http"]["paths"]:
            assert f"Ingress: https://{rule['host']}{path['path']}" in notes
    assert bool(ingress) == ("Ingress:" in notes)


def test_notes_warn_without_token_and_follow_metrics_mode():
    notes = install_dry_run(profile="minimal")["info"]["notes"]
    assert "WARNING: model.hfToken.existingSecret is empty" in notes
    assert "metrics.mode=none" in notes
    notes = install_dry_run("metrics.mode=serviceMonitor", profile="default")["info"]["notes"]
    assert f"ServiceMonitor {NAMESPACE}/{FULLNAME}" in notes
    assert "WARNING: model.hfToken" not in notes


def test_notes_warn_that_full_graphs_narrow_on_the_images_vllm():
    """vLLM 0.33+ on Hopper narrows FULL to FULL_AND_PIECEWISE for Gemma 4 (TRITON_FLASH_ATTN;
    twenty-seventh sitting) unless an attention backend is chosen: the chart's default chooses
    TRITON_ATTN (twenty-eighth), and the notes warn when a user's values drop it."""
    warning = "narrows FULL to FULL_AND_PIECEWISE"
    assert warning not in install_dry_run(profile="default")["info"]["notes"]
    assert warning not in install_dry_run(profile="vllm-default-graphs")["info"]["notes"]
    # extraArgs no longer replace the backend: it has its own value
    own = install_dry_run("server.extraArgs={--max-num-seqs,64}", profile="default")
    assert warning not in own["info"]["notes"]
    dropped = install_dry_run("server.attentionBackend=null", profile="default")
    assert warning in dropped["info"]["notes"]
    assert "server.attentionBackend=TRITON_ATTN" in dropped["info"]["notes"]
    lower = install_dry_run(
        "server.compilationConfig.cudagraph_mode=full", profile="vllm-default-graphs"
    )
    assert warning in lower["info"]["notes"]  # vLLM takes the lower-case spelling too
    chosen = install_dry_run(
        "server.attentionBackend=null",
        "server.extraArgs={--attention-backend=FLASHINFER}",
        profile="default",
    )
    assert warning not in chosen["info"]["notes"]  # the user's own choice in extraArgs
