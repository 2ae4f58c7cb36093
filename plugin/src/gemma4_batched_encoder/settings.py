"""Runtime controls, read from the environment once per process (see plugin/README.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal, get_args

Mode = Literal["exact", "fast"]
Fused = Literal["auto", "on", "off"]
FastKernels = Literal[
    "stock",
    "merged",
    "merged-triton",
    "merged-triton-fp8",
    "merged-triton-fp8-norms",
    "merged-triton-fp8-epilogues",
    "merged-triton-fp8-gemms",
]

_TRUE = {"1", "true", "yes", "on"}
# No "" here: an empty value (a Helm chart's empty string) means "unset", i.e. the default, and
# must not turn a default-on switch off.
_FALSE = {"0", "false", "no", "off"}


def env_value(name: str) -> str | None:
    """The variable's value, None when unset or empty (both mean: use the default). Every
    GEMMA4_* reader goes through this, so an empty value from a chart reads as unset everywhere."""
    raw = os.environ.get(name)
    return raw if raw is not None and raw.strip() else None


def parse_switch(raw: str) -> bool | None:
    """1/true/yes/on -> True, 0/false/no/off -> False, anything else (empty included) None."""
    value = raw.strip().lower()
    return True if value in _TRUE else False if value in _FALSE else None


def _flag(name: str, default: bool) -> bool:
    raw = env_value(name)
    if raw is None:
        return default
    value = parse_switch(raw)
    if value is None:
        raise ValueError(f"{name}={raw!r}: expected one of 1/0/true/false/yes/no/on/off")
    return value


def _ints(name: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """A comma list of positive integers (unset or empty: `default`; "off": none)."""
    raw = env_value(name)
    if raw is None:
        return default
    if raw.strip().lower() == "off":
        return ()
    try:
        values = tuple(int(v) for v in raw.replace(" ", "").split(",") if v)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected positive integers, comma separated") from None
    if any(v <= 0 for v in values):
        raise ValueError(f"{name}={raw!r}: expected positive integers, comma separated")
    return values


def _threads(name: str) -> int | None:
    """None for "auto", 0 for "off" (also unset or empty), else a count (`_int`)."""
    raw = (env_value(name) or "off").strip().lower()
    if raw == "auto":
        return None
    return 0 if raw == "off" else _int(name, 0)


def _int(name: str, default: int) -> int:
    raw = env_value(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a non-negative integer") from None
    if value < 0:
        raise ValueError(f"{name}={raw!r}: must be >= 0")
    return value


# GEMMA4_ENGINE_GRAPH_RANGES' width for "on" and "auto": a 6-frame video is 6 ranges, so 16
# images or frames fit in one request's prefill chunk.
GRAPH_RANGES_ON = 16


def _width(name: str) -> int | None:
    """A count where on/off also reads: on = GRAPH_RANGES_ON, off = 0; unset, empty or "auto":
    None (the caller decides)."""
    raw = (env_value(name) or "auto").strip().lower()
    if raw == "auto":
        return None
    switch = parse_switch(raw)
    if switch is not None:
        return GRAPH_RANGES_ON if switch else 0
    return _int(name, 0)


def disabled_by_env() -> bool:
    """GEMMA4_ENCODER_DISABLE on its own (as ``Settings.disabled`` parses it), so that the off
    switch holds even when another GEMMA4_* value is bad; raises ValueError if it is bad itself."""
    return _flag("GEMMA4_ENCODER_DISABLE", False)


@dataclass(frozen=True)
class Settings:
    disabled: bool = False
    mode: Mode = "exact"
    # Upper bound for the activations of one encoder pass; items beyond it go to further passes.
    max_batch_bytes: int = 8 << 30
    cuda_graphs: bool = True
    # Largest captured batch (items); bigger chunks run eagerly.
    cuda_graph_max_items: int = 128
    verify_every: int = 0
    compile_fast: bool = False
    # inductor-fused encoder layers (fused.py; exact mode: bit-identical, fast mode: plain).
    # auto = CUDA only (exact served on the H200 without a compile after start-up; on CPU
    # inductor gains little and compiles long).
    fused: Fused = "auto"
    # Fast mode's compiled layers (when ``fused`` compiles them): "stock" = transformers' layer
    # compiled plainly (fused.py); "merged" = hand-written layers with q/k/v and gate/up merged
    # into one GEMM each (fast_layers.py); "merged-triton" = those with the norms and rotary after
    # the Q/K/V GEMM as one Triton kernel (qkv_kernel.py); "merged-triton-fp8" = those with the
    # four GEMMs in float8, row-wise scaled, and GELU x up + quantize as one Triton kernel
    # (fp8_quant.py; opt-in, a precision trade: 3.4 / 42.3 ms against merged-triton's 3.4 / 48.2
    # in the same H200 run, 1.38x stock bf16's distance from an fp32 tower;
    # bench/results/h200/vllm-0.26.0-17-random/NOTES.md); "merged-triton-fp8-norms" = that with
    # each residual add + norm + quantize in front of the Q/K/V and gate/up GEMMs as one Triton
    # kernel too (fp8_quant.add_norm_quant; opt-in: 2.8-3.1 / 34.6-35.9 ms against fp8's
    # 2.9-3.2 / 34.9-36.9 on four H200 hosts, bench/results/h200/encoder-21/NOTES.md);
    # "merged-triton-fp8-epilogues" = that with the Q/K/V and gate/up GEMMs as Triton float8
    # GEMMs carrying the norms + rotary and GELU x up in their epilogues (fp8_gemm.py; opt-in);
    # "merged-triton-fp8-gemms" = that with the down GEMM in Triton too, quantizing its input
    # tile by tile from maxima the GELU GEMM gathered (no float8 copy in between; opt-in).
    # merged-triton is the default: 3.4 / 44.6 ms for 1 / 16 videos against stock's 4.1 / 52.1 in
    # the same H200 run, deviation from exact of the same size (bench/results/h200/
    # encoder-fast-kernels/NOTES.md).
    fast_kernels: FastKernels = "merged-triton"
    # torch.set_num_threads in the process that builds the model (engine_threads.py): None =
    # auto (1 where this vLLM does not do that itself), 0 = leave vLLM's setting, N = N. Off by
    # default: on the H200 (vLLM 0.20.0, eighth sitting) `auto` served 35 video req/s with a
    # median ITL of 22 ms and p95 824 ms, where the seventh sitting's server (OpenMP left at 16
    # threads; no start-up graph warm-up yet) passed with 9.7 / 241 ms.
    engine_torch_threads: int | None = 0
    # Gemma 4's per-step image ranges copied to the GPU without a host sync, each placeholder's
    # ranges computed once (engine_mm_ranges.py; same values, as vLLM 0.32 does).
    engine_async_ranges: bool = True
    # vLLM's merge of the multimodal items' tensors done on the GPU instead of a CPU concat into
    # pinned memory (engine_mm_batching.py; same tensors). Opt-in until measured served.
    engine_gpu_batching: bool = False
    # Gemma 4's image ranges in a persistent buffer of this many ranges a request, so FULL CUDA
    # graphs keep them (engine_graph_ranges.py); 0 = vLLM's per-step tensor; None ("auto", the
    # default) = 16 exactly when vLLM's cudagraph mode captures mixed prefill-decode batches
    # whole (FULL), which without it replays image steps with the ranges lost.
    engine_graph_ranges: int | None = None
    # Soft-token budgets whose CUDA graphs exact mode captures at its first call (the profile
    # run), every batch bucket, padded and not (encoder.py `_warm_graphs`); () = capture lazily.
    # 70: Gemma 4's video frames.
    warmup_tokens: tuple[int, ...] = (70,)

    @classmethod
    def from_env(cls) -> Settings:
        mode = (env_value("GEMMA4_ENCODER_MODE") or cls.mode).strip().lower()
        if mode not in ("exact", "fast"):
            raise ValueError(f"GEMMA4_ENCODER_MODE={mode!r}: expected 'exact' or 'fast'")
        fused = (env_value("GEMMA4_ENCODER_FUSED") or cls.fused).strip().lower()
        fused = "on" if fused in _TRUE else "off" if fused in _FALSE else fused
        if fused not in ("auto", "on", "off"):
            raise ValueError(f"GEMMA4_ENCODER_FUSED={fused!r}: expected auto, on or off")
        fast_kernels = (
            (env_value("GEMMA4_ENCODER_FAST_KERNELS") or cls.fast_kernels).strip().lower()
        )
        if fast_kernels not in get_args(FastKernels):
            raise ValueError(
                f"GEMMA4_ENCODER_FAST_KERNELS={fast_kernels!r}: expected one of"
                f" {', '.join(get_args(FastKernels))}"
            )
        return cls(
            disabled=disabled_by_env(),
            mode=mode,  # type: ignore[arg-type]
            max_batch_bytes=_int("GEMMA4_ENCODER_MAX_BATCH_BYTES", cls.max_batch_bytes),
            cuda_graphs=_flag("GEMMA4_ENCODER_CUDA_GRAPHS", True),
            cuda_graph_max_items=_int("GEMMA4_ENCODER_CUDA_GRAPH_MAX_ITEMS", 128),
            verify_every=_int("GEMMA4_ENCODER_VERIFY_EVERY", 0),
            compile_fast=_flag("GEMMA4_ENCODER_COMPILE", False),
            fused=fused,  # type: ignore[arg-type]
            fast_kernels=fast_kernels,  # type: ignore[arg-type]
            engine_torch_threads=_threads("GEMMA4_ENGINE_TORCH_THREADS"),
            engine_async_ranges=_flag("GEMMA4_ENGINE_ASYNC_RANGES", True),
            engine_gpu_batching=_flag("GEMMA4_ENGINE_GPU_BATCHING", False),
            engine_graph_ranges=_width("GEMMA4_ENGINE_GRAPH_RANGES"),
            warmup_tokens=_ints("GEMMA4_ENCODER_WARMUP_TOKENS", cls.warmup_tokens),
        )
