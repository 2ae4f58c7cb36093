"""Fast mode's per-GPU kernel launch table (launch_config.py, fast_launch.json)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from gemma4_batched_encoder import launch_config

CPU = torch.device("cpu")


def test_a_device_without_an_entry_gets_the_default():
    assert "cpu" not in launch_config.table()
    assert launch_config.launch("qkv", CPU) == launch_config.table()["default"]["qkv"]


def test_a_device_entry_and_overrides_take_precedence(monkeypatch):
    table = {
        "default": {"qkv": {"block_m": 64, "warps": 4, "all_heads": False}},
        "cpu": {"qkv": {"block_m": 32}},
    }
    monkeypatch.setattr(launch_config, "table", lambda: table)
    assert launch_config.launch("qkv", CPU) == {"block_m": 32, "warps": 4, "all_heads": False}
    with launch_config.overridden({"qkv": {"warps": 8}}):
        assert launch_config.launch("qkv", CPU)["warps"] == 8
        assert launch_config.launch("qkv", CPU)["block_m"] == 32
    assert launch_config.launch("qkv", CPU)["warps"] == 4  # restored, also after an error
    with pytest.raises(RuntimeError), launch_config.overridden({"qkv": {"warps": 2}}):
        raise RuntimeError
    assert launch_config.launch("qkv", CPU)["warps"] == 4


def test_every_entry_names_only_known_kernels_and_keys():
    table = launch_config.table()
    default = table["default"]
    kernels = {"gelu_quant", "qkv", "norm_quant", "gemm_gelu", "gemm_qkv", "gemm_down"}
    assert set(default) == kernels
    for device, entry in table.items():
        for kernel, choice in entry.items():
            assert set(choice) <= set(default[kernel]), (device, kernel)


def test_entering_launches_keeps_the_entrys_other_kernels(tmp_path):
    # two bench tools tune different kernels of one device entry (fast_kernel_tune: the row
    # kernels; fp8_gemm_probe: the GEMMs): each must leave the other's choices in place
    path = tmp_path / "table.json"
    path.write_text(json.dumps(launch_config.table()))
    launch_config.enter(path, CPU, {"gemm_gelu": {"tma": 1}})
    launch_config.enter(path, CPU, {"qkv": {"block_m": 8}, "gemm_qkv": {"warps": 8}})
    written = json.loads(path.read_text())
    assert written["cpu"] == {
        "gemm_gelu": {"tma": 1},
        "qkv": {"block_m": 8},
        "gemm_qkv": {"warps": 8},
    }
    assert {k: v for k, v in written.items() if k != "cpu"} == launch_config.table()
    launch_config.enter(path, CPU, {"gemm_gelu": {"tma": 0}})  # a later run replaces its own
    assert json.loads(path.read_text())["cpu"]["gemm_gelu"] == {"tma": 0}


def test_the_wheel_carries_the_table(tmp_path):
    # package data: without it an installed plugin's fast mode fails at its first Triton launch
    plugin = Path(__file__).resolve().parents[1]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path), str(plugin)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        shipped = json.loads(z.read("gemma4_batched_encoder/fast_launch.json"))
    assert shipped == launch_config.table()


def test_the_qkv_kernel_takes_all_heads_a_program_only_from_the_tables_row_count(monkeypatch):
    # The H200 entry: all heads a program at 16 videos' rows, one program a head below (fewer
    # row blocks than the GPU has room for). The grids the launcher picks, kernel not run.
    from gemma4_batched_encoder import qkv_kernel

    grids = []

    class Recorder:
        def __getitem__(self, grid):
            grids.append(grid)
            return lambda *args, **kwargs: None

    monkeypatch.setattr(qkv_kernel, "_qkv_norm_rope_kernel", Recorder(), raising=False)
    entry = {"block_m": 16, "warps": 4, "all_heads": True, "all_heads_min_rows": 1000}
    with launch_config.overridden({"qkv": entry}):
        for rows in (999, 1000):
            qkv = torch.zeros(1, rows, 3 * 2 * 8)
            cos = torch.zeros(1, rows, 8)
            qkv_kernel._launch_qkv_norm_rope(qkv, cos, cos, torch.ones(8), torch.ones(8), 2, 1e-6)
    assert grids == [(63, 2), (63,)]
