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
    assert set(default) == {"gelu_quant", "qkv"}
    for device, entry in table.items():
        for kernel, choice in entry.items():
            assert set(choice) <= set(default[kernel]), (device, kernel)


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
