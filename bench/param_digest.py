"""Digest of every weight a vLLM worker holds, to tell whether two server processes run the same
model bit for bit (the greedy-output classes: bench/README.md).

Served as a worker extension, read through vLLM's dev-mode RPC endpoint:

    VLLM_SERVER_DEV_MODE=1 PYTHONPATH=bench:$PYTHONPATH vllm serve MODEL \
        --worker-extension-cls param_digest.ParamDigest ...
    python bench/param_digest.py --target http://127.0.0.1:8001 --out a.json
    python bench/param_digest.py --compare a.json b.json     # exits 1 on any difference

Each parameter and buffer gets a position-weighted sum of its 32-bit words, computed on its own
device in chunks (no 15 GB copy to the host), plus its shape and dtype. Two processes whose
digests differ hold different weights: something the checkpoint does not set (memory left
uninitialised) or a load that is not deterministic.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

_CHUNK = 1 << 26  # 32-bit words per step: 64 Mi words, 1 GiB of int64 temporaries at most
_MASK64 = (1 << 64) - 1  # the sum wraps as a uint64 would


def tensor_digest(t: torch.Tensor) -> str:
    """Position-weighted sum of the tensor's bytes taken as 32-bit words (tail bytes alone)."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    words = raw.numel() // 4
    total = 0
    if words:
        w = raw[: words * 4].view(torch.int32)
        for start in range(0, words, _CHUNK):
            part = w[start : start + _CHUNK].to(torch.int64)
            pos = torch.arange(start + 1, start + 1 + part.numel(), device=part.device)
            total = (total + int((part * (pos % 1000003 + 1)).sum())) & _MASK64
    tail = bytes(raw[words * 4 :].tolist())
    return f"{total:016x}{tail.hex()}"


def model_digests(model: torch.nn.Module) -> dict[str, list[Any]]:
    """name -> [digest, shape, dtype] for every parameter and buffer."""
    out: dict[str, list[Any]] = {}
    tensors = [*model.named_parameters(), *model.named_buffers()]
    for name, t in tensors:
        out[name] = [tensor_digest(t), list(t.shape), str(t.dtype).removeprefix("torch.")]
    return out


class ParamDigest:
    """vLLM worker extension (``--worker-extension-cls param_digest.ParamDigest``)."""

    def param_digests(self) -> dict[str, list[Any]]:
        runner = self.model_runner  # type: ignore[attr-defined]
        with torch.inference_mode():
            return model_digests(runner.get_model())


def compare(a: dict[str, list[Any]], b: dict[str, list[Any]]) -> dict[str, Any]:
    differ = sorted(n for n in a.keys() & b.keys() if a[n] != b[n])
    return {
        "identical": not differ and a.keys() == b.keys(),
        "tensors": len(a),
        "differing": differ,
        "only_first": sorted(a.keys() - b.keys()),
        "only_second": sorted(b.keys() - a.keys()),
    }


def fetch(target: str) -> dict[str, list[Any]]:
    import httpx

    r = httpx.post(f"{target}/collective_rpc", json={"method": "param_digests"}, timeout=600)
    r.raise_for_status()
    results = r.json()["results"]
    if len(results) != 1 or not isinstance(results[0], dict):
        raise SystemExit(f"expected one worker's digests, got {str(results)[:200]}")
    return results[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", help="server URL (started with the worker extension, dev mode)")
    p.add_argument("--out", type=Path)
    p.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    args = p.parse_args(argv)
    if args.compare:
        a, b = (json.loads(f.read_text()) for f in args.compare)
        result = compare(a, b)
        print(json.dumps({**result, "differing": result["differing"][:50]}))
        return 0 if result["identical"] else 1
    if not args.target or not args.out:
        p.error("--target and --out (or --compare A B)")
    digests = fetch(args.target)
    args.out.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"{len(digests)} tensors from {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
