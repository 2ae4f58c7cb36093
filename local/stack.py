"""The local stack: real vLLM (CPU) and real Prometheus as supervised local processes.

vLLM is started through `images/entrypoint.sh`, the container's own entrypoint, so the command
and the blog's flags the chart deploys are the ones exercised here, with the chart's plugin
switches and warm-up; its GPU-only flags (the CUDA graph profile, the attention backend) are left
to vLLM's CPU defaults. Prometheus scrapes it with the chart's
scrape settings (read from the chart's values.yaml) and loads the rule files the chart ships.
Every process runs in its own process group and dies with its supervisor (PR_SET_PDEATHSIG), so
Ctrl-C or a crash leaves nothing behind.

    python local/stack.py up            # vLLM + Prometheus until Ctrl-C
    python local/stack.py up --no-prometheus
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ENTRYPOINT = REPO / "images" / "entrypoint.sh"
RULES_DIR = REPO / "dashboards" / "rules"
CHART_VALUES = REPO / "charts" / "gemma4-serving" / "values.yaml"
SERVED_MODEL_NAME = "gemma4-tiny"

# What a 2-core CPU needs on top of the blog's flags (the entrypoint adds those): a short
# context, a small batch, and eager mode (no torch.compile warm-up). A model directory without
# weights also gets `--load-format dummy` (see serve_args).
CPU_SERVE_ARGS = [
    "--dtype", "bfloat16",
    "--max-model-len", "4096",
    "--max-num-seqs", "16",
    "--max-num-batched-tokens", "4096",
    "--enforce-eager",
]  # fmt: skip


def serve_args(model_path: Path) -> list[str]:
    import build_model

    dummy = [] if build_model.has_weights(model_path) else ["--load-format", "dummy"]
    return [*dummy, *CPU_SERVE_ARGS]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """preexec_fn: new process group, and SIGTERM when the supervisor dies (Linux)."""
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Process:
    """A supervised child process whose output goes to a log file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    popen: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
        )  # fmt: skip
        log.close()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_until(self, url: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(
                    f"{self.name} exited with {self.popen.returncode if self.popen else '?'} "
                    f"before {url} answered; last log lines ({self.log_path}):\n{self.log_tail()}"
                )
            if _http_ok(url):
                return
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"{self.name}: {url} not ready after {timeout:.0f} s\n{self.log_tail()}")

    def wait_for_file(self, path: Path, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if not self.alive():
                raise RuntimeError(f"{self.name} exited before {path} appeared:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.name}: no {path} after {timeout:.0f} s\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def stop(self, grace: float = 20.0) -> None:
        """SIGTERM the whole process group (vLLM's engine core included), then SIGKILL."""
        if self.popen is None:
            return
        pgid = self.popen.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace)
        # Children (engine core) may outlive the leader by a moment; make sure none remain.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)


@dataclass
class VllmServer:
    """vLLM serving a local model directory through images/entrypoint.sh."""

    model_path: Path
    workdir: Path
    port: int = field(default_factory=free_port)
    model: str = SERVED_MODEL_NAME
    extra_env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def log_path(self) -> Path:
        return self.workdir / "vllm.log"

    @property
    def metrics_dir(self) -> Path:
        return self.workdir / "prometheus-multiproc"

    @property
    def warmup_done_file(self) -> Path:
        return self.workdir / "warmup-done"

    def start(self, timeout: float = 300.0) -> VllmServer:
        env = {
            **os.environ,
            "MODEL": str(self.model_path),
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            # `vllm serve`, as the image runs it (several API-server processes for
            # --api-server-count, which `-m vllm.entrypoints.openai.api_server` ignores); the
            # CPU wheel's console script cannot read its own version, so through a small shim.
            "VLLM_LAUNCHER": f"{sys.executable} {Path(__file__).parent / 'vllm_cli.py'} serve",
            "VLLM_EXTRA_ARGS": " ".join(
                [*serve_args(self.model_path), "--served-model-name", self.model, *self.extra_args]
            ),
            "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir),
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_LOGGING_LEVEL": "INFO",
            # the entrypoint's warm-up (GEMMA4_WARMUP=1) runs in this Python, as python3 does
            # in the image
            "GEMMA4_WARMUP_PYTHON": sys.executable,
            "GEMMA4_WARMUP_DONE_FILE": str(self.warmup_done_file),
            **self.extra_env,
        }
        self.process = Process("vllm", [str(ENTRYPOINT)], env, self.log_path)
        self.process.start()
        self.process.wait_until(f"{self.url}/health", timeout)
        if env.get("GEMMA4_WARMUP") == "1":  # what the chart's startup probe waits for
            self.process.wait_for_file(Path(env["GEMMA4_WARMUP_DONE_FILE"]), timeout)
        return self

    def stop(self) -> None:
        if self.process:
            self.process.stop()

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as resp:
            return resp.read().decode()


@functools.cache
def chart_values() -> dict[str, Any]:
    """The chart's values.yaml, read once: what the local stack copies from the chart."""
    import yaml

    return yaml.safe_load(CHART_VALUES.read_text()) or {}


def chart_scrape_settings() -> dict[str, str]:
    """The chart's metrics.path and metrics.serviceMonitor.{interval,scrapeTimeout}."""
    metrics = chart_values()["metrics"]
    return {
        "path": metrics["path"],
        "interval": metrics["serviceMonitor"]["interval"],
        "scrapeTimeout": metrics["serviceMonitor"]["scrapeTimeout"],
    }


def chart_plugin_env() -> dict[str, str]:
    """The chart's server.pluginEnv (the plugin switches its Deployment sets), as env vars."""
    plugin_env = chart_values()["server"]["pluginEnv"] or {}
    return {name: str(value) for name, value in plugin_env.items() if value is not None}


def chart_warmup_env() -> dict[str, str]:
    """The chart's server.warmup as the entrypoint's env (empty when it is off)."""
    warmup = chart_values()["server"]["warmup"]
    if not warmup.get("enabled"):
        return {}
    return {"GEMMA4_WARMUP": "1", "GEMMA4_WARMUP_ARGS": warmup.get("args", "")}


@dataclass
class PrometheusServer:
    """A real Prometheus scraping one vLLM, with the chart's scrape settings and rules."""

    target: str  # host:port
    workdir: Path
    port: int = field(default_factory=free_port)
    scrape_interval: str | None = None  # None: the chart's
    process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict:
        scrape = chart_scrape_settings()
        interval = self.scrape_interval or scrape["interval"]
        rule_files = sorted(str(p) for p in RULES_DIR.glob("*.yaml")) if RULES_DIR.exists() else []
        return {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": rule_files,
            "scrape_configs": [
                {
                    # Same job/labels shape as the ServiceMonitor produces in a cluster.
                    "job_name": "gemma4-serving",
                    "metrics_path": scrape["path"],
                    "scrape_interval": interval,
                    "scrape_timeout": min(scrape["scrapeTimeout"], interval, key=_seconds),
                    "static_configs": [
                        {
                            "targets": [self.target],
                            "labels": {"namespace": "local", "pod": "vllm-local-0"},
                        }
                    ],
                }
            ],
        }

    def start(self, timeout: float = 60.0) -> PrometheusServer:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError("prometheus is not installed: run `make tools`")
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(json.dumps(self.config(), indent=2))  # JSON is valid YAML
        argv = [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
        ]
        self.process = Process("prometheus", argv, dict(os.environ), self.workdir / "prom.log")
        self.process.start()
        self.process.wait_until(f"{self.url}/-/ready", timeout)
        return self

    def stop(self) -> None:
        if self.process:
            self.process.stop(grace=10)

    def query(self, promql: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise RuntimeError(f"query failed: {promql}: {body}")
        return body["data"]["result"]

    def wait_for_scrapes(self, n: int = 2, timeout: float = 120.0) -> None:
        """Block until the target has been scraped `n` times (rate() needs two samples)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.query('count_over_time(up{job="gemma4-serving"}[10m])')
            if result and float(result[0]["value"][1]) >= n:
                return
            time.sleep(1)
        raise TimeoutError(f"Prometheus did not scrape {self.target} {n} times in {timeout} s")


def _seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    return float(duration)


def default_model_dir() -> Path:
    return REPO / ".cache" / "models" / "tiny"


def ensure_model(
    path: Path | None = None, vision: str = "tiny", text: str = "tiny", weights: str = "random"
) -> Path:
    """Build the model directory if it is missing or stale (keyed on the builder's fingerprint).

    The local stack's tiny model carries seeded random weights (~1 MB), so greedy outputs and
    logprobs depend on the inputs (tests compare them with and without the plugin)."""
    import build_model  # local/ is on sys.path wherever stack is importable

    path = path or default_model_dir()
    stamp = path / ".fingerprint"
    key = f"{build_model.fingerprint()}:{vision}:{text}:{weights}"
    if not (stamp.exists() and stamp.read_text() == key):
        build_model.build(vision, text, path, weights)
        stamp.write_text(key)
    return path


@contextlib.contextmanager
def running_stack(
    workdir: Path | None = None, prometheus: bool = True, scrape_interval: str | None = None
) -> Iterator[tuple[VllmServer, PrometheusServer | None]]:
    """vLLM with the chart's plugin switches and warm-up (+ Prometheus) for the duration of a
    with-block; always torn down."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="gemma4-stack-"))
    server = VllmServer(
        model_path=ensure_model(),
        workdir=workdir,
        extra_env={**chart_plugin_env(), **chart_warmup_env()},
    )
    prom: PrometheusServer | None = None
    try:
        server.start()
        if prometheus:
            prom = PrometheusServer(
                target=f"127.0.0.1:{server.port}",
                workdir=workdir / "prometheus",
                scrape_interval=scrape_interval,
            ).start()
        yield server, prom
    finally:
        if prom:
            prom.stop()
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the local stack until Ctrl-C.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start vLLM (+ Prometheus) and wait for Ctrl-C")
    up.add_argument("--no-prometheus", action="store_true")
    up.add_argument("--workdir", type=Path, default=REPO / ".cache" / "stack")
    args = parser.parse_args(argv)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.workdir.exists():
        shutil.rmtree(args.workdir)
    with running_stack(args.workdir, prometheus=not args.no_prometheus) as (server, prom):
        print(f"vLLM:       {server.base_url}  (model {server.model}, log {server.log_path})")
        if prom:
            print(f"Prometheus: {prom.url}")
        print("Ctrl-C stops everything.")
        with contextlib.suppress(KeyboardInterrupt):
            while server.process and server.process.alive():
                time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
