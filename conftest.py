"""Shared fixtures: one real vLLM (CPU) serving a tiny random-weight Gemma 4, one real Prometheus.

Both start once per test session, lazily (only when a test asks for them), and are stopped at
the end of the session. See docs/architecture.md for the contract.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "local"))

import stack

# The test server caps media per prompt so the limit itself can be tested; the blog's
# `{"audio": 0}` stays in force. Later flags override the entrypoint's defaults.
TEST_SERVER_ARGS = ["--limit-mm-per-prompt", '{"image":4,"video":2,"audio":0}']
# Shorter than the chart's 15 s so rate() has two samples within seconds; path and timeout are
# the chart's.
TEST_SCRAPE_INTERVAL = "2s"


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    return stack.ensure_model()


def _test_server(
    model: Path, workdir: Path, env: dict[str, str] | None = None, args: list[str] | None = None
) -> stack.VllmServer:
    return stack.VllmServer(
        model_path=model,
        workdir=workdir,
        extra_env=env or {},
        extra_args=[*TEST_SERVER_ARGS, *(args or [])],
    )


@pytest.fixture
def vllm_server_factory(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., stack.VllmServer]]:
    """Start extra servers (e.g. with the plugin disabled) for one test; they are stopped when
    it ends. Each holds ~3 GB here: kept for the whole session, seven of them took this 24 GiB
    machine out of memory."""
    started: list[stack.VllmServer] = []

    def start(
        name: str, env: dict[str, str] | None = None, args: list[str] | None = None
    ) -> stack.VllmServer:
        server = _test_server(tiny_model, tmp_path_factory.mktemp(f"vllm-{name}"), env, args)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def vllm_server(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[stack.VllmServer]:
    """The session's main server; `model_path` (the local model dir) doubles as a tokenizer
    path for clients."""
    server = _test_server(tiny_model, tmp_path_factory.mktemp("vllm-main"))
    yield server.start()
    server.stop()


@pytest.fixture(scope="session")
def prometheus(
    vllm_server: stack.VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[stack.PrometheusServer]:
    prom = stack.PrometheusServer(
        target=f"127.0.0.1:{vllm_server.port}",
        workdir=tmp_path_factory.mktemp("prometheus"),
        scrape_interval=TEST_SCRAPE_INTERVAL,
    ).start()
    prom.wait_for_scrapes(1)
    yield prom
    prom.stop()
