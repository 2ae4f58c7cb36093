"""vLLM adapter: ``Gemma4ForConditionalGeneration`` with the batched vision encoder.

Adapted from vllm/model_executor/models/gemma4_mm.py (vLLM 0.20-0.34). Only the image/video
encoding methods (on 0.34+ their per-rank ``_local`` bodies, so upstream's data-parallel dispatch
stays) and the encoder CUDA-graph forward where upstream has one are overridden; the maths lives
in ``encode_frames``. Pixel values that arrive as uint8 patches
(``GEMMA4_MEDIA_UINT8=on``) become stock's values on the device before anything reads them
(``pixels``). The class keeps upstream's name (speculative decoding keys on
``__class__.__name__``) and inherits its processor, dummy inputs and weights loading.
Patch ledger: plugin/README.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from vllm.model_executor.models.gemma4_mm import (
    Gemma4ForConditionalGeneration as _Upstream,
)
from vllm.platforms import current_platform

from . import (
    engine_cpu,
    engine_graph_ranges,
    engine_mm_batching,
    engine_mm_ranges,
    engine_profile,
    pixels,
)
from .engine_threads import set_engine_torch_threads
from .log import logger
from .media.env import uint8_requested
from .pooling import pool_exact
from .runtime import EncoderRuntime
from .settings import Settings
from .versions import Layout, gate, vllm_version

VLLM_VERSION = vllm_version()
LAYOUT: Layout | None = gate(_Upstream, VLLM_VERSION)

try:
    from vllm.utils.gpu_sync_debug import gpu_sync_allowed as _sync_allowed
except ImportError:  # vLLM < 0.23 has no sync checker
    _sync_allowed = contextlib.nullcontext


def _flatten_counts(value: Any) -> list[int] | None:
    """video_num_soft_tokens (host lists or CPU tensors) as one flat list, or None."""
    out: list[int] = []

    def walk(v: Any) -> bool:
        if isinstance(v, torch.Tensor):
            if v.device.type != "cpu":
                return False  # reading it would sync
            out.extend(int(x) for x in v.reshape(-1).tolist())
            return True
        if isinstance(v, (list, tuple)):
            return all(walk(x) for x in v)
        if isinstance(v, int):
            out.append(v)
            return True
        return False

    return out if value is not None and walk(value) else None


def _engine_patches(settings: Settings, vllm_config: Any) -> None:
    """The model runner's patches (engine_mm_*.py), each on its own: one that fails is logged
    and leaves vLLM's code, and the encoder override, as they are."""
    on_cpu = current_platform.is_cpu()
    patches: tuple[tuple[str, Callable[[], object]], ...] = (
        (
            "GEMMA4_ENGINE_ASYNC_RANGES",
            lambda: engine_mm_ranges.install(settings.engine_async_ranges),
        ),
        (
            "GEMMA4_ENGINE_GPU_BATCHING",
            lambda: engine_mm_batching.install(settings.engine_gpu_batching, on_cpu),
        ),
        (
            "GEMMA4_ENGINE_GRAPH_RANGES",
            lambda: engine_graph_ranges.apply(settings.engine_graph_ranges, vllm_config),
        ),
        ("the profile run's exclusion from the encoder metrics", engine_profile.install),
    )
    for name, install in patches:
        try:
            install()
        except Exception:
            logger.warning("gemma4_batched_encoder: %s not applied", name, exc_info=True)


def _inactive_reason(model: Any, settings: Settings) -> str | None:
    """Why the override stays out of this model (None: it applies)."""
    if settings.disabled:
        return "GEMMA4_ENCODER_DISABLE"
    if getattr(model, "_enable_mm_lora", False):
        return "MM LoRA on the tower"
    if LAYOUT is Layout.LOCAL:
        # 0.34's `_embed_patches` feeds input_proj the model dtype; the tower's patch embedder
        # (which the batched encoder calls) casts to input_proj's weight dtype instead: the same
        # unless the tower is quantized
        weight = getattr(model.vision_tower.patch_embedder.input_proj, "weight", None)
        if weight is None or weight.dtype != model.model_dtype:
            return "quantized vision tower"
    return None


class Gemma4ForConditionalGeneration(_Upstream):
    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        # What vLLM's processor casts floating pixel values to (`_postprocess_output`).
        self._g4_pixel_dtype: torch.dtype = vllm_config.model_config.dtype
        self._g4_uint8_seen = False
        # vLLM 0.34+ rescales on the device itself: its uint8 pixel values are left to it
        self._g4_device_norm = pixels.device_normalizes(vllm_config)
        if self._g4_device_norm:
            logger.info(
                "gemma4_batched_encoder: this vLLM rescales pixel values on the device "
                "(mm_device_do_normalize); the plugin leaves its uint8 pixel values to it%s",
                " (GEMMA4_MEDIA_UINT8 has nothing to add)" if uint8_requested() else "",
            )
        elif uint8_requested():
            pixels.install_batch_guard()
        self._g4_video_tokens: list[int] | None = None
        self._g4: EncoderRuntime | None = None
        try:
            settings = Settings.from_env()
            # Only the engine core (one GPU) or the workers build the model; API servers don't.
            set_engine_torch_threads(settings.engine_torch_threads, current_platform.is_cpu())
            _engine_patches(settings, vllm_config)
            self._g4_inactive = _inactive_reason(self, settings)
            active = LAYOUT is not None and self._g4_inactive is None
            self._g4 = EncoderRuntime(self.vision_tower, settings, active, VLLM_VERSION)
        except Exception:
            # Never keep vLLM from starting: without a runtime every method is the stock one.
            logger.warning(
                "gemma4_batched_encoder: plugin setup failed; stock vision encoder in use",
                exc_info=True,
            )
            return
        try:  # this thread builds the model and runs it: the step loop's CPU on /metrics
            engine_cpu.start_for_this_thread(self._g4.metrics)
        except Exception:  # a metric never keeps the encoder from serving
            logger.warning("gemma4_batched_encoder: engine thread CPU not sampled", exc_info=True)
        if self._g4.active:
            logger.info(
                "gemma4_batched_encoder: vision encoder override active (mode=%s, layout=%s, "
                "cuda_graphs=%s, vllm=%s)",
                settings.mode,
                LAYOUT.value if LAYOUT else None,
                self._g4.encoder.graphs_active(next(self.vision_tower.parameters()).device),
                VLLM_VERSION,
            )
        elif LAYOUT is not None:  # (unrecognised code was already reported once, at import)
            logger.warning(
                "gemma4_batched_encoder: plugin inactive (%s); stock vision encoder in use",
                self._g4_inactive,
            )

    # -- call level: metrics and host-side hints ------------------------------------------------
    def _g4_restore_pixels(self, kwargs: dict[str, Any]) -> None:
        """uint8 patches (the hand-off) -> stock's pixel values, in place, on their device;
        where vLLM rescales on the device itself, uint8 is its own input: left as it is."""
        if getattr(self, "_g4_device_norm", False):
            return
        dtype = getattr(self, "_g4_pixel_dtype", None) or self.model_dtype
        if pixels.restore(kwargs, dtype) and not getattr(self, "_g4_uint8_seen", False):
            self._g4_uint8_seen = True
            logger.info(
                "gemma4_batched_encoder: uint8 pixel values received; rescaled on %s to %s",
                next(self.vision_tower.parameters()).device,
                dtype,
            )

    def embed_multimodal(self, **kwargs: object) -> Any:
        self._g4_restore_pixels(kwargs)
        pv = kwargs.get("pixel_values")
        pvv = kwargs.get("pixel_values_videos")
        if self._g4 is None or (pv is None and pvv is None):
            return super().embed_multimodal(**kwargs)
        frames = int(pvv.shape[0]) if isinstance(pvv, torch.Tensor) else 0
        images = (
            (len(pv) if isinstance(pv, (list, tuple)) else int(pv.shape[0]))
            if pv is not None
            else 0
        )
        self._g4_video_tokens = _flatten_counts(kwargs.get("video_num_soft_tokens"))
        self._g4.begin_call(frames, images)
        try:
            return super().embed_multimodal(**kwargs)
        finally:
            self._g4_video_tokens = None
            self._g4.end_call()

    # -- per modality -------------------------------------------------------------------------
    def _process_image_input(self, image_input: Any) -> list[torch.Tensor]:
        if self._g4 is None or LAYOUT is Layout.LOCAL:
            return super()._process_image_input(image_input)
        return self._g4.run(self._g4_images, super()._process_image_input, image_input)

    def _process_video_input(self, video_input: Any) -> list[torch.Tensor]:
        if self._g4 is None or LAYOUT is Layout.LOCAL:
            return super()._process_video_input(video_input)
        return self._g4.run(self._g4_videos, super()._process_video_input, video_input)

    if hasattr(_Upstream, "_process_image_input_local"):  # 0.34+: each rank's share of items

        def _process_image_input_local(self, image_input: Any) -> list[torch.Tensor]:
            stock = super()._process_image_input_local
            if self._g4 is None or LAYOUT is not Layout.LOCAL:
                return stock(image_input)
            return self._g4.run(self._g4_images, stock, image_input)

        def _process_video_input_local(self, video_input: Any) -> list[torch.Tensor]:
            stock = super()._process_video_input_local
            if self._g4 is None or LAYOUT is not Layout.LOCAL:
                return stock(video_input)
            return self._g4.run(self._g4_videos, stock, video_input)

    def _g4_pixels(self, pixel_values: Any) -> Any:
        """What the tower's patch embedder sees of stock's pixel values. 0.34+ embeds with
        `_embed_patches`: its input norm (uint8 -> rescaled, in the model dtype), then the patch
        embedder's own arithmetic; the norm is elementwise, so normalizing a whole batch at once
        gives stock's values wherever stock's chunks cut it."""
        if LAYOUT is not Layout.LOCAL:
            return pixel_values
        if isinstance(pixel_values, (list, tuple)):
            return [self._g4_pixels(p) for p in pixel_values]
        channels = getattr(self.vision_tower.config, "num_channels", 3)
        flat = pixel_values.reshape(-1, channels)
        return self.vision_input_norm(flat, self.model_dtype).view(pixel_values.shape)

    def _g4_images(self, image_input: Any) -> list[torch.Tensor]:
        with _sync_allowed():  # without host-side counts, valid patches are read in one transfer
            pooled = self._g4.encoder.encode(
                self._g4_pixels(image_input["pixel_values"]), image_input["pixel_position_ids"]
            )
        return self._g4_project(pooled, [1] * len(pooled))

    def _g4_videos(self, video_input: Any) -> list[torch.Tensor]:
        pixel_values = video_input["pixel_values_videos"]
        counts = video_input["video_frame_counts"]
        fc = [int(c) for c in (counts.tolist() if isinstance(counts, torch.Tensor) else counts)]
        if sum(fc) != pixel_values.shape[0]:
            raise ValueError(f"frame counts {fc} do not add up to {pixel_values.shape[0]} frames")
        hint = self._g4_video_tokens
        if hint is not None and len(hint) != pixel_values.shape[0]:
            hint = None
        with _sync_allowed():
            pooled = self._g4.encoder.encode(
                self._g4_pixels(pixel_values),
                video_input["pixel_position_ids_videos"],
                valid_tokens=hint,
            )
        return self._g4_project(pooled, fc)

    def _g4_project(self, pooled: list[torch.Tensor], group_sizes: list[int]) -> list[torch.Tensor]:
        """Project soft tokens exactly as the stock path of this vLLM layout does, then group."""
        if LAYOUT is Layout.SERIAL:
            # 0.20-0.22 project every frame/image on its own (the GEMM shape decides the bits).
            target = self.embed_vision.embedding_projection.weight.dtype
            per_item = [
                self.embed_vision(inputs_embeds=p.unsqueeze(0).to(target)).squeeze(0)
                for p in pooled
            ]
            out, i = [], 0
            for n in group_sizes:
                out.append(per_item[i] if n == 1 else torch.cat(per_item[i : i + n], dim=0))
                i += n
            return out
        # 0.23+: one projection over all valid tokens of the modality, then views per group.
        flat = torch.cat(pooled, dim=0).to(self.model_dtype)
        proj = self.embed_vision(inputs_embeds=flat.unsqueeze(0)).squeeze(0)
        out, i, offset = [], 0, 0
        for n in group_sizes:
            length = sum(int(p.shape[0]) for p in pooled[i : i + n])
            out.append(proj[offset : offset + length])
            offset += length
            i += n
        return out

    # -- vLLM's own encoder CUDA graphs (0.32+, opt-in there) ----------------------------------
    if hasattr(_Upstream, "select_encoder_cudagraph_items"):

        def select_encoder_cudagraph_items(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            """Upstream's selection with uint8 patches restored: vLLM's graph manager feeds it
            (not ``embed_multimodal``) to the replay buffers and the eager forward."""
            selected = super().select_encoder_cudagraph_items(*args, **kwargs)
            self._g4_restore_pixels(selected)
            return selected

    if hasattr(_Upstream, "encoder_cudagraph_forward"):

        def encoder_cudagraph_forward(
            self, inputs: dict[str, torch.Tensor], path: str = "default", **kwargs: Any
        ) -> torch.Tensor:
            """Upstream's captured forward with its one batched pooler GEMM replaced by the
            per-item GEMMs of ``pool_exact`` (the batched call drifts by one bf16 ulp); any
            error in it runs upstream's, counted in the fallbacks like the other paths."""

            def stock() -> torch.Tensor:
                return _Upstream.encoder_cudagraph_forward(self, inputs, path=path, **kwargs)

            if self._g4 is None or not self._g4.active:
                return stock()
            return self._g4.guarded(lambda: self._g4_graph_forward(inputs), stock)

        def _g4_graph_forward(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
            pixel_values = inputs["pixel_values"]
            position_ids = inputs["pixel_position_ids"]
            pad = (position_ids == -1).all(dim=-1)
            vt = self.vision_tower
            if LAYOUT is Layout.LOCAL:  # upstream's own embedding (uint8 buffers on 0.34+)
                embeds = self._embed_patches(pixel_values, position_ids, pad)
            else:
                embeds = vt.patch_embedder(pixel_values, position_ids, pad).to(self.model_dtype)
            hidden = vt.encoder(
                inputs_embeds=embeds, attention_mask=~pad, pixel_position_ids=position_ids
            ).last_hidden_state
            k = vt.config.pooling_kernel_size
            pooled = pool_exact(
                hidden,
                position_ids,
                pad,
                pixel_values.shape[1] // (k * k),
                k,
                vt.pooler.root_hidden_size,
            )
            if getattr(vt.config, "standardize", False):
                pooled = (pooled - vt.std_bias) * vt.std_scale
            gathered = pooled.reshape(-1, pooled.shape[-1])[inputs["gather_indices"]]
            gathered = gathered.to(
                self.model_dtype
                if LAYOUT is Layout.LOCAL
                else self.embed_vision.embedding_projection.weight.dtype
            )
            return self.embed_vision(inputs_embeds=gathered.unsqueeze(0)).squeeze(0)
