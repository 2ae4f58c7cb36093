"""Bad input is rejected up front, naming the flag; rate lists parse as documented."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from slo_loadtest.cli import cli
from slo_loadtest.config import SweepConfig, field_default
from slo_loadtest.validation import (
    RESERVED_BODY_KEYS,
    check_target,
    parse_extra_body,
    parse_rates,
    parse_workloads,
)


@pytest.mark.parametrize(
    ("text", "rates"),
    [
        ("1,2,5", (1.0, 2.0, 5.0)),
        ("1..5", (1.0, 2.0, 3.0, 4.0, 5.0)),
        ("10..20:5", (10.0, 15.0, 20.0)),
        ("0.5, 1..2:0.5", (0.5, 1.0, 1.5, 2.0)),
        ("5,1", (1.0, 5.0)),
    ],
)
def test_parse_rates(text: str, rates: tuple[float, ...]) -> None:
    assert parse_rates(text) == rates


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no rates"),
        ("1,,2", "empty item"),
        ("0", "positive"),
        ("-1", "positive"),
        ("abc", "not a number"),
        ("5..1", "below its start"),
        ("1..5:0", "step must be > 0"),
        ("1,1", "duplicate"),
        ("nan", "finite"),
        ("1..1000:1", "more than"),
    ],
)
def test_parse_rates_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rates(text)


def test_targets_and_workloads() -> None:
    assert check_target("http://h:8000/") == "http://h:8000"
    for bad in ("", "h:8000", "ftp://h", "http://", "http://h:99999"):
        with pytest.raises(ValueError):
            check_target(bad)
    assert parse_workloads("Text, video") == ("text", "video")
    for bad in ("", "audio", "text,text"):
        with pytest.raises(ValueError):
            parse_workloads(bad)


def test_defaults_come_from_the_config() -> None:
    cfg = SweepConfig()
    assert cfg.rates == tuple(float(r) for r in range(1, 21))
    assert cfg.slo_ms == 300 and cfg.prompt_tokens == 500 and cfg.output_tokens == 10
    assert cfg.video_frames == 6 and (cfg.video_width, cfg.video_height) == (854, 480)
    assert cfg.criteria.min_achieved_ratio == 0.95 and cfg.criteria.max_error_ratio == 0.01
    opts = {p.name: p for p in __import__("slo_loadtest.cli").cli.run.params}
    assert opts["slo_ms"].default == field_default("slo_ms")
    assert opts["rates"].default == "1..20"
    assert opts["duration_s"].envvar == "SLO_LOADTEST_DURATION_S"
    assert cfg.extra_body == {} and opts["extra_body"].envvar == "SLO_LOADTEST_EXTRA_BODY"
    assert opts["extra_body"].opts == ["--extra-body"] and opts["extra_body"].default is None


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--rates", "0,1"], "--rates"),
        (["--rates", "1..x"], "--rates"),
        (["--slo-ms", "-5"], "--slo-ms"),
        (["--slo-ms", "0"], "--slo-ms"),
        (["--target", "localhost:8000"], "--target"),
        (["--workloads", "text,audio"], "--workloads"),
        (["--duration", "0"], "--duration"),
        (["--warmup", "50"], "--warmup"),
        (["--min-achieved-ratio", "1.5"], "--min-achieved-ratio"),
        (["--tokenizer", "/nonexistent/dir"], "--tokenizer"),
        (["--video-codec", "vp9"], "--video-codec"),
        (["--video-codec", "h264", "--video-width", "853"], "--video-codec"),  # yuv420p: even
    ],
)
def test_run_rejects_bad_input_naming_the_flag(args: list[str], flag: str, tmp_path) -> None:
    base = ["run", "--target", "http://127.0.0.1:9", "--out", str(tmp_path / "o")]
    r = CliRunner().invoke(cli, [*base, *args])
    assert r.exit_code == 2, r.output
    assert flag in r.output, r.output
    assert not (tmp_path / "o").exists(), "nothing may run before input is validated"


def test_parse_extra_body() -> None:
    assert parse_extra_body("") == {} and parse_extra_body("  ") == {}
    assert parse_extra_body('{"skip_special_tokens": false, "a": {"b": [1]}}') == {
        "skip_special_tokens": False,
        "a": {"b": [1]},
    }
    for bad, message in [
        ("{x", "is not valid JSON"),
        ('{"a": NaN}', "is not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"s"', "got a JSON string"),
        ("null", "got a JSON null"),
        ('{"max_tokens": 5}', "'max_tokens' is set by slo-loadtest itself"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_extra_body(bad)
    for key in RESERVED_BODY_KEYS:
        with pytest.raises(ValueError, match="cannot be overridden"):
            parse_extra_body(json.dumps({key: 1, "temperature": 0}))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{skip_special_tokens: false}", "is not valid JSON"),
        ("[1]", "must be a JSON object"),
        ("true", "must be a JSON object"),
        ('{"model": "other"}', "'model' is set by slo-loadtest itself"),
        ('{"stream": false, "ignore_eos": false}', "'stream', 'ignore_eos' are set"),
        ('{"max_completion_tokens": 1}', "cannot be overridden"),
        ('{"messages": []}', "cannot be overridden"),
    ],
)
@pytest.mark.parametrize("via", ["flag", "env"])
def test_bad_extra_body_exits_2_before_anything_runs(
    body: str, message: str, via: str, tmp_path
) -> None:
    base = ["run", "--target", "http://127.0.0.1:9", "--out", str(tmp_path / "o")]
    if via == "flag":
        r = CliRunner().invoke(cli, [*base, "--extra-body", body])
    else:
        r = CliRunner().invoke(cli, base, env={"SLO_LOADTEST_EXTRA_BODY": body})
    assert r.exit_code == 2, r.output
    assert "--extra-body" in r.output and message in r.output, r.output
    assert not (tmp_path / "o").exists(), "nothing may run before input is validated"
    # the Job entrypoint reads the same variable and refuses it the same way
    r = CliRunner().invoke(
        cli,
        ["job", "--target", "http://127.0.0.1:9", "--out", str(tmp_path / "j")],
        env={"SLO_LOADTEST_EXTRA_BODY": body},
    )
    assert r.exit_code == 2 and message in r.output, r.output
    assert not (tmp_path / "j").exists()


def test_env_vars_configure_run(tmp_path) -> None:
    r = CliRunner().invoke(
        cli,
        ["run", "--out", str(tmp_path / "o")],
        env={"SLO_LOADTEST_TARGET": "http://127.0.0.1:9", "SLO_LOADTEST_RATES": "0"},
    )
    assert r.exit_code == 2 and "--rates" in r.output
    r = CliRunner().invoke(cli, ["run", "--out", str(tmp_path / "o")], env={})
    assert r.exit_code == 2 and "--target" in r.output
