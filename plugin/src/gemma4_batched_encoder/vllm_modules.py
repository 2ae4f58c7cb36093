"""A vLLM name moves between modules across versions: find it in the first module that has it."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any

# VideoMediaIO: vllm/multimodal/media/video.py on 0.27+, vllm/multimodal/video.py before.
VIDEO_IO_MODULES = ("vllm.multimodal.media.video", "vllm.multimodal.video")
# BaseMultiModalProcessor: vllm/multimodal/processing/processor.py on 0.32+ (a package),
# vllm/multimodal/processing.py before.
PROCESSOR_MODULES = ("vllm.multimodal.processing.processor", "vllm.multimodal.processing")
# OpenCVVideoBackendMixin: vllm/multimodal/video_decoders/opencv.py on 0.32+, video.py before.
OPENCV_MODULES = ("vllm.multimodal.video_decoders.opencv", "vllm.multimodal.video")


def first_attr(modules: Iterable[str], name: str) -> tuple[str, Any] | None:
    """(module name, object) of the first importable module that defines `name`, else None."""
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        obj = getattr(module, name, None)
        if obj is not None:
            return module_name, obj
    return None
