"""A short real sweep (2 low rates x 8 s, text and video) against the shared real vLLM-CPU
server, through the installed CLI, producing the report and the plots."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.e2e
def test_short_sweep_against_real_vllm(vllm_server, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    cmd = [
        sys.executable, "-m", "slo_loadtest.cli", "run",
        "--target", vllm_server.url, "--model", vllm_server.model,
        "--workloads", "text,video", "--rates", "0.5,1", "--duration", "8", "--warmup", "1",
        "--prompt-tokens", "100", "--video-frames", "2", "--video-width", "64",
        "--video-height", "48", "--tokenizer", str(vllm_server.model_path),
        "--max-workers", "1", "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=800)
    s = json.loads((out / "summary.json").read_text())
    # pass or fail on the SLO, never incomplete; inconclusive (exit 3) only if this busy machine
    # could not send even 1 req/s on time
    assert proc.returncode in (0, 1) or s["verdict"] == "inconclusive", proc.stderr
    assert s["schema_version"] == 1 and s["complete"] and s["guidellm_version"] == "0.8.1"
    assert s["model"] == vllm_server.model
    assert [(r["workload"], r["target_rate"], r["status"]) for r in s["results"]] == [
        ("text", 0.5, "ok"),
        ("text", 1.0, "ok"),
        ("video", 0.5, "ok"),
        ("video", 1.0, "ok"),
    ]
    for r in s["results"]:
        m = r["measurement"]
        assert m["successful"] + m["incomplete"] + m["errored"] > 0
        assert m["errored"] == 0, r  # vLLM accepted every text and video request
        assert r["passed"] == (not r["reasons"])
    text1 = s["results"][0]["measurement"]
    assert text1["successful"] > 0 and text1["ttft_p95_ms"] > 0
    assert text1["prompt_tokens_mean"] >= 100  # sized with the served model's tokenizer
    assert text1["output_tokens_mean"] == 10
    # vLLM decoded our mp4s and answered: some video requests completed and were measured
    video = [r["measurement"] for r in s["results"] if r["workload"] == "video"]
    assert sum(m["successful"] for m in video) > 0, video
    assert any(m["ttft_p95_ms"] for m in video)
    for w in ("text", "video"):
        assert w in s["workloads"]
        assert (out / "steps" / f"{w}-r0p5" / "guidellm-report.json").exists()
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 4
    # the run's configuration in every row, after the measurements
    for row in rows:
        assert row["config_target"] == vllm_server.url.rstrip("/")
        assert row["config_model"] == vllm_server.model
        assert (row["config_rates"], row["config_duration_s"]) == ("0.5,1", "8")
        assert (row["config_prompt_tokens"], row["config_output_tokens"]) == ("100", "10")
        assert row["config_video_frames"] == "2" and row["config_slo_ms"] == "300"
        assert row["config_started_at"] <= s["created_at"] and row["tool_version"]
    md = (out / "report.md").read_text()
    assert "Highest passing rate" in md
    config = md.split("## Configuration", 1)[1]
    assert "| rates (req/s) | 0.5, 1 |" in config and "| duration per rate | 8 s |" in config
    assert "| video | 2 frames, 64x48 at 2 fps, mpeg4 |" in config
    assert f"| started | {s['config']['started_at']} |" in config
    assert "| guidellm | 0.8.1 |" in config
    assert (out / "latency-vs-rate.png").stat().st_size > 5000


def _one_rate(vllm_server, out: Path, workload: str, *args: str) -> Path:
    """One 8 s rate of one workload at 0.5 req/s through the installed CLI; pass or fail on the
    SLO, never an error exit."""
    cmd = [
        sys.executable, "-m", "slo_loadtest.cli", "run",
        "--target", vllm_server.url, "--workloads", workload, "--rates", "0.5",
        "--duration", "8", "--warmup", "0", "--media-prompt-tokens", "8",
        "--tokenizer", str(vllm_server.model_path), "--max-workers", "1", "--out", str(out), *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    verdict = json.loads((out / "summary.json").read_text())["verdict"]
    assert proc.returncode in (0, 1) or verdict == "inconclusive", proc.stderr
    return out


@pytest.mark.e2e
def test_image_workload_with_two_images_per_request(vllm_server, tmp_path: Path) -> None:
    """The optional image workload (two images per request, sent as one OpenAI message) is
    accepted by vLLM: no request errors."""
    out = _one_rate(
        vllm_server, tmp_path / "img", "image", "--images-per-request", "2",
        "--image-width", "64", "--image-height", "48",
    )  # fmt: skip
    s = json.loads((out / "summary.json").read_text())
    (r,) = s["results"]
    assert r["status"] == "ok" and s["model"] == vllm_server.model
    m = r["measurement"]
    assert m["errored"] == 0, r
    assert m["successful"] + m["incomplete"] > 0


@pytest.mark.e2e
def test_h264_videos_are_served(vllm_server, tmp_path: Path) -> None:
    """--video-codec h264: vLLM's loader decodes the H.264 clips and answers every request."""
    out = _one_rate(
        vllm_server, tmp_path / "h264", "video", "--video-codec", "h264", "--video-frames", "2",
        "--video-width", "64", "--video-height", "48",
    )  # fmt: skip
    s = json.loads((out / "summary.json").read_text())
    (r,) = s["results"]
    assert r["status"] == "ok" and s["config"]["video_codec"] == "h264"
    m = r["measurement"]
    assert m["errored"] == 0, r
    assert m["successful"] > 0, r
    assert list((out / "data" / "media").glob("*-h264-*.mp4"))
