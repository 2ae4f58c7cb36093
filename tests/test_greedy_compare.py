"""bench/greedy_outputs.py --compare: which requests differ, and by how much."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "greedy_outputs.py"


def _run(tmp_path: Path, a: list[dict], b: list[dict]) -> tuple[int, dict]:
    for name, outputs in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"outputs": outputs}))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--compare", *(str(tmp_path / f"{n}.json") for n in "ab")],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout)


def _out(case: int, kind: str, tokens: list[str], top: list[list[list]]) -> dict:
    return {"case": case, "kind": kind, "tokens": tokens, "top_logprobs": top}


def test_identical_outputs_exit_zero(tmp_path: Path) -> None:
    a = [_out(0, "text", ["x", "y"], [[["x", -0.1], ["z", -2.0]], [["y", -0.2]]])]
    rc, result = _run(tmp_path, a, a)
    assert rc == 0
    assert result == {
        "identical": True,
        "requests": 1,
        "differing": [],
        "tokens_equal": True,
        "max_logprob_diff": {},
    }


def test_logprob_and_token_differences_are_reported(tmp_path: Path) -> None:
    a = [
        _out(0, "text", ["x", "y"], [[["x", -0.1], ["z", -2.0]], [["y", -0.2]]]),
        _out(1, "video", ["p"], [[["p", -0.5]]]),
        _out(2, "image", ["q"], [[["q", -0.5]]]),
    ]
    b = [
        # same tokens; "z" moved by 0.75 nats, "w" is only in b's top-5 (not compared)
        _out(0, "text", ["x", "y"], [[["x", -0.1], ["z", -1.25]], [["y", -0.2], ["w", -3.0]]]),
        _out(1, "video", ["r"], [[["r", -0.4]]]),  # another greedy token
        _out(2, "image", ["q"], [[["q", -0.5]]]),
    ]
    rc, result = _run(tmp_path, a, b)
    assert rc == 1
    assert result["differing"] == [[0, "text"], [1, "video"]]
    assert not result["tokens_equal"]
    assert result["max_logprob_diff"] == {"0:text": 0.75, "1:video": None}


def _classes(tmp_path: Path, runs: dict[str, list[dict]]) -> tuple[int, dict]:
    for name, outputs in runs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({"outputs": outputs}))
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--classes", *(str(tmp_path / f"{n}.json") for n in runs)],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout)


def test_classes_group_identical_runs_in_first_seen_order(tmp_path: Path) -> None:
    x = [_out(0, "text", ["x"], [[["x", -0.1], ["z", -2.0]]])]
    y = [_out(0, "text", ["x"], [[["x", -0.1], ["z", -2.5]]])]  # one logprob apart
    rc, result = _classes(tmp_path, {"s1": x, "p1": y, "s2": x, "p2": y, "p3": x})
    assert rc == 1
    names = [[Path(p).stem for p in members] for members in result["classes"]]
    assert names == [["s1", "s2", "p3"], ["p1", "p2"]]
    assert result["runs"] == 5


def test_one_class_exits_zero(tmp_path: Path) -> None:
    x = [_out(0, "text", ["x"], [[["x", -0.1]]])]
    rc, result = _classes(tmp_path, {"a": x, "b": x})
    assert rc == 0
    assert len(result["classes"]) == 1
