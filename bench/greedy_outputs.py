"""Greedy outputs of a running server on a fixed set of text, image and video requests.

    python bench/greedy_outputs.py --target http://127.0.0.1:8001 --model M --out stock.json
    python bench/greedy_outputs.py --compare stock.json plugin.json
    python bench/greedy_outputs.py --classes a.json b.json c.json ...   # identical groups

The inputs depend only on --seed, so two servers (stock vLLM, vLLM + plugin) answer the same
requests; requests are sent one at a time so the batch composition is the same on both. With
`--compare`, prints which requests differ and exits 1 on any difference. Each request records
its greedy tokens and the top-5 logprob values at every step, with special tokens kept in the
text: a dummy-weights model emits only `<pad>`, so the tokens alone would agree whatever the
encoder computed, while the logprob values still depend on every input embedding.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

# (kind, width, height): sizes and aspect ratios that give different soft-token layouts
CASES: list[tuple[str, int, int]] = [
    ("text", 0, 0),
    ("image", 640, 480),
    ("image", 320, 900),
    ("image", 1280, 720),
    ("video", 854, 480),
    ("video", 1280, 720),
    ("image+video", 640, 480),
]


def _png_url(rng: np.random.Generator, width: int, height: int) -> str:
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def build_requests(seed: int, model: str, tmp: Path) -> list[dict]:
    # Here, not at the top: `--compare` needs neither this nor slo_loadtest (a plain python3 on
    # the GPU host compared two files and failed on that import; 2026-12-02).
    from ttft_gap import chat_body, video_url  # same directory: `python bench/greedy_outputs.py`

    rng = np.random.default_rng(seed)
    bodies = []
    for i, (kind, width, height) in enumerate(CASES):
        content: list[dict] = [{"type": "text", "text": f"case {i}: describe what you see."}]
        if "image" in kind:
            url = _png_url(rng, width, height)
            content.append({"type": "image_url", "image_url": {"url": url}})
        if "video" in kind:
            url = video_url(i, seed, tmp, width, height)
            content.append({"type": "video_url", "video_url": {"url": url}})
        if kind == "text":
            content = [
                {"type": "text", "text": " ".join(f"w{(seed + j) % 997}" for j in range(480))}
            ]
        bodies.append(chat_body(model, content, logprobs=True, top_logprobs=5))
    return bodies


def collect(target: str, model: str, seed: int) -> list[dict]:
    url = target.rstrip("/") + "/v1/chat/completions"
    out = []
    with tempfile.TemporaryDirectory() as tmp_dir, httpx.Client(timeout=120) as client:
        for i, body in enumerate(build_requests(seed, model, Path(tmp_dir))):
            resp = client.post(url, json=body)
            resp.raise_for_status()
            choice = resp.json()["choices"][0]
            steps = (choice.get("logprobs") or {}).get("content") or []
            tokens = [t["token"] for t in steps]
            top = [[[c["token"], c["logprob"]] for c in t.get("top_logprobs") or []] for t in steps]
            out.append(
                {
                    "case": i,
                    "kind": CASES[i][0],
                    "size": CASES[i][1:],
                    "text": choice["message"]["content"],
                    "tokens": tokens,
                    "top_logprobs": top,
                }
            )
    return out


def _max_logprob_diff(x: dict, y: dict) -> float | None:
    """Largest |logprob difference| over the top-5 entries both runs list at the same step and
    token (None when the greedy tokens differ: then the steps are not comparable)."""
    if x["tokens"] != y["tokens"]:
        return None
    diff = 0.0
    for sx, sy in zip(x.get("top_logprobs") or [], y.get("top_logprobs") or [], strict=True):
        other = dict(map(tuple, sy))
        diff = max([diff, *(abs(lp - other[tok]) for tok, lp in sx if tok in other)])
    return diff


def _differs(x: dict, y: dict) -> bool:
    """One request's outputs differ: a greedy token or a top-5 logprob."""
    return x["tokens"] != y["tokens"] or x.get("top_logprobs") != y.get("top_logprobs")


def compare(a_path: Path, b_path: Path) -> int:
    a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
    pairs = list(zip(a["outputs"], b["outputs"], strict=True))
    diffs = [(x["case"], x["kind"]) for x, y in pairs if _differs(x, y)]
    print(
        json.dumps(
            {
                "identical": not diffs,
                "requests": len(pairs),
                "differing": diffs,
                "tokens_equal": all(x["tokens"] == y["tokens"] for x, y in pairs),
                # per differing request: its largest top-5 logprob difference (nats)
                "max_logprob_diff": {
                    f"{x['case']}:{x['kind']}": _max_logprob_diff(x, y)
                    for x, y in pairs
                    if (x["case"], x["kind"]) in diffs
                },
            }
        )
    )
    return 1 if diffs else 0


def _same(a: dict, b: dict) -> bool:
    """Every greedy token and every top-5 logprob equal."""
    xs, ys = a["outputs"], b["outputs"]
    return len(xs) == len(ys) and not any(map(_differs, xs, ys))


def classes(paths: list[Path]) -> int:
    """Group runs (e.g. one file a server process) into classes of bit-identical outputs, in
    first-seen order; prints them as JSON; exit 1 when there is more than one class."""
    groups: list[tuple[dict, list[str]]] = []
    for path in paths:
        run = json.loads(path.read_text())
        for first, members in groups:
            if _same(first, run):
                members.append(str(path))
                break
        else:
            groups.append((run, [str(path)]))
    print(json.dumps({"runs": len(paths), "classes": [members for _, members in groups]}))
    return 1 if len(groups) > 1 else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--model", default="")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"))
    parser.add_argument(
        "--classes", nargs="+", type=Path, metavar="RUN", help="group runs into identical classes"
    )
    args = parser.parse_args()
    if args.compare:
        sys.exit(compare(*args.compare))
    if args.classes:
        sys.exit(classes(args.classes))
    if not args.target:
        parser.error("--target is required unless --compare or --classes is given")
    result = {
        "target": args.target,
        "seed": args.seed,
        "outputs": collect(args.target, args.model, args.seed),
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text)
    print(f"{len(result['outputs'])} greedy outputs from {args.target}")


if __name__ == "__main__":
    main()
