"""Per-model runtime of the plugin: fallback to stock, shadow verification, metrics, timing.

vLLM-independent so that the fallback and verification logic are tested on real towers; the
vLLM subclass passes its stock (upstream) methods in as ``stock``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch import nn

from . import __version__
from .encoder import BatchedVisionEncoder
from .log import logger
from .metrics import NO_METRICS, get_metrics, recording, records_metrics, set_info
from .settings import Settings
from .timing import CallTimer

Encode = Callable[[Any], list[torch.Tensor]]
T = TypeVar("T")


def outputs_equal(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y)
        for x, y in zip(a, b, strict=True)
    )


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False where CUDA is unusable)."""
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # a CPU-only build or no driver: nothing can be capturing
        return False


class EncoderRuntime:
    def __init__(
        self,
        vision_tower: nn.Module,
        settings: Settings,
        active: bool,
        vllm_version: str = "none",
    ) -> None:
        self.settings = settings
        self.encoder = BatchedVisionEncoder(vision_tower, settings)
        self.active = active and not settings.disabled
        # Every tensor-parallel rank runs the same encoder call: one rank records it.
        self.recording = records_metrics()
        self.metrics = get_metrics() if self.recording else NO_METRICS
        # Only a recording rank times calls (a CallTimer records CUDA events on the GPU).
        self.timer = (
            CallTimer(lambda path, s: self.metrics.seconds.labels(path=path).observe(s))
            if self.recording
            else None
        )
        self._device = next(vision_tower.parameters()).device
        self._checks = 0
        self._logged: set[str] = set()
        self._call_path: str | None = None
        self._fused_reported: bool | None = None  # written at the first call, then on change
        self._graphs_reported = (0, 0)  # (captured, failed), as the gauges' initial zeros
        self._info = {
            "mode": settings.mode if self.active else "stock",
            "cuda_graphs": self.active and self.encoder.graphs_active(self._device),
            "vllm_version": vllm_version,
            "plugin_version": __version__,
        }
        self._fast_kernels_reported = self.encoder.fast_kernels_in_force(self._device)
        self._fast_changes_seen = self.encoder.fast_layers_changes
        set_info(**self._info, fast_kernels=self._fast_kernels_reported, metrics=self.metrics)

    # -- one embed_multimodal call ------------------------------------------------------------
    def begin_call(self, frames: int, images: int) -> None:
        self._call_path = "plugin" if self.active else "stock"
        if not recording():  # vLLM's start-up profile run (engine_profile.py)
            return
        try:
            if frames:
                self.metrics.items_per_call.labels(kind="frame").observe(frames)
            if images:
                self.metrics.items_per_call.labels(kind="image").observe(images)
            if self.timer is not None:
                self.timer.start(self._device)
        except Exception:
            self._log_once("metrics", "recording metrics failed")

    def end_call(self) -> None:
        path = self._call_path or "stock"
        self._call_path = None
        try:
            if recording():
                self.metrics.calls.labels(path=path).inc()
                if self.timer is not None:
                    self.timer.stop(path)
            fused = self.encoder.fused_in_use()
            if fused != self._fused_reported:  # decided at the first call; no write per call
                self._fused_reported = fused
                self.metrics.fused_layers.set(1 if fused else 0)
            changes = self.encoder.fast_layers_changes
            if changes != self._fast_changes_seen:  # built at the first call; may fall back later
                self._fast_changes_seen = changes
                kernels = self.encoder.fast_kernels_in_force(self._device)
                if kernels != self._fast_kernels_reported:
                    self._fast_kernels_reported = kernels
                    set_info(**self._info, fast_kernels=kernels, metrics=self.metrics)
            graphs = self.encoder.graphs
            counts = (graphs.num_graphs, graphs.num_failed)
            if counts != self._graphs_reported:  # captures happen at first use of a shape
                self._graphs_reported = counts
                self.metrics.cuda_graphs.labels(state="captured").set(counts[0])
                self.metrics.cuda_graphs.labels(state="failed").set(counts[1])
        except Exception:
            self._log_once("metrics", "recording metrics failed")

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            logger.warning("gemma4_batched_encoder: %s", message, exc_info=True)

    def _record(self, record: Callable[[], object]) -> None:
        """A metric update that must never fail the request it describes."""
        try:
            record()
        except Exception:
            self._log_once("metrics", "recording metrics failed")

    # -- one modality within the call ---------------------------------------------------------
    def run(self, plugin: Encode, stock: Encode, arg: Any) -> list[torch.Tensor]:
        if not self.active:
            return stock(arg)
        try:
            out = plugin(arg)
        except Exception as exc:
            return self._fallback(exc, stock, arg)
        every = self.settings.verify_every
        if every:
            self._checks += 1
            if self._checks % every == 0:
                return self._shadow_verify(out, stock, arg)
        return out

    def guarded(self, plugin: Callable[[], T], stock: Callable[[], T]) -> T:
        """``plugin()``, or on any exception ``stock()`` (counted and logged as in ``run``); no
        shadow verification: vLLM's encoder CUDA graphs capture this, where a compare syncs.

        Inside a CUDA-graph capture the exception is re-raised instead (logged, not counted in
        the fallbacks: nothing ran stock): kernels the plugin launched before failing are already
        in the graph, so a fallback there would capture both and run the encoder twice at every
        replay. The capture then fails as it would with stock's own error, for vLLM to handle."""
        try:
            return plugin()
        except Exception as exc:
            if _capturing():
                self._log_once(
                    "capture", "plugin encoder failed during CUDA graph capture; not falling back"
                )
                raise
            return self._fallback(exc, lambda _: stock(), None)

    def _fallback(self, exc: Exception, stock: Callable[[Any], T], arg: Any) -> T:
        reason = type(exc).__name__
        self._record(lambda: self.metrics.fallbacks.labels(reason=reason).inc())
        if reason not in self._logged:
            self._logged.add(reason)
            logger.warning(
                "gemma4_batched_encoder: plugin encoder failed (%s); this call and later failures "
                "use the stock path",
                reason,
                exc_info=True,
            )
        self._call_path = "stock"
        return stock(arg)

    def _shadow_verify(
        self, out: list[torch.Tensor], stock: Encode, arg: Any
    ) -> list[torch.Tensor]:
        try:
            ref = stock(arg)
        except Exception:
            logger.warning(
                "gemma4_batched_encoder: stock path failed during shadow verify", exc_info=True
            )
            return out
        self._record(lambda: self.metrics.verify_checks.inc())
        if outputs_equal(out, ref):
            return out
        self._record(lambda: self.metrics.verify_mismatches.inc())
        if "mismatch" not in self._logged:
            self._logged.add("mismatch")
            diffs = [
                (x.float() - y.float()).abs().max().item() if x.shape == y.shape else float("inf")
                for x, y in zip(out, ref, strict=False)
            ]
            logger.warning(
                "gemma4_batched_encoder: shadow verify mismatch (max |diff| per item %s); "
                "serving the stock result for this call",
                diffs,
            )
        self._call_path = "stock"
        return ref
