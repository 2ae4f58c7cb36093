"""What guidellm 0.8.1 really sends for our datasets, and how its runs are bounded: real
guidellm subprocesses through the adapter against a real local HTTP server that records every
request body (tests/lt_recording_server.py)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path

from lt_cli import run_argv
from lt_recording_server import RecordingServer

from slo_loadtest import guidellm_adapter as gl
from slo_loadtest.config import WorkloadShape
from slo_loadtest.dataset import DatasetWriter

SHAPE = WorkloadShape(
    prompt_tokens=40,
    video_frames=2,
    video_width=64,
    video_height=48,
    image_width=64,
    image_height=48,
    images_per_request=2,
)


def _spec(srv: RecordingServer, ds: Path, step: Path, **kw: object) -> gl.StepSpec:
    return gl.StepSpec(
        target=srv.url,
        model=srv.model,
        rate=2,
        duration_s=3,
        warmup_s=0,
        data_path=ds,
        step_dir=step,
        max_workers=1,
        labels={"workload": "video"},
        **kw,
    )  # type: ignore[arg-type]


def test_video_rows_become_video_url_data_urls(tmp_path: Path) -> None:
    ds = DatasetWriter(tmp_path / "d", SHAPE, seed=5).write("video", 2, 3, "r2")
    rows = [json.loads(x) for x in ds.path.read_text().splitlines()]
    with RecordingServer() as srv:
        out = gl.run_step(_spec(srv, ds.path, tmp_path / "s"), timeout_s=240)
    assert out.status == "ok", out.message
    assert srv.bodies, "guidellm sent nothing"
    body = srv.bodies[0]
    assert body["model"] == srv.model and body["stream"] is True
    assert body["max_completion_tokens"] == 10 and body["ignore_eos"] is True
    (msg,) = body["messages"]
    text, video = msg["content"]
    assert text == {"type": "text", "text": rows[0]["prompt"]}
    assert video["type"] == "video_url"
    url = video["video_url"]["url"]
    assert url.startswith("data:video/mp4;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == Path(rows[0]["video"]).read_bytes()
    sent = {b["messages"][0]["content"][0]["text"] for b in srv.bodies}
    assert len(sent) == len(srv.bodies), "a row was sent twice"
    # the report: our labels, the version, one benchmark at the target rate
    rep = gl.load_report(out.report_path)
    assert rep.guidellm_version == "0.8.1" and rep.measurements[0].target_rate == 2
    assert rep.measurements[0].labels["workload"] == "video"
    assert rep.measurements[0].successful >= 4
    assert out.report_path.stat().st_size < 300_000  # sample_size keeps it small
    scenario = json.loads((tmp_path / "s" / "scenario.json").read_text())
    assert scenario["spec"]["profile"] == {"kind": "constant", "rate": [2], "warmup": 0}


def test_several_images_go_as_one_message(tmp_path: Path) -> None:
    ds = DatasetWriter(tmp_path / "d", SHAPE, seed=5).write("image", 2, 3, "r2")
    with RecordingServer() as srv:
        out = gl.run_step(_spec(srv, ds.path, tmp_path / "s"), timeout_s=240)
    assert out.status == "ok", out.message
    parts = srv.bodies[0]["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["text", "image_url", "image_url"]
    assert set(parts[1]) == {"type", "image_url"}  # no null keys from the jsonl round trip


def test_a_hung_guidellm_is_killed_at_the_bound(tmp_path: Path) -> None:
    """guidellm 0.8.1 waits forever when every row is unusable (here: a list in the image
    column); the adapter kills its whole process group at the wall-time bound."""
    ds = tmp_path / "bad.jsonl"
    ds.write_text(
        "".join(
            json.dumps({"prompt": "x", "image": ["/a.jpg", "/b.jpg"], "output_tokens_count": 10})
            + "\n"
            for _ in range(10)
        )
    )
    with RecordingServer() as srv:
        t0 = time.monotonic()
        out = gl.run_step(_spec(srv, ds, tmp_path / "s"), timeout_s=45)
        took = time.monotonic() - t0
    assert out.status == "timeout" and out.report_path is None
    assert 45 <= took < 45 + 25
    assert "did not finish within 45 s" in out.message
    log = (tmp_path / "s" / "guidellm.log").read_text()
    assert "Unsupported image type" in log
    # nothing of that run survives: guidellm's workers ran in its process group
    for pid in _pids_with(str(tmp_path / "s" / "scenario.json")):
        raise AssertionError(f"guidellm process {pid} outlived the bound")


def _pids_with(needle: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                    found.append(int(d.name))
            except OSError:
                continue
    return [p for p in found if p != os.getpid() and _alive(p)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False


def test_scenario_validates_with_guidellms_own_model(tmp_path: Path) -> None:
    """The scenario we write is what guidellm 0.8.1's BenchmarkScenario accepts, and a warm-up
    below one second stays seconds (a bare 0.5 would mean 50 % of the duration)."""
    from guidellm.schemas.benchmark import BenchmarkScenario

    spec = gl.StepSpec(
        target="http://127.0.0.1:1/v1",
        model="m",
        rate=2.5,
        duration_s=10,
        warmup_s=0.5,
        data_path=tmp_path / "d.jsonl",
        step_dir=tmp_path / "s",
        tokenizer=str(tmp_path),
        sample_size=3,
        extra_body={"skip_special_tokens": False, "chat_template_kwargs": {"x": 1}},
    )
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(gl.build_scenario(spec)))
    (bench,) = BenchmarkScenario.create(scenario=path).get_benchmarks()
    assert bench.backend.target == "http://127.0.0.1:1" and bench.backend.model == "m"
    assert bench.profile.kind == "constant" and bench.profile.rate == [2.5]
    assert bench.profile.warmup.compute_limits(None, 10.0) == (0.5, None)
    assert bench.constraints[0].seconds == 10
    assert bench.metrics.sample_size == 3 and bench.tokenizer.model == str(tmp_path)
    assert bench.backend.extras.body == {
        "skip_special_tokens": False,
        "chat_template_kwargs": {"x": 1},
    }
    # no extra body: no extras at all (guidellm's own defaults)
    plain = gl.build_scenario(gl.StepSpec(**{**spec.__dict__, "extra_body": {}}))
    assert "extras" not in plain["spec"]["backend"]


def _run_cli(srv: RecordingServer, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`slo-loadtest run`, one text rate, as a user runs it (a subprocess)."""
    return subprocess.run(
        run_argv(
            srv.url,
            "--workloads",
            "text",
            "--rates",
            "2",
            "--duration",
            "4",
            "--warmup",
            "0",
            "--prompt-tokens",
            "20",
            "--max-workers",
            "1",
            "--no-plots",
            "--out",
            str(out),
            *extra,
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )


EXTRA = {
    "skip_special_tokens": False,
    "temperature": 0,
    "chat_template_kwargs": {"enable_thinking": False},
}


def test_extra_body_arrives_in_every_request(tmp_path: Path) -> None:
    """--extra-body travels CLI -> config -> scenario -> guidellm -> every request body, next to
    (not over) what guidellm sets; against a server that streams text only when asked for its
    special tokens (a dummy-weight model), TTFT is measured again."""
    out = tmp_path / "out"
    with RecordingServer(special_tokens_only=True) as srv:
        proc = _run_cli(srv, out, "--extra-body", json.dumps(EXTRA))
    assert proc.returncode in (0, 1), proc.stderr
    assert srv.bodies, "guidellm sent nothing"
    (probe,) = srv.plain_bodies  # the preflight request carries it too
    assert {k: probe[k] for k in EXTRA} == EXTRA
    for body in srv.bodies:
        assert {k: body[k] for k in EXTRA} == EXTRA
        assert body["model"] == srv.model and body["stream"] is True
        assert body["max_completion_tokens"] == 10 and body["ignore_eos"] is True
        assert body["stream_options"]["include_usage"] is True
        assert body["messages"][0]["content"]
    s = json.loads((out / "summary.json").read_text())
    assert s["config"]["extra_body"] == EXTRA
    (r,) = s["results"]
    m = r["measurement"]
    assert m["successful"] > 0 and m["ttft_samples"] == m["successful"]
    assert m["ttft_p95_ms"] is not None and r["notes"] == []
    md = (out / "report.md").read_text()
    assert f"extra request body: `{json.dumps(EXTRA, sort_keys=True)}`" in md
    assert "not (fully) measured" not in md
    step = out / "steps" / "text-r2"
    scenario = json.loads((step / "scenario.json").read_text())
    assert scenario["spec"]["backend"]["extras"] == {"body": EXTRA}


def test_no_streamed_content_is_diagnosed(tmp_path: Path) -> None:
    """The H200 case: every request succeeds but streams only empty deltas (special tokens
    skipped), so guidellm has no TTFT. The rate is still judged on total latency; the notes,
    the log and the report say what happened and how to fix it."""
    out = tmp_path / "out"
    with RecordingServer(special_tokens_only=True) as srv:
        proc = _run_cli(srv, out)
    assert proc.returncode in (0, 1), proc.stderr
    assert all("skip_special_tokens" not in b for b in srv.bodies)
    s = json.loads((out / "summary.json").read_text())
    assert s["config"]["extra_body"] == {}
    (r,) = s["results"]
    m = r["measurement"]
    assert r["status"] == "ok" and m["successful"] > 0 and m["ttft_samples"] == 0
    assert m["ttft_p95_ms"] is None and m["latency_p95_ms"] is not None
    (note,) = r["notes"]
    assert (
        note.startswith("no streamed content arrived") and f"{m['successful']} successful" in note
    )
    assert r["passed"] == (not r["reasons"])  # notes are not reasons
    assert not any("TTFT" in x or "content" in x for x in r["reasons"])
    assert "note: no streamed content arrived" in proc.stderr
    assert """--extra-body '{"skip_special_tokens": false}'""" in proc.stderr
    md = (out / "report.md").read_text()
    assert "**TTFT/ITL not (fully) measured** at text 2 req/s" in md
    assert """--extra-body '{"skip_special_tokens": false}'""" in md
    assert "## Notes" in md and "- text 2 req/s: no streamed content arrived" in md
    assert "- extra request body" not in md and "| extra request body | none |" in md


def test_no_content_hint_knows_the_request_body(tmp_path: Path) -> None:
    """With skip_special_tokens already false (the H100 sitting's sweeps), requests that still
    stream no text are not told to pass it: the hint names what is left."""
    out = tmp_path / "out"
    with RecordingServer(no_text=True) as srv:
        proc = _run_cli(srv, out, "--extra-body", json.dumps(EXTRA))
    assert proc.returncode in (0, 1), proc.stderr
    (r,) = json.loads((out / "summary.json").read_text())["results"]
    assert r["notes"] and r["notes"][0].startswith("no streamed content arrived")
    md = (out / "report.md").read_text()
    for text in (proc.stderr, md):
        assert "the requests already set skip_special_tokens false" in text
        assert "byte tokens that never complete a UTF-8 character" in text
        assert "--extra-body '{" not in text


def test_connection_per_request_closes_every_connection(tmp_path: Path) -> None:
    """--connection-per-request travels CLI -> config -> scenario -> guidellm -> every request as
    `Connection: close` (httpx then opens a new connection for the next request: what spreads
    requests over vLLM's API-server processes, bench/api_server_balance.py); without it, none."""
    for flag in ("", "--connection-per-request"):
        out = tmp_path / (flag or "keep-alive")
        with RecordingServer() as srv:
            proc = _run_cli(srv, out, *([flag] if flag else []))
        assert proc.returncode in (0, 1), proc.stderr
        assert len(srv.connection_headers) >= 4, "too few requests to tell"
        on = flag == "--connection-per-request"
        assert all(
            (h or "").lower() == ("close" if on else "keep-alive") for h in srv.connection_headers
        ), srv.connection_headers
        scenario = json.loads((out / "steps" / "text-r2" / "scenario.json").read_text())
        expected = {"headers": {"Connection": "close"}} if on else None
        assert scenario["spec"]["backend"].get("extras") == expected
        summary = json.loads((out / "summary.json").read_text())
        assert summary["config"]["connection_per_request"] is on


def test_the_api_key_reaches_the_server_but_no_file(tmp_path: Path) -> None:
    """The key authenticates every request (guidellm reads it from its environment), and no
    file of the run (scenario, logs, reports, summary, data) contains it."""
    key = "sk-test-9f3c1e77d2b04a8b"
    out = tmp_path / "out"
    with RecordingServer() as srv:
        proc = _run_cli(srv, out, "--api-key", key)
    assert proc.returncode in (0, 1), proc.stderr
    assert srv.authorization and set(srv.authorization) == {f"Bearer {key}"}
    files = [p for p in out.rglob("*") if p.is_file()]
    assert any(p.name == "scenario.json" for p in files)
    leaked = [str(p) for p in files if key.encode() in p.read_bytes()]
    assert not leaked, leaked
    assert key not in proc.stdout + proc.stderr
