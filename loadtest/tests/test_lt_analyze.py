"""The verdict and every output, from guidellm 0.8.1 JSON reports recorded against the real local
vLLM (tests/fixtures, produced by tests/fixtures/record_fixtures.py)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slo_loadtest.cli import cli
from slo_loadtest.config import Criteria
from slo_loadtest.guidellm_adapter import load_report
from slo_loadtest.summary import build_summary
from slo_loadtest.verdict import RateResult, allowed_incomplete, judge, judge_result

FIXTURES = Path(__file__).parent / "fixtures"
LENIENT = Criteria(
    slo_ms=600_000, min_achieved_ratio=0.0, max_error_ratio=1.0, max_dispatch_delay_ms=600_000
)


def m(name: str):
    (one,) = load_report(FIXTURES / f"{name}.json").measurements
    return one


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.name)
def test_fixtures_are_real_small_guidellm_081_reports(path: Path) -> None:
    assert path.stat().st_size < 300_000
    rep = load_report(path)
    assert rep.guidellm_version == "0.8.1"
    (one,) = rep.measurements
    assert one.labels["fixture"] == path.stem
    assert one.target_rate == float(one.labels["rate"])


def test_ordinary_run_is_measured() -> None:
    x = m("text-1rps")
    assert x.successful > 0 and x.errored == 0
    for v in (
        x.ttft_p50_ms,
        x.ttft_p95_ms,
        x.ttft_p99_ms,
        x.itl_median_ms,
        x.itl_p95_ms,
        x.latency_p95_ms,
        x.dispatch_delay_p95_ms,
        x.achieved_rate,
    ):
        assert v is not None and v > 0
    assert x.ttft_p50_ms <= x.ttft_p95_ms <= x.ttft_p99_ms
    assert x.latency_p95_ms >= x.ttft_p95_ms
    assert x.output_tokens_mean == 10
    # every successful request streamed content: TTFT of each, and no content note
    assert x.ttft_samples == x.successful
    from slo_loadtest.verdict import content_notes

    assert content_notes(x) == []
    assert x.prompt_tokens_mean >= 100  # sized with the model's own tokenizer
    assert x.stop_reason == "max_duration"
    ok, reasons = judge(x, LENIENT)
    assert ok, reasons
    # the same run against a 1 ms SLO fails on latency and only on latency
    ok, reasons = judge(
        x,
        Criteria(
            slo_ms=1, min_achieved_ratio=0.0, max_error_ratio=1.0, max_dispatch_delay_ms=600_000
        ),
    )
    assert not ok and any("> SLO 1 ms" in r for r in reasons)


def test_errors_fail_the_rate() -> None:
    x = m("video-errors")
    assert x.errored > 0
    ok, reasons = judge(x, LENIENT.__class__(**{**LENIENT.__dict__, "max_error_ratio": 0.01}))
    assert not ok and any(r.startswith("errors ") for r in reasons), reasons


def test_incompletes_beyond_the_in_flight_allowance_fail() -> None:
    x = m("video-incomplete")
    assert x.incomplete > allowed_incomplete(x.target_rate, 300)
    ok, reasons = judge(
        x,
        Criteria(
            slo_ms=300, min_achieved_ratio=0.0, max_error_ratio=1.0, max_dispatch_delay_ms=600_000
        ),
    )
    assert not ok and any("incomplete" in r for r in reasons), reasons


def test_client_that_fell_behind_is_inconclusive(tmp_path: Path) -> None:
    """The recorded run where one worker on 2 cores could not send 150 req/s: the rate is not
    judged (README: the verdict refuses to), and analyze exits 3, not 1."""
    x = m("text-fell-behind")
    assert x.dispatch_delay_p95_ms > 50
    assert x.achieved_rate < 0.95 * x.target_rate
    behind = Criteria(
        slo_ms=600_000, min_achieved_ratio=0.0, max_error_ratio=1.0, max_dispatch_delay_ms=50
    )
    ok, reasons = judge(x, behind)
    assert not ok and any("client fell behind" in r for r in reasons), reasons
    r = judge_result(RateResult(workload="text", target_rate=x.target_rate, measurement=x), behind)
    assert r.inconclusive and not r.passed
    ok, reasons = judge(
        x,
        Criteria(
            slo_ms=600_000,
            min_achieved_ratio=0.95,
            max_error_ratio=1.0,
            max_dispatch_delay_ms=600_000,
        ),
    )
    assert not ok and any(r.startswith("achieved") for r in reasons), reasons
    out = tmp_path / "behind"
    res = CliRunner().invoke(
        cli,
        ["analyze", str(FIXTURES / "text-fell-behind.json"), "--slo-ms", "600000",
         "--max-error-ratio", "1", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 3, res.output
    assert "verdict: INCONCLUSIVE" in res.output and "inconclusive from" in res.output
    s = json.loads((out / "summary.json").read_text())
    assert s["verdict"] == "inconclusive" and s["complete"]
    assert s["workloads"]["text"]["first_inconclusive_rate"] == x.target_rate
    assert "- verdict: **INCONCLUSIVE**" in (out / "report.md").read_text()
    (row,) = csv.DictReader((out / "results.csv").open())
    assert row["verdict"] == "inconclusive"


def test_a_fell_behind_rate_with_a_server_failure_fails_not_inconclusive() -> None:
    """The recorded fell-behind rate (0 successful, 187 incomplete, p95 dispatch delay 1760 ms)
    with errors or an exhausted dataset injected: "client fell behind" makes a rate
    inconclusive only when every other reason depends on the client's pace (p95 over the SLO,
    achieved rate short, incomplete requests, nothing finished while requests were in flight).
    Errors above the maximum, the dataset running out, or no request succeeding with none left
    in flight say the server (or the run) failed, whatever the client's pace: fail, exit 1."""
    from dataclasses import replace

    from slo_loadtest.cli import exit_code
    from slo_loadtest.exit_codes import EXIT_FAIL, EXIT_INCOMPLETE

    x = m("text-fell-behind")
    assert (x.successful, x.errored, x.incomplete) == (0, 0, 187)
    crit = Criteria()  # 300 ms, 1 % errors, 50 ms dispatch delay

    def summary(meas, c=crit) -> dict:
        r = RateResult(workload="text", target_rate=x.target_rate, measurement=meas)
        return build_summary([r], c)

    def verdict(s: dict) -> tuple[str, bool, int]:
        (r,) = s["results"]
        assert any(w.startswith("client fell behind") for w in r["reasons"]), r["reasons"]
        return s["verdict"], r["inconclusive"], exit_code(s)

    # as recorded, and with errors within the maximum (1/188 = 0.5 %): inconclusive
    assert verdict(summary(x)) == ("inconclusive", True, EXIT_INCOMPLETE)
    assert verdict(summary(replace(x, errored=1))) == ("inconclusive", True, EXIT_INCOMPLETE)
    # errors above the maximum: the server failed requests the client did send
    s = summary(replace(x, errored=50, top_errors=["HTTP 500"]))
    assert verdict(s) == ("fail", False, EXIT_FAIL)
    assert any(w.startswith("errors 50/237 > 1%") for w in s["results"][0]["reasons"])
    assert s["workloads"]["text"]["first_failing_rate"] == x.target_rate
    assert s["workloads"]["text"]["first_inconclusive_rate"] is None
    # the same errors allowed by --max-error-ratio: inconclusive again
    lax = replace(crit, max_error_ratio=0.5)
    assert verdict(summary(replace(x, errored=50), lax))[0] == "inconclusive"
    # the dataset ran out: the run, not the client's pace, ended the rate early
    gone = replace(x, stop_reason="max_duration,requests_exhausted")
    assert verdict(summary(gone)) == ("fail", False, EXIT_FAIL)
    # every request errored, none left in flight (errors allowed): nothing succeeded, and not
    # because the client left requests running
    all_err = replace(x, errored=187, incomplete=0)
    assert verdict(summary(all_err, replace(crit, max_error_ratio=1.0)))[0] == "fail"
    # with successful requests: p95 over the SLO and a short achieved rate stay the client's
    # pace; errors above the maximum on top of them fail the rate
    some = replace(x, successful=100, incomplete=87, latency_p95_ms=900.0, achieved_rate=20.0)
    assert verdict(summary(some)) == ("inconclusive", True, EXIT_INCOMPLETE)
    assert verdict(summary(replace(some, errored=10))) == ("fail", False, EXIT_FAIL)


def test_analyze_cli_writes_every_output_and_exit_code(tmp_path: Path) -> None:
    runner = CliRunner()
    reports = [str(FIXTURES / f) for f in ("text-1rps.json", "video-incomplete.json")]
    out = tmp_path / "a"
    r = runner.invoke(
        cli,
        [
            "analyze",
            *reports,
            "--out",
            str(out),
            "--slo-ms",
            "600000",
            "--min-achieved-ratio",
            "0",
            "--max-dispatch-delay-ms",
            "600000",
        ],
    )
    assert r.exit_code == 1, r.output  # video's incompletes fail it
    s = json.loads((out / "summary.json").read_text())
    assert s["schema_version"] == 1 and s["guidellm_version"] == "0.8.1"
    assert s["workloads"]["text"]["highest_passing_rate"] == 1.0
    assert s["workloads"]["video"]["highest_passing_rate"] is None
    assert s["workloads"]["video"]["first_failing_rate"] == 3.0
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {row["workload"] for row in rows} == {"text", "video"}
    assert rows[0]["ttft_p95_ms"] and rows[0]["guidellm_version"] == "0.8.1"
    md = (out / "report.md").read_text()
    assert "Highest passing rate" in md and "latency-vs-rate.png" in md
    assert (out / "latency-vs-rate.png").stat().st_size > 5000

    # require-rate: text passes at 1 req/s, so requiring 1 passes and requiring 2 fails
    r = runner.invoke(
        cli,
        [
            "analyze",
            reports[0],
            "--slo-ms",
            "600000",
            "--min-achieved-ratio",
            "0",
            "--max-dispatch-delay-ms",
            "600000",
            "--require-rate",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["analyze", reports[0], "--slo-ms", "600000", "--require-rate", "2"])
    assert r.exit_code == 1

    # a run directory / summary re-judged with other criteria
    r = runner.invoke(cli, ["analyze", str(out), "--slo-ms", "1", "--out", str(tmp_path / "b")])
    assert r.exit_code == 1
    s2 = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert s2["workloads"]["text"]["highest_passing_rate"] is None
    assert s2["criteria"]["slo_ms"] == 1


def test_analyze_rejects_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}')
    r = CliRunner().invoke(cli, ["analyze", str(bad)])
    assert r.exit_code == 2 and "neither a guidellm JSON report" in r.output
    r = CliRunner().invoke(cli, ["analyze", str(FIXTURES / "text-1rps.json"), "--slo-ms", "-1"])
    assert r.exit_code == 2 and "--slo-ms" in r.output
    same = str(FIXTURES / "text-1rps.json")
    r = CliRunner().invoke(cli, ["analyze", same, same])
    assert r.exit_code == 2 and "two results" in r.output


def test_confidence_interval_of_p95_from_a_real_h200_report(tmp_path: Path) -> None:
    """guidellm 0.8.1's own interval, read from a committed H200 sweep (~200 requests a rate):
    25 req/s (p95 292 ms) is marginal against the 300 ms SLO, 20 req/s (141 ms) is not."""
    import tarfile

    from slo_loadtest.verdict import RateResult, judge_result

    sweep = Path(__file__).parents[2] / "bench/results/h200/vllm-0.26.0-random-8api/sweep-p8"
    with tarfile.open(sweep / "steps.tgz") as tar:
        tar.extractall(tmp_path, filter="data")
    notes = {}
    for rate in (20, 25):
        (x,) = load_report(tmp_path / f"steps/video-r{rate}/guidellm-report.json").measurements
        assert x.latency_p95_ci_low_ms < x.latency_p95_ms < x.latency_p95_ci_high_ms
        r = judge_result(RateResult(workload="video", target_rate=rate, measurement=x), Criteria())
        notes[rate] = [n for n in r.notes if n.startswith("marginal")]
    assert notes[20] == []
    assert len(notes[25]) == 1 and "251..325 ms" in notes[25][0]


def test_too_few_requests_give_no_interval() -> None:
    x = m("text-1rps")  # 3 requests: guidellm reports no percentile interval
    assert x.latency_p95_ci_low_ms is None and x.latency_p95_ci_high_ms is None


def test_the_slo_line_is_drawn_only_on_the_total_latency_panel() -> None:
    """The SLO bounds p95 total latency; a line on the TTFT panel would read as a TTFT SLO."""
    from slo_loadtest.plots import PANELS, summary_figure

    m = load_report(FIXTURES / "text-1rps.json").measurements[0]
    summary = build_summary(
        [RateResult(workload="text", target_rate=m.target_rate, measurement=m)],
        LENIENT,
        workloads=["text"],
    )
    fig = summary_figure(summary)
    with_slo = [
        key
        for ax, (key, _) in zip(fig.axes, PANELS, strict=True)
        if any(str(line.get_label()).startswith("SLO") for line in ax.get_lines())
    ]
    assert with_slo == ["latency_p95_ms"]
