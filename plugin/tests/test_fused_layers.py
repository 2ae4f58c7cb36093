"""Exact mode's inductor-fused encoder layers (fused.py): bit-identical, and off when unsafe."""

from __future__ import annotations

import logging

import g4helpers as H
import torch
from test_bit_identity import COMPOSITIONS, assert_identical

from gemma4_batched_encoder import Settings, encode_frames
from gemma4_batched_encoder.encoder import BatchedVisionEncoder
from gemma4_batched_encoder.reference import serial_per_item

FUSED = Settings(fused="on", cuda_graphs=False)


def test_fused_exact_is_bit_identical_to_the_per_item_tower():
    # One bf16 tower for every composition: inductor compiles each layer once statically and
    # once with dynamic shapes (the self-check's two sizes); the compositions reuse that.
    tower = H.tower(torch.bfloat16, seed=5)
    enc = BatchedVisionEncoder(tower, FUSED)
    for name in ("images_and_videos", "480p_720p_mixed", "frames_without_padding"):
        pvs, pps = H.batch(COMPOSITIONS[name], torch.bfloat16, seed=len(name))
        assert_identical(enc.encode(pvs, pps), serial_per_item(tower, pvs, pps))
    assert enc.fused_active(torch.device("cpu"), torch.bfloat16)
    # The stock path runs through the same (instance-patched) norms and keeps its values.
    pvs, pps = H.batch(COMPOSITIONS["one_video"], torch.bfloat16, seed=1)
    assert_identical(
        encode_frames(tower, pvs, pps, settings=Settings(fused="off", cuda_graphs=False)),
        serial_per_item(H.tower(torch.bfloat16, seed=5), pvs, pps),
    )


def test_fused_is_off_by_default_on_cpu_and_when_disabled():
    tower = H.tower(torch.bfloat16)
    cpu = torch.device("cpu")
    assert not BatchedVisionEncoder(tower, Settings()).fused_active(cpu, torch.bfloat16)
    assert not BatchedVisionEncoder(tower, Settings(fused="off")).fused_active(cpu, torch.bfloat16)


def test_a_failing_self_check_keeps_the_unfused_path(monkeypatch, caplog):
    import gemma4_batched_encoder.encoder as E

    def broken(self, vt):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(E.FusedLayers, "__init__", broken)
    tower = H.tower(torch.bfloat16, seed=2)
    enc = BatchedVisionEncoder(tower, FUSED)
    pvs, pps = H.batch(COMPOSITIONS["one_video"], torch.bfloat16, seed=2)
    with caplog.at_level(logging.WARNING):
        assert_identical(enc.encode(pvs, pps), serial_per_item(tower, pvs, pps))
    assert not enc.fused_active(torch.device("cpu"), torch.bfloat16)
    assert "fused encoder layers unavailable" in caplog.text
