"""Options shared by the ``verify`` and ``bench`` CLIs: tower and batch composition."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from . import synthetic as S
from .presets import VISION_PRESETS

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


class UsageError(ValueError):
    """Bad arguments, as one line naming the option: exit 2 (verify's 1 means "not
    bit-identical", so a usage error must never look like that)."""


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one line (``--help`` still shows the usage); exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}\n")


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def checked_ints(option: str, text: str, minimum: int) -> list[int]:
    """A comma list of integers >= ``minimum`` for ``option``, at least one."""
    try:
        values = int_list(text)
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected integers, comma separated") from None
    if not values:
        raise UsageError(f"{option} {text!r}: expected at least one integer")
    if min(values) < minimum:
        raise UsageError(f"{option} {text!r}: every value must be >= {minimum}")
    return values


def checked_count(option: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise UsageError(f"{option} {value}: must be >= {minimum}")


# Sizes the tower divides or allocates by (the config's types are checked by transformers).
_POSITIVE_SIZES = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "patch_size",
    "pooling_kernel_size",
    "position_embedding_size",
)


def _checked_config(path: str) -> dict[str, Any]:
    """--config's kwargs, checked by ``Gemma4VisionConfig`` itself (types included)."""
    from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig

    try:
        kwargs = S.vision_config_kwargs(None, path)
        config = Gemma4VisionConfig(**kwargs)
        for name in _POSITIVE_SIZES:
            value = getattr(config, name, 1)
            if isinstance(value, int) and value < 1:
                raise ValueError(f"{name} is {value}, must be >= 1")
    except Exception as exc:  # strict-dataclass errors are TypeErrors, often several lines
        message = _one_line(exc)
        raise UsageError(
            f"--config {message if message.startswith(path) else f'{path}: {message}'}"
        ) from None
    return kwargs


def check_args(args: argparse.Namespace) -> None:
    """Every check that needs no tower: raise UsageError naming the option. Runs before
    anything is built or written (``--out`` included)."""
    if args.config is not None:
        args.vision_kwargs = _checked_config(args.config)
    elif args.preset not in VISION_PRESETS:
        raise UsageError(f"--preset {args.preset!r}: choose from {', '.join(VISION_PRESETS)}")
    checked_count("--frames", args.frames, 1)
    checked_count("--frame-budget", args.frame_budget, 1)
    checked_count("--images", args.images, 0)
    grids = [g.strip().lower().partition("x") for g in args.frame_grid.split(",") if g.strip()]
    if not grids or not all(h.isdigit() and w.isdigit() and int(h) * int(w) for h, _, w in grids):
        raise UsageError(f"--frame-grid {args.frame_grid!r}: expected HxW patch grids, e.g. 21x27")
    checked_ints("--image-budgets", args.image_budgets, 1)
    try:
        aspects = [float(a) for a in args.image_aspects.split(",") if a.strip()]
    except ValueError:
        aspects = []
    if not aspects or not all(math.isfinite(a) and a > 0 for a in aspects):
        raise UsageError(f"--image-aspects {args.image_aspects!r}: expected positive numbers (w/h)")
    videos = checked_ints("--videos", args.videos, 0)
    if args.images == 0 and not any(videos):
        raise UsageError(f"--videos {args.videos!r} with --images 0: no videos and no images")


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
    check: Callable[[argparse.Namespace], None] | None = None,
) -> dict[str, Any] | None:
    """Check the arguments (``check_args``, then the CLI's own ``check``), run the CLI's
    measurement, print `render(result)` and write its JSON to --out.

    Returns None after printing the reason, one line, when the arguments cannot run here (exit
    code 2); nothing is written then."""
    import json

    try:
        check_args(args)
        if check is not None:
            check(args)
        if args.device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: CUDA is not available")
        result = run(args)
    except ValueError as exc:  # UsageError, and what the batch cannot be (e.g. --layout)
        print(f"error: {_one_line(exc)}", file=sys.stderr)
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
    """The call's items; UsageError where the (checked) options do not fit this tower's pooling
    kernel ``k``."""
    grids = [S.parse_grid(g) for g in args.frame_grid.split(",") if g.strip()]
    for h, w in grids:
        if h % k or w % k or h * w > args.frame_budget * k * k:
            raise UsageError(
                f"--frame-grid {h}x{w}: must be multiples of {k} (the tower's pooling kernel) "
                f"and fit --frame-budget {args.frame_budget} ({args.frame_budget * k * k} patches)"
            )
    media: list[S.Media] = []
    for v in range(videos):
        media += [S.Media("frame", grids[v % len(grids)], args.frame_budget)] * args.frames
    budgets = int_list(args.image_budgets)
    aspects = [float(a) for a in args.image_aspects.split(",") if a.strip()]
    for i in range(args.images):
        budget, aspect = budgets[i % len(budgets)], aspects[i % len(aspects)]
        grid = S.grid_for_budget(budget, k, aspect)
        if min(grid) < k:
            raise UsageError(
                f"--image-aspects {aspect:g}: no {k}-aligned grid of that shape within "
                f"--image-budgets {budget}"
            )
        media.append(S.Media("image", grid, budget))
    return Composition(media, [args.frames] * videos)


def load_tower(args: argparse.Namespace) -> torch.nn.Module:
    kwargs = getattr(args, "vision_kwargs", None) or S.vision_config_kwargs(
        None if args.config else args.preset, args.config
    )
    try:
        return S.build_vision_tower(
            kwargs, seed=args.seed, dtype=DTYPES[args.dtype], device=args.device
        )
    except Exception as exc:  # values the config accepts but no tower can be built from
        if args.config is None:
            raise
        raise UsageError(
            f"--config {args.config}: no vision tower from it ({type(exc).__name__}: "
            f"{_one_line(exc)})"
        ) from None


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
