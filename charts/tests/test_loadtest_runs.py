"""The standalone load-test Job is one-shot: it is named after loadtest.job.runId and a hash of
its pod template, and its manifest never depends on the release revision, so `helm upgrade` (a
new revision) with the same runId and values renders the very same Job (Helm patches nothing, the
finished Job is not run again), while a new runId or a changed pod template (a Job's is
immutable) renders a new Job instead of an upgrade Kubernetes would refuse. Checked with real
`helm install` / `helm upgrade` renders: Helm's
memory storage driver holds the previous revision (HELM_MEMORY_DRIVER_DATA) and a stand-in API
server answers the discovery calls `helm upgrade --dry-run=client` makes (nothing else)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from chartlib import (
    CHART,
    FULLNAME,
    HELM,
    NAMESPACE,
    RELEASE,
    TOOLS,
    by_kind,
    install_dry_run,
    render,
    require_tool,
)

DISCOVERY = {
    "/version": {"major": "1", "minor": "37", "gitVersion": "v1.37.0", "platform": "linux/amd64"},
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": []},
}


class _Discovery(BaseHTTPRequestHandler):
    def do_GET(self):
        body = DISCOVERY.get(self.path.split("?")[0])
        self.send_response(200 if body else 404)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body or {}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discovery)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    path = tmp_path_factory.mktemp("kube") / "config"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                ],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {}}],
                "current-context": "c",
            }
        )
    )
    yield path
    server.shutdown()


class Releases:
    """A release's history in Helm's memory driver: install, then upgrades, each rendered by
    the real helm binary as that revision."""

    def __init__(self, kubeconfig: Path, workdir: Path, chart: Path = CHART):
        self.kubeconfig, self.workdir, self.chart = kubeconfig, workdir, chart
        self.history: list[dict] = []

    def _helm(self, verb: str, sets: tuple[str, ...], chart: Path) -> dict:
        require_tool(HELM, "helm 4")
        args = [str(HELM), verb, RELEASE, str(chart), "-n", NAMESPACE, "--dry-run=client"]
        args += ["-o", "json", *(a for s in sets for a in ("--set", s))]
        env = {**os.environ, "HELM_CACHE_HOME": str(TOOLS / "helm-cache")}
        if self.history:
            data = self.workdir / f"history-{len(self.history)}.yaml"
            data.write_text(yaml.safe_dump(self.history))
            env |= {
                "HELM_DRIVER": "memory",
                "HELM_MEMORY_DRIVER_DATA": str(data),
                "KUBECONFIG": str(self.kubeconfig),
            }
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    def deploy(self, *sets: str, chart: Path | None = None) -> dict:
        """Install (first call) or upgrade; returns the standalone Job of that revision."""
        rel = self._helm("upgrade" if self.history else "install", sets, chart or self.chart)
        assert rel["version"] == len(self.history) + 1
        for old in self.history:
            old["info"]["status"] = "superseded"
        rel["info"]["status"] = "deployed"
        self.history.append(rel)
        return rel

    @staticmethod
    def jobs(rel: dict) -> list[dict]:
        docs = [d for d in yaml.safe_load_all(rel["manifest"]) if d]
        return by_kind(docs, "Job")  # the helm test hook is in rel["hooks"], not the manifest


JOB = ("loadtest.job.enabled=true",)
HASH = "[0-9a-f]{8}"


def job_name(run_id: str) -> re.Pattern:
    return re.compile(rf"{FULLNAME}-loadtest-{run_id}-({HASH})")


def same_name_same_spec(history: list[dict]) -> None:
    """Across all revisions: a Job name stands for one spec (what Kubernetes requires of an
    object Helm would patch: its pod template is immutable)."""
    seen: dict[str, dict] = {}
    for rel in history:
        for job in Releases.jobs(rel):
            spec = seen.setdefault(job["metadata"]["name"], job["spec"])
            assert job["spec"] == spec, job["metadata"]["name"]


def test_same_run_id_is_the_same_job_across_upgrades(kubeconfig, tmp_path):
    releases = Releases(kubeconfig, tmp_path)
    (first,) = releases.jobs(releases.deploy(*JOB, "loadtest.job.runId=sweep-a"))
    assert job_name("sweep-a").fullmatch(first["metadata"]["name"])
    # revisions 2 and 3, the runId kept (one upgrade changes a value the Job does not use)
    (second,) = releases.jobs(releases.deploy(*JOB, "loadtest.job.runId=sweep-a"))
    (third,) = releases.jobs(
        releases.deploy(*JOB, "loadtest.job.runId=sweep-a", "server.apiServerCount=4")
    )
    assert [r["version"] for r in releases.history] == [1, 2, 3]
    assert second == first and third == first  # name, labels and (immutable) spec: no new run
    # a new runId: a new Job, the previous one leaves the manifest (Helm deletes it)
    rel = releases.deploy(*JOB, "loadtest.job.runId=sweep-b")
    (fourth,) = releases.jobs(rel)
    assert job_name("sweep-b").fullmatch(fourth["metadata"]["name"])
    assert fourth["metadata"]["labels"]["gemma4-serving/loadtest-run"] == "sweep-b"
    assert fourth["spec"]["template"]["metadata"]["labels"]["gemma4-serving/loadtest-run"] == (
        "sweep-b"
    )
    assert "sweep-a" not in rel["manifest"]
    # a numeric runId from --set (e.g. $(date +%Y%m%d%H%M)) arrives as a number: same name
    (fifth,) = releases.jobs(releases.deploy(*JOB, "loadtest.job.runId=202601051230"))
    assert job_name("202601051230").fullmatch(fifth["metadata"]["name"])
    for rel in releases.history:  # no revision anywhere in the Job
        for job in releases.jobs(rel):
            assert f"-r{rel['version']}" not in job["metadata"]["name"]
    same_name_same_spec(releases.history)


def test_changed_pod_template_is_a_new_job_not_an_immutable_patch(kubeconfig, tmp_path):
    """With the same runId, every change to what the Job runs with (its pod template: settings,
    the API key Secret, the ServiceAccount, pull secrets, the Service port, the health wait,
    commonLabels) gives a new Job name, so `helm upgrade` creates a new Job (a new run) instead of
    patching the immutable pod template ("field is immutable"); going back to earlier values
    renders the earlier name and spec again."""
    releases = Releases(kubeconfig, tmp_path)
    run = (*JOB, "loadtest.job.runId=r1")
    changes = [
        (),
        ("loadtest.job.settings.rates=1..5",),
        ("server.apiKey.existingSecret=vllm-key",),
        ("serviceAccount.name=runner",),
        ("imagePullSecrets[0]=regcred",),
        ("service.port=8080",),
        ("loadtest.healthWaitSeconds=300",),
        ("commonLabels.team=vision",),
        (),  # back to the first values
    ]
    names = []
    for change in changes:
        (job,) = releases.jobs(releases.deploy(*run, *change))
        assert job_name("r1").fullmatch(job["metadata"]["name"]), job["metadata"]["name"]
        names.append(job["metadata"]["name"])
    assert len(set(names[:-1])) == len(changes) - 1, names
    assert names[-1] == names[0]
    same_name_same_spec(releases.history)
    (labelled,) = releases.jobs(releases.history[7])
    assert labelled["spec"]["template"]["metadata"]["labels"]["team"] == "vision"


def _bumped_chart(tmp_path: Path, version: str, app_version: str | None = None) -> Path:
    chart = tmp_path / f"gemma4-serving-{version}"
    shutil.copytree(CHART, chart)  # files/dashboards copied, not linked
    meta = (chart / "Chart.yaml").read_text().replace("version: 0.1.0", f"version: {version}")
    if app_version:
        meta = meta.replace('appVersion: "0.1.0"', f'appVersion: "{app_version}"')
    (chart / "Chart.yaml").write_text(meta)
    return chart


def test_chart_upgrade_keeps_the_job_spec(kubeconfig, tmp_path):
    """A new chart version with the same runId and a pinned load-test image: the Job's name and
    spec are unchanged (its pod carries no chart version or appVersion label), only its own
    (mutable) labels move, so the upgrade neither fails on the immutable pod template nor runs
    the sweep again."""
    chart = _bumped_chart(tmp_path, "9.9.9", "0.2.0")
    sets = (*JOB, "loadtest.job.runId=r1", "loadtest.image.tag=0.1.0")
    releases = Releases(kubeconfig, tmp_path)
    (before,) = releases.jobs(releases.deploy(*sets))
    (after,) = releases.jobs(releases.deploy(*sets, chart=chart))
    assert after["metadata"]["labels"]["helm.sh/chart"] == "gemma4-serving-9.9.9"
    assert after["metadata"]["labels"]["app.kubernetes.io/version"] == "0.2.0"
    assert after["metadata"]["name"] == before["metadata"]["name"]
    assert after["spec"] == before["spec"]


def test_app_version_bump_with_the_default_image_is_a_new_job(kubeconfig, tmp_path):
    """The load-test image's default tag is the chart's appVersion: a chart upgrade that moves
    it, with the same values and runId, changes the pod template, so it renders a new Job (a new
    run, the old Job deleted by Helm) rather than patching the old one, which Kubernetes refuses
    (`field is immutable`); the release's history never has one name with two specs."""
    chart = _bumped_chart(tmp_path, "0.2.0", "0.2.0")
    sets = (*JOB, "loadtest.job.runId=r1")
    releases = Releases(kubeconfig, tmp_path)
    (before,) = releases.jobs(releases.deploy(*sets))
    rel = releases.deploy(*sets, chart=chart)
    (after,) = releases.jobs(rel)
    pods = [j["spec"]["template"]["spec"] for j in (before, after)]
    image = [c["image"] for pod in pods for c in pod["containers"]]
    assert image == ["gemma4-loadtest:0.1.0", "gemma4-loadtest:0.2.0"]
    assert job_name("r1").fullmatch(after["metadata"]["name"])
    assert after["metadata"]["name"] != before["metadata"]["name"]
    assert before["metadata"]["name"] not in rel["manifest"]
    # the same values and runId on the new chart once more: the same Job, no new run
    (again,) = releases.jobs(releases.deploy(*sets, chart=chart))
    assert again == after
    same_name_same_spec(releases.history)


def test_job_defaults_and_schema():
    """Enabling the Job alone runs runId "1"; a finished Job is kept (no TTL: with one, Helm
    would recreate the deleted Job on the next upgrade and run the same runId again)."""
    (job,) = [
        j for j in by_kind(render("default", sets=JOB), "Job") if "annotations" not in j["metadata"]
    ]
    assert job_name("1").fullmatch(job["metadata"]["name"])
    assert "ttlSecondsAfterFinished" not in job["spec"]
    ttl = by_kind(render("default", sets=(*JOB, "loadtest.job.ttlSecondsAfterFinished=60")), "Job")
    assert [j["spec"].get("ttlSecondsAfterFinished") for j in ttl] == [60, None]
    long_release = "r" * 53  # the full name is cut so that the Job name fits 63 characters
    run_id = "loadtest.job.runId=" + "x" * 20
    out = subprocess.run(
        [str(HELM), "template", long_release, str(CHART), "--set", JOB[0], "--set", run_id,
         "--show-only", "templates/loadtest-job.yaml"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "HELM_CACHE_HOME": str(TOOLS / "helm-cache")},
    ).stdout  # fmt: skip
    name = yaml.safe_load(out)["metadata"]["name"]
    assert len(name) <= 63 and re.fullmatch(rf"r+-loadtest-{'x' * 20}-{HASH}", name), name


def _section5(notes: str) -> str:
    return notes.split("5. Load test", 1)[1].split("WARNING", 1)[0]


@pytest.mark.parametrize(
    ("sets", "expect", "refuse"),
    [
        # helm test only (default): the hook pod keeps nothing
        (
            (),
            ["exits as soon as the sweep ends (loadtest.helmTest.keepResultsSeconds=0)",
             "--set loadtest.job.enabled=true --set loadtest.job.runId=<id>",
             f"slo-loadtest k8s fetch -n {NAMESPACE} --release {RELEASE} --wait 900"],
            ["keeps /results", "kubectl -n serve cp", "900 s"],
        ),
        # the standalone Job keeps its results 900 s; the hook still 0 s
        (
            JOB,
            ["exits as soon as the sweep ends (loadtest.helmTest.keepResultsSeconds=0)",
             "(loadtest.job.runId=1; the suffix hashes its pod template)",
             "keeps the runId and everything the Job runs with does not run it again",
             "is a new Job, a new run",
             f"kubectl -n {NAMESPACE} logs -f job/{FULLNAME}-loadtest-1-",
             "Its pod keeps /results for 900 s after the sweep (loadtest.job.keepResultsSeconds",
             "--reuse-values --set loadtest.job.runId=<new id>",
             "--wait 3600"],
            ["deleted", "--set loadtest.job.enabled=true"],
        ),
        # the hook told to keep its results
        (
            ("loadtest.helmTest.keepResultsSeconds=120",),
            ["keeps /results for 120 s after the sweep (loadtest.helmTest.keepResultsSeconds"],
            ["exits as soon as"],
        ),
        # results on a claim, a standalone Job that keeps nothing, a TTL
        (
            (*JOB, "loadtest.results.persistence.enabled=true", "loadtest.job.keepResultsSeconds=0",
             "loadtest.job.ttlSecondsAfterFinished=3600"),
            [f"the files stay on the claim {FULLNAME}-loadtest-results",
             "(loadtest.job.keepResultsSeconds=0); the files stay on the claim",
             "deleted 3600 s after it ends"],
            ["keeps /results", "kubectl -n serve cp"],
        ),
        # no load test at all: nothing to fetch
        (
            ("loadtest.helmTest.enabled=false",),
            ["--set loadtest.job.enabled=true --set loadtest.job.runId=<id>"],
            ["helm test", "slo-loadtest k8s fetch", "keeps /results"],
        ),
    ],
    ids=["helm-test", "standalone", "hook-keeps", "claim-ttl", "none"],
)  # fmt: skip
def test_notes_tell_how_long_each_path_keeps_results(sets, expect, refuse):
    """NOTES state each Job's own keepResultsSeconds (the hook's default is 0 s: the pod exits
    at once, so the report is read from the pod log, never copied out of a 900 s window)."""
    release = install_dry_run(*sets)
    text = _section5(release["info"]["notes"])
    flat = " ".join(text.split())
    for want in expect:
        assert " ".join(want.split()) in flat, (want, text)
    for bad in refuse:
        assert bad not in text, (bad, text)
    # the Job named is the one rendered; the seconds quoted are the ones the rendered pods get
    docs = [d for d in yaml.safe_load_all(release["manifest"]) if d]
    for job in by_kind(docs, "Job"):
        assert f"Job {job['metadata']['name']} " in text
        assert f"logs -f job/{job['metadata']['name']}\n" in text
    docs += [d for h in release.get("hooks", []) for d in yaml.safe_load_all(h["manifest"]) if d]
    for job in by_kind(docs, "Job"):
        env = {
            e["name"]: e.get("value")
            for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
        }
        keep = env["KEEP_RESULTS_SECONDS"]
        if keep == "0":
            assert "keepResultsSeconds=0" in text
        else:
            assert f"keeps /results for {keep} s" in text


def test_helm_test_hook_unchanged_by_run_id():
    """The hook Job (helm test) keeps its fixed name; runId belongs to the standalone Job."""
    hooks = [
        j
        for j in by_kind(render("default", sets=(*JOB, "loadtest.job.runId=x")), "Job")
        if "annotations" in j["metadata"]
    ]
    (hook,) = hooks
    assert hook["metadata"]["name"] == f"{FULLNAME}-loadtest-test"
    assert "gemma4-serving/loadtest-run" not in hook["spec"]["template"]["metadata"]["labels"]
    assert copy.deepcopy(hook)["spec"]["backoffLimit"] == 0


def test_load_test_pod_labels():
    """The helm test hook's pod (a new Job on every `helm test`, no immutable spec to keep)
    carries all the chart's labels, commonLabels included. The standalone Job's pod carries the
    fixed labels and commonLabels (a change is a new pod-template hash, a new Job) but no chart
    version or appVersion label, so a chart bump with a pinned image is not a new run."""
    docs = render("default", sets=(*JOB, "commonLabels.team=vision", "commonLabels.cost=ml"))
    jobs = {"hook" if "annotations" in j["metadata"] else "job": j for j in by_kind(docs, "Job")}
    fixed = {
        "app.kubernetes.io/name": "gemma4-serving",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "loadtest",
        "app.kubernetes.io/part-of": "gemma4-serving",
        "app.kubernetes.io/managed-by": "Helm",
        "team": "vision",
        "cost": "ml",
    }
    hook = jobs["hook"]["spec"]["template"]["metadata"]["labels"]
    assert hook == {**fixed, "helm.sh/chart": "gemma4-serving-0.1.0",
                    "app.kubernetes.io/version": "0.1.0"}  # fmt: skip
    assert hook == {**jobs["hook"]["metadata"]["labels"]}
    job = jobs["job"]["spec"]["template"]["metadata"]["labels"]
    assert job == {**fixed, "gemma4-serving/loadtest-run": "1"}
