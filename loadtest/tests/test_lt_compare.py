"""`slo-loadtest compare` on the committed H200 sweeps in bench/results (real runs, read in
place): the tables, the highest passing rates against each run's own report.md, the plots, and
every kind of bad input (exit 2, one line, nothing written)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from slo_loadtest.cli import cli
from slo_loadtest.compare import load_configs, slo_lines

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "bench" / "results" / "h200"
V020 = H200 / "vllm-0.20.0"
V026 = H200 / "vllm-0.26.0"
STOCK = V020 / "stock" / "sweep-stock"  # results.csv + report.md, no summary.json
STOCKTEXT = V020 / "stock" / "sweep-stocktext"
PLUGIN = V020 / "plugin" / "sweep-plugin"  # no summary.json
PLUGIN4 = V020 / "plugin-4api" / "sweep-plugin4"
STOCK26, PLUGIN26 = V026 / "stock" / "sweep-stock", V026 / "plugin" / "sweep-plugin"
SWEEPS = [STOCK, STOCKTEXT, PLUGIN, PLUGIN4, STOCK26, PLUGIN26]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def compare(*args: str | Path):
    return CliRunner().invoke(cli, ["compare", *(str(a) for a in args)])


def test_020_video_stock_vs_plugin_vs_four_api_servers(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    r = compare(f"stock={STOCK}", f"plugin={PLUGIN}", f"plugin-4api={PLUGIN4}", "--out", out)
    assert r.exit_code == 0, r.output
    md = (out / "compare.md").read_text()
    lines = md.splitlines()
    assert "| workload | stock | plugin | plugin-4api |" in lines
    assert "| video | none | 15 req/s | 30 req/s |" in lines
    assert "SLO: p95 total latency <= 300 ms" in lines
    # the run's own SLO where it has a summary.json, else --slo-ms's default
    assert f"- `stock`: `{STOCK}` (SLO 300 ms from --slo-ms (no summary.json))" in lines
    assert f"- `plugin-4api`: `{PLUGIN4}` (SLO 300 ms from summary.json)" in lines
    # one row per rate of any config, numerically sorted; probes marked, – where not run
    rates = [m.group(1) for line in lines if (m := re.match(r"\| (\d+) \|", line))]
    assert rates == ["1", "2", "5", "10", "15", "20", "30", "35", "40"]
    for row in (
        "| 1 | 359 ✗ | 140 ✓ | 123 ✓ |",
        "| 15 | no p95 ✗ | 211 ✓ | 153 ✓ |",  # stock at 15 req/s: no request succeeded
        "| 20 | no p95 ✗ | 591 ✗ | 174 ✓ |",
        "| 30 | – | – | 285 ✓ (search) |",
        "| 40 | – | – | 4412 ✗ (search) |",
    ):
        assert row in lines
    assert "![compare-video](compare-video.png)" in lines
    assert sorted(p.name for p in out.iterdir()) == ["compare-video.png", "compare.md"]
    png = out / "compare-video.png"
    assert png.read_bytes()[:8] == PNG_MAGIC
    with Image.open(png) as im:
        im.verify()
        assert im.format == "PNG" and im.size[0] > 400 and im.size[1] > 300
    # stdout carries the tables, not the file's header
    assert "| video | none | 15 req/s | 30 req/s |" in r.stdout
    assert "# Sweep comparison" not in r.stdout


def _reported_highest(report_md: Path) -> dict[str, str]:
    """workload -> the 'highest passing rate' cell of a run's own report.md."""
    text = report_md.read_text().split("## Highest passing rate", 1)[1]
    return dict(re.findall(r"^\| (\w+) \| (none|[\d.]+ req/s) \|", text, flags=re.M))


def test_highest_passing_rate_matches_every_runs_report(tmp_path: Path) -> None:
    labels = [f"s{i}" for i in range(len(SWEEPS))]
    r = compare(*(f"{lab}={p}" for lab, p in zip(labels, SWEEPS, strict=True)), "--out", tmp_path)
    assert r.exit_code == 0, r.output
    md = (tmp_path / "compare.md").read_text().split("## Highest passing rate", 1)[1]
    ours = {m[0]: m[1:] for m in re.findall(r"^\| (\w+) \| (.*) \|$", md, flags=re.M)}
    checked = 0
    for i, sweep in enumerate(SWEEPS):
        for workload, cell in _reported_highest(sweep / "report.md").items():
            assert ours[workload][0].split(" | ")[i] == cell, (sweep, workload)
            checked += 1
    assert checked == 7  # 0.26 stock has text and video
    assert {p.name for p in tmp_path.glob("*.png")} == {"compare-video.png", "compare-text.png"}


def test_026_workload_filter_results_csv_path_and_slo(tmp_path: Path) -> None:
    r = compare(
        f"stock={STOCK26}",
        f"plugin={PLUGIN26 / 'results.csv'}",  # a file: its summary.json is still found
        f"old={PLUGIN}",
        "--workloads",
        "video",
        "--slo-ms",
        "250",
        "--out",
        tmp_path,
    )
    assert r.exit_code == 0, r.output
    md = (tmp_path / "compare.md").read_text()
    lines = md.splitlines()
    assert "| video | 10 req/s | 20 req/s | 15 req/s |" in lines
    assert "| 25 | – | 985 ✗ (search) | – |" in lines
    assert not any(line.startswith("| text |") or "## text" in line for line in lines)
    assert f"- `plugin`: `{PLUGIN26 / 'results.csv'}` (SLO 300 ms from summary.json)" in lines
    assert f"- `old`: `{PLUGIN}` (SLO 250 ms from --slo-ms (no summary.json))" in lines
    assert "SLO differs between configs (stock 300 ms, plugin 300 ms, old 250 ms)" in md
    assert [p.name for p in tmp_path.glob("*.png")] == ["compare-video.png"]
    # the figure's SLO lines: one per distinct SLO of the configs that ran the workload
    configs = load_configs([f"new={STOCK26}", f"old={PLUGIN}"], 250)
    assert slo_lines(configs, "video") == [(300, "SLO 300 ms (new)"), (250, "SLO 250 ms (old)")]
    assert slo_lines(configs, "text") == [(300, "SLO 300 ms")]


def test_one_config_is_a_table_too(tmp_path: Path) -> None:
    r = compare(f"only={STOCKTEXT}", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    assert "| text | 40 req/s |" in r.stdout
    assert "| 45 | 627 ✗ (search) |" in r.stdout


def _without_column(src: Path, dst: Path, column: str) -> Path:
    with src.open(newline="") as f:
        rows = list(csv.DictReader(f))
    with dst.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != column], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return dst


def _bad_inputs(tmp: Path) -> list[tuple[list[str], str]]:
    real = (PLUGIN / "results.csv").read_text()
    first_row = real.splitlines()[1]
    (tmp / "rate.csv").write_text(
        real.replace(first_row, first_row.replace("video,1,", "video,x,"))
    )
    (tmp / "short.csv").write_text(real.replace(first_row, "video,1,ok"))
    (tmp / "dup.csv").write_text(real + first_row + "\n")
    (tmp / "run").mkdir()
    (tmp / "run" / "results.csv").write_text(real)
    (tmp / "run" / "summary.json").write_text('{"criteria": ')
    _without_column(PLUGIN / "results.csv", tmp / "cols.csv", "latency_p95_ms")
    ok = f"plugin={PLUGIN}"
    return [
        ([f"a={tmp / 'nope'}"], "no such file or directory"),
        ([f"a={V020 / 'stock'}"], "no results.csv in that directory"),
        ([f"a={tmp / 'cols.csv'}"], "missing column(s) latency_p95_ms"),
        ([f"a={STOCK / 'report.md'}"], "is not an slo-loadtest results.csv"),
        ([f"a={tmp / 'rate.csv'}"], "target_rate 'x' is not a positive number"),
        ([f"a={tmp / 'short.csv'}"], "a row has the wrong number of cells"),
        ([f"a={tmp / 'dup.csv'}"], "two rows for video at 1 req/s"),
        ([f"a={tmp / 'run'}"], "cannot read summary.json"),
        ([str(PLUGIN)], "is not LABEL=PATH (no '=')"),
        ([f"={PLUGIN}"], "has an empty label"),
        ([ok, f"plugin={STOCK}"], "duplicate label 'plugin'"),
        ([ok, "--workloads", "video,image"], "workload(s) image not in any input"),
    ]


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    cases = _bad_inputs(tmp_path)
    for i, (args, message) in enumerate(cases):
        out = tmp_path / f"out{i}"
        r = compare(*args, "--out", out)
        assert r.exit_code == 2, (args, r.output)
        assert r.output.strip().splitlines() == [r.output.strip()], r.output
        assert r.output.startswith("Error: ") and message in r.output, (message, r.output)
        assert not out.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--out", "x"], "Missing argument 'LABEL=PATH...'"),
        ([f"a={PLUGIN}"], "Missing option '--out'"),
        ([f"a={PLUGIN}", "--out", "x", "--slo-ms", "-3"], "the SLO must be a positive number"),
    ],
)
def test_usage_errors_exit_2(args: list[str], message: str) -> None:
    r = compare(*args)
    assert r.exit_code == 2 and message in r.output, r.output


def test_an_inconclusive_rate_is_marked_as_such(tmp_path: Path) -> None:
    """A rate where the client fell behind was not judged: `?`, neither ✓ nor ✗ (the CSV's
    verdict column; older CSVs without it read as before)."""
    fixture = Path(__file__).parent / "fixtures" / "text-fell-behind.json"
    run = tmp_path / "run"
    r = CliRunner().invoke(cli, ["analyze", str(fixture), "--out", str(run), "--no-plots"])
    assert r.exit_code == 3, r.output
    r = compare(f"behind={run}", f"old={STOCKTEXT}", "--out", tmp_path / "cmp")
    assert r.exit_code == 0, r.output
    (row,) = [line for line in r.stdout.splitlines() if line.startswith("| 150 |")]
    assert row.split(" | ")[1].endswith(" ?"), row
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "? inconclusive (the client fell behind" in md
