"""Verdict rules on hand-made measurements (the recorded reports are in test_lt_analyze.py)."""

from __future__ import annotations

from dataclasses import replace

from slo_loadtest.config import Criteria
from slo_loadtest.guidellm_adapter import Measurement
from slo_loadtest.summary import build_summary
from slo_loadtest.verdict import RateResult, highest_passing_rate, judge

GOOD = Measurement(
    target_rate=10,
    achieved_rate=9.9,
    duration_s=30,
    successful=297,
    errored=0,
    incomplete=3,
    ttft_p50_ms=20,
    ttft_p95_ms=40,
    ttft_p99_ms=60,
    itl_median_ms=5,
    itl_p95_ms=8,
    latency_p50_ms=80,
    latency_p95_ms=120,
    latency_p99_ms=200,
    dispatch_delay_median_ms=1,
    dispatch_delay_p95_ms=3,
    prompt_tokens_mean=500,
    output_tokens_mean=10,
    stop_reason="max_duration",
)
C = Criteria()


def test_a_good_rate_passes_and_each_rule_can_fail_it() -> None:
    assert judge(GOOD, C) == (True, [])
    cases = {
        "p95 latency 301 ms > SLO 300 ms": replace(GOOD, latency_p95_ms=301),
        "achieved 9.40 req/s < 95% of 10": replace(GOOD, achieved_rate=9.4),
        "errors 4/304 > 1%": replace(GOOD, errored=4),
        "client fell behind": replace(GOOD, dispatch_delay_p95_ms=51),
        "6 incomplete requests > 4 allowed in flight": replace(GOOD, incomplete=6),
        "dataset ran out": replace(GOOD, stop_reason="max_duration,requests_exhausted"),
        "no successful requests": replace(GOOD, successful=0),
    }
    for why, m in cases.items():
        ok, reasons = judge(m, C)
        assert not ok and any(why in r for r in reasons), (why, reasons)
    assert judge(replace(GOOD, errored=2), C)[0]  # 2/302 = 0.66 % < 1 %


def test_max_error_ratio_is_a_maximum() -> None:
    """0 means no errors allowed (not "every rate fails"); exactly the ratio passes."""
    none = replace(C, max_error_ratio=0.0)
    assert judge(GOOD, none) == (True, [])
    ok, reasons = judge(replace(GOOD, errored=1), none)
    assert not ok and reasons == ["errors 1/301 > 0%"]
    # 3 errored of 300 requests is exactly 1 %: at the bound, so it passes
    at_bound = replace(GOOD, successful=294, errored=3, incomplete=3)
    assert judge(at_bound, replace(C, max_error_ratio=0.01)) == (True, [])
    assert not judge(replace(at_bound, successful=293, errored=4), C)[0]


def _r(rate: float, ok: bool, probe: bool = False) -> RateResult:
    m = replace(
        GOOD, target_rate=rate, achieved_rate=rate, incomplete=0, latency_p95_ms=120 if ok else 900
    )
    return RateResult(workload="video", target_rate=rate, measurement=m, search_probe=probe)


def test_highest_passing_rate_is_contiguous_from_the_bottom() -> None:
    s = build_summary([_r(1, True), _r(2, True), _r(5, False), _r(10, True)], C)
    assert s["workloads"]["video"]["highest_passing_rate"] == 2
    assert s["workloads"]["video"]["first_failing_rate"] == 5
    assert s["verdict"] == "fail"
    assert highest_passing_rate([]) is None


def test_require_rate_and_search_probes() -> None:
    rs = [_r(1, True), _r(2, True), _r(4, True, probe=True), _r(8, False, probe=True)]
    s = build_summary(rs, C)
    assert s["verdict"] == "pass", "a failing search probe is the edge, not a failed sweep"
    assert s["workloads"]["video"]["highest_passing_rate"] == 4
    assert build_summary(rs, C, require_rate=4)["verdict"] == "pass"
    s = build_summary(rs, C, require_rate=5)
    assert s["verdict"] == "fail" and s["workloads"]["video"]["requirement_met"] is False


def test_no_streamed_content_is_a_note_not_a_failure() -> None:
    """Successful requests without streamed text (a model emitting only special tokens): TTFT is
    None (or NaN from an older summary), ITL 0. The verdict is unchanged; notes say why."""
    empty = replace(
        GOOD, ttft_p50_ms=None, ttft_p95_ms=None, ttft_p99_ms=None, itl_median_ms=0.0,
        itl_p95_ms=0.0, ttft_samples=0,
    )  # fmt: skip
    cases = {
        "no streamed content arrived: none of the 297 successful": empty,
        "no streamed content arrived": replace(empty, ttft_samples=None, ttft_p95_ms=float("nan")),
        "streamed content arrived for only 3 of 297 successful requests": replace(
            GOOD, ttft_samples=3, itl_median_ms=0.0
        ),
        "median ITL is 0 ms for 10 output tokens": replace(GOOD, itl_median_ms=0.0),
    }
    for note, m in cases.items():
        (r,) = build_summary([RateResult("video", 10, measurement=m)], C)["results"]
        assert r["passed"] and r["reasons"] == [], r
        assert len(r["notes"]) == 1 and note in r["notes"][0], (note, r["notes"])
    for m in (GOOD, replace(GOOD, ttft_samples=297), replace(empty, successful=0)):
        (r,) = build_summary([RateResult("video", 10, measurement=m)], C)["results"]
        assert r["notes"] == []


def test_report_says_plainly_that_no_content_streamed() -> None:
    from slo_loadtest.report import to_csv, to_markdown

    empty = replace(GOOD, ttft_p50_ms=None, ttft_p95_ms=None, ttft_p99_ms=None, ttft_samples=0)
    s = build_summary(
        [
            RateResult("text", 10, measurement=GOOD),
            RateResult("video", 10, measurement=empty),
            RateResult(
                "video",
                20,
                measurement=replace(empty, target_rate=20, achieved_rate=20, latency_p95_ms=900),
            ),
        ],
        C,
        config={"extra_body": {}},
    )
    md = to_markdown(s)
    assert "**TTFT/ITL not (fully) measured** at video 10, 20 req/s" in md
    assert """pass --extra-body '{"skip_special_tokens": false}'""" in md
    assert "Pass/fail rests on the total latency and is not affected" in md
    assert "- video 10 req/s: no streamed content arrived" in md
    assert "| video | 10 | 9.90 | – / – / – |" in md
    assert "| yes | see Notes |" in md
    assert "| no | p95 latency 900 ms > SLO 300 ms; see Notes |" in md
    assert "- extra request body" not in md  # the bullet; the Configuration table says none
    assert "no streamed content arrived" in to_csv(s).splitlines()[2]
    assert s["verdict"] == "fail" and s["workloads"]["video"]["highest_passing_rate"] == 10
    # a healthy sweep has neither the bullet nor the Notes section; the extra body is named
    s = build_summary([RateResult("text", 10, measurement=GOOD)], C,
                      config={"extra_body": {"skip_special_tokens": False}})  # fmt: skip
    md = to_markdown(s)
    assert "not (fully) measured" not in md and "## Notes" not in md
    assert 'extra request body: `{"skip_special_tokens": false}`' in md


def test_a_marginal_rate_is_noted_without_changing_the_verdict() -> None:
    from slo_loadtest.verdict import judge_result

    def noted(lo: float | None, hi: float | None, p95: float) -> tuple[bool, list[str]]:
        m = replace(GOOD, latency_p95_ms=p95, latency_p95_ci_low_ms=lo, latency_p95_ci_high_ms=hi)
        r = judge_result(RateResult(workload="video", target_rate=10, measurement=m), C)
        return r.passed, r.notes

    passed, notes = noted(251, 325, 292)  # SLO 300 inside: passes, but marginally
    assert passed and len(notes) == 1 and "marginal" in notes[0] and "251..325 ms" in notes[0]
    passed, notes = noted(290, 340, 310)
    assert not passed and "marginal" in notes[0]
    assert noted(110, 180, 141) == (True, [])  # clearly below
    assert noted(320, 400, 350)[1] == []  # clearly above
    assert noted(None, None, 299) == (True, [])  # no interval reported


def test_report_marks_a_marginal_edge_and_keeps_the_content_warning_for_content() -> None:
    from slo_loadtest.report import to_csv, to_markdown
    from slo_loadtest.verdict import judge_result

    def rate(r: float, p95: float, lo: float, hi: float) -> RateResult:
        m = replace(
            GOOD, target_rate=r, achieved_rate=r, incomplete=0, latency_p95_ms=p95,
            latency_p95_ci_low_ms=lo, latency_p95_ci_high_ms=hi,
        )  # fmt: skip
        return judge_result(RateResult(workload="video", target_rate=r, measurement=m), C)

    s = build_summary(
        [rate(20, 141, 130, 175), rate(25, 292, 251, 325), rate(30, 900, 700, 1000)], C
    )
    md = to_markdown(s)
    assert "| video | 25 req/s (marginal) | 30 req/s |" in md
    assert "292 (251..325)" in md
    assert "not (fully) measured" not in md  # a marginal note is not a missing-content note
    assert "- video 25 req/s: marginal: the SLO (300 ms) lies inside" in md
    header, *rows = to_csv(s).splitlines()
    cols = header.split(",")
    row25 = dict(zip(cols, rows[1].split(","), strict=False))
    assert float(row25["latency_p95_ci_low_ms"]) == 251
    assert float(row25["latency_p95_ci_high_ms"]) == 325


def _behind(rate: float, p95: float = 120) -> RateResult:
    """A rate where the client fell behind (p95 dispatch delay above the 50 ms bound)."""
    m = replace(
        GOOD, target_rate=rate, achieved_rate=rate, incomplete=0, latency_p95_ms=p95,
        dispatch_delay_p95_ms=80,
    )  # fmt: skip
    return RateResult(workload="video", target_rate=rate, measurement=m)


def test_a_client_that_fell_behind_makes_the_rate_inconclusive_not_failed() -> None:
    """README: the verdict refuses to judge such a rate. It breaks the highest-passing chain
    like a failure, but the sweep fails only where a rate failed outright; where the outcome
    hangs on the inconclusive rate, the verdict is inconclusive (exit 3: rerun, not fix)."""
    from slo_loadtest.cli import exit_code
    from slo_loadtest.exit_codes import EXIT_FAIL, EXIT_INCOMPLETE, EXIT_PASS

    s = build_summary([_r(1, True), _behind(2), _behind(5, p95=900)], C)
    one, two, five = s["results"]
    assert one["passed"] and not one["inconclusive"]
    assert two["inconclusive"] and not two["passed"]
    assert any(x.startswith("client fell behind") for x in two["reasons"])
    # whatever else it says (here p95 over the SLO too), its numbers are the client's pace
    assert five["inconclusive"] and any("> SLO" in x for x in five["reasons"])
    w = s["workloads"]["video"]
    assert (w["highest_passing_rate"], w["first_failing_rate"]) == (1, None)
    assert w["first_inconclusive_rate"] == 2 and w["verdict"] == "inconclusive"
    assert s["complete"] and s["verdict"] == "inconclusive"
    assert exit_code(s) == EXIT_INCOMPLETE

    # an outright failure still fails the sweep
    s = build_summary([_r(1, True), _behind(2), _r(5, False)], C)
    assert s["verdict"] == "fail" and exit_code(s) == EXIT_FAIL
    assert s["workloads"]["video"]["first_failing_rate"] == 5
    # a required rate below the inconclusive one is met; at it, undecided; one that the
    # outright failure rules out fails whatever the inconclusive rate would have said
    rs = [_r(1, True), _behind(2), _r(5, False)]
    assert build_summary(rs, C, require_rate=1)["verdict"] == "pass"
    s = build_summary(rs, C, require_rate=2)
    assert s["verdict"] == "inconclusive" and s["workloads"]["video"]["requirement_met"] is False
    assert build_summary(rs, C, require_rate=5)["verdict"] == "fail"
    assert exit_code(build_summary(rs, C, require_rate=1)) == EXIT_PASS
    # an inconclusive search probe is the edge, like a failing one
    probe = _behind(4)
    probe.search_probe = True
    assert build_summary([_r(1, True), _r(2, True), probe], C)["verdict"] == "pass"


def test_only_pace_dependent_reasons_leave_a_fell_behind_rate_inconclusive() -> None:
    """Each of judge()'s reasons beside "client fell behind": the pace-dependent ones keep the
    rate inconclusive, the others (errors, the dataset, nothing succeeding with nothing in
    flight, a report without a p95 or achieved rate despite successes) make it a failure."""
    from slo_loadtest.verdict import judge_result

    behind = replace(GOOD, dispatch_delay_p95_ms=80)
    pace = {
        "> SLO": replace(behind, latency_p95_ms=900),
        "achieved": replace(behind, achieved_rate=5),
        "incomplete requests": replace(behind, incomplete=40),
        # nothing finished in the window while requests were in flight (the recorded run)
        "no successful requests": replace(
            behind, successful=0, incomplete=40, latency_p95_ms=None, achieved_rate=0.0
        ),
    }
    definite = {
        "errors 10/310": replace(behind, errored=10),
        "dataset ran out": replace(behind, stop_reason="max_duration,requests_exhausted"),
        "no successful requests": replace(
            behind, successful=0, errored=0, incomplete=0, latency_p95_ms=None, achieved_rate=None
        ),
        "no p95 latency": replace(behind, latency_p95_ms=None),
        "no achieved rate": replace(behind, achieved_rate=None),
    }
    for expect_inconclusive, cases in ((True, pace), (False, definite)):
        for why, m in cases.items():
            r = judge_result(RateResult(workload="v", target_rate=10, measurement=m), C)
            assert any(why in x for x in r.reasons), (why, r.reasons)
            assert any(x.startswith("client fell behind") for x in r.reasons), (why, r.reasons)
            assert not r.passed and r.inconclusive is expect_inconclusive, (why, r.reasons)


def test_report_and_csv_show_an_inconclusive_rate() -> None:
    import csv
    import io

    from slo_loadtest.report import to_csv, to_markdown

    s = build_summary([_r(1, True), _behind(2)], C)
    md = to_markdown(s)
    assert "- verdict: **INCONCLUSIVE**" in md
    assert "**inconclusive rates** (video 2 req/s): the client fell behind" in md
    assert "| video | 1 req/s | none | – | 2 req/s |" in md  # first inconclusive rate column
    assert "| inconclusive | client fell behind: p95 dispatch delay 80 ms > 50 ms |" in md
    rows = list(csv.DictReader(io.StringIO(to_csv(s))))
    assert [r["verdict"] for r in rows] == ["pass", "inconclusive"]
    assert [r["passed"] for r in rows] == ["True", "False"]  # the old column keeps its meaning
    # a sweep without inconclusive rates keeps the old table
    md = to_markdown(build_summary([_r(1, True)], C))
    assert "first inconclusive rate" not in md and "inconclusive rates" not in md
