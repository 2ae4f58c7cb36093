"""bench/pyspy_top.py on a real py-spy profile of a real process whose time split is known."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import pyspy_top

# Two thirds of the time in heavy(), one third in light(), both called from loop().
CHILD = textwrap.dedent(
    """
    import time

    def spin(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    def heavy():
        spin(0.02)

    def light():
        spin(0.01)

    def loop():
        end = time.perf_counter() + 6
        while time.perf_counter() < end:
            heavy()
            light()

    loop()
    """
)


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    assert Path(found).exists(), "py-spy is in requirements/cpu.in"
    return found


def test_top_functions_of_a_real_profile(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    raw = tmp_path / "raw.txt"
    try:
        subprocess.run(
            [py_spy(), "record", "--pid", str(child.pid), "--duration", "3", "--rate", "200",
             "--format", "raw", "--output", str(raw), "--nonblocking", "--threads", "--idle"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    finally:
        child.kill()
        child.wait()
    result = pyspy_top.top(pyspy_top.parse(raw.read_text()), n=10)
    assert result["samples"] > 100
    own = dict(result["self"])
    inclusive = dict(result["inclusive"])
    spin = next(f for f in own if f.startswith("spin "))
    heavy = next(f for f in inclusive if f.startswith("heavy "))
    light = next(f for f in inclusive if f.startswith("light "))
    loop = next(f for f in inclusive if f.startswith("loop "))
    assert own[spin] > 90  # the innermost frame: where the time was spent
    assert inclusive[loop] > 95  # every sample is under loop(), counted once
    assert 1.4 < inclusive[heavy] / inclusive[light] < 2.8  # 2:1 by construction
    assert ":" not in spin.split("(")[-1]  # line numbers dropped: one entry per function
    main = result["threads"][0]  # the one thread of the child (names need a blocking read)
    assert main["thread"].startswith("thread (") and main["share"] > 95
    assert main["self"][0][0] == spin


def test_parse_ignores_junk_and_counts_a_frame_once_per_sample() -> None:
    text = "a (x.py:1);b (x.py:2);a (x.py:9) 3\nnot a profile line\nc (y.py:4) 1\n"
    stacks = pyspy_top.parse(text)
    assert stacks == [(("a (x.py)", "b (x.py)", "a (x.py)"), 3), (("c (y.py)",), 1)]
    result = pyspy_top.top(stacks)
    assert dict(result["inclusive"])["a (x.py)"] == 75.0  # recursion counted once
    assert dict(result["self"]) == {"a (x.py)": 75.0, "c (y.py)": 25.0}
    assert result["threads"] == []  # no --threads frames


def test_threads_are_split_off_and_reported() -> None:
    text = (
        "thread (11): MainThread;loop (e.py:1);step (e.py:2) 6\n"
        "thread (12): out;run (t.py:3);get (queue.py:9) 4\n"
    )
    result = pyspy_top.top(pyspy_top.parse(text))
    assert dict(result["self"]) == {"step (e.py)": 60.0, "get (queue.py)": 40.0}
    assert [(t["thread"], t["share"]) for t in result["threads"]] == [
        ("thread (11): MainThread", 60.0),
        ("thread (12): out", 40.0),
    ]
    assert result["threads"][1]["self"] == [("get (queue.py)", 40.0)]


def test_breakdown_groups_one_threads_samples_under_the_innermost_anchor() -> None:
    text = (
        "thread (11): MainThread;loop (e.py:1);run (w.py:1);run (w.py:2);batch (m.py:3) 5\n"
        "thread (11): MainThread;loop (e.py:1);run (w.py:1);run (w.py:2);fwd (m.py:4);k (m:5) 3\n"
        "thread (11): MainThread;loop (e.py:1);run (w.py:1) 1\n"
        "thread (11): MainThread;loop (e.py:1);wait (q.py:1) 1\n"
        "thread (12): out;run (w.py:3);batch (m.py:3) 90\n"
    )
    rows = pyspy_top.breakdown(pyspy_top.parse(text), "MainThread", "run (w.py)", depth=2)
    assert rows == [
        ("batch", 50.0),  # under the innermost run(), not the outer one
        ("fwd > k", 30.0),
        ("(in run (w.py))", 10.0),
        ("(not under run (w.py))", 10.0),
    ]  # the other thread's 90 samples are not counted
