"""vLLM 0.20.0's code that the engine patches wrap, verbatim, for tests on a machine that runs
a later vLLM (0.32 here)."""

from __future__ import annotations

import torch


class Metadata020:
    @staticmethod
    def compute_mm_prefix_range_tensor(
        mm_prefix_range: dict[int, list[tuple[int, int]]] | None,
        num_seqs: int,
        device: torch.device,
    ) -> torch.Tensor | None:
        # vLLM 0.20.0, vllm/v1/attention/backends/triton_attn.py:91-123 (docstring dropped)
        if mm_prefix_range is None:
            return None

        # Collect ranges, using [(0,0)] for empty sequences to ensure uniform dims
        range_lists = [mm_prefix_range.get(i, [(0, 0)]) or [(0, 0)] for i in range(num_seqs)]

        # Return None if all ranges are trivial (only (0,0) placeholders)
        if all(r == [(0, 0)] for r in range_lists):
            return None

        # Build on CPU first then move to GPU in a single H2D transfer
        max_ranges = max(len(r) for r in range_lists)
        # Pad all sequences to the same number of ranges
        padded = []
        for r in range_lists:
            padded_r = list(r) + [(0, 0)] * (max_ranges - len(r))
            padded.append(padded_r)
        # Create tensor with efficient H2D transfer
        return torch.tensor(padded, dtype=torch.int32, device=device).view(num_seqs, max_ranges, 2)
