"""The --search-beyond policy: grow while rates pass, then bisect to the resolution."""

from __future__ import annotations

from slo_loadtest.config import SweepConfig
from slo_loadtest.sweep import Sweep


def simulate(capacity: float, **kw: float) -> tuple[list[float], float]:
    cfg = SweepConfig(target="http://x", rates=(1.0, 2.0, 5.0), **kw)
    s = Sweep(cfg, log=lambda _: None)
    passed, failed, probes = [1.0, 2.0, 5.0], [], []
    while (r := s.next_probe(passed, failed)) is not None:
        probes.append(r)
        (passed if r <= capacity else failed).append(r)
        assert len(probes) < 30
    return probes, max(passed)


def test_search_finds_the_capacity_within_resolution() -> None:
    probes, best = simulate(37.0)
    assert probes[:3] == [10.0, 20.0, 40.0]  # step = last rate, doubling
    assert 36.0 <= best <= 37.0


def test_search_respects_the_upper_bound_and_step() -> None:
    probes, best = simulate(1000.0, search_max_rate=60.0, search_step=10.0)
    assert max(probes) == 60.0 and best == 60.0
    assert probes[0] == 15.0


def test_search_stops_when_bracket_is_narrow() -> None:
    probes, best = simulate(5.5, search_resolution=2.0)
    assert best == 5.0 and all(p > 5 for p in probes)


def test_search_beyond_runs_real_probes(tmp_path) -> None:
    """Rates 1 then probes 2 and 3 (capped by --search-max-rate), real guidellm runs against a
    local recording server; criteria loose so that the search mechanics, not the box, decide."""
    from lt_recording_server import RecordingServer

    from slo_loadtest.summary import build_summary

    with RecordingServer() as srv:
        cfg = SweepConfig(
            target=srv.url,
            model=srv.model,
            workloads=("text",),
            rates=(1.0,),
            duration_s=4,
            warmup_s=0,
            prompt_tokens=20,
            max_workers=1,
            search_beyond=True,
            search_max_rate=3,
            slo_ms=60_000,
            min_achieved_ratio=0.5,
            max_dispatch_delay_ms=10_000,
            out=tmp_path / "out",
        )
        outcome = Sweep(cfg, log=lambda _: None).run()
    rates = [(r.target_rate, r.search_probe, r.passed) for r in outcome.results]
    assert rates == [(1.0, False, True), (2.0, True, True), (3.0, True, True)], outcome.results
    s = build_summary(outcome.results, cfg.criteria, workloads=cfg.workloads)
    assert s["workloads"]["text"]["highest_passing_rate"] == 3.0
