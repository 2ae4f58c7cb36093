"""Options shared by the ``verify`` and ``bench`` CLIs: tower and batch composition."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from . import synthetic as S

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def add_common(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("vision tower")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--preset", default="tiny", help="tiny or e4b (default tiny)")
    src.add_argument("--config", help="JSON file: Gemma4VisionConfig kwargs or a model config.json")
    g.add_argument("--seed", type=int, default=0, help="random weights and pixels")
    g.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    g.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    b = p.add_argument_group("batch")
    b.add_argument("--frames", type=int, default=6, help="frames per video")
    b.add_argument(
        "--frame-grid",
        default="21x27",
        help="patch grid HxW of video frames; a comma list is cycled over videos "
        "(21x27 = 480p, 18x33 = 720p / 854x480)",
    )
    b.add_argument("--frame-budget", type=int, default=70, help="soft tokens per frame (padding)")
    b.add_argument("--images", type=int, default=0, help="images per call")
    b.add_argument(
        "--image-budgets", default="70,140,280", help="soft-token budgets cycled over the images"
    )
    b.add_argument("--image-aspects", default="1.333,0.75,1.0,2.0", help="w/h cycled over images")
    b.add_argument(
        "--layout",
        choices=("list", "stacked"),
        default="list",
        help="how the plugin receives the items: a list of [P, D] tensors, or one stacked "
        "[N, P, D] tensor as vLLM hands video frames (equal padded sizes only; the per-item "
        "references always take the list)",
    )
    p.add_argument("--mode", choices=["exact", "fast"], default="exact")
    p.add_argument(
        "--cuda-graphs", choices=["on", "off"], default="on", help="plugin CUDA graphs (CUDA only)"
    )
    p.add_argument("--out", help="write the JSON result here too")


def run_and_write(
    args: argparse.Namespace,
    run: Callable[[argparse.Namespace], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
) -> dict[str, Any] | None:
    """Run a CLI's measurement, print `render(result)` and write its JSON to --out.

    Returns None after printing the reason when the arguments cannot run here (exit code 2)."""
    import json

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available", file=sys.stderr)
        return None
    try:
        result = run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None
    print(render(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return result


@dataclass
class Composition:
    media: list[S.Media]
    frame_counts: list[int]

    @property
    def frames(self) -> int:
        return sum(self.frame_counts)

    @property
    def images(self) -> int:
        return sum(1 for m in self.media if m.kind == "image")


def composition(args: argparse.Namespace, videos: int, k: int) -> Composition:
    grids = [S.parse_grid(g) for g in args.frame_grid.split(",") if g.strip()]
    media: list[S.Media] = []
    for v in range(videos):
        media += [S.Media("frame", grids[v % len(grids)], args.frame_budget)] * args.frames
    budgets = int_list(args.image_budgets)
    aspects = [float(a) for a in args.image_aspects.split(",") if a.strip()]
    for i in range(args.images):
        budget = budgets[i % len(budgets)]
        media.append(
            S.Media("image", S.grid_for_budget(budget, k, aspects[i % len(aspects)]), budget)
        )
    return Composition(media, [args.frames] * videos)


def load_tower(args: argparse.Namespace) -> torch.nn.Module:
    kwargs = S.vision_config_kwargs(None if args.config else args.preset, args.config)
    return S.build_vision_tower(
        kwargs, seed=args.seed, dtype=DTYPES[args.dtype], device=args.device
    )


def inputs(
    args: argparse.Namespace, comp: Composition, vt: torch.nn.Module, seed: int
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    cfg = vt.config
    pvs, pps = S.make_batch(comp.media, 3 * cfg.patch_size**2, cfg.pooling_kernel_size, seed=seed)
    dtype = DTYPES[args.dtype]
    return ([p.to(args.device, dtype) for p in pvs], [p.to(args.device) for p in pps])


def laid_out(
    args: argparse.Namespace, pvs: list[torch.Tensor], pps: list[torch.Tensor]
) -> tuple[list[torch.Tensor] | torch.Tensor, list[torch.Tensor] | torch.Tensor]:
    """The plugin's inputs in ``--layout``: the lists as they are, or each stacked."""
    if args.layout == "list":
        return pvs, pps
    if len({tuple(p.shape) for p in pvs}) > 1:
        raise ValueError("--layout stacked needs items of one padded size (no mixed budgets)")
    return torch.stack(pvs), torch.stack(pps)
