"""bench/param_digest.py: the weights a vLLM worker holds, digested where they live.

The nineteenth H200 sitting used it to rule out weights that differ between server processes
(uninitialised memory, a non-deterministic load) as the cause of the greedy-output classes. Here:
the digest tells one flipped bit apart, and a real vLLM (CPU) serving the tiny model answers it
through the worker extension with exactly the checkpoint's tensors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import param_digest  # noqa: E402


def test_digest_sees_one_flipped_bit_and_the_word_order():
    t = torch.arange(1000, dtype=torch.float32).reshape(10, 100).to(torch.bfloat16)
    base = param_digest.tensor_digest(t)
    assert param_digest.tensor_digest(t.clone()) == base
    flipped = t.clone().view(torch.int16)
    flipped[3, 7] ^= 1  # the lowest mantissa bit of one element
    assert param_digest.tensor_digest(flipped.view(torch.bfloat16)) != base
    swapped = t.clone()
    swapped[[0, 1]] = swapped[[1, 0]]  # same words, another order
    assert param_digest.tensor_digest(swapped) != base
    # a tensor whose size is not a whole number of 32-bit words keeps its tail bytes
    odd = torch.tensor([1, 2, 3], dtype=torch.uint8)
    assert param_digest.tensor_digest(odd).endswith("010203")
    assert param_digest.tensor_digest(odd) != param_digest.tensor_digest(odd + 1)


def test_compare_names_what_differs(tmp_path):
    a = {"w": ["00ff", [2], "bfloat16"], "b": ["0001", [2], "float32"]}
    b = {"w": ["00fe", [2], "bfloat16"], "b": ["0001", [2], "float32"], "extra": ["1", [1], "x"]}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    run = [sys.executable, str(BENCH / "param_digest.py"), "--compare"]
    same = subprocess.run([*run, tmp_path / "a.json", tmp_path / "a.json"], capture_output=True)
    assert same.returncode == 0
    assert json.loads(same.stdout)["identical"] is True
    diff = subprocess.run([*run, tmp_path / "a.json", tmp_path / "b.json"], capture_output=True)
    assert diff.returncode == 1
    result = json.loads(diff.stdout)
    assert result["differing"] == ["w"] and result["only_second"] == ["extra"]


@pytest.mark.e2e
def test_served_weights_are_the_checkpoints(vllm_server_factory, tiny_model):
    """The worker extension, loaded by a real vLLM through `--worker-extension-cls`, digests the
    tensors the engine runs: those vLLM loads unchanged match the checkpoint's, bit for bit."""
    server = vllm_server_factory(
        "param-digest",
        env={"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": str(BENCH)},
        args=["--worker-extension-cls", "param_digest.ParamDigest"],
    )
    served = param_digest.fetch(server.url)
    checkpoint = load_file(str(next(tiny_model.glob("*.safetensors"))))
    pairs = {
        "language_model.model.embed_tokens.weight": "model.language_model.embed_tokens.weight",
        "vision_tower.patch_embedder.position_embedding_table": (
            "model.vision_tower.patch_embedder.position_embedding_table"
        ),
    }
    for served_name, checkpoint_name in pairs.items():
        digest, shape, dtype = served[served_name]
        tensor = checkpoint[checkpoint_name]
        assert shape == list(tensor.shape) and dtype == str(tensor.dtype).removeprefix("torch.")
        assert digest == param_digest.tensor_digest(tensor), served_name
    assert len(served) > 50  # every parameter and buffer, not a handful
