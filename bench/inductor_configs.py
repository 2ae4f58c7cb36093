"""Which launch-time autotuning choices did each vLLM server make? Issue 7's greedy question.

    python bench/inductor_configs.py stock-a=/tmp/cache-stock-a plugin=/tmp/cache-plugin \
        [--out configs.json]

Each NAME=DIR is one server's cache root as `bench/gpu/h200.sh serve ... FRESH_CACHES=1` lays it
out (vLLM's cache with inductor's inside it, and `triton/`). Inductor keeps the config its
launch-time benchmarking chose for each kernel beside the kernel (`*.best_config`, named by a hash
of the kernel, so the same kernel has the same name on every server); the config's
`triton_cache_hash` names the Triton cache folder whose metadata holds the kernel's name.

Prints, for every pair of servers, how many of inductor's generated modules are the same (the
servers' own paths taken out), and the kernels whose chosen configs differ, split by kind:
reductions (`triton_red_*`: R0_BLOCK and num_warps change the summation order) and persistent
reductions (`triton_per_*`: num_warps does), which can change numerics, and pointwise kernels
(`triton_poi_*`), which cannot. Writes every server's kernel -> config table with --out.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import re
import sys
from pathlib import Path

# Bookkeeping fields of a .best_config, not the choice itself.
_NOT_CHOICE = ("found_by_coordesc", "time_taken_ms", "triton_cache_hash", "configs_hash")


def kernel_kind(name: str, config: dict) -> str:
    for prefix, kind in (
        ("triton_red_", "reduction"),
        ("triton_per_", "persistent reduction"),
        ("triton_poi_", "pointwise"),
    ):
        if name.startswith(prefix):
            return kind
    # Kernels compiled only to be benchmarked while fusing keep inductor's placeholder name
    # (`triton_`); an R0_BLOCK in the config still marks a reduction.
    return "reduction" if any(k.startswith("R0_") for k in config) else "other"


def _kernel_names(root: Path) -> dict[str, str]:
    """Triton cache folder (the hash a best_config names) -> the kernel's name, from the
    metadata file beside the compiled kernel; one walk of the cache root."""
    return {
        meta.parent.name: meta.stem
        for meta in sorted(root.rglob("*.json"))
        if not meta.name.startswith("__grp__")
    }


def server_configs(root: Path) -> dict[str, dict]:
    """best_config name (a hash of the kernel) -> {"kernel", "kind", "config"}, one server."""
    names = _kernel_names(root)
    out = {}
    for path in sorted(root.rglob("*.best_config")):
        raw = json.loads(path.read_text())
        name = names.get(raw.get("triton_cache_hash") or "", "?")
        config = {k: v for k, v in raw.items() if k not in _NOT_CHOICE}
        out[path.stem] = {"kernel": name, "kind": kernel_kind(name, config), "config": config}
    return out


def generated_code(root: Path) -> set[str]:
    """Hashes of inductor's generated modules, with the server's own paths taken out (each
    module names its cache folder, so the files' names differ between servers even when the
    code is the same)."""
    out = set()
    for path in root.rglob("*.py"):
        if "inductor_cache" not in path.parts:
            continue
        text = path.read_text(errors="replace").replace(str(root), "ROOT")
        text = re.sub(r"# kernel path: .*", "", text)
        text = re.sub(r"inductor_cache/\w{2}/c\w{51}", "KERNEL", text)
        out.add(hashlib.sha256(text.encode()).hexdigest())
    return out


def compare(servers: dict[str, dict[str, dict]]) -> list[dict]:
    """For each pair: the shared kernels whose configs differ, numerics-relevant ones first."""
    pairs = []
    for a, b in itertools.combinations(servers, 2):
        shared = sorted(set(servers[a]) & set(servers[b]))
        diffs = [
            {
                "kernel": servers[a][k]["kernel"],
                "kind": servers[a][k]["kind"],
                a: servers[a][k]["config"],
                b: servers[b][k]["config"],
            }
            for k in shared
            if servers[a][k]["config"] != servers[b][k]["config"]
        ]
        numeric = [d for d in diffs if "reduction" in d["kind"]]
        pairs.append(
            {
                "pair": [a, b],
                "shared_kernels": len(shared),
                "differing": len(diffs),
                "differing_reductions": numeric,
                "differing_other": [d for d in diffs if "reduction" not in d["kind"]],
            }
        )
    return pairs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("servers", nargs="+", metavar="NAME=DIR", help="a server's cache root")
    ap.add_argument("--out", type=Path, help="write the tables and the comparison as JSON")
    args = ap.parse_args(argv)
    servers, code = {}, {}
    for spec in args.servers:
        name, sep, root = spec.partition("=")
        if not sep or not Path(root).is_dir():
            ap.error(f"{spec!r}: expected NAME=DIR with an existing directory")
        servers[name] = server_configs(Path(root))
        code[name] = generated_code(Path(root).resolve())
    pairs = compare(servers)
    for name, table in servers.items():
        print(f"{name}: {len(table)} autotuned kernels, {len(code[name])} generated modules")
    for p in pairs:
        a, b = p["pair"]
        # same generated code: then only the autotuned configs below can differ at compile time
        p["generated_code"] = {
            "same": len(code[a] & code[b]),
            f"only {a}": len(code[a] - code[b]),
            f"only {b}": len(code[b] - code[a]),
        }
        print(
            f"{a} vs {b}: {p['shared_kernels']} shared, {p['differing']} differ, "
            f"{len(p['differing_reductions'])} of them reductions; generated modules "
            + ", ".join(f"{k} {v}" for k, v in p["generated_code"].items())
        )
        for d in p["differing_reductions"]:
            print(f"    {d['kernel']} ({d['kind']}): {d[a]} vs {d[b]}")
    if args.out:
        args.out.write_text(json.dumps({"servers": servers, "pairs": pairs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
