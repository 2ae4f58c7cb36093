"""vLLM's own Triton attention kernel fed Gemma 4's image ranges two ways: vLLM's compact
per-step tensor and engine_graph_ranges' buffer rows. Prints one JSON object of comparisons.

    python plugin/tests/graph_ranges_kernel_check.py                # CPU: Triton interpreter
    python plugin/tests/graph_ranges_kernel_check.py --device cuda  # GPU: compiled, + a graph

On the CPU (test_engine_graph_ranges.py runs it in a subprocess: TRITON_INTERPRET must be set
before Triton loads) vLLM has Triton turned off (no CPU backend), so ``vllm.triton_utils`` is
replaced by the real Triton before the kernel module is imported; the kernel itself is vLLM's,
unchanged. On a GPU (bench/gpu/h200.sh graph-ranges, with the vLLM the server runs) the kernel is
compiled, and one more check does what a FULL CUDA graph does: capture the kernel on the buffer's
rows as vLLM's capture leaves them (zeros), then fill the buffer with a step's ranges and replay.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types
from typing import Any

import torch

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 4, 2, 64, 16
BLOCKS_PER_SEQ = 6

# (first query position, query tokens, all the request's ranges): a prefill chunk that holds
# two frames whole and the start of a third (and follows one it does not hold), a decoding
# request whose frames are all behind it, a text-only prefill.
REQUESTS = [
    (20, 40, [(2, 10), (25, 34), (40, 49), (55, 70)]),
    (44, 1, [(5, 15), (20, 30)]),
    (0, 30, []),
]
# A decode-only step (one query token each): vLLM's split-softmax ("3D") kernel runs it.
DECODES = [(71, 1, [(2, 10), (25, 34), (40, 49), (55, 70)]), (44, 1, [(5, 15), (20, 30)])]
SEGMENTS = 16  # vLLM's NUM_PAR_SOFTMAX_SEGMENTS


def load_kernel(device: str) -> tuple[Any, Any, Any]:
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        import triton
        import triton.language as tl

        shim = types.ModuleType("vllm.triton_utils")
        shim.triton, shim.tl, shim.HAS_TRITON = triton, tl, True  # type: ignore[attr-defined]
        sys.modules["vllm.triton_utils"] = shim
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    from gemma4_batched_encoder.engine_graph_ranges import GraphRanges, step_ranges

    return unified_attention, GraphRanges, step_ranges


class Batch:
    """One step's static inputs on the device (a graph needs them allocated before capture)."""

    def __init__(self, seqs: list, q: torch.Tensor, kv: tuple, three_d: bool) -> None:
        device = q.device
        qlens = [n for _, n, _ in seqs]
        slens = [first + n for first, n, _ in seqs]
        self.seqs, self.q, (self.k, self.v) = seqs, q, kv
        self.cu = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
        self.cu = self.cu.to(device)
        self.used = torch.tensor(slens, dtype=torch.int32, device=device)
        self.max_q, self.max_k = max(qlens), max(slens)
        n = len(seqs)
        table = torch.arange(n * BLOCKS_PER_SEQ, dtype=torch.int32) % (self.k.shape[0])
        self.table = table.view(n, BLOCKS_PER_SEQ).to(device)
        self.segm: dict[str, Any] = {}
        if three_d:  # vLLM's split-softmax buffers, as its Triton backend allocates them
            self.segm = {
                "seq_threshold_3D": 8,
                "num_par_softmax_segments": SEGMENTS,
                "softmax_segm_output": torch.empty(
                    (8, HEADS, SEGMENTS, HEAD_SIZE), dtype=torch.float32, device=device
                ),
                "softmax_segm_max": torch.empty(
                    (8, HEADS, SEGMENTS), dtype=torch.float32, device=device
                ),
                "softmax_segm_expsum": torch.empty(
                    (8, HEADS, SEGMENTS), dtype=torch.float32, device=device
                ),
            }

    def run(self, kernel: Any, out: torch.Tensor, ranges: torch.Tensor | None, window: int) -> None:
        kernel(
            q=self.q,
            k=self.k,
            v=self.v,
            out=out,
            cu_seqlens_q=self.cu,
            max_seqlen_q=self.max_q,
            seqused_k=self.used,
            max_seqlen_k=self.max_k,
            softmax_scale=HEAD_SIZE**-0.5,
            causal=True,
            window_size=(window - 1, 0) if window else (-1, -1),
            block_table=self.table,
            softcap=0,
            q_descale=None,
            k_descale=None,
            v_descale=None,
            mm_prefix_range=ranges,
            **self.segm,
        )

    def __call__(self, kernel: Any, ranges: torch.Tensor | None, window: int) -> torch.Tensor:
        out = torch.empty_like(self.q)
        self.run(kernel, out, ranges, window)
        return out


def compact(seqs: list, device: torch.device) -> torch.Tensor | None:
    """vLLM's form: every request's ranges padded with (0, 0) to the widest; None without any."""
    lists = [rs or [(0, 0)] for _, _, rs in seqs]
    if all(rs == [(0, 0)] for rs in lists):
        return None
    width = max(len(rs) for rs in lists)
    padded = [rs + [(0, 0)] * (width - len(rs)) for rs in lists]
    return torch.tensor(padded, dtype=torch.int32, device=device)


def windows(seqs: list) -> tuple[Any, Any, dict]:
    first = torch.tensor([f for f, _, _ in seqs]).numpy()
    count = torch.tensor([n for _, n, _ in seqs]).numpy()
    return first, count, {i: rs for i, (_, _, rs) in enumerate(seqs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None)
    args = parser.parse_args()
    kernel, GraphRanges, step_ranges = load_kernel(args.device)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device == "cuda" else "float32"))

    torch.manual_seed(0)
    tokens = sum(n for _, n, _ in REQUESTS)
    q = torch.randn(tokens, HEADS, HEAD_SIZE).to(device, dtype)
    k = torch.randn(len(REQUESTS) * BLOCKS_PER_SEQ, BLOCK, KV_HEADS, HEAD_SIZE).to(device, dtype)
    kv = (k, torch.randn_like(k))
    batch = Batch(REQUESTS, q, kv, three_d=False)
    first, count, doc = windows(REQUESTS)
    kept = step_ranges(doc, first, count)
    short = {**kept, 0: [r for r in kept[0] if r != (40, 49)]}  # one range with queries left out
    stock_ranges = compact(REQUESTS, device)
    # One buffer for every call, as in a runner: each call's rows are filled just before it.
    buffer = GraphRanges(rows=8, width=8, device=device)
    addresses = set()
    result: dict[str, object] = {"device": str(device), "dtype": str(dtype), "kept": kept}
    for window in (0, 16):
        stock = batch(kernel, stock_ranges, window)
        rows = buffer.view(kept, len(REQUESTS))
        addresses.add(rows.data_ptr())
        mine = batch(kernel, rows, window)
        causal = batch(kernel, None, window)
        rows = buffer.view(short, len(REQUESTS))
        addresses.add(rows.data_ptr())
        dropped = batch(kernel, rows, window)
        text = Batch([(0, 30, [])], q[:30].clone(), kv, three_d=False)
        empty = GraphRanges(rows=8, width=8, device=device).view({}, 1)
        dq = torch.randn(len(DECODES), HEADS, HEAD_SIZE).to(device, dtype)
        decode = Batch(DECODES, dq, kv, three_d=True)
        d_first, d_count, d_doc = windows(DECODES)
        d_rows = GraphRanges(rows=8, width=8, device=device).view(
            step_ranges(d_doc, d_first, d_count), len(DECODES)
        )
        d_none = decode(kernel, None, window)
        result[f"window{window}"] = {
            "buffer_equals_vllm": torch.equal(mine, stock),
            "ranges_matter": not torch.equal(stock, causal),
            "dropping_a_range_changes_output": not torch.equal(dropped, stock),
            "text_zero_rows_equal_none": torch.equal(
                text(kernel, empty, window), text(kernel, None, window)
            ),
            # decoding requests keep no ranges: the split-softmax kernel gives what vLLM's
            # tensor (all their ranges) and no tensor give
            "decode_3d_buffer_equals_vllm": torch.equal(
                decode(kernel, d_rows, window), decode(kernel, compact(DECODES, device), window)
            ),
            "decode_3d_buffer_equals_none": torch.equal(decode(kernel, d_rows, window), d_none),
        }
        if args.device == "cuda":
            result[f"window{window}"]["graph"] = graph_replay(
                kernel, batch, buffer, kept, short, stock, dropped, window
            )
    result["one_address"] = len(addresses) == 1
    print(json.dumps(result))


def graph_replay(kernel, batch, buffer, kept, short, stock, dropped, window) -> dict[str, bool]:
    """A FULL CUDA graph's life: captured on the buffer's rows as a capture run leaves them (no
    image in the dummy batch: zeros), replayed after each step has refilled the buffer."""
    n = len(batch.seqs)
    out = torch.empty_like(batch.q)
    rows = buffer.view({}, n)
    batch.run(kernel, out, rows, window)  # compile before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        batch.run(kernel, out, rows, window)
    replays = {}
    for name, ranges, expected in (("step", kept, stock), ("short", short, dropped)):
        refilled = buffer.view(ranges, n)
        assert refilled.data_ptr() == rows.data_ptr()
        graph.replay()
        replays[name] = torch.equal(out, expected)
    torch.cuda.synchronize()
    return {
        "replay_reads_the_step_ranges": replays["step"],
        "replay_follows_a_refill": replays["short"],
    }


if __name__ == "__main__":
    main()
