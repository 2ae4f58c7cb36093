"""bench/inductor_configs.py: which autotuning choices two servers' caches differ in.

The files are laid out as the eighteenth H200 sitting's FRESH_CACHES servers had them (vLLM
0.26.0, torch 2.11): `*.best_config` in inductor's cache, Triton metadata under `triton/HASH/`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "inductor_configs.py"
AOT = "vllm/torch_compile_cache/torch_aot_compile/dc27b5bf/inductor_cache"


def _server(root: Path, kernels: dict[str, tuple[str, dict]]) -> Path:
    """kernels: best_config name -> (kernel name, chosen config)."""
    for i, (best, (name, config)) in enumerate(kernels.items()):
        triton_hash = f"HASH{root.name}{i}"
        meta = root / "triton" / triton_hash
        meta.mkdir(parents=True)
        (meta / f"{name}.json").write_text(json.dumps({"name": name}))
        (meta / f"__grp__{name}.json").write_text("{}")
        where = root / AOT / best[:2]
        where.mkdir(parents=True, exist_ok=True)
        raw = {**config, "configs_hash": "3ca5", "found_by_coordesc": False, "time_taken_ms": i}
        raw["triton_cache_hash"] = triton_hash
        (where / f"{best}.best_config").write_text(json.dumps(raw))
    return root


def _run(*args: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


RMS = ("triton_red_fused_rms_norm_0", {"XBLOCK": 1, "R0_BLOCK": 4096, "num_warps": 16})
GELU = ("triton_poi_fused_gelu_mul_3", {"XBLOCK": 1024, "num_warps": 4})


def test_a_reduction_choice_is_reported_and_a_pointwise_one_is_kept_apart(tmp_path: Path) -> None:
    a = _server(tmp_path / "a", {"aa11": RMS, "bb22": GELU})
    b = _server(
        tmp_path / "b",
        {
            "aa11": (RMS[0], {**RMS[1], "R0_BLOCK": 2048}),
            "bb22": (GELU[0], {"XBLOCK": 512, "num_warps": 8}),
            "cc33": GELU,  # only on b: not compared
        },
    )
    out = tmp_path / "configs.json"
    rc, text = _run(f"a={a}", f"b={b}", "--out", str(out))
    assert rc == 0, text
    result = json.loads(out.read_text())
    assert result["servers"]["a"]["aa11"] == {
        "kernel": "triton_red_fused_rms_norm_0",
        "kind": "reduction",
        "config": {"XBLOCK": 1, "R0_BLOCK": 4096, "num_warps": 16},
    }
    (pair,) = result["pairs"]
    assert pair["shared_kernels"] == 2 and pair["differing"] == 2
    (red,) = pair["differing_reductions"]
    assert red["kernel"] == "triton_red_fused_rms_norm_0"
    assert (red["a"]["R0_BLOCK"], red["b"]["R0_BLOCK"]) == (4096, 2048)
    assert [d["kind"] for d in pair["differing_other"]] == ["pointwise"]
    assert "1 of them reductions" in text


def test_same_choices_differ_in_nothing_but_bookkeeping(tmp_path: Path) -> None:
    a = _server(tmp_path / "a", {"aa11": RMS})
    b = _server(tmp_path / "b", {"aa11": RMS})  # other triton hash and time_taken_ms
    rc, text = _run(f"a={a}", f"b={b}")
    assert rc == 0
    assert "1 shared, 0 differ" in text


def test_a_placeholder_named_kernel_with_r0_block_counts_as_a_reduction(tmp_path: Path) -> None:
    cfg = {"XBLOCK": 16, "R0_BLOCK": 32, "num_warps": 4}
    a = _server(tmp_path / "a", {"ea58": ("triton_", cfg)})
    b = _server(tmp_path / "b", {"ea58": ("triton_", {**cfg, "R0_BLOCK": 4})})
    rc, text = _run(f"a={a}", f"b={b}")
    assert rc == 0
    assert "triton_ (reduction)" in text


def test_a_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    rc, text = _run(f"a={tmp_path / 'nope'}")
    assert rc == 2
    assert "expected NAME=DIR" in text


def _module(root: Path, name: str, body: str) -> None:
    where = root / AOT / name[1:3]
    where.mkdir(parents=True, exist_ok=True)
    # each generated module names its own cache folder, as inductor writes them
    (where / f"{name}.py").write_text(f"# kernel path: {where}/{name}.py\n{body}\n")


def test_generated_modules_compare_without_the_servers_own_paths(tmp_path: Path) -> None:
    a = _server(tmp_path / "a", {"aa11": RMS})
    b = _server(tmp_path / "b", {"aa11": RMS})
    _module(a, "cabc" + "a" * 48, "def call(): return rms_norm(x)")
    _module(b, "cxyz" + "b" * 48, "def call(): return rms_norm(x)")  # same code, other path
    _module(b, "cqqq" + "c" * 48, "def call(): return gelu(x)")  # only on b
    out = tmp_path / "configs.json"
    rc, text = _run(f"a={a}", f"b={b}", "--out", str(out))
    assert rc == 0, text
    (pair,) = json.loads(out.read_text())["pairs"]
    assert pair["generated_code"] == {"same": 1, "only a": 0, "only b": 1}
    assert "generated modules same 1, only a 0, only b 1" in text
