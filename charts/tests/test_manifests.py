"""Assertions on the rendered manifests: serve command, GPU, probes, Secrets, labels/selectors,
security, monitoring, autoscaling and the load-test Jobs."""

from __future__ import annotations

import re

import pytest
import yaml
from chartlib import (
    API_VARIANTS,
    CHART,
    FULLNAME,
    GRAPH_PROFILE,
    NAMESPACE,
    PROFILES,
    RELEASE,
    by_kind,
    deployment_container,
    helm,
    one,
    profile_file,
    render,
    render_text,
    values_file,
)

import stack

SELECTOR = {
    "app.kubernetes.io/name": "gemma4-serving",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/component": "server",
}
SECRET_VALUE = "hf_THIS_MUST_NEVER_APPEAR"


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def pod_spec(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]


@pytest.mark.parametrize("profile", PROFILES)
def test_gpu_requested_and_scheduling(profile):
    docs = render(profile)
    container = deployment_container(docs)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    spec = pod_spec(one(docs, "Deployment"))
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]


def test_scheduling_values_pass_through():
    spec = pod_spec(one(render("autoscaling-multi-replica"), "Deployment"))
    assert spec["runtimeClassName"] == "nvidia"
    assert "podAntiAffinity" in spec["affinity"]
    (tsc,) = spec["topologySpreadConstraints"]
    assert tsc["labelSelector"] == {"matchLabels": SELECTOR}  # filled in from the fixed labels


def test_serve_command_env_and_default_args():
    container = deployment_container(render("default"))
    assert container["command"] == ["/usr/local/bin/gemma4-entrypoint"]
    # the blog flags come from images/entrypoint.sh; the chart adds the API servers and its
    # CUDA graph profile
    assert container["args"] == ["--api-server-count", "8", *GRAPH_PROFILE]
    assert int(container["resources"]["requests"]["cpu"]) >= 8 + 4
    env = env_of(container)
    assert env["MODEL"]["value"] == "google/gemma-4-E4B-it"
    assert env["PORT"]["value"] == "8000"
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_plugin_env_defaults_override_and_removal():
    """server.pluginEnv: the measured switches by default, a --set overrides one (numbers become
    strings), null drops one; extraEnv comes after them."""
    env = env_of(deployment_container(render("default")))
    plugin = {
        k: v["value"]
        for k, v in env.items()
        if k.startswith("GEMMA4_") and not k.startswith("GEMMA4_WARMUP")  # server.warmup's
    }
    assert plugin == {
        "GEMMA4_ENGINE_GPU_BATCHING": "1",
        "GEMMA4_MEDIA_UINT8": "on",
        "GEMMA4_MEDIA_FRAME_THREADS": "2",
    }
    assert plugin == stack.chart_plugin_env()  # what `make demo` serves with
    container = deployment_container(
        render(
            "default",
            sets=(
                "server.pluginEnv.GEMMA4_MEDIA_FRAME_THREADS=4",
                "server.pluginEnv.GEMMA4_MEDIA_UINT8=null",
                "server.extraEnv[0].name=EXTRA",
                "server.extraEnv[0].value=x",
            ),
        )
    )
    names = [e["name"] for e in container["env"]]
    env = env_of(container)
    assert env["GEMMA4_MEDIA_FRAME_THREADS"]["value"] == "4"
    assert "GEMMA4_MEDIA_UINT8" not in env
    assert names.index("EXTRA") > names.index("GEMMA4_MEDIA_FRAME_THREADS")


def test_extra_args_and_api_server_count():
    container = deployment_container(render("autoscaling-multi-replica"))
    assert container["args"] == [
        *("--api-server-count", "2"),
        *GRAPH_PROFILE,
        *("--served-model-name", "google/gemma-4-E4B-it", "--max-num-seqs", "64"),
    ]
    one = deployment_container(render("vllm-default-graphs", sets=("server.apiServerCount=null",)))
    assert "args" not in one  # null everywhere: vLLM's own defaults, no flags


def test_graph_profile_renders_before_extra_args():
    """The chart's default is the FULL graph profile (thirty-third sitting: the ceiling where the
    engine thread binds); its flags come before extraArgs, so a user's flag still wins."""
    container = deployment_container(
        render("default", sets=("server.extraArgs={--max-num-seqs,64}",))
    )
    assert container["args"] == [
        *("--api-server-count", "8"),
        *GRAPH_PROFILE,
        *("--max-num-seqs", "64"),  # last: a user's flag still wins
    ]
    # FULL graphs keep the image ranges through the plugin's auto default: nothing to set
    assert "GEMMA4_ENGINE_GRAPH_RANGES" not in env_of(container)
    # a user's extraArgs no longer carry the backend away (it has its own value)
    assert container["args"].count("--attention-backend") == 1


def test_vllm_default_graphs_profile_drops_every_graph_flag():
    """The profile resets the three keys with null (an empty map would merge with the chart's)."""
    args = deployment_container(render("vllm-default-graphs"))["args"]
    assert args == ["--api-server-count", "8"]
    # the same by --set, which users reach for first
    reset = deployment_container(
        render(
            "default",
            sets=(
                "server.compilationConfig=null",
                "server.attentionBackend=null",
                "server.maxNumBatchedTokens=null",
            ),
        )
    )["args"]
    assert reset == ["--api-server-count", "8"]
    # {} is merged, not a reset: the chart's FULL keys stay
    merged = deployment_container(render("default", values="server:\n  compilationConfig: {}\n"))
    assert '{"cudagraph_mode":"FULL","max_cudagraph_capture_size":2560}' in merged["args"]


def test_attention_backend_is_validated():
    proc = helm(
        "template", "x", str(CHART), "--set", "server.attentionBackend=triton attn", check=False
    )
    assert proc.returncode != 0 and "attentionBackend" in proc.stderr


@pytest.mark.parametrize(("value", "mode"), [("0", "FULL"), ("off", "FULL"), ("false", "full")])
def test_full_graphs_without_the_range_buffer_are_refused(value, mode):
    profile = profile_file("default")
    proc = helm(  # (not render(): it would raise before stderr is read)
        "template",
        "x",
        str(profile.parents[1]),
        "-f",
        str(profile),
        "--set",
        f"server.pluginEnv.GEMMA4_ENGINE_GRAPH_RANGES={value}",
        "--set",
        f"server.compilationConfig.cudagraph_mode={mode}",  # vLLM also takes "full"
        check=False,
    )
    assert proc.returncode != 0
    assert "drop Gemma 4's image ranges" in proc.stderr
    # an explicit width is the user's choice, and the plugin keeps the ranges with it
    env = env_of(
        deployment_container(
            render("default", sets=("server.pluginEnv.GEMMA4_ENGINE_GRAPH_RANGES=8",))
        )
    )
    assert env["GEMMA4_ENGINE_GRAPH_RANGES"]["value"] == "8"


def test_full_graphs_leave_the_model_runner_to_vllm():
    """The plugin's graph-safe image ranges hook both of vLLM's model runners (V2: the image's
    0.33.0 default; checked bit for bit against eager on a GPU with 0.26.0), so the chart sets
    no runner; a user's own VLLM_USE_V2_MODEL_RUNNER passes through once."""
    assert "VLLM_USE_V2_MODEL_RUNNER" not in env_of(deployment_container(render("default")))
    own = 'server:\n  extraEnv:\n    - {name: VLLM_USE_V2_MODEL_RUNNER, value: "0"}\n'
    env = deployment_container(render("default", values=own))["env"]
    assert [e for e in env if e["name"] == "VLLM_USE_V2_MODEL_RUNNER"] == [
        {"name": "VLLM_USE_V2_MODEL_RUNNER", "value": "0"}
    ]


def test_flag_override_is_appended_verbatim():
    values = (
        "server:\n  extraArgs: [--limit-mm-per-prompt, '{\"image\": 4}', --enable-prefix-caching]\n"
    )
    container = deployment_container(render(values=values))
    assert container["args"] == [
        *("--api-server-count", "8"),
        *GRAPH_PROFILE,
        *("--limit-mm-per-prompt", '{"image": 4}', "--enable-prefix-caching"),
    ]


def test_probes():
    container = deployment_container(render("default"))
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/health", "port": "http"}
    startup = container["startupProbe"]
    # weights download + load + compile warm-up + media warm-up: at least 20 minutes
    budget = startup["initialDelaySeconds"] + startup["periodSeconds"] * startup["failureThreshold"]
    assert budget >= 1200
    assert container["livenessProbe"]["failureThreshold"] >= 3


def test_progress_deadline_covers_the_startup_budget():
    """Kubernetes' default progressDeadlineSeconds (600 s) would mark a normal first start (up to
    the startup probe's budget) as ProgressDeadlineExceeded; the chart derives it instead."""
    for sets in ((), ("probes.startup.failureThreshold=360",)):
        dep = one(render("default", sets=sets), "Deployment")
        startup = deployment_container([dep])["startupProbe"]
        budget = (
            startup["initialDelaySeconds"] + startup["periodSeconds"] * startup["failureThreshold"]
        )
        assert dep["spec"]["progressDeadlineSeconds"] == budget + 600
    dep = one(render("default", sets=("progressDeadlineSeconds=7200",)), "Deployment")
    assert dep["spec"]["progressDeadlineSeconds"] == 7200


def test_notes_and_readme_state_the_real_startup_budget_and_warmup():
    from chartlib import install_dry_run

    notes = install_dry_run()["info"]["notes"]
    assert "up to\n   1830 s before the startup probe gives up" in notes  # 30 + 10 x 180
    notes = install_dry_run("probes.startup.initialDelaySeconds=60")["info"]["notes"]
    assert "1860 s before the startup probe gives up" in notes
    args = env_of(deployment_container(render("default")))["GEMMA4_WARMUP_ARGS"]["value"].split()
    videos = args[args.index("--bursts") + 1].split(",")
    images = args[args.index("--image-bursts") + 1].split(",")
    readme = " ".join((CHART / "README.md").read_text().split())
    assert f"{', '.join(videos[:-1])} and {videos[-1]} videos at once" in readme
    assert f"{', '.join(images[:-1])} and {images[-1]} images at once" in readme


def test_warmup_gates_startup_and_can_be_turned_off():
    """server.warmup: the entrypoint's warm-up env, and the startup probe waits for its done
    file on the /tmp emptyDir; off, the startup probe is /health and nothing is set."""
    container = deployment_container(render("default"))
    env = env_of(container)
    assert env["GEMMA4_WARMUP"]["value"] == "1"
    assert env["GEMMA4_WARMUP_ARGS"]["value"] == (
        "--bursts 1,2,4,8,16 --image-bursts 2,16 --video-frames 6"
    )
    done = env["GEMMA4_WARMUP_DONE_FILE"]["value"]
    assert container["startupProbe"]["exec"] == {"command": ["test", "-f", done]}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert done.startswith("/tmp/") and "/tmp" in mounts  # writable under readOnlyRootFilesystem

    off = deployment_container(render("default", sets=("server.warmup.enabled=false",)))
    assert off["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert not any(e["name"].startswith("GEMMA4_WARMUP") for e in off["env"])


def test_volumes_shm_metrics_and_cache():
    docs = render("default")
    container = deployment_container(docs)
    spec = pod_spec(one(docs, "Deployment"))
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert mounts["dshm"] == "/dev/shm"
    # PROMETHEUS_MULTIPROC_DIR is a subdirectory of an emptyDir: the entrypoint wipes it
    multiproc = env_of(container)["PROMETHEUS_MULTIPROC_DIR"]["value"]
    assert "emptyDir" in volumes["metrics-multiproc"]
    assert multiproc.startswith(mounts["metrics-multiproc"] + "/")
    assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == f"{FULLNAME}-model-cache"
    env = env_of(container)
    # the weights and every compile cache survive a restart: vLLM's (which also takes inductor's
    # and Triton's for its own compile) and inductor's default, where the plugin's encoder compiles
    for name in ("HF_HOME", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
        assert env[name]["value"].startswith(mounts["model-cache"] + "/"), name
    pvc = one(docs, "PersistentVolumeClaim", "model-cache")
    assert pvc["metadata"]["name"] == f"{FULLNAME}-model-cache"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


ROLLING = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}


@pytest.mark.parametrize(
    ("sets", "strategy"),
    [
        ((), {"type": "Recreate"}),  # created ReadWriteOnce claim: no surge pod on another node
        (("modelCache.accessModes={ReadWriteOncePod}",), {"type": "Recreate"}),
        (("modelCache.accessModes={ReadWriteMany}",), ROLLING),
        (("modelCache.existingClaim=weights",), ROLLING),
        (("modelCache.enabled=false",), ROLLING),
        (("replicaCount=2", "modelCache.podsOnOneNode=true"), ROLLING),
        (
            ("strategy.type=Recreate", "modelCache.accessModes={ReadWriteMany}"),
            {"type": "Recreate"},
        ),
    ],
)
def test_strategy_follows_the_model_cache(sets, strategy):
    assert one(render("default", sets=sets), "Deployment")["spec"]["strategy"] == strategy


@pytest.mark.parametrize(
    ("sets", "mode", "why"),
    [
        (("replicaCount=3",), "ReadWriteOnce", "replicaCount is 3"),
        (
            ("autoscaling.enabled=true", "autoscaling.keda.serverAddress=http://p:9090"),
            "ReadWriteOnce",
            "autoscaling may run up to 4 replicas",
        ),
        (
            (
                "replicaCount=2",
                "modelCache.podsOnOneNode=true",  # not enough: ReadWriteOncePod is one pod
                "modelCache.accessModes={ReadWriteOncePod}",
            ),
            "ReadWriteOncePod",
            "replicaCount is 2",
        ),
    ],
)
def test_read_write_once_cache_with_several_pods_is_refused(sets, mode, why):
    """A created ReadWriteOnce claim attaches to one node: a second pod elsewhere hangs on
    Multi-Attach, so the render fails and says what to do instead."""
    args = [a for s in sets for a in ("--set", s)]
    proc = helm("template", RELEASE, str(CHART), *args, check=False)
    assert proc.returncode != 0
    assert f"the chart creates a {mode} claim" in proc.stderr, proc.stderr
    assert why in proc.stderr and "modelCache.accessModes=[ReadWriteMany]" in proc.stderr
    if mode == "ReadWriteOnce":  # shared storage, or all pods declared on one node: accepted
        helm("template", RELEASE, str(CHART), *args, "--set", "modelCache.podsOnOneNode=true")
        helm(
            "template",
            RELEASE,
            str(CHART),
            *args,
            "--set",
            "modelCache.accessModes={ReadWriteMany}",
        )


def test_notes_warn_about_read_write_once_surges():
    from chartlib import install_dry_run

    notes = install_dry_run("strategy.type=RollingUpdate")["info"]["notes"]
    assert "WARNING: strategy RollingUpdate with a ReadWriteOnce model-cache claim" in notes
    notes = install_dry_run("replicaCount=2", "modelCache.podsOnOneNode=true")["info"]["notes"]
    assert "must land on the node that holds it" in notes
    assert "Multi-Attach" not in install_dry_run()["info"]["notes"]


@pytest.mark.parametrize(
    ("sets", "warned"),
    [
        ((), True),  # 1 replica, maxUnavailable 1: the only pod may go
        (("podDisruptionBudget.maxUnavailable=50%",), True),  # rounds up to 1
        (("podDisruptionBudget.maxUnavailable=null", "podDisruptionBudget.minAvailable=0"), True),
        (("podDisruptionBudget.maxUnavailable=null", "podDisruptionBudget.minAvailable=1"), False),
        (("podDisruptionBudget.maxUnavailable=0",), False),
        (("podDisruptionBudget.enabled=false",), False),
        (("replicaCount=2", "modelCache.accessModes={ReadWriteMany}"), False),
    ],
)
def test_notes_warn_when_the_pdb_lets_the_only_pod_go(sets, warned):
    from chartlib import install_dry_run

    notes = install_dry_run(*sets)["info"]["notes"]
    assert ("lets a node drain or cluster upgrade evict\nthe only serving pod" in notes) == warned
    if warned:
        assert "replicaCount=2" in notes and "podDisruptionBudget.minAvailable=1" in notes


def test_existing_claim_and_emptydir_cache():
    docs = render(sets=("modelCache.existingClaim=weights",))
    spec = pod_spec(one(docs, "Deployment"))
    cache = next(v for v in spec["volumes"] if v["name"] == "model-cache")
    assert cache["persistentVolumeClaim"]["claimName"] == "weights"
    assert not by_kind(docs, "PersistentVolumeClaim")
    docs = render("minimal")
    spec = pod_spec(one(docs, "Deployment"))
    cache = next(v for v in spec["volumes"] if v["name"] == "model-cache")
    assert cache == {"name": "model-cache", "emptyDir": {}}


def test_secrets_referenced_never_inlined():
    docs = render("default")
    container = deployment_container(docs)
    env = env_of(container)
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "HF_TOKEN"}
    assert env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "vllm-api-key",
        "key": "VLLM_API_KEY",
    }
    assert "value" not in env["HF_TOKEN"] and "value" not in env["VLLM_API_KEY"]
    assert not by_kind(docs, "Secret")
    lt = by_kind(docs, "Job")[0]
    lt_env = env_of(pod_spec(lt)["containers"][0])
    assert lt_env["SLO_LOADTEST_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "vllm-api-key"
    # without secrets configured, no token env at all
    env = env_of(deployment_container(render("minimal")))
    assert "HF_TOKEN" not in env and "VLLM_API_KEY" not in env


def test_inline_secret_values_rejected():
    from chartlib import helm

    for key in ("model.hfToken.value", "model.hfToken.token", "server.apiKey.value"):
        proc = helm(
            "template",
            "x",
            str(profile_file("default").parents[1]),
            "--set",
            f"{key}={SECRET_VALUE}",
            check=False,
        )
        assert proc.returncode != 0
        assert "additional properties" in proc.stderr
        assert SECRET_VALUE not in proc.stdout


@pytest.mark.parametrize("profile", PROFILES)
def test_security_context(profile):
    for doc in render(profile):
        if doc["kind"] not in ("Deployment", "Job"):
            continue
        spec = pod_spec(doc)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert spec["automountServiceAccountToken"] is False
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["runAsNonRoot"] is True
            assert sc.get("privileged") is not True


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("api", list(API_VARIANTS))
def test_selectors_match_labels(profile, api):
    docs = render(profile, api=api)
    dep = one(docs, "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"] == SELECTOR
    assert SELECTOR.items() <= pod_labels.items()
    svc = one(docs, "Service")
    assert svc["spec"]["selector"] == SELECTOR
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"] == SELECTOR
    for np in by_kind(docs, "NetworkPolicy"):
        assert np["spec"]["podSelector"]["matchLabels"] == SELECTOR
    for sm in by_kind(docs, "ServiceMonitor"):
        # the ServiceMonitor selects the Service by its labels
        assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
        assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    for job in by_kind(docs, "Job"):
        labels = job["spec"]["template"]["metadata"]["labels"]
        assert labels["app.kubernetes.io/component"] == "loadtest"
        assert labels["app.kubernetes.io/instance"] == RELEASE
    for scaler in by_kind(docs, "ScaledObject") + by_kind(docs, "HorizontalPodAutoscaler"):
        ref = scaler["spec"]["scaleTargetRef"]
        assert (ref["kind"], ref["name"]) == ("Deployment", dep["metadata"]["name"])


def test_user_labels_never_enter_selectors():
    docs = render(sets=("commonLabels.team=vision", "podLabels.tier=gpu"))
    dep = one(docs, "Deployment")
    assert dep["spec"]["selector"]["matchLabels"] == SELECTOR
    assert dep["metadata"]["labels"]["team"] == "vision"
    assert dep["spec"]["template"]["metadata"]["labels"]["tier"] == "gpu"
    assert one(docs, "Service")["spec"]["selector"] == SELECTOR


def test_chart_version_and_common_labels_leave_the_pod_template_alone(tmp_path):
    """A chart or app version bump, or new commonLabels, must not roll every GPU pod: the pod
    template carries only the selector labels, the component and podLabels."""
    import shutil

    chart = tmp_path / "gemma4-serving"
    shutil.copytree(CHART, chart)  # files/dashboards copied, not linked
    meta = (chart / "Chart.yaml").read_text()
    (chart / "Chart.yaml").write_text(
        meta.replace("version: 0.1.0", "version: 9.9.9").replace(
            'appVersion: "0.1.0"', 'appVersion: "0.1.0-rc1"'
        )
    )
    sets = ("image.tag=0.1.0",)  # the image is pinned, as a real upgrade of the chart alone
    before = one(render("default", sets=sets), "Deployment")
    after = one(
        render("default", sets=(*sets, "commonLabels.team=vision"), chart=chart), "Deployment"
    )
    assert after["metadata"]["labels"]["helm.sh/chart"] == "gemma4-serving-9.9.9"
    assert after["metadata"]["labels"]["team"] == "vision"
    assert after["spec"]["template"] == before["spec"]["template"]
    assert before["spec"]["template"]["metadata"]["labels"] == SELECTOR


def test_helpers_are_prefixed_with_the_chart_name():
    from chartlib import CHART

    names = []
    for tpl in (CHART / "templates").rglob("*.tpl"):
        names += re.findall(r'define "([^"]+)"', tpl.read_text())
    assert names and all(n.startswith("gemma4-serving.") for n in names), names


def test_service_monitor_values():
    docs = render("autoscaling-multi-replica", api="operator")
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    ep = sm["spec"]["endpoints"][0]
    assert ep["path"] == "/metrics"
    assert ep["interval"] == "15s"
    assert ep["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}
    ]
    pr = one(docs, "PrometheusRule")
    assert pr["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_scrape_annotations_without_operator():
    docs = render("default", api="no-operator")
    svc = one(docs, "Service")
    assert svc["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8000",
        "prometheus.io/path": "/metrics",
    }
    # pods are not annotated as well (that would scrape every target twice)
    dep = one(docs, "Deployment")
    assert "prometheus.io/scrape" not in dep["spec"]["template"]["metadata"].get("annotations", {})
    # with the operator there are no annotations; the override forces either way
    assert "annotations" not in one(render("default", api="operator"), "Service")["metadata"]
    forced = render("default", api="operator", sets=("metrics.mode=annotations",))
    assert not by_kind(forced, "ServiceMonitor")
    forced = render("default", api="no-operator", sets=("metrics.mode=serviceMonitor",))
    assert len(by_kind(forced, "ServiceMonitor")) == 1
    none = render("minimal", api="operator")
    assert not by_kind(none, "ServiceMonitor") and not by_kind(none, "PrometheusRule")
    assert "annotations" not in one(none, "Service")["metadata"]


def test_keda_scaledobject_scales_on_load_per_pod():
    docs = render("autoscaling-multi-replica")
    so = one(docs, "ScaledObject")
    assert not by_kind(docs, "HorizontalPodAutoscaler")
    dep = one(docs, "Deployment")
    assert "replicas" not in dep["spec"]
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (2, 8)
    (trigger,) = so["spec"]["triggers"]  # the SLO trigger is opt-in
    assert trigger["type"] == "prometheus"
    # AverageValue: desired = ceil(total / target), independent of the current replica count
    assert trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert meta["serverAddress"] == "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
    assert meta["threshold"] == "6"
    query = meta["query"]
    sel = f'namespace="{NAMESPACE}",service="{FULLNAME}"'
    assert f"vllm:num_requests_running{{{sel}}}" in query
    assert f"vllm:num_requests_waiting{{{sel}}}" in query
    assert "{{" not in query and "gemma4_request_e2e" not in query  # load, not the SLO ratio
    assert so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]


def test_keda_slo_trigger_is_an_extra_opt_in_trigger():
    sets = ("autoscaling.keda.sloTrigger.enabled=true", "autoscaling.targetPerPod=4.5")
    so = one(render("autoscaling-multi-replica", sets=sets), "ScaledObject")
    load, slo = so["spec"]["triggers"]
    assert (load["name"], load["metricType"], load["metadata"]["threshold"]) == (
        "load",
        "AverageValue",
        "4.5",
    )
    assert (slo["name"], slo["metricType"], slo["metadata"]["threshold"]) == (
        "slo",
        "Value",
        "0.05",
    )
    sel = f'namespace="{NAMESPACE}",service="{FULLNAME}"'
    assert (
        f'gemma4_request_e2e_latency_seconds_bucket{{le="0.3",{sel}}}' in slo["metadata"]["query"]
    )
    assert slo["metadata"]["serverAddress"] == load["metadata"]["serverAddress"]


def test_keda_query_is_a_template():
    query = 'sum(rate(x_count{ns="{{ .Release.Namespace }}"}[1m]))'
    values = yaml.safe_dump({"autoscaling": {"keda": {"query": query}, "targetPerPod": "25"}})
    docs = render("autoscaling-multi-replica", values=values)
    meta = one(docs, "ScaledObject")["spec"]["triggers"][0]["metadata"]
    assert meta["query"] == query.replace("{{ .Release.Namespace }}", NAMESPACE)
    assert meta["threshold"] == "25"


def test_old_slo_threshold_keys_are_rejected():
    """The ratio's threshold/metricType/target are gone: a left-over value fails loudly instead
    of becoming a per-pod in-flight target of 0.05."""
    for key in ("autoscaling.keda.threshold=0.05", "autoscaling.hpa.target=50m"):
        proc = helm("template", RELEASE, str(CHART), "--set", key, check=False)
        assert proc.returncode != 0 and "additional properties" in proc.stderr, proc.stderr


def test_hpa_on_external_load_metric():
    docs = render("no-prometheus-operator")
    hpa = one(docs, "HorizontalPodAutoscaler")
    assert not by_kind(docs, "ScaledObject")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"] == {
        "name": "gemma4_inflight_requests",
        "selector": {"matchLabels": {"namespace": NAMESPACE, "service": FULLNAME}},
    }
    # the total divided by the replica count, not a Value compared as is
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "6"}
    pods = render("no-prometheus-operator", sets=("autoscaling.hpa.metricType=Pods",))
    (metric,) = one(pods, "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "6"}


def test_pdb_and_network_policy():
    docs = render("autoscaling-multi-replica")
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": SELECTOR}}
    np = one(docs, "NetworkPolicy")
    peers = np["spec"]["ingress"][0]["from"]
    assert {
        "podSelector": {"matchLabels": {**SELECTOR, "app.kubernetes.io/component": "loadtest"}}
    } in peers
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}
    } in peers
    assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert not by_kind(render("default"), "NetworkPolicy")  # opt-in


def test_extra_volumes_env_and_containers_pass_through():
    spec = pod_spec(one(render("autoscaling-multi-replica"), "Deployment"))
    (init,) = spec["initContainers"]
    assert init["name"] == "fetch-weights"
    volumes = {v["name"]: v for v in spec["volumes"]}
    # the init container fills the chart's own model cache; the extra volume sits beside it
    assert {m["name"] for m in init["volumeMounts"]} <= volumes.keys()
    assert volumes["corp-ca"] == {"name": "corp-ca", "configMap": {"name": "corp-ca-bundle"}}
    (vllm,) = spec["containers"]
    assert {"name": "corp-ca", "mountPath": "/etc/ssl/corp", "readOnly": True} in vllm[
        "volumeMounts"
    ]
    assert vllm["envFrom"] == [{"configMapRef": {"name": "egress-proxy"}}]
    default = pod_spec(one(render("default"), "Deployment"))
    assert "initContainers" not in default and len(default["containers"]) == 1
    assert "envFrom" not in default["containers"][0]
    sidecar = pod_spec(
        one(
            render("default", sets=("extraContainers[0].name=log", "extraContainers[0].image=x")),
            "Deployment",
        )
    )
    assert [c["name"] for c in sidecar["containers"]] == ["vllm", "log"]


def test_complete_example_serves_the_synced_weights():
    """ci/autoscaling-multi-replica: vLLM loads the directory the init container fills (offline),
    not the Hub id, which would download the weights again into HF_HOME."""
    spec = pod_spec(one(render("autoscaling-multi-replica"), "Deployment"))
    (init,) = spec["initContainers"]
    (vllm,) = spec["containers"]
    env = env_of(vllm)
    cache = next(m["mountPath"] for m in vllm["volumeMounts"] if m["name"] == "model-cache")
    init_cache = next(m["mountPath"] for m in init["volumeMounts"] if m["name"] == "model-cache")
    target = init["args"][-1].rstrip("/")
    assert init_cache == cache and env["MODEL"]["value"] == target
    assert not target.startswith(env["HF_HOME"]["value"])  # a plain directory, not the HF cache
    assert env["HF_HUB_OFFLINE"]["value"] == "1"
    from chartlib import install_dry_run  # no Hub token needed for a local path: no warning

    notes = install_dry_run(profile="autoscaling-multi-replica")["info"]["notes"]
    assert "model.hfToken.existingSecret is empty" not in notes
    # the Ingress's controller is the namespace the NetworkPolicy admits
    docs = render("autoscaling-multi-replica")
    assert one(docs, "Ingress")["spec"]["ingressClassName"] == "nginx"
    peers = one(docs, "NetworkPolicy")["spec"]["ingress"][0]["from"]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}
    } in peers


def test_ingress_routes_only_the_api_to_the_service():
    docs = render("autoscaling-multi-replica")
    ingress = one(docs, "Ingress")
    service = one(docs, "Service")
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"hosts": ["gemma4.example.com"], "secretName": "gemma4-tls"}]
    assert (
        ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    )
    (rule,) = spec["rules"]
    assert rule["host"] == "gemma4.example.com"
    (path,) = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/v1", "Prefix")  # not /metrics, not /health
    backend = path["backend"]["service"]
    assert backend["name"] == service["metadata"]["name"]
    assert backend["port"]["name"] in {p["name"] for p in service["spec"]["ports"]}
    assert not by_kind(render("default"), "Ingress")  # opt-in


def test_ingress_without_a_host_matches_any_host_and_the_default_class():
    (rule,) = one(render("default", sets=("ingress.enabled=true",)), "Ingress")["spec"]["rules"]
    assert "host" not in rule
    spec = one(render("default", sets=("ingress.enabled=true",)), "Ingress")["spec"]
    assert "ingressClassName" not in spec and "tls" not in spec


def test_http_route_attaches_the_api_to_the_gateway():
    docs = render("no-prometheus-operator")
    route = one(docs, "HTTPRoute")
    service = one(docs, "Service")
    spec = route["spec"]
    assert spec["parentRefs"] == [
        {"name": "public", "namespace": "gateway-system", "sectionName": "https"}
    ]
    assert spec["hostnames"] == ["gemma4.example.com"]
    (rule,) = spec["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    assert rule["timeouts"] == {"request": "600s"}
    assert rule["backendRefs"] == [
        {"name": service["metadata"]["name"], "port": service["spec"]["ports"][0]["port"]}
    ]
    assert not by_kind(render("default"), "HTTPRoute")  # opt-in


def test_http_route_needs_the_gateway_api_and_a_parent():
    """A cluster without the Gateway API CRDs, or a route with nowhere to attach, fails at
    install with a message that says what to do (not Kubernetes' 'no matches for kind')."""
    sets = ("--set", "httpRoute.enabled=true", "--set", "httpRoute.parentRefs[0].name=gw")
    proc = helm("template", RELEASE, str(CHART), *sets, check=False)
    assert proc.returncode != 0
    assert "does not serve gateway.networking.k8s.io/v1 HTTPRoute" in proc.stderr, proc.stderr
    api = ("--api-versions", "gateway.networking.k8s.io/v1/HTTPRoute")
    proc = helm(
        "template", RELEASE, str(CHART), *api, "--set", "httpRoute.enabled=true", check=False
    )
    assert proc.returncode != 0
    assert "set httpRoute.parentRefs" in proc.stderr, proc.stderr
    netpol = ("--set", "networkPolicy.enabled=true")
    proc = helm("template", RELEASE, str(CHART), *api, *sets, *netpol, check=False)
    assert proc.returncode != 0
    assert "add the Gateway's namespace to networkPolicy.ingressFrom" in proc.stderr, proc.stderr
    rendered = helm("template", RELEASE, str(CHART), *api, *sets).stdout
    assert one([d for d in yaml.safe_load_all(rendered) if d], "HTTPRoute")


def loadtest_jobs(docs: list[dict]) -> dict[str, dict]:
    jobs = {}
    for job in by_kind(docs, "Job"):
        hook = job["metadata"].get("annotations", {}).get("helm.sh/hook")
        jobs["test" if hook == "test" else "job"] = job
    return jobs


def test_loadtest_helm_test_hook():
    jobs = loadtest_jobs(render("default"))
    assert set(jobs) == {"test"}  # the standalone Job is opt-in
    job = jobs["test"]
    ann = job["metadata"]["annotations"]
    assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation"
    spec = job["spec"]
    assert spec["backoffLimit"] == 0
    assert 0 < spec["activeDeadlineSeconds"] <= 900
    container = pod_spec(job)["containers"][0]
    env = env_of(container)
    assert env["SLO_LOADTEST_TARGET"]["value"] == f"http://{FULLNAME}.{NAMESPACE}.svc:8000"
    assert env["SLO_LOADTEST_OUT"]["value"] == "/results"
    assert env["SLO_LOADTEST_RATES"]["value"] == "1,2"
    assert "nvidia.com/gpu" not in container["resources"].get("limits", {})
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/results" in mounts
    assert not loadtest_jobs(render("minimal"))


def test_loadtest_standalone_job():
    docs = render("autoscaling-multi-replica")
    job = loadtest_jobs(docs)["job"]
    # loadtest.job.runId, then the pod template hash
    assert re.fullmatch(rf"{FULLNAME}-loadtest-baseline-[0-9a-f]{{8}}", job["metadata"]["name"])
    assert "annotations" not in job["metadata"]
    spec = job["spec"]
    assert "ttlSecondsAfterFinished" not in spec  # kept: see test_loadtest_runs.py
    assert spec["activeDeadlineSeconds"] == 3600
    assert pod_spec(job)["restartPolicy"] == "Never"
    env = env_of(pod_spec(job)["containers"][0])
    assert env["SLO_LOADTEST_RATES"]["value"] == "1..20"
    assert env["KEEP_RESULTS_SECONDS"]["value"] == "900"
    results = next(v for v in pod_spec(job)["volumes"] if v["name"] == "results")
    claim = results["persistentVolumeClaim"]["claimName"]
    assert claim == f"{FULLNAME}-loadtest-results"
    assert one(docs, "PersistentVolumeClaim", "loadtest-results")["metadata"]["name"] == claim


def test_dashboards_configmaps_from_files():
    from chartlib import DASHBOARDS

    docs = render("default")
    cms = [
        c for c in by_kind(docs, "ConfigMap") if c["metadata"]["labels"].get("grafana_dashboard")
    ]
    files = sorted(DASHBOARDS.glob("*.json"))
    assert len(cms) == len(files)
    shipped = {k: v for c in cms for k, v in c["data"].items()}
    for f in files:
        # byte-identical: never parsed or templated by Helm ({{legend}} survives)
        assert shipped[f.name] == f.read_text()
    for c in cms:
        # a ConfigMap holds at most 1 MiB
        assert sum(len(v.encode()) for v in c["data"].values()) < 1024 * 1024
        assert c["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert c["metadata"]["annotations"]["grafana_folder"] == "Gemma 4 serving"
    assert not [c for c in by_kind(render("minimal"), "ConfigMap")]


def test_documented_dashboard_prerequisites():
    """The chart README's recipe for the load-test dashboard (a Pushgateway push) renders the
    option slo-loadtest reads, and the grafana_folder annotation is documented with the Grafana
    sidecar settings it needs next to its value."""
    readme = (CHART / "README.md").read_text()
    assert "loadtest.settings.pushgateway=" in readme and "honor_labels: true" in readme
    job = loadtest_jobs(render("default", sets=("loadtest.settings.pushgateway=http://pg:9091",)))
    env = env_of(pod_spec(job["test"])["containers"][0])
    assert env["SLO_LOADTEST_PUSHGATEWAY"]["value"] == "http://pg:9091"
    values = (CHART / "values.yaml").read_text()
    folder_doc = values.split("dashboards:", 1)[1].split("folder:", 1)[0]
    for needed in ("folderAnnotation: grafana_folder", "foldersFromFilesStructure: true"):
        assert needed in folder_doc.replace("\n  # ", " ") and needed in readme


def test_image_pull_secrets_take_names_and_the_kubernetes_form():
    """Both forms become LocalObjectReferences in every pod spec: the Deployment and both
    load-test Jobs (a {name: x} item once rendered as `name: map[name:x]` in the Jobs, which a
    schema check accepts because it is still a string)."""
    values = (
        "imagePullSecrets:\n  - regcred\n  - name: other-cred\n"
        "loadtest:\n  job:\n    enabled: true\n"
    )
    text = render_text("default", values=values)
    # no blank line in between, in all three pod specs
    assert text.count("imagePullSecrets:\n        - name: regcred\n") == 3
    assert "map[" not in text
    docs = render("default", values=values)
    pods = [one(docs, "Deployment"), *by_kind(docs, "Job")]
    assert len(pods) == 3  # the Deployment, the helm test hook and the standalone Job
    for doc in pods:
        assert pod_spec(doc)["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other-cred"}]
    for doc in [one(render("default"), "Deployment"), *by_kind(render("default"), "Job")]:
        assert "imagePullSecrets" not in pod_spec(doc)  # none set: no empty list
    bad = values_file("imagePullSecrets:\n  - nme: x\n")
    proc = helm("template", RELEASE, str(CHART), "-f", str(bad), check=False)
    assert proc.returncode != 0 and "at '/imagePullSecrets/0'" in proc.stderr, proc.stderr


def test_image_reference():
    assert deployment_container(render())["image"] == "gemma4-serving:0.1.0"
    digest = "sha256:" + "a" * 64
    c = deployment_container(
        render(sets=("image.repository=reg.example/g4", f"image.digest={digest}"))
    )
    assert c["image"] == f"reg.example/g4@{digest}"


def test_every_profile_is_valid_yaml_with_comments_only_header():
    for profile in PROFILES:
        data = yaml.safe_load(profile_file(profile).read_text())
        assert isinstance(data, dict) and data


def test_no_service_links_and_graceful_stop():
    docs = render("default")
    for doc in by_kind(docs, "Deployment") + by_kind(docs, "Job"):
        assert pod_spec(doc)["enableServiceLinks"] is False  # no VLLM_PORT from a "vllm" Service
    container = deployment_container(docs)
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    spec = pod_spec(one(docs, "Deployment"))
    assert spec["terminationGracePeriodSeconds"] > 5
    assert "lifecycle" not in deployment_container(render(sets=("server.preStopSleepSeconds=0",)))
