"""Environment controls and CUDA-graph bucket sizes (pure logic, no device needed)."""

from __future__ import annotations

import pytest

from gemma4_batched_encoder.cuda_graphs import bucket_size
from gemma4_batched_encoder.settings import Settings


def test_defaults(monkeypatch):
    for name in (
        "GEMMA4_ENCODER_DISABLE", "GEMMA4_ENCODER_MODE", "GEMMA4_ENCODER_MAX_BATCH_BYTES",
        "GEMMA4_ENCODER_CUDA_GRAPHS", "GEMMA4_ENCODER_VERIFY_EVERY", "GEMMA4_ENCODER_COMPILE",
    ):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    s = Settings.from_env()
    assert (s.disabled, s.mode, s.cuda_graphs, s.verify_every) == (False, "exact", True, 0)
    assert s.max_batch_bytes == 8 << 30


def test_env_values(monkeypatch):
    monkeypatch.setenv("GEMMA4_ENCODER_DISABLE", "1")
    monkeypatch.setenv("GEMMA4_ENCODER_MODE", "FAST")
    monkeypatch.setenv("GEMMA4_ENCODER_MAX_BATCH_BYTES", "1048576")
    monkeypatch.setenv("GEMMA4_ENCODER_CUDA_GRAPHS", "off")
    monkeypatch.setenv("GEMMA4_ENCODER_VERIFY_EVERY", "10")
    s = Settings.from_env()
    assert (s.disabled, s.mode, s.max_batch_bytes, s.cuda_graphs, s.verify_every) == (
        True, "fast", 1 << 20, False, 10,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "attribute", "default"),
    [("GEMMA4_ENGINE_ASYNC_RANGES", "engine_async_ranges", True),
     ("GEMMA4_ENGINE_GPU_BATCHING", "engine_gpu_batching", False)],
)  # fmt: skip
def test_engine_switches(monkeypatch, name, attribute, default):
    monkeypatch.delenv(name, raising=False)
    assert getattr(Settings.from_env(), attribute) is default
    for raw, want in (("0", False), ("off", False), ("1", True), ("on", True)):
        monkeypatch.setenv(name, raw)
        assert getattr(Settings.from_env(), attribute) is want
    monkeypatch.setenv(name, "sometimes")
    with pytest.raises(ValueError, match=name):
        Settings.from_env()


@pytest.mark.parametrize(
    ("name", "value"),
    [("GEMMA4_ENCODER_MODE", "turbo"), ("GEMMA4_ENCODER_DISABLE", "maybe"),
     ("GEMMA4_ENCODER_VERIFY_EVERY", "-1")],
)  # fmt: skip
def test_bad_values_raise(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        Settings.from_env()


def test_bucket_sizes():
    assert [bucket_size(n) for n in (1, 2, 3, 5, 6, 7, 9, 13, 17, 25, 49, 97)] == [
        1, 2, 3, 6, 6, 8, 12, 16, 24, 32, 64, 128,
    ]  # fmt: skip
    for n in range(1, 300):
        b = bucket_size(n)
        assert n <= b < 2 * n or n == b


# Every variable Settings reads; a Helm chart's empty value (`GEMMA4_X=`) must read as unset.
SETTINGS_ENV = (
    "GEMMA4_ENCODER_DISABLE", "GEMMA4_ENCODER_MODE", "GEMMA4_ENCODER_MAX_BATCH_BYTES",
    "GEMMA4_ENCODER_CUDA_GRAPHS", "GEMMA4_ENCODER_CUDA_GRAPH_MAX_ITEMS",
    "GEMMA4_ENCODER_VERIFY_EVERY", "GEMMA4_ENCODER_COMPILE", "GEMMA4_ENCODER_FUSED",
    "GEMMA4_ENCODER_FAST_KERNELS", "GEMMA4_ENGINE_TORCH_THREADS", "GEMMA4_ENGINE_ASYNC_RANGES",
    "GEMMA4_ENGINE_GPU_BATCHING", "GEMMA4_ENGINE_GRAPH_RANGES", "GEMMA4_ENCODER_WARMUP_TOKENS",
)  # fmt: skip


@pytest.mark.parametrize("empty", ["", "  "], ids=["empty", "blank"])
def test_empty_values_are_the_defaults(monkeypatch, empty):
    for name in SETTINGS_ENV:
        monkeypatch.delenv(name, raising=False)
    defaults = Settings.from_env()
    # the default-on switches are what an empty value used to turn off
    assert defaults.cuda_graphs and defaults.engine_async_ranges and defaults.fused == "auto"
    assert defaults.warmup_tokens == (70,)
    for name in SETTINGS_ENV:
        monkeypatch.setenv(name, empty)
    assert Settings.from_env() == defaults


def test_empty_is_not_a_switch_value():
    from gemma4_batched_encoder.settings import parse_switch

    assert parse_switch("") is None and parse_switch("off") is False and parse_switch("1")


def test_empty_media_values_are_the_defaults(monkeypatch, caplog):
    from gemma4_batched_encoder import media

    for name in (
        "GEMMA4_MEDIA_FAST_PATH",
        "GEMMA4_MEDIA_TORCH_THREADS",
        "GEMMA4_MEDIA_FRAME_THREADS",
        "GEMMA4_MEDIA_CV2_THREADS",
    ):
        monkeypatch.setenv(name, "")
    assert media.fast_path_requested() is True
    assert media.media_torch_threads() == 1 and media.media_frame_threads() == 1
    from gemma4_batched_encoder.media import decode

    assert decode.cv2_threads() == 1
    assert not [r for r in caplog.records if "GEMMA4_MEDIA" in r.getMessage()]  # no warning
    monkeypatch.setenv("GEMMA4_MEDIA_TORCH_THREADS", "many")
    assert media.media_torch_threads() == 1
    assert "GEMMA4_MEDIA_TORCH_THREADS='many'" in caplog.text
