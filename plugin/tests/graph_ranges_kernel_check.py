"""vLLM's own Triton attention kernel, run on the CPU by the Triton interpreter, fed Gemma 4's
image ranges two ways: vLLM's compact per-step tensor and engine_graph_ranges' buffer rows.
Prints one JSON object of comparisons (run by test_engine_graph_ranges.py in a subprocess:
TRITON_INTERPRET must be set before Triton loads).

vLLM turns Triton off on a CPU build (no CPU backend), so ``vllm.triton_utils`` is replaced by
the real Triton before the kernel module is imported; the kernel itself is vLLM's, unchanged.
"""

from __future__ import annotations

import json
import os
import sys
import types

os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton
import triton.language as tl

shim = types.ModuleType("vllm.triton_utils")
shim.triton, shim.tl, shim.HAS_TRITON = triton, tl, True  # type: ignore[attr-defined]
sys.modules["vllm.triton_utils"] = shim

from vllm.v1.attention.ops.triton_unified_attention import unified_attention  # noqa: E402

from gemma4_batched_encoder.engine_graph_ranges import GraphRanges, step_ranges  # noqa: E402

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 4, 2, 64, 16

# (first query position, query tokens, all the request's ranges): a prefill chunk that holds
# two frames whole and the start of a third (and follows one it does not hold), a decoding
# request whose frames are all behind it, a text-only prefill.
REQUESTS = [
    (20, 40, [(2, 10), (25, 34), (40, 49), (55, 70)]),
    (44, 1, [(5, 15), (20, 30)]),
    (0, 30, []),
]


def attention(q, k, v, seqs, ranges: torch.Tensor | None, window: int) -> torch.Tensor:
    qlens = [n for _, n, _ in seqs]
    slens = [first + n for first, n, _ in seqs]
    out = torch.empty_like(q)
    unified_attention(
        q=q,
        k=k,
        v=v,
        out=out,
        cu_seqlens_q=torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32),
        max_seqlen_q=max(qlens),
        seqused_k=torch.tensor(slens, dtype=torch.int32),
        max_seqlen_k=max(slens),
        softmax_scale=HEAD_SIZE**-0.5,
        causal=True,
        window_size=(window - 1, 0) if window else (-1, -1),
        block_table=torch.arange(len(seqs) * 6, dtype=torch.int32).view(len(seqs), 6),
        softcap=0,
        q_descale=None,
        k_descale=None,
        v_descale=None,
        mm_prefix_range=ranges,
    )
    return out


def compact(per_seq: list[list[tuple[int, int]]]) -> torch.Tensor | None:
    """vLLM's form: every request's ranges padded with (0, 0) to the widest; None without any."""
    lists = [rs or [(0, 0)] for rs in per_seq]
    if all(rs == [(0, 0)] for rs in lists):
        return None
    width = max(len(rs) for rs in lists)
    return torch.tensor([rs + [(0, 0)] * (width - len(rs)) for rs in lists], dtype=torch.int32)


def main() -> None:
    torch.manual_seed(0)
    tokens = sum(n for _, n, _ in REQUESTS)
    q = torch.randn(tokens, HEADS, HEAD_SIZE)
    k = torch.randn(len(REQUESTS) * 6, BLOCK, KV_HEADS, HEAD_SIZE)
    v = torch.randn_like(k)
    first = torch.tensor([f for f, _, _ in REQUESTS]).numpy()
    count = torch.tensor([n for _, n, _ in REQUESTS]).numpy()
    doc = {i: rs for i, (_, _, rs) in enumerate(REQUESTS)}
    kept = step_ranges(doc, first, count)
    # One buffer for every call, as in a runner: each call's rows are filled just before it.
    buffer = GraphRanges(rows=8, width=8, device=torch.device("cpu"))
    addresses = set()
    result: dict[str, object] = {"kept": kept}
    for window in (0, 16):
        stock = attention(q, k, v, REQUESTS, compact([rs for _, _, rs in REQUESTS]), window)
        rows = buffer.view(kept, len(REQUESTS))
        assert rows is not None
        addresses.add(rows.data_ptr())
        mine = attention(q, k, v, REQUESTS, rows, window)
        causal = attention(q, k, v, REQUESTS, None, window)
        # one range that holds query tokens left out: must change the output
        short = {**kept, 0: [r for r in kept[0] if r != (40, 49)]}
        rows = buffer.view(short, len(REQUESTS))
        assert rows is not None
        addresses.add(rows.data_ptr())
        dropped = attention(q, k, v, REQUESTS, rows, window)
        text = [(0, 30, [])]
        empty = GraphRanges(rows=8, width=8, device=torch.device("cpu")).view({}, 1)
        tq = q[:30].clone()
        result[f"window{window}"] = {
            "buffer_equals_vllm": torch.equal(mine, stock),
            "ranges_matter": not torch.equal(stock, causal),
            "dropping_a_range_changes_output": not torch.equal(dropped, stock),
            "text_zero_rows_equal_none": torch.equal(
                attention(tq, k, v, text, empty, window), attention(tq, k, v, text, None, window)
            ),
        }
    result["one_address"] = len(addresses) == 1
    print(json.dumps(result))


if __name__ == "__main__":
    main()
