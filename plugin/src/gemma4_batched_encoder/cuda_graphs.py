"""CUDA-graph capture of one encoder pass for bucketed batch sizes (CUDA only).

A replay runs the kernels recorded at capture, so bits match the eager pass with the same
shapes; what graphs remove is launch overhead (~100 small kernels per layer). Batch sizes are
rounded up to a bucket (2^i or 3*2^i); the extra rows repeat the last real item and are dropped.
The graphs of one input shape read their inputs from views of one static buffer (the largest
bucket's; calls are sequential on one stream, and each copies its inputs in before its replay),
so the buffers cost one batch, not one per bucket. Any capture error disables that key and the
caller runs eagerly, and so does an exact-mode graph whose first replay differs from the eager
warm-up run on the same inputs: a capture can record other kernels than the eager pass runs
(transformers 5.17 builds a mask for "no padding" while a stream captures; H200, 2026-12-01),
and exact mode's promise is the eager bits.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .log import logger

ChunkFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def bucket_size(n: int) -> int:
    """Smallest 2^i or 3*2^i >= n: under 50% filler rows; 6-frame videos fill 6/12/24/48/96."""
    p = 1 << max(0, (n - 1).bit_length())
    return 3 * p // 4 if p >= 4 and 3 * p // 4 >= n else p


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    pixel_values: torch.Tensor
    position_ids: torch.Tensor
    output: torch.Tensor


class CudaGraphRunner:
    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self._graphs: dict[tuple, _Captured] = {}
        self._failed: set[tuple] = set()
        # Static inputs per (key, item shape, dtypes, device): [rows, ...] pixel values and ids.
        self._inputs: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        self._pool = None
        self._stream: torch.cuda.Stream | None = None  # warm-up and capture stream
        # False while the encoder's start-up warm-up captures: later captures stall a serving
        # step (~0.5-1 s on the H200), so each gets an INFO line naming its key.
        self.serving = True

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def captured_graphs(self) -> list[torch.cuda.CUDAGraph]:
        """The captured graphs, oldest first (benchmarks time a replay alone against a call)."""
        return [captured.graph for captured in self._graphs.values()]

    @property
    def num_failed(self) -> int:
        """Keys whose capture failed or whose replay differed from eager (they run eagerly)."""
        return len(self._failed)

    def run(
        self,
        key: tuple,
        fn: ChunkFn,
        pixel_values: torch.Tensor,
        position_ids: torch.Tensor,
        check_bits: bool = True,
    ) -> torch.Tensor | None:
        """Replay (capturing on first use) ``fn`` for this batch; None means: run it eagerly.

        ``check_bits``: keep a new graph only if its first replay equals the eager pass bit for
        bit (exact mode's promise; fast mode promises no bits, so it skips the check)."""
        n = pixel_values.shape[0]
        size = bucket_size(n)
        if size > self.max_items or not self._can_capture(pixel_values):
            return None
        shape_key = (
            *key,
            tuple(pixel_values.shape[1:]),
            pixel_values.dtype,
            position_ids.dtype,
            pixel_values.device,
        )
        full_key = (*shape_key, size)
        if full_key in self._failed:
            return None
        captured = self._graphs.get(full_key)
        if captured is None:
            start = time.perf_counter()
            try:
                captured, eager = self._capture(fn, pixel_values, position_ids, size, shape_key)
                same = not check_bits or self._replays_as_eager(captured, eager)
            except Exception:
                logger.warning(
                    "CUDA graph capture failed for %s; running eagerly", full_key, exc_info=True
                )
                self._failed.add(full_key)
                self._abandon_pool(pixel_values.device)
                torch.cuda.synchronize()
                return None
            if not same:
                logger.warning(
                    "CUDA graph for %s replays other values than its eager pass on the same "
                    "inputs; running this key eagerly",
                    full_key,
                )
                self._failed.add(full_key)
                return None
            self._graphs[full_key] = captured
            if self.serving:
                logger.info(
                    "CUDA graph captured while serving for %s in %.2f s",
                    full_key,
                    time.perf_counter() - start,
                )
        captured.pixel_values[:n].copy_(pixel_values)
        captured.position_ids[:n].copy_(position_ids)
        if size > n:
            captured.pixel_values[n:].copy_(pixel_values[-1:].expand(size - n, -1, -1))
            captured.position_ids[n:].copy_(position_ids[-1:].expand(size - n, -1, -1))
        captured.graph.replay()
        # The static output is overwritten by the next replay.
        return captured.output[:n].clone()

    @staticmethod
    def _can_capture(pixel_values: torch.Tensor) -> bool:
        return pixel_values.is_cuda

    def _static_inputs(
        self, shape_key: tuple, pixel_values: torch.Tensor, position_ids: torch.Tensor, size: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[size, ...] views of this shape's shared input buffers (a larger buffer replaces the
        entry; graphs captured on the old one keep it alive)."""
        buffers = self._inputs.get(shape_key)
        if buffers is None or buffers[0].shape[0] < size:
            buffers = (
                pixel_values.new_empty((size, *pixel_values.shape[1:])),
                position_ids.new_empty((size, *position_ids.shape[1:])),
            )
            self._inputs[shape_key] = buffers
        return buffers[0][:size], buffers[1][:size]

    def _capture(
        self,
        fn: ChunkFn,
        pixel_values: torch.Tensor,
        position_ids: torch.Tensor,
        size: int,
        shape_key: tuple,
    ) -> tuple[_Captured, torch.Tensor]:
        """The graph, and the eager warm-up's output on the same static inputs."""
        n = pixel_values.shape[0]
        reps = [min(i, n - 1) for i in range(size)]
        static_pv, static_pp = self._static_inputs(shape_key, pixel_values, position_ids, size)
        static_pv.copy_(pixel_values[reps])
        static_pp.copy_(position_ids[reps])
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        if self._stream is None:
            self._stream = torch.cuda.Stream()
        # Warm up (cuBLAS handles, autotuning, any compile) on the very stream the capture uses,
        # as torch.cuda.graphs recommends: nothing may compile or allocate afresh inside capture.
        self._stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._stream):
            eager = fn(static_pv, static_pp)
        torch.cuda.current_stream().wait_stream(self._stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(
            graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"
        ):
            output = fn(static_pv, static_pp)
        return _Captured(graph, static_pv, static_pp, output), eager

    @staticmethod
    def _replays_as_eager(captured: _Captured, eager: torch.Tensor) -> bool:
        """Replay once on the capture's inputs and compare with the eager warm-up's output, bit
        for bit (one sync per captured key, at capture time only)."""
        captured.graph.replay()
        return torch.equal(captured.output, eager)

    def _abandon_pool(self, device: torch.device) -> None:
        """After a failed capture: the caching allocator may still route to the pool that capture
        opened, and capturing into it again fails ("already recording to mempool_id", then an
        internal assert) for every later key (H200, 2026-11-30). Close it where this torch can;
        later captures take a fresh pool (graphs captured earlier keep theirs alive)."""
        pool, self._pool = self._pool, None
        end = getattr(torch._C, "_cuda_endAllocateToPool", None)
        if pool is not None and end is not None:
            # Already closed, or another signature: the fresh pool suffices.
            with contextlib.suppress(Exception):
                end(device.index if device.index is not None else torch.cuda.current_device(), pool)
