"""The command line of the Triton kernel checks (fp8_kernel_check.py, fp8_gemm_check.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def device_from_argv(description: str) -> str:
    """``--device cpu|cuda`` (default cpu). On the CPU the kernels run in Triton's interpreter,
    which must be switched on before Triton loads: call this before importing torch or the
    plugin. Also makes this folder importable (g4helpers, test_bit_identity)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    device = parser.parse_args().device
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(Path(__file__).parent))
    return device
