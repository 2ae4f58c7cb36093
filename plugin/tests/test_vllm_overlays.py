"""The plugin on the Gemma 4 code of vLLM versions with no CPU build on PyPI: 0.33.0 (the
image's) and 0.34.0, their CUDA wheels beside .venv (`make vllm033 vllm034`), on this CPU,
eagerly. The adapter's bit-identity tests against the real upstream methods, the layout gate,
the image range buffer on Model Runner V2 (0.32-0.33's default on GPUs, 0.34's only runner), the
media fast path's count check beside the decode on their OpenCV loader, on 0.33 the whole media
fast path and, on 0.34, what it changed (vllm034_cases.py) run in a fresh interpreter whose
PYTHONPATH puts that version and its torch 2.14 first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
CACHE = HERE.parents[1] / ".cache"
SHARED = [
    "test_vllm_adapter.py",
    "test_versions_and_register.py::test_detect_layouts",
    "test_engine_graph_ranges_v2.py",
    # FULL narrowed by vLLM's own check of its attention backends (0.33 on Hopper)
    "test_engine_graph_ranges.py::test_full_narrowed_by_vllms_attention_backend_is_a_warning_once",
    "test_engine_graph_ranges.py::test_no_warning_where_vllm_keeps_what_was_asked_for",
    "test_engine_graph_ranges.py::test_apply_watches_vllms_resolution_only_when_full_is_asked_for",
    # the count check beside the decode on 0.33+'s loader (the check on a capture of its own)
    "test_media_count_check.py",
    # the profile run's exclusion from the encoder metrics (V1 and V2 runners on 0.33, V2 on 0.34)
    "test_engine_profile.py",
]
# The media fast path's tests whole on the image's vLLM (its processor, loader and hand-off code;
# 0.34 changes the hand-off: `mm_device_do_normalize`, vllm034_cases.py).
MEDIA = [
    "test_media_install.py",
    "test_media_fast_processor.py",
    "test_media_decode.py",
    "test_media_uint8.py",
    "test_media_overlap.py",
    "test_media_source_key.py",
    "test_media_stages.py",
    "test_media_guard.py",
]
# version -> (overlay folders, first wins; cases; passed): none skipped or deselected. The
# adapter's 13, the layout gate, the V2 range buffer's 10, the narrowed-FULL warning's 4, the
# count check's 29, the profile run's 4; on 0.33 the media tests' 144, on 0.34 vllm034_cases.py's 6.
OVERLAYS = {
    "0.33.0": (["vllm-0.33.0", "vllm-0.34.0"], [*SHARED, *MEDIA], 205),
    "0.34.0": (["vllm-0.34.0"], [*SHARED, "vllm034_cases.py"], 67),
}


@pytest.mark.parametrize("version", sorted(OVERLAYS))
def test_the_plugin_passes_on_that_vllms_code(version: str) -> None:
    folders, cases, passed = OVERLAYS[version]
    paths = [CACHE / f for f in folders]
    for path in paths:
        assert (path / ".installed").is_file(), f"{path} missing: run `make vllm033 vllm034`"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*map(str, paths), env.get("PYTHONPATH")]))
    probe = subprocess.run(
        [sys.executable, "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.stdout.split()[:2] == [version, "2.14.0+cu130"], probe.stderr[-2000:]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *cases],
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
    assert counts == {"passed": passed}, proc.stdout[-2000:]
