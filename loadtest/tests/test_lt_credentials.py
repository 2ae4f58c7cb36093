"""Credentials reach the server and nothing else: a target URL with user:password@ authenticates
every request (the preflight through urllib, guidellm's main process and its workers), while no
file of the run, and nothing `slo-loadtest` prints, carries them. Real `slo-loadtest run`
subprocesses and real guidellm runs against a real local server that refuses (401) every request
without the right Authorization header (tests/lt_recording_server.py)."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from lt_cli import run_argv
from lt_recording_server import RecordingServer

from slo_loadtest import guidellm_adapter as gl
from slo_loadtest.cli import cli
from slo_loadtest.credentials import has_userinfo, redact_url, scrub, split_userinfo
from slo_loadtest.validation import check_target

USER = "loadtester"
# percent-encoded in the URL ('%2F' is '/'), as a password with reserved characters must be
PASSWORD = "pw%2FS3cr3t-7d41"
DECODED = "pw/S3cr3t-7d41"
BASIC = "Basic " + base64.b64encode(f"{USER}:{DECODED}".encode()).decode()
# every form the secret could be written in
SECRETS = (PASSWORD, DECODED, f"{USER}:", BASIC.split()[1], "S3cr3t-7d41")


def _with_credentials(url: str, password: str = PASSWORD) -> str:
    return url.replace("http://", f"http://{USER}:{password}@")


def _run(target: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`slo-loadtest run`, one text rate, as a user runs it (a subprocess)."""
    return subprocess.run(
        run_argv(
            target, "--workloads", "text", "--rates", "2", "--duration", "4", "--warmup", "0",
            "--prompt-tokens", "20", "--max-workers", "1", "--no-plots", "--out", str(out), *extra,
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip


def _leaks(out: Path, *texts: str) -> list[str]:
    """Where any form of the secret appears: files under ``out`` (every byte), and ``texts``."""
    found = [
        f"{p}: {s!r}"
        for p in out.rglob("*")
        if p.is_file()
        for s in SECRETS
        if s.encode() in p.read_bytes()
    ]
    found += [f"output: {s!r}" for t in texts for s in SECRETS if s in t]
    return found


def test_url_credentials_authenticate_every_request_and_reach_no_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with RecordingServer(require_authorization=BASIC) as srv:
        proc = _run(_with_credentials(srv.url), out)
    # pass or fail; inconclusive (3) where a busy machine made the client fall behind
    assert proc.returncode in (0, 1, 3), proc.stderr
    # authenticated: the preflight (GET /v1/models, one plain POST) and guidellm's streamed
    # requests, sent from its worker processes, all carried the credentials; none was refused
    assert srv.plain_bodies and len(srv.bodies) >= 4, (srv.requests, proc.stderr)
    assert {auth for _, _, auth in srv.requests} == {BASIC}, srv.requests
    assert any(m == "GET" and p == "/v1/models" for m, p, _ in srv.requests)
    s = json.loads((out / "summary.json").read_text())
    (r,) = s["results"]
    assert s["verdict"] in ("pass", "fail", "inconclusive"), proc.stderr
    assert r["status"] == "ok" and r["measurement"]["successful"] > 0, r
    assert r["measurement"]["errored"] == 0, r
    # the outputs name the server without its credentials
    assert s["target"] == srv.url and s["config"]["target"] == srv.url
    step = out / "steps" / "text-r2"
    assert json.loads((step / "scenario.json").read_text())["spec"]["backend"]["target"] == srv.url
    report = json.loads((step / gl.REPORT_NAME).read_text())
    assert report["config"]["spec"]["backend"]["target"] == srv.url
    assert f"target {srv.url}," in proc.stderr
    # and nothing written or printed carries them, in any form
    assert not _leaks(out, proc.stdout, proc.stderr), _leaks(out, proc.stdout, proc.stderr)


def test_wrong_url_credentials_stop_at_the_preflight_without_being_quoted(tmp_path: Path) -> None:
    """The server's 401 is reported (exit 3, partial report), the URL it quotes has no
    credentials, and the wrong password is nowhere either."""
    out = tmp_path / "out"
    with RecordingServer(require_authorization=BASIC) as srv:
        proc = _run(_with_credentials(srv.url, "Wr0ng-Pw-55e1"), out)
    assert proc.returncode == 3, proc.stderr
    assert "HTTP 401" in proc.stderr and f"{srv.url}/v1/models" in proc.stderr, proc.stderr
    assert not srv.bodies  # no guidellm run
    s = json.loads((out / "summary.json").read_text())
    assert "HTTP 401" in s["aborted"]["reason"]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files
    for p in files:
        for secret in ("Wr0ng-Pw-55e1", f"{USER}:"):
            assert secret.encode() not in p.read_bytes(), (p, secret)
    assert "Wr0ng-Pw-55e1" not in proc.stdout + proc.stderr


def test_url_credentials_and_an_api_key_are_refused_together(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        cli,
        ["run", "--target", _with_credentials("http://127.0.0.1:9"), "--api-key", "sk-Zz91x",
         "--out", str(tmp_path / "out")],
    )  # fmt: skip
    assert r.exit_code == 2 and "not both" in r.output, r.output
    assert not any(s in r.output for s in (*SECRETS, "sk-Zz91x")), r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("ftp://u:Pw-Bad-1@h:21", "is not an http:// or https:// URL"),
        ("http://u:Pw-Bad-1@h:99999", "has an invalid port"),
        ("http://u:Pw-Bad-1@h:8000/v1?token=Tk-Bad-2", "a query or fragment is not supported"),
        ("http://h:8000/#Tk-Bad-2", "a query or fragment is not supported"),
    ],
)
def test_bad_targets_are_named_without_their_credentials(target: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as exc:
        check_target(target)
    assert "Pw-Bad-1" not in str(exc.value) and "Tk-Bad-2" not in str(exc.value), exc.value
    r = CliRunner().invoke(cli, ["run", "--target", target])
    assert r.exit_code == 2 and message in r.output, r.output
    assert "Pw-Bad-1" not in r.output and "Tk-Bad-2" not in r.output, r.output


def test_url_helpers() -> None:
    assert split_userinfo("http://h:8000/v1") == ("http://h:8000/v1", "")
    assert split_userinfo(_with_credentials("http://h:8000/v1")) == ("http://h:8000/v1", BASIC)
    # a user alone (a token as user name) is Basic with an empty password, as httpx and curl send
    assert split_userinfo("https://tok@h")[1] == "Basic " + base64.b64encode(b"tok:").decode()
    assert redact_url("http://u:p@[::1]:8000/v1?t=1") == "http://[::1]:8000/v1"
    assert redact_url("u:p@pg:9091") == "pg:9091"  # a Pushgateway without scheme
    assert redact_url("http://u:p@h:99999/x?t=1") == "http://h:99999/x"  # unparsable port
    assert scrub("GET 'http://u:p@h/v1' failed; see https://docs") == (
        "GET 'http://***@h/v1' failed; see https://docs"
    )
    assert has_userinfo("--pushgateway=http://u:p@pg:9091") and not has_userinfo("http://h/a@b")


def test_errors_quoting_a_url_with_credentials_are_scrubbed() -> None:
    """An error text in a guidellm report (e.g. one written before this version, or by a
    guidellm that was given such a target) reaches summary.json and report.md scrubbed."""
    b = {
        "requests": {
            "errored": [
                {"info": {"error": f"HTTPStatusError: 401 for url '{_with_credentials('http://h')}"
                          "/v1/chat/completions'\\nFor more information check: https://x"}}
            ] * 2
        }
    }  # fmt: skip
    (line,) = gl.top_errors(b)
    assert line == "2 x HTTPStatusError: 401 for url 'http://***@h/v1/chat/completions'", line


def test_k8s_start_refuses_credentials_in_plain_text() -> None:
    """The Job spec is readable by whoever reads Jobs, `--dry-run` prints it and the pod script
    echoes the target into the pod log: credentials go through --api-key-secret, not there."""
    start = ["k8s", "start", "--release", "g4", "--image", "i", "--dry-run"]
    for more, hint in (
        (["--target", _with_credentials("http://vllm:8000")], "'--target'"),
        (["--set", f"pushgateway={_with_credentials('http://pg:9091')}"], "pushgateway"),
        (["--arg", "--api-key=sk-Zz91x"], "'--arg'"),
        (["--arg", "--api-key", "--arg", "sk-Zz91x"], "'--arg'"),
        (["--arg", f"--pushgateway={_with_credentials('http://pg:9091')}"], "'--arg'"),
    ):
        r = CliRunner().invoke(cli, [*start, *more])
        assert r.exit_code == 2 and hint in r.output, (more, r.output)
        assert "--api-key-secret" in r.output or "Pushgateway" in r.output, r.output
        assert not any(s in r.output for s in (*SECRETS, "sk-Zz91x")), r.output
    r = CliRunner().invoke(cli, [*start, "--target", "http://vllm:8000"])
    assert r.exit_code == 0, r.output
