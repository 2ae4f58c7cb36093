"""``encode_frames``: the vLLM-independent core of the plugin."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import nn

from .chunk import PoolerImpl, exact_chunk, fast_chunk
from .cuda_graphs import CudaGraphRunner, bucket_size
from .fast_layers import CHOICES, MergedLayers, Unsupported
from .fused import FusedLayers
from .inputs import Item, PixelInput, build_items, bytes_per_item, chunks, group_items
from .log import logger
from .settings import Mode, Settings


def _batch(
    source: PixelInput, items: list[Item], idx: list[int], attr: str, patches: int | None = None
) -> torch.Tensor:
    """Items ``idx`` as one [n, P, ...] batch (``patches``: its first P patches only).

    A view of ``source`` when that is one stacked tensor and ``idx`` a contiguous run of it (vLLM
    hands video frames so): no copy and no per-item calls. Else one stack of the items' whole
    rows (equal shapes: a group's always are), viewed down to ``patches``; the values are the same
    either way. Exact mode takes the view only when it is contiguous, as the stack is: other
    strides could pick other kernels in an eager pass, and exact mode's promise is its bits."""
    first = idx[0]
    if isinstance(source, torch.Tensor) and source.dim() == 3 and idx[-1] - first + 1 == len(idx):
        view = source[first : idx[-1] + 1]
        if patches is not None or view.is_contiguous():
            return view if patches is None else view[:, :patches]
    rows = [getattr(items[i], attr) for i in idx]
    if len({r.shape for r in rows}) > 1:  # fast mode: equal valid patches, other padding
        rows = [r[:patches] for r in rows]
    batch = rows[0].unsqueeze(0) if len(rows) == 1 else torch.stack(rows)
    return batch if patches is None else batch[:, :patches]


class BatchedVisionEncoder:
    """Batches all images/frames of a call through one Gemma 4 vision tower.

    ``mode='exact'``: per item bit-identical to ``vision_tower(pv[i:i+1], pp[i:i+1])``; on CUDA the
    encoder+pooler pass is replayed from CUDA graphs for bucketed batch sizes when enabled.
    ``mode='fast'``: encodes only valid patches (no attention mask) and pools with one GEMM.
    """

    def __init__(self, vision_tower: nn.Module, settings: Settings | None = None) -> None:
        self.vt = vision_tower
        self.settings = settings or Settings.from_env()
        self.graphs = CudaGraphRunner(self.settings.cuda_graph_max_items)
        self._poolers: dict[tuple[torch.device, torch.dtype], PoolerImpl] = {}
        self._fused: dict[tuple[torch.device, torch.dtype], FusedLayers | None] = {}
        self._fused_layers: FusedLayers | None = None  # compiled once per tower
        self._warmed: set[tuple[torch.device, torch.dtype]] = set()  # graphs captured at start-up
        # Fast mode's compiled layers per (device, dtype); None = eager (off, or it failed).
        self._fast_layers: dict[
            tuple[torch.device, torch.dtype], FusedLayers | MergedLayers | None
        ] = {}
        # bumped whenever _fast_layers changes (built, or dropped after a failure): the runtime
        # re-reads fast_kernels_in_force for its metrics only then, not on every call
        self.fast_layers_changes = 0
        self._fast_fn = partial(fast_chunk, self.vt)
        if self.settings.compile_fast:
            self._fast_fn = torch.compile(self._fast_fn, dynamic=False)

    def _item_bytes(self, num_patches: int, dtype: torch.dtype) -> int:
        cfg = self.vt.config
        elem = torch.empty((), dtype=dtype).element_size()
        return bytes_per_item(
            num_patches, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, elem
        )

    def pooler_impl(self, device: torch.device, dtype: torch.dtype) -> PoolerImpl:
        """Self-check, once per device and dtype, that the batched pooler reproduces this
        transformers version's tower on a tiny batch; else use the tower's pooler per item."""
        key = (device, dtype)
        impl = self._poolers.get(key)
        if impl is None:
            impl = self._poolers[key] = _calibrate(self.vt, device, dtype)
        return impl

    def fused_layers(self, device: torch.device, dtype: torch.dtype) -> FusedLayers | None:
        """Exact mode's fused layers for this device and dtype, or None (unfused): per the
        ``fused`` setting, and only after a self-check shows them bit-identical here."""
        setting = self.settings.fused
        if setting == "off" or (setting == "auto" and device.type != "cuda"):
            return None
        key = (device, dtype)
        if key not in self._fused:
            self._fused[key] = None  # also while checking: a failure leaves it off
            try:
                if self._fused_layers is None:
                    self._fused_layers = FusedLayers(self.vt)
                ok = _self_check_fused(
                    self.vt, self._fused_layers, self.pooler_impl(device, dtype), device, dtype
                )
            except Exception:
                logger.warning(
                    "fused encoder layers unavailable; exact mode runs unfused", exc_info=True
                )
                ok = False
            if ok:
                self._fused[key] = self._fused_layers
            logger.info(
                "exact mode on %s/%s: fused encoder layers %s", device, dtype, "on" if ok else "off"
            )
        return self._fused[key]

    def fused_in_use(self) -> bool:
        """Whether any device/dtype used so far runs fused layers, exact or fast (no check
        triggered)."""
        return any(v is not None for v in (*self._fused.values(), *self._fast_layers.values()))

    def fast_layers(
        self, device: torch.device, dtype: torch.dtype
    ) -> FusedLayers | MergedLayers | None:
        """Fast mode's compiled layers (plain inductor, no bit check: fast mode promises only
        closeness), per the ``fused`` setting; None with GEMMA4_ENCODER_COMPILE, which compiles
        the whole fast pass instead."""
        if not self._fast_layers_apply(device):
            return None
        key = (device, dtype)
        if key not in self._fast_layers:
            self._fast_layers[key] = self._new_fast_layers()
            self.fast_layers_changes += 1
            logger.info(
                "fast mode on %s/%s: compiled encoder layers on (%s)",
                device,
                dtype,
                type(self._fast_layers[key]).__name__,
            )
        return self._fast_layers[key]

    def _fast_layers_apply(self, device: torch.device) -> bool:
        setting = self.settings.fused
        return not (
            setting == "off"
            or (setting == "auto" and device.type != "cuda")
            or self.settings.compile_fast
        )

    def fast_kernels_in_force(self, device: torch.device) -> str:
        """Fast mode's layers on ``device``, as the metrics report them: the
        GEMMA4_ENCODER_FAST_KERNELS choice, "stock" where that choice was unsupported (compiled
        stock layers), "eager" where no compiled layers run (CPU by default,
        GEMMA4_ENCODER_FUSED=off, after a run-time failure), "compiled-pass" with
        GEMMA4_ENCODER_COMPILE. Before the first call: what that call will build."""
        if self.settings.compile_fast:
            return "compiled-pass"
        if not self._fast_layers_apply(device):
            return "eager"
        built = [layers for (d, _), layers in self._fast_layers.items() if d == device]
        if not built:
            return self.settings.fast_kernels
        if built[0] is None:
            return "eager"
        return self.settings.fast_kernels if isinstance(built[0], MergedLayers) else "stock"

    def _new_fast_layers(self) -> FusedLayers | MergedLayers:
        kernels = self.settings.fast_kernels
        if kernels != "stock":
            try:
                return MergedLayers(self.vt, **CHOICES[kernels])
            except Unsupported as e:
                logger.warning("GEMMA4_ENCODER_FAST_KERNELS=%s unsupported here (%s)", kernels, e)
        return FusedLayers(self.vt, exact=False)

    def fused_active(self, device: torch.device, dtype: torch.dtype) -> bool:
        return self.fused_layers(device, dtype) is not None

    def _disable_fused(self, device: torch.device, dtype: torch.dtype) -> None:
        logger.warning(
            "fused encoder layers failed; exact mode runs unfused from now on", exc_info=True
        )
        self._fused[(device, dtype)] = None

    def graphs_active(self, device: torch.device) -> bool:
        return self.settings.cuda_graphs and device.type == "cuda"

    @torch.inference_mode()
    def encode(
        self,
        pixel_values: PixelInput,
        pixel_position_ids: PixelInput,
        valid_tokens: Sequence[int] | None = None,
        mode: Mode | None = None,
    ) -> list[torch.Tensor]:
        mode = mode or self.settings.mode
        k = self.vt.config.pooling_kernel_size
        items = build_items(pixel_values, pixel_position_ids, k, valid_tokens)
        if not items:
            return []
        out: list[torch.Tensor | None] = [None] * len(items)
        budget = self.settings.max_batch_bytes
        if mode == "exact":
            for group in group_items(items):
                per_item = self._item_bytes(
                    group.num_patches, items[group.indices[0]].pixel_values.dtype
                )
                for idx in chunks(group.indices, per_item, budget):
                    pv = _batch(pixel_values, items, idx, "pixel_values")
                    pp = _batch(pixel_position_ids, items, idx, "position_ids")
                    pooled = self._exact(pv, pp, group.has_padding)
                    for j, i in enumerate(idx):
                        out[i] = pooled[j, : items[i].valid_tokens]
        elif mode == "fast":
            by_valid: dict[int, list[int]] = {}
            for i, item in enumerate(items):
                by_valid.setdefault(item.valid_patches, []).append(i)
            for valid, indices in by_valid.items():
                per_item = self._item_bytes(valid, items[indices[0]].pixel_values.dtype)
                for idx in chunks(indices, per_item, budget):
                    # Valid patches are a prefix of each item (the HF processor pads at the end).
                    pv = _batch(pixel_values, items, idx, "pixel_values", valid)
                    pp = _batch(pixel_position_ids, items, idx, "position_ids", valid)
                    for i, row in zip(idx, self._fast(pv, pp).unbind(0), strict=True):
                        out[i] = row
        else:
            raise ValueError(f"unknown mode {mode!r}")
        return out  # type: ignore[return-value]

    def _fast(self, pv: torch.Tensor, pp: torch.Tensor) -> torch.Tensor:
        layers = self.fast_layers(pv.device, pv.dtype)
        fn = self._fast_fn if layers is None else partial(fast_chunk, self.vt, layers=layers)
        try:
            pooled = None
            if self.graphs_active(pv.device):
                pooled = self.graphs.run(("fast", layers is not None), fn, pv, pp, check_bits=False)
            return pooled if pooled is not None else fn(pv, pp)
        except Exception:
            if layers is None:
                raise
            logger.warning(
                "compiled encoder layers failed; fast mode runs them eagerly from now on",
                exc_info=True,
            )
            self._fast_layers[(pv.device, pv.dtype)] = None
            self.fast_layers_changes += 1
            return self._fast(pv, pp)

    def _exact_pass(
        self, device: torch.device, dtype: torch.dtype, has_padding: bool
    ) -> tuple[tuple, Callable[[torch.Tensor, torch.Tensor], torch.Tensor], bool]:
        """(graph key, the pass, whether it runs fused layers) for this device, dtype, padding."""
        impl = self.pooler_impl(device, dtype)
        layers = self.fused_layers(device, dtype)
        fn = partial(exact_chunk, self.vt, has_padding=has_padding, pooler=impl, layers=layers)
        return ("exact", has_padding, impl, layers is not None), fn, layers is not None

    def _warm_graphs(self, device: torch.device, dtype: torch.dtype) -> None:
        """Capture exact mode's graphs for the ``warmup_tokens`` budgets now, every batch bucket
        the memory budget allows, padded and not: a first capture of a fused bucket while
        serving took seconds on the H200 (kernels built for the new size), stalling the step."""
        key = (device, dtype)
        if key in self._warmed or not self.settings.warmup_tokens:
            return
        self._warmed.add(key)  # once, also when it fails
        from .synthetic import patchify

        start, captured = time.perf_counter(), 0
        self.graphs.serving = False  # no per-capture INFO lines for these (one summary below)
        k = self.vt.config.pooling_kernel_size
        patch_dim = 3 * self.vt.config.patch_size**2
        gen = torch.Generator().manual_seed(0)
        try:
            for tokens in self.settings.warmup_tokens:
                patches = tokens * k * k
                per_pass = max(1, self.settings.max_batch_bytes // self._item_bytes(patches, dtype))
                # The buckets a pass of up to per_pass items replays from; largest first, so the
                # shared input buffer is allocated once (cuda_graphs.py).
                cap = self.settings.cuda_graph_max_items
                buckets = {bucket_size(n) for n in range(1, min(per_pass, cap) + 1)}
                buckets = sorted((b for b in buckets if b <= cap), reverse=True)
                if not buckets:
                    continue
                most = buckets[0]
                for has_padding in (False, True):
                    # A k-row strip of whole pooling bins: all patches valid, or one bin column
                    # short (padding); the values do not matter to a capture.
                    cols = tokens * k - (k if has_padding else 0)
                    if cols <= 0:
                        continue
                    pv, pp = patchify((k, cols), tokens, patch_dim, k, gen)
                    pv = pv.to(device, dtype).expand(most, -1, -1)
                    pp = pp.to(device).expand(most, -1, -1)
                    graph_key, fn, _ = self._exact_pass(device, dtype, has_padding)
                    for b in buckets:
                        captured += self.graphs.run(graph_key, fn, pv[:b], pp[:b]) is not None
        except Exception:
            logger.warning("encoder CUDA-graph warm-up stopped early", exc_info=True)
        finally:
            self.graphs.serving = True
        logger.info(
            "exact mode on %s/%s: %d encoder CUDA graphs captured at start-up for %s soft tokens "
            "in %.1f s",
            device,
            dtype,
            captured,
            ",".join(map(str, self.settings.warmup_tokens)),
            time.perf_counter() - start,
        )

    def _exact(self, pv: torch.Tensor, pp: torch.Tensor, has_padding: bool) -> torch.Tensor:
        graphs = self.graphs_active(pv.device)
        if graphs:
            self._warm_graphs(pv.device, pv.dtype)
        key, fn, fused = self._exact_pass(pv.device, pv.dtype, has_padding)
        try:
            pooled = None
            if graphs:
                pooled = self.graphs.run(key, fn, pv, pp)
            return pooled if pooled is not None else fn(pv, pp)
        except Exception:
            if not fused:
                raise
            self._disable_fused(pv.device, pv.dtype)
            return self._exact(pv, pp, has_padding)


def _self_check_fused(
    vt: nn.Module, layers: FusedLayers, impl: PoolerImpl, device: torch.device, dtype: torch.dtype
) -> bool:
    """Fused vs unfused exact pass on small padded and unpadded batches of one and of two items.
    That compiles every graph a request can need now, not under load (batch and length are
    dynamic; torch specialises a batch of one): a compile while serving would stall the
    engine's step for seconds."""
    from .synthetic import Media, make_batch

    k = vt.config.pooling_kernel_size
    patch_dim = 3 * vt.config.patch_size**2
    for n, budget, grids in (
        (1, 4, ((k, 2 * k), (2 * k, 2 * k))),
        (2, 8, ((k, 2 * k), (2 * k, 4 * k))),
    ):
        for grid in grids:
            pvs, pps = make_batch([Media("frame", grid, budget)] * n, patch_dim, k, seed=budget)
            has_padding = grid[0] * grid[1] < pvs[0].shape[0]
            with torch.inference_mode():  # inputs built as encode() builds them
                pv = torch.stack(pvs).to(device, dtype)
                pp = torch.stack(pps).to(device)
                want = exact_chunk(vt, pv, pp, has_padding, impl)
                got = exact_chunk(vt, pv, pp, has_padding, impl, layers)
            if not torch.equal(got, want):
                logger.warning(
                    "fused encoder layers differ from the unfused pass on %s/%s (%d x %s); off",
                    device,
                    dtype,
                    n,
                    grid,
                )
                return False
    return True


def _calibrate(vt: nn.Module, device: torch.device, dtype: torch.dtype) -> PoolerImpl:
    from .reference import serial_per_item

    k = vt.config.pooling_kernel_size
    patch_dim = 3 * vt.config.patch_size**2
    gen = torch.Generator().manual_seed(0)
    length = 4  # soft tokens per item: a padded 1x2-bin item and a full 2x2-bin one
    pvs, pps = [], []
    for h, w in ((k, 2 * k), (2 * k, 2 * k)):
        pv = torch.zeros(length * k * k, patch_dim)
        pv[: h * w] = torch.rand(h * w, patch_dim, generator=gen)
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        pp = torch.full((length * k * k, 2), -1, dtype=torch.long)
        pp[: h * w] = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=-1)
        pvs.append(pv.to(device, dtype))
        pps.append(pp.to(device))
    ref = serial_per_item(vt, pvs, pps)
    for impl in ("batched", "stock"):
        for i, has_padding in ((0, True), (1, False)):
            got = exact_chunk(vt, pvs[i][None], pps[i][None], has_padding, impl)
            if not torch.equal(got[0, : ref[i].shape[0]], ref[i]):
                break
        else:
            return impl  # type: ignore[return-value]
    raise RuntimeError(
        "gemma4_batched_encoder: exact mode cannot reproduce this transformers version's "
        "Gemma4VisionModel (self-check failed); use the stock path"
    )


# Cached on the tower (a cycle gc frees): a WeakKeyDictionary value holding .vt pins its key.
_ENCODER_ATTR = "_gemma4_batched_encoder"


def encode_frames(
    vision_tower: nn.Module,
    pixel_values: PixelInput,
    pixel_position_ids: PixelInput,
    *,
    valid_tokens: Sequence[int] | None = None,
    mode: Mode | None = None,
    settings: Settings | None = None,
) -> list[torch.Tensor]:
    """Soft tokens per image/frame, as ``vision_tower(pv[i:i+1], pp[i:i+1]).last_hidden_state``.

    ``pixel_values``: [B, P, 3*patch^2] or a list of [P_i, ...] / [1, P_i, ...] tensors;
    ``pixel_position_ids`` likewise with (x, y) per patch and (-1, -1) for padding.
    ``valid_tokens`` (soft tokens per item, host ints) avoids the one host transfer needed
    otherwise to count valid patches. The encoder object (and its CUDA graphs) is cached per tower.
    """
    if settings is not None:
        encoder = BatchedVisionEncoder(vision_tower, settings)
    else:
        encoder = getattr(vision_tower, _ENCODER_ATTR, None)
        if encoder is None:
            encoder = BatchedVisionEncoder(vision_tower)
            setattr(vision_tower, _ENCODER_ATTR, encoder)
    return encoder.encode(pixel_values, pixel_position_ids, valid_tokens, mode)
