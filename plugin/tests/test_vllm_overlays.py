"""The plugin on vLLM 0.34.0's own Gemma 4 code: its wheel beside .venv (`make vllm034`; no CPU
build of 0.34 is on PyPI yet), on this CPU, eagerly. The adapter's bit-identity tests against
the real upstream methods, the layout gate, what 0.34 changed (vllm034_cases.py) and the image
range buffer on Model Runner V2 (0.34's only runner) run in a fresh interpreter whose PYTHONPATH
puts 0.34 and its torch first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parents[1]
OVERLAY = REPO / ".cache" / "vllm-0.34.0"
CASES = [
    "test_vllm_adapter.py",
    "test_versions_and_register.py::test_detect_layouts",
    "vllm034_cases.py",
    "test_engine_graph_ranges_v2.py",
]


def test_the_plugin_passes_on_vllm_034s_code() -> None:
    assert (OVERLAY / ".installed").is_file(), f"{OVERLAY} missing: run `make vllm034`"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(OVERLAY), env.get("PYTHONPATH")]))
    probe = subprocess.run(
        [sys.executable, "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.stdout.split()[:2] == ["0.34.0", "2.14.0+cu130"], probe.stderr[-2000:]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CASES],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    counts = dict(
        (k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", proc.stdout)
    )
    # the adapter's 13, the layout gate, vllm034_cases.py's 6, the V2 range buffer's 9: none
    # skipped or deselected
    assert counts == {"passed": 29}, proc.stdout[-2000:]
