"""The verify and bench CLIs as the lead runs them (python -m ..., PYTHONPATH=plugin/src).

Runs that measure go through the real entry point, a process each. Usage errors (exit 2) run
in this process through ``run_cli`` (each process imports torch: ~20 of them were most of this
file's time), except one per entry point (``test_entry_point_usage_error``), which proves the
wiring (``sys.exit(main())``) and that nothing else reaches stderr, imports included."""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

SRC = str(Path(__file__).parents[1] / "src")

# What Python's default warning filters hide in a process of its own (no -W, no PYTHONWARNINGS).
HIDDEN_BY_DEFAULT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def cli(module: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run(
        [sys.executable, "-m", f"gemma4_batched_encoder.{module}", *args],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.fixture
def run_cli(capfd, caplog):
    """``cli`` in this process: ``sys.exit(main(args))`` as the module's ``__main__`` does, its
    exit code and what reached file descriptors 1 and 2. What a process of its own would also
    print to stderr but pytest intercepts here is appended to stderr: warnings its default
    filters show, and log records of WARNING or above (the last-resort handler). torch's global
    RNG (seeded by a tower build) is restored afterwards."""
    import torch

    def run(module: str, *args: str) -> subprocess.CompletedProcess:
        main = importlib.import_module(f"gemma4_batched_encoder.{module}").main
        capfd.readouterr()
        caplog.clear()
        with (
            warnings.catch_warnings(record=True) as caught,
            torch.random.fork_rng(devices=[]),
            pytest.raises(SystemExit) as exited,
        ):
            sys.exit(main(list(args)))
        stdout, stderr = capfd.readouterr()
        stderr += "".join(
            warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line)
            for w in caught
            if not issubclass(w.category, HIDDEN_BY_DEFAULT)
        )
        stderr += "".join(
            f"{r.getMessage()}\n" for r in caplog.records if r.levelno >= logging.WARNING
        )
        return subprocess.CompletedProcess([module, *args], exited.value.code, stdout, stderr)

    return run


def test_verify_exact_passes(tmp_path):
    out = tmp_path / "verify.json"
    proc = cli(
        "verify", "--preset", "tiny", "--dtype", "bf16", "--videos", "1,2", "--frames", "2",
        "--frame-grid", "21x27,18x33", "--images", "3", "--image-budgets", "70,140,280",
        "--pooler-drift", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    drift = result["calls"][0]["pooler_alternatives_max_abs_diff"]
    assert set(drift) == {"naive_bmm", "gather_mul_add", "gather_addcmul"}
    assert result["bit_identical"] is True and result["max_abs_diff"] == 0.0
    assert [c["frames"] for c in result["calls"]] == [2, 4]
    assert len(result["calls"][1]["items"]) == 4 + 3
    assert json.loads(out.read_text()) == result


def test_verify_fast_reports_deviation_and_tolerance_exit_code():
    args = ("verify", "--mode", "fast", "--dtype", "bf16", "--videos", "1", "--frames", "2")
    report = cli(*args)
    assert report.returncode == 0, report.stderr[-3000:]
    deviation = json.loads(report.stdout)["max_abs_diff"]
    assert deviation > 0  # bf16 fast path is not bitwise on this tower
    strict = cli(*args, "--tolerance", "0")
    assert strict.returncode == 1


def test_verify_noise_floor_puts_fast_mode_beside_stock_bf16():
    args = ("verify", "--mode", "fast", "--dtype", "bf16", "--videos", "1", "--images", "1")
    result = json.loads(cli(*args, "--noise-floor").stdout)
    # both bf16 paths are some distance from the fp32 tower; fast may not be much further
    assert result["stock_vs_fp32"] > 0 and result["plugin_vs_fp32"] > 0
    assert result["plugin_vs_fp32"] <= 2 * result["stock_vs_fp32"]
    item = result["calls"][0]["items"][0]
    assert {"stock_vs_fp32", "plugin_vs_fp32", "max_abs_ref"} <= item.keys()
    assert 0 < result["max_rel_diff"] < 1


def test_verify_bad_arguments_exit_2(run_cli):
    assert run_cli("verify", "--frame-grid", "20x20", "--videos", "1").returncode == 2
    assert run_cli("verify", "--preset", "nope").returncode == 2
    assert run_cli("verify", "--videos", "0").returncode == 2


def test_bench_writes_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = cli(
        "bench", "--videos", "1", "--frames", "2", "--repeats", "1", "--warmup", "0",
        "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "serial ms" in proc.stdout and "upstream/exact" in proc.stdout
    result = json.loads(out.read_text())
    row = result["rows"][0]
    assert result["methods"] == ["serial", "upstream", "exact", "fast"]  # no graphs on CPU
    assert row["exact"]["bit_identical"] and row["upstream"]["bit_identical"]
    assert row["serial"]["median_ms"] > 0
    # video-only: the frames' token counts come from the host, as vLLM serves them
    assert row["token_counts"] == "host"


def test_bench_counts_tokens_on_the_device_for_images_or_when_asked(tmp_path):
    out = tmp_path / "bench.json"
    proc = cli(
        "bench", "--videos", "0,1", "--frames", "2", "--images", "1", "--repeats", "1",
        "--warmup", "0", "--methods", "serial,exact", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["token_counts"] for r in rows] == ["device", "device"]  # images in every row
    assert all(r["exact"]["bit_identical"] for r in rows)
    proc = cli(
        "bench", "--videos", "1", "--frames", "2", "--repeats", "1", "--warmup", "0",
        "--methods", "exact", "--token-counts", "device", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["rows"][0]["token_counts"] == "device"


def test_stacked_layout_as_vllm_hands_frames(tmp_path, run_cli):
    # one stacked [N, P, D] tensor for the plugin, lists for the references: still bitwise
    verify = cli("verify", "--videos", "1,2", "--frames", "2", "--layout", "stacked")
    assert verify.returncode == 0, verify.stderr[-3000:]
    result = json.loads(verify.stdout)
    assert result["layout"] == "stacked" and result["bit_identical"] is True
    out = tmp_path / "bench.json"
    bench = cli(
        "bench", "--videos", "2", "--frames", "2", "--repeats", "1", "--warmup", "0",
        "--methods", "serial,exact", "--layout", "stacked", "--out", str(out),
    )  # fmt: skip
    assert bench.returncode == 0, bench.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["layout"] == "stacked" and result["rows"][0]["exact"]["bit_identical"]
    # mixed padded sizes cannot stack: a clear error, exit 2
    mixed = run_cli(
        "verify", "--videos", "1", "--images", "1", "--image-budgets", "140", "--layout", "stacked"
    )
    assert (
        mixed.returncode == 2 and "--layout stacked needs items of one padded size" in mixed.stderr
    )


CONFIGS = {
    "missing.json": None,
    "malformed.json": "{not json",
    "list.json": "[1, 2]",
    "nested-list.json": '{"vision_config": [1]}',
    "wrong-type.json": '{"hidden_size": "abc"}',
    "zero-size.json": '{"pooling_kernel_size": 0}',
}

# (CLI and arguments, the option the one-line error must name)
USAGE_ERRORS = {
    "config missing": (("verify", "--config", "{dir}/missing.json"), "--config"),
    "config malformed": (("verify", "--config", "{dir}/malformed.json"), "--config"),
    "config is a JSON list": (("bench", "--config", "{dir}/list.json"), "--config"),
    "vision_config a list": (("verify", "--config", "{dir}/nested-list.json"), "--config"),
    "config wrong type": (("verify", "--config", "{dir}/wrong-type.json"), "--config"),
    "config zero size": (("bench", "--config", "{dir}/zero-size.json"), "--config"),
    "image aspect 0": (("verify", "--images", "1", "--image-aspects", "0"), "--image-aspects"),
    "image aspect abc": (("bench", "--images", "1", "--image-aspects", "abc"), "--image-aspects"),
    "image budget 0": (("verify", "--images", "1", "--image-budgets", "0"), "--image-budgets"),
    "repeats 0": (("bench", "--repeats", "0"), "--repeats"),
    "warmup -1": (("bench", "--warmup", "-1"), "--warmup"),
    "videos abc (verify)": (("verify", "--videos", "abc"), "--videos"),
    "videos abc (bench)": (("bench", "--videos", "abc"), "--videos"),
    "frames 0": (("verify", "--frames", "0"), "--frames"),
    "frames abc": (("verify", "--frames", "abc"), "--frames"),
    "nothing to encode": (("verify", "--videos", "0"), "--videos"),
    "grid off the kernel": (("verify", "--frame-grid", "20x20", "--videos", "1"), "--frame-grid"),
    "unknown method": (("bench", "--methods", "serial,nope"), "--methods"),
    "negative tolerance": (("verify", "--tolerance", "-1"), "--tolerance"),
}


# One real process per entry point, on a case where main() returns 2 (an argparse error exits by
# itself, so it would not prove that __main__ passes main()'s code on).
ENTRY_POINT_CASES = {"verify": "negative tolerance", "bench": "unknown method"}


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("usage")
    for name, text in CONFIGS.items():
        if text is not None:
            (tmp / name).write_text(text)
    return tmp


def usage_args(case: str, config_dir: Path, out: Path) -> tuple[str, list[str]]:
    (module, *args), _ = USAGE_ERRORS[case]
    return module, [*(a.format(dir=config_dir) for a in args), "--out", str(out)]


def assert_usage_error(proc: subprocess.CompletedProcess, out: Path, option: str) -> None:
    """Exit 2 (1 is verify's "not bit-identical"), one 'error:' line naming the option, no
    traceback, and nothing written to --out."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    assert option in lines[0], lines[0]
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    assert proc.stdout == ""


@pytest.mark.parametrize("case", list(USAGE_ERRORS))
def test_bad_arguments_are_one_line_usage_errors(run_cli, config_dir, tmp_path, case):
    out = tmp_path / "out.json"
    module, args = usage_args(case, config_dir, out)
    assert_usage_error(run_cli(module, *args), out, USAGE_ERRORS[case][1])


@pytest.mark.parametrize("module", list(ENTRY_POINT_CASES))
def test_entry_point_usage_error(config_dir, tmp_path, module):
    """``python -m gemma4_batched_encoder.<module>`` itself: exit status 2 and the one line."""
    case = ENTRY_POINT_CASES[module]
    out = tmp_path / "out.json"
    case_module, args = usage_args(case, config_dir, out)
    assert case_module == module, case
    assert_usage_error(cli(module, *args), out, USAGE_ERRORS[case][1])


def test_grid_for_budget_is_direct_and_as_before():
    """The image grid in one step: what the old loop (w shrunk by k while over budget) gave for
    every aspect and budget the CLIs take, and an aspect of 1e12 at once (the loop: minutes)."""
    import time

    from gemma4_batched_encoder import synthetic as S

    def looped(budget: int, k: int, aspect: float) -> tuple[int, int]:
        max_patches = budget * k * k
        h = max(k, int((max_patches / aspect) ** 0.5) // k * k)
        w = max(k, int(h * aspect) // k * k)
        while h * w > max_patches:
            w -= k
        return h, w

    aspects = [10.0**e for e in range(-6, 5)] + [0.75, 4 / 3, 1.777, 2.5, 16 / 9, 21 / 9]
    for k in (1, 2, 3, 4):
        for budget in (1, 2, 5, 70, 140, 280, 560, 1120):
            for aspect in aspects:
                assert S.grid_for_budget(budget, k, aspect) == looped(budget, k, aspect)
    start = time.perf_counter()
    assert S.grid_for_budget(280, 3, 1e12) == (3, 840)
    assert time.perf_counter() - start < 0.1
