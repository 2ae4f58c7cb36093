"""The run configuration in report.md and results.csv (no credentials), and `compare`'s warning
when the compared runs were not configured alike."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from slo_loadtest.cli import cli
from slo_loadtest.config import SweepConfig
from slo_loadtest.guidellm_adapter import load_report
from slo_loadtest.outputs import write_outputs
from slo_loadtest.summary import build_summary
from slo_loadtest.sweep import config_record
from slo_loadtest.verdict import RateResult

FIXTURES = Path(__file__).parent / "fixtures"
# the columns results.csv had before the configuration was added: kept first, in this order
OLD_COLUMNS = [
    "workload", "target_rate", "status", "passed", "achieved_rate", "guidellm_rps_mean",
    "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "itl_median_ms", "itl_p95_ms", "latency_p50_ms",
    "latency_p95_ms", "latency_p99_ms", "latency_p95_ci_low_ms", "latency_p95_ci_high_ms",
    "successful", "errored", "incomplete", "dispatch_delay_median_ms", "dispatch_delay_p95_ms",
    "prompt_tokens_mean", "output_tokens_mean", "duration_s", "stop_reason", "search_probe",
    "wall_s", "guidellm_version", "reasons", "message", "notes",
]  # fmt: skip


def _run(out: Path, model: str = "gemma4-tiny", **changes: object) -> Path:
    """A run directory as `slo-loadtest run` writes it, from a recorded guidellm report."""
    cfg = SweepConfig(
        target="http://user:s3cret@vllm.example:8000/v1?token=t0ken",
        pushgateway="http://pg-user:pg-pass@pushgateway:9091",
        workloads=("text",),
        rates=(1.0,),
        duration_s=20.0,
        out=out,
    ).with_(**changes)
    m = load_report(FIXTURES / "text-1rps.json").measurements[0]
    summary = build_summary(
        [RateResult(workload="text", target_rate=m.target_rate, measurement=m)],
        cfg.criteria,
        workloads=cfg.workloads,
        target=cfg.target,
        model=model,
        guidellm_version="0.8.1",
        config={**config_record(cfg, 1234), "started_at": "2026-12-05T04:00:00+00:00"},
    )
    write_outputs(summary, out, with_plots=False)
    return out


def test_report_and_csv_carry_the_run_configuration_without_credentials(tmp_path: Path) -> None:
    out = _run(tmp_path / "run", rates=(1.0, 2.5), prompt_tokens=300, output_tokens=12)
    for name in ("summary.json", "results.csv", "report.md"):
        text = (out / name).read_text()
        for secret in ("s3cret", "t0ken", "pg-pass", "user:"):
            assert secret not in text, (name, secret)
    md = (out / "report.md").read_text()
    assert "- target: `http://vllm.example:8000/v1`, model: `gemma4-tiny`" in md
    config = md.split("## Configuration", 1)[1]
    for row in (
        "| target | `http://vllm.example:8000/v1` |",
        "| model | `gemma4-tiny` |",
        "| rates (req/s) | 1, 2.5 |",
        "| duration per rate | 20 s |",
        "| warm-up (inside the duration, not measured) | 5 s |",
        "| text prompt tokens | 300 |",
        "| output tokens (every request) | 12 |",
        "| SLO: p95 total latency | 300 ms |",
        "| guidellm | 0.8.1 |",
        "| started | 2026-12-05T04:00:00+00:00 |",
        "| seed | 1234 |",
    ):
        assert row in config, row
    assert "| slo-loadtest | 0.1.0 |" in config
    assert "| video |" not in config  # a text-only run has no video settings to show

    with (out / "results.csv").open(newline="") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        (row,) = list(reader)
    # old consumers (by position or by name) keep working: the new columns come last
    assert header[: len(OLD_COLUMNS)] == OLD_COLUMNS
    assert header[len(OLD_COLUMNS)] == "verdict"
    assert all(c.startswith("config_") or c == "tool_version" for c in header[32:])
    assert row["config_target"] == "http://vllm.example:8000/v1"
    assert row["config_model"] == "gemma4-tiny" and row["config_rates"] == "1,2.5"
    assert (row["config_duration_s"], row["config_warmup_s"]) == ("20", "5")
    assert (row["config_prompt_tokens"], row["config_output_tokens"]) == ("300", "12")
    assert row["config_slo_ms"] == "300" and row["config_video_codec"] == "mpeg4"
    assert row["config_started_at"] == "2026-12-05T04:00:00+00:00"
    assert row["tool_version"] == "0.1.0" and row["guidellm_version"] == "0.8.1"


def test_analyze_keeps_the_configuration_of_the_run(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", output_tokens=12)
    r = CliRunner().invoke(cli, ["analyze", str(run), "--out", str(tmp_path / "again")])
    assert r.exit_code in (0, 1), r.output
    md = (tmp_path / "again" / "report.md").read_text().split("## Configuration", 1)[1]
    assert "| output tokens (every request) | 12 |" in md
    assert "| started | 2026-12-05T04:00:00+00:00 |" in md
    # a raw guidellm report carries no sweep configuration: said so, not invented
    r = CliRunner().invoke(cli, ["analyze", str(FIXTURES / "text-1rps.json")])
    assert "| duration per rate | not recorded |" in r.stdout


def compare(*args: str | Path):
    return CliRunner().invoke(cli, ["compare", *(str(a) for a in args)])


def test_compare_warns_when_the_configurations_differ(tmp_path: Path) -> None:
    a = _run(tmp_path / "a")
    b = _run(tmp_path / "b", model="gemma4-other", output_tokens=20, duration_s=10.0, slo_ms=250.0)
    r = compare(f"before={a}", f"after={b}", "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    err = r.stderr.splitlines()
    assert err[0].startswith(
        "warning: the configurations differ in model, duration_s, output_tokens, slo_ms: "
        "these runs are not like for like"
    ), err
    assert "warning: output_tokens: before 10, after 20" in err
    assert "warning: duration_s: before 20, after 10" in err
    assert "warning: model: before gemma4-tiny, after gemma4-other" in err
    assert "warning" not in r.stdout  # stdout stays the tables
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "**Warning: the configurations differ in model, duration_s, output_tokens, slo_ms" in md
    assert "- slo_ms: before 300, after 250" in md
    assert "| output_tokens | 10 | 20 | **yes** |" in md
    assert "| prompt_tokens | 500 | 500 |  |" in md


def test_compare_alike_runs_quietly_even_from_a_bare_results_csv(tmp_path: Path) -> None:
    """The configuration read from results.csv's columns equals the one from summary.json;
    settings of a workload not compared (video here) do not count; a run that recorded no
    configuration is named as unchecked."""
    a = _run(tmp_path / "a", video_width=320)
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(_run(tmp_path / "b", seed=7) / "results.csv", bare / "results.csv")
    r = compare(f"a={a}", f"b={bare}", "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    assert r.stderr.strip().splitlines() == [
        f"wrote {tmp_path / 'cmp' / 'compare.md'} and 1 plot(s)"
    ]
    assert "Warning" not in (tmp_path / "cmp" / "compare.md").read_text()
    # an older results.csv without the config columns
    old = tmp_path / "old"
    old.mkdir()
    with (a / "results.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    with (old / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=OLD_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    r = compare(f"a={a}", f"old={old}", "--out", tmp_path / "cmp2")
    assert r.exit_code == 0, r.output
    assert "warning: old: no recorded configuration" in r.stderr
    assert "Note: old: no recorded configuration" in (tmp_path / "cmp2" / "compare.md").read_text()
    assert json.loads((a / "summary.json").read_text())["config"]["video_width"] == 320
