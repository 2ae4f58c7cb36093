"""Which torch stack a wheelhouse must carry for a GPU host that has its own torch.

vLLM 0.20-0.26 pin the torch the lent GPU hosts have (2.11), so a wheelhouse leaves the whole
torch + CUDA stack to the host. vLLM 0.32+ pin torch 2.14: then torch, the torchvision/torchaudio
and triton it needs, and those CUDA libraries whose release differs from what the host's torch
brought must travel too. The rest of the host's CUDA libraries serve the new torch, since a
library keeps its ABI within a major.minor release (cuda-toolkit 13.0.2 -> 13.0.3 stays; cuDNN
9.19 -> 9.24 is carried: torch refuses a cuDNN older than the one it was built with).

    python3 bench/gpu/torch_stack.py 0.33.0      # prints one pip spec per line, nothing if none
    python3 bench/gpu/torch_stack.py 0.33.0 --stand-ins FILE   # also: the torch stack the
        # resolution of vLLM's other dependencies should assume, one name==version per line

Exit status 0 either way; the metadata comes from PyPI (`pip install --dry-run`, no downloads).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# What the lent GPU hosts have (device KINDS.md, "pip list").
HOST_STACK = {"torch": "2.11.0", "torchvision": "0.26.0", "torchaudio": "2.11.0", "triton": "3.6.0"}
_PIN = re.compile(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(==|~=)\s*([0-9][^;,\s]*)\s*(;.*)?$")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(requires: list[str]) -> dict[str, tuple[str, str]]:
    """name -> (operator, version) for the `==`/`~=` requirements that apply on Linux, CPython 3.12
    (extras' requirements and other platforms' are left out)."""
    out: dict[str, tuple[str, str]] = {}
    for req in requires:
        m = _PIN.match(req.strip())
        if not m:
            continue
        marker = m.group(5) or ""
        if "extra ==" in marker or re.search(r"platform_system\s*!=\s*.Linux", marker):
            continue
        if re.search(r"platform_system\s*==\s*.(Windows|Darwin)", marker):
            continue
        out[_canonical(m.group(1))] = (m.group(3), m.group(4))
    return out


def _release(version: str, parts: int) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:parts])


def carried(
    vllm_requires: list[str],
    torch_requires: list[str],
    host_torch_requires: list[str],
    host: dict[str, str] | None = None,
) -> list[str]:
    """The pip specs to carry: empty when vLLM pins the host's torch.

    torch_requires: the requirements of the torch vLLM pins; host_torch_requires: those of the
    host's torch (what its CUDA wheels were installed for)."""
    host = host or HOST_STACK
    wanted = {n: v for n, (op, v) in pins(vllm_requires).items() if op == "==" and n in host}
    if wanted.get("torch", host["torch"]) == host["torch"]:
        return []
    specs = [f"{n}=={v}" for n, v in sorted(wanted.items()) if v != host[n]]
    new, old = pins(torch_requires), pins(host_torch_requires)
    for name, (op, version) in sorted(new.items()):
        if name == "triton":
            # `~=3.8.0` means 3.8.*; the host's 3.6 does not do for a torch built against 3.8
            if _release(version, 2) != _release(host["triton"], 2):
                specs.append(f"triton{op}{version}")
        elif op == "==" and name in old and _release(version, 2) != _release(old[name][1], 2):
            specs.append(f"{name}=={version}")
    return specs


def stand_ins(specs: list[str], host: dict[str, str] | None = None) -> list[str]:
    """The torch stack as vLLM's resolution should see it: the host's, with the carried
    versions in place of the host's (wheelhouse.sh stands each in with an empty wheel, so their
    CUDA dependencies are never resolved)."""
    stack = dict(host or HOST_STACK)
    for spec in specs:
        name, _, version = re.split(r"(==|~=)", spec, maxsplit=1)
        if name in stack:
            stack[name] = version
    return [f"{name}=={version}" for name, version in stack.items()]


def _requires(spec: str, pip_args: list[str]) -> list[str]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--dry-run",
                "--ignore-installed",
                "--no-deps",
                "--report",
                str(report),
                "--target",
                str(Path(tmp) / "t"),
                *pip_args,
                spec,
            ],
            check=True,
        )
        (item,) = json.loads(report.read_text())["install"]
        return list(item["metadata"].get("requires_dist", []))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("vllm_version")
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--stand-ins", type=Path, help="write the stack vLLM's resolution sees")
    args = parser.parse_args(argv)
    pip_args = [
        "--only-binary=:all:",
        "--python-version",
        args.python_version,
        "--implementation",
        "cp",
        "--platform",
        "manylinux_2_28_x86_64",
        "--platform",
        "manylinux_2_31_x86_64",
        "--platform",
        "manylinux_2_17_x86_64",
    ]
    vllm_requires = _requires(f"vllm=={args.vllm_version}", pip_args)
    torch_pin = pins(vllm_requires).get("torch", ("==", HOST_STACK["torch"]))[1]
    specs = []
    if torch_pin != HOST_STACK["torch"]:
        specs = carried(
            vllm_requires,
            _requires(f"torch=={torch_pin}", pip_args),
            _requires(f"torch=={HOST_STACK['torch']}", pip_args),
        )
        print("\n".join(specs))
    if args.stand_ins:
        args.stand_ins.write_text("".join(f"{line}\n" for line in stand_ins(specs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
