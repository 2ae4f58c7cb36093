"""Pushing a summary to a real Prometheus Pushgateway (Debian's prometheus-pushgateway)."""

from __future__ import annotations

import base64
import contextlib
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from slo_loadtest.cli import cli
from slo_loadtest.config import Criteria
from slo_loadtest.guidellm_adapter import load_report
from slo_loadtest.pushgateway import push
from slo_loadtest.summary import build_summary
from slo_loadtest.verdict import RateResult

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# HTTP Basic users of the authenticating Pushgateway (exporter-toolkit's --web.config.file):
# PG_USER's bcrypt hash, made with crypt.crypt(PG_PASSWORD, crypt.mksalt(METHOD_BLOWFISH, 16))
PG_USER, PG_PASSWORD = "pusher", "pg-SECRET-pw"
PG_BCRYPT = "$2b$04$11F0UoZqvFJUCQMJFQxlxuGUv1Ihfte7LSacR4TihMoUa99RSo8LC"
PG_BASIC = "Basic " + base64.b64encode(f"{PG_USER}:{PG_PASSWORD}".encode()).decode()


@contextlib.contextmanager
def _pushgateway(*flags: str, authorization: str = "") -> Iterator[str]:
    binary = shutil.which("prometheus-pushgateway")
    assert binary, "apt-get install -y prometheus-pushgateway"
    port = _free_port()
    proc = subprocess.Popen(
        [binary, f"--web.listen-address=127.0.0.1:{port}", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                _get(url + "/-/ready", authorization, timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline, "pushgateway did not start"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def pushgateway() -> Iterator[str]:
    with _pushgateway() as url:
        yield url


def _get(url: str, authorization: str = "", timeout: float = 5) -> str:
    headers = {"Authorization": authorization} if authorization else {}
    req = urllib.request.Request(url, headers=headers)
    return urllib.request.urlopen(req, timeout=timeout).read().decode()


def _metrics(url: str, authorization: str = "") -> str:
    return _get(url + "/metrics", authorization)


def _analyze_text_1rps(*options: str):
    """`slo-loadtest analyze` of the 1 req/s text fixture with a 600 s SLO (always met)."""
    args = ["analyze", str(FIXTURES / "text-1rps.json"), "--slo-ms", "600000", *options]
    return CliRunner().invoke(cli, args)


def _summary(slo_ms: float) -> dict:
    rs = []
    for name, workload in (("text-1rps", "text"), ("video-incomplete", "video")):
        m = load_report(FIXTURES / f"{name}.json").measurements[0]
        rs.append(RateResult(workload=workload, target_rate=m.target_rate, measurement=m))
    return build_summary(
        rs,
        Criteria(slo_ms=slo_ms, min_achieved_ratio=0, max_dispatch_delay_ms=1e6),
        workloads=["text", "video"],
    )


def test_push_names_labels_and_values(pushgateway: str) -> None:
    pushed = push(pushgateway, _summary(600_000))
    assert [u.rsplit("/", 1)[1] for u in pushed] == ["text", "video"]
    text = _metrics(pushgateway)
    lines = [ln for ln in text.splitlines() if ln.startswith("slo_loadtest_")]
    assert any(
        ln.startswith(
            'slo_loadtest_e2e_p95_seconds{instance="",job="slo_loadtest",rate="1",workload="text"}'
        )
        for ln in lines
    ), lines
    for name in ("ttft_p95_seconds", "itl_p95_seconds", "achieved_rps", "error_ratio"):
        assert any(
            ln.startswith(f"slo_loadtest_{name}{{") and 'workload="text"' in ln for ln in lines
        ), name
    assert 'slo_loadtest_slo_pass{instance="",job="slo_loadtest",workload="text"} 1' in text
    assert 'slo_loadtest_slo_pass{instance="",job="slo_loadtest",workload="video"} 0' in text
    assert (
        'slo_loadtest_max_rate_within_slo{instance="",job="slo_loadtest",workload="text"} 1' in text
    )
    assert "slo_loadtest_last_run_timestamp_seconds{" in text


def test_a_new_push_replaces_the_workloads_group(pushgateway: str) -> None:
    push(pushgateway, _summary(600_000))
    push(pushgateway, _summary(1))  # now text fails too
    text = _metrics(pushgateway)
    assert 'slo_loadtest_slo_pass{instance="",job="slo_loadtest",workload="text"} 0' in text


def test_analyze_pushes_and_unreachable_gateway_is_an_error(pushgateway: str) -> None:
    r = _analyze_text_1rps("--pushgateway", pushgateway)
    assert "slo_loadtest_slo_pass" in _metrics(pushgateway), r.output
    with pytest.raises(RuntimeError, match="push to"):
        push(f"http://127.0.0.1:{_free_port()}", _summary(1), timeout_s=2)


def test_two_releases_keep_their_own_groups(pushgateway: str) -> None:
    """--push-release (the chart's Jobs: <namespace>/<release>) is a grouping label: a second
    release's push does not replace the first's."""
    push(pushgateway, _summary(600_000), release="serve/a")
    push(pushgateway, _summary(1), release="serve/b")
    text = _metrics(pushgateway)
    assert 'slo_pass{instance="",job="slo_loadtest",release="serve/a",workload="text"} 1' in text
    assert 'slo_pass{instance="",job="slo_loadtest",release="serve/b",workload="text"} 0' in text


def test_rates_that_never_ran_are_not_pushed_as_all_errors() -> None:
    from slo_loadtest.pushgateway import exposition

    s = _summary(600_000)
    s["results"].append(
        {**s["results"][0], "target_rate": 2.0, "status": "not_run", "measurement": None}
    )
    text = exposition(s, "text")
    ratios = [ln for ln in text.splitlines() if ln.startswith("slo_loadtest_error_ratio{")]
    assert ratios == ['slo_loadtest_error_ratio{rate="1"} 0.0']


def test_analyze_without_out_warns_when_the_push_fails() -> None:
    """A failed push is a warning with --out or without; the exit code is the verdict's."""
    r = _analyze_text_1rps(
        "--min-achieved-ratio",
        "0",
        "--max-dispatch-delay-ms",
        "1000000",
        "--pushgateway",
        f"http://127.0.0.1:{_free_port()}",
    )
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert r.exit_code == 0, r.output
    assert "warning: push to" in r.output


def test_only_dashboard_metric_names_are_written() -> None:
    """dashboards/generate.py lists the names the dashboard reads; we write no others."""
    import re

    written = {
        m
        for f in (REPO / "loadtest" / "src").rglob("*.py")
        for m in re.findall(r"slo_loadtest_[a-z0-9_]+", f.read_text())
    }
    expected = {
        "slo_loadtest_e2e_p95_seconds",
        "slo_loadtest_ttft_p95_seconds",
        "slo_loadtest_itl_p95_seconds",
        "slo_loadtest_achieved_rps",
        "slo_loadtest_error_ratio",
        "slo_loadtest_slo_pass",
        "slo_loadtest_max_rate_within_slo",
        "slo_loadtest_last_run_timestamp_seconds",
    }
    assert written == expected
    gen = (REPO / "dashboards" / "generate.py").read_text()
    assert all(name in gen for name in expected)


def test_push_with_credentials_in_the_url(tmp_path: Path) -> None:
    """A Pushgateway behind HTTP Basic authentication: user:password@ in --pushgateway is sent
    as the Authorization header, and neither the output nor the files written quote it."""
    web_config = tmp_path / "web.yml"
    web_config.write_text(f"basic_auth_users:\n  {PG_USER}: {PG_BCRYPT}\n")
    with _pushgateway(f"--web.config.file={web_config}", authorization=PG_BASIC) as url:
        with pytest.raises(urllib.error.HTTPError):  # it does refuse anonymous requests
            _metrics(url)
        out = tmp_path / "out"
        authed = url.replace("http://", f"http://{PG_USER}:{PG_PASSWORD}@")
        ok = _analyze_text_1rps("--pushgateway", authed, "--out", str(out))
        assert f"pushed {url}/metrics/job/slo_loadtest/workload/text" in ok.output, ok.output
        assert "slo_loadtest_slo_pass" in _metrics(url, PG_BASIC)
        wrong = _analyze_text_1rps("--pushgateway", url.replace("http://", "http://pusher:Wr0ng1@"))
        assert f"warning: push to {url}/metrics/job/" in wrong.output, wrong.output
        assert "401" in wrong.output, wrong.output
    for text in (ok.output, wrong.output):
        assert PG_PASSWORD not in text and "Wr0ng1" not in text and "pusher:" not in text, text
    for p in (p for p in out.rglob("*") if p.is_file()):
        assert PG_PASSWORD.encode() not in p.read_bytes(), p
