"""The standalone load-test Job is one-shot: it is named after loadtest.job.runId and its
manifest never depends on the release revision, so `helm upgrade` (a new revision) with the same
runId renders the very same Job (Helm patches nothing, the finished Job is not run again) and a
new runId renders a new Job. Checked with real `helm install` / `helm upgrade` renders: Helm's
memory storage driver holds the previous revision (HELM_MEMORY_DRIVER_DATA) and a stand-in API
server answers the discovery calls `helm upgrade --dry-run=client` makes (nothing else)."""

from __future__ import annotations

import copy
import json
import os
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


def test_same_run_id_is_the_same_job_across_upgrades(kubeconfig, tmp_path):
    releases = Releases(kubeconfig, tmp_path)
    (first,) = releases.jobs(releases.deploy(*JOB, "loadtest.job.runId=sweep-a"))
    assert first["metadata"]["name"] == f"{FULLNAME}-loadtest-sweep-a"
    # revisions 2 and 3, the runId kept (one upgrade changes an unrelated value)
    (second,) = releases.jobs(releases.deploy(*JOB, "loadtest.job.runId=sweep-a"))
    (third,) = releases.jobs(
        releases.deploy(*JOB, "loadtest.job.runId=sweep-a", "server.apiServerCount=4")
    )
    assert [r["version"] for r in releases.history] == [1, 2, 3]
    assert second == first and third == first  # name, labels and (immutable) spec: no new run
    # a new runId: a new Job, the previous one leaves the manifest (Helm deletes it)
    rel = releases.deploy(*JOB, "loadtest.job.runId=sweep-b")
    (fourth,) = releases.jobs(rel)
    assert fourth["metadata"]["name"] == f"{FULLNAME}-loadtest-sweep-b"
    assert fourth["metadata"]["labels"]["gemma4-serving/loadtest-run"] == "sweep-b"
    assert fourth["spec"]["template"]["metadata"]["labels"]["gemma4-serving/loadtest-run"] == (
        "sweep-b"
    )
    assert "sweep-a" not in rel["manifest"]
    # a numeric runId from --set (e.g. $(date +%Y%m%d%H%M)) arrives as a number: same name
    (fifth,) = releases.jobs(releases.deploy(*JOB, "loadtest.job.runId=202601051230"))
    assert fifth["metadata"]["name"] == f"{FULLNAME}-loadtest-202601051230"
    for rel in releases.history:  # no revision anywhere in the Job
        for job in releases.jobs(rel):
            assert f"-r{rel['version']}" not in job["metadata"]["name"]


def test_chart_upgrade_keeps_the_job_spec(kubeconfig, tmp_path):
    """A new chart version (and new commonLabels) with the same runId and a pinned load-test
    image: the Job's spec is unchanged, only its own (mutable) labels move, so the upgrade
    neither fails on the immutable pod template nor runs the sweep again."""
    chart = tmp_path / "gemma4-serving"
    shutil.copytree(CHART, chart)  # files/dashboards copied, not linked
    meta = (chart / "Chart.yaml").read_text()
    (chart / "Chart.yaml").write_text(meta.replace("version: 0.1.0", "version: 9.9.9"))
    sets = (*JOB, "loadtest.job.runId=r1", "loadtest.image.tag=0.1.0")
    releases = Releases(kubeconfig, tmp_path)
    (before,) = releases.jobs(releases.deploy(*sets))
    (after,) = releases.jobs(releases.deploy(*sets, "commonLabels.team=vision", chart=chart))
    assert after["metadata"]["labels"]["helm.sh/chart"] == "gemma4-serving-9.9.9"
    assert after["metadata"]["labels"]["team"] == "vision"
    assert after["metadata"]["name"] == before["metadata"]["name"]
    assert after["spec"] == before["spec"]


def test_job_defaults_and_schema():
    """Enabling the Job alone runs runId "1"; a finished Job is kept (no TTL: with one, Helm
    would recreate the deleted Job on the next upgrade and run the same runId again)."""
    (job,) = [
        j for j in by_kind(render("default", sets=JOB), "Job") if "annotations" not in j["metadata"]
    ]
    assert job["metadata"]["name"] == f"{FULLNAME}-loadtest-1"
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
    assert len(name) <= 63 and name.endswith("-loadtest-" + "x" * 20), name


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
             f"Job {FULLNAME}-loadtest-1 (loadtest.job.runId=1) runs once",
             f"kubectl -n {NAMESPACE} logs -f job/{FULLNAME}-loadtest-1",
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
    # the seconds quoted are the ones the rendered pods get
    docs = [d for d in yaml.safe_load_all(release["manifest"]) if d]
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
