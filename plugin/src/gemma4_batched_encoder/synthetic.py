"""Random vision towers and patchified inputs shaped like the HF Gemma 4 processor's output."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .presets import VISION_PRESETS

_JSON_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
_JSON_KINDS[type(None)] = "null"


def vision_config_kwargs(
    preset: str | None = None, config_path: str | Path | None = None
) -> dict[str, Any]:
    if config_path is not None:
        try:
            data = json.loads(Path(config_path).read_text())
        except OSError as exc:
            raise ValueError(f"{config_path}: cannot read ({exc.strerror or exc})") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{config_path}: not a JSON file ({exc})") from None
        # Accept a full model config.json too.
        vision = data.get("vision_config", data) if isinstance(data, dict) else data
        if not isinstance(vision, dict):
            where = "its vision_config" if vision is not data else "the file"
            kind = _JSON_KINDS.get(type(vision), type(vision).__name__)
            raise ValueError(
                f"{config_path}: {where} is a JSON {kind}, expected an object "
                "(Gemma4VisionConfig kwargs or a model config.json)"
            )
        return dict(vision)
    if preset not in VISION_PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(VISION_PRESETS)}")
    return dict(VISION_PRESETS[preset])


def build_vision_tower(
    kwargs: dict[str, Any], seed: int = 0, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> torch.nn.Module:
    """A transformers ``Gemma4VisionModel`` with random weights (SDPA attention, eval mode)."""
    from transformers.models.gemma4.configuration_gemma4 import Gemma4VisionConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4VisionModel

    config = Gemma4VisionConfig(**kwargs)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = Gemma4VisionModel(config)
    # Random, non-trivial weights: the default init leaves norms at 1 and the table at ones.
    with torch.no_grad():
        gen = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            std = 0.5 if "position_embedding_table" in name else 0.05
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
        if getattr(config, "standardize", False):
            model.std_bias.copy_(0.1 * torch.randn(model.std_bias.shape, generator=gen))
            model.std_scale.copy_(1.0 + 0.1 * torch.randn(model.std_scale.shape, generator=gen))
    return model.to(device=device, dtype=dtype).eval()


@dataclass
class Media:
    kind: str  # "frame" or "image"
    grid: tuple[int, int]  # (patches high, patches wide) before padding
    budget: int  # max soft tokens (70 for video frames)


def patchify(
    grid: tuple[int, int], budget: int, patch_dim: int, k: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random pixels in [0, 1] for a patch grid, padded to budget*k^2 as the HF processor does."""
    h, w = grid
    max_patches = budget * k * k
    if h % k or w % k or h * w > max_patches:
        raise ValueError(f"grid {h}x{w} must be multiples of {k} and fit {max_patches} patches")
    pv = torch.zeros(max_patches, patch_dim)
    pv[: h * w] = torch.rand(h * w, patch_dim, generator=gen)
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pp = torch.full((max_patches, 2), -1, dtype=torch.long)
    pp[: h * w, 0] = xs.reshape(-1)
    pp[: h * w, 1] = ys.reshape(-1)
    return pv, pp


def grid_for_budget(budget: int, k: int, aspect: float = 4 / 3) -> tuple[int, int]:
    """Largest k-aligned grid of roughly this aspect (w/h) within the budget, like the processor."""
    max_patches = budget * k * k
    h = max(k, int((max_patches / aspect) ** 0.5) // k * k)
    w = max(k, int(h * aspect) // k * k)
    # The widest k-aligned w with h * w <= max_patches, in one step (a loop of k at a time ran
    # for minutes at --image-aspects 1e10); 0 when not even k fits (the CLI rejects that).
    return h, min(w, max_patches // h // k * k)


def make_batch(
    media: list[Media], patch_dim: int, k: int, seed: int = 0
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    pvs, pps = [], []
    for m in media:
        pv, pp = patchify(m.grid, m.budget, patch_dim, k, gen)
        pvs.append(pv)
        pps.append(pp)
    return pvs, pps


def parse_grid(text: str) -> tuple[int, int]:
    h, _, w = text.lower().partition("x")
    return int(h), int(w)
