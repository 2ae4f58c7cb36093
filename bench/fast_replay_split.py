"""Fast mode's wall time split: the whole encode call against its CUDA graph's replay alone.

One stacked call (as vLLM hands video frames) of 6-frame 480p videos through the plugin's fast
mode with CUDA graphs, after warm-up: the call's median wall time, the replay's alone (wall and
CUDA events) and the call's host time before it returns (no sync). What the call adds to the
replay is host work; what the replay's events show over the kernels' busy time
(`bench/encoder_kernel_profile.py`) is the graph's own gaps.

    python bench/fast_replay_split.py --videos 16,1 [--out FILE]     # CUDA only
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from gemma4_batched_encoder import synthetic as S
from gemma4_batched_encoder.bench import event_ms, timed
from gemma4_batched_encoder.encoder import BatchedVisionEncoder
from gemma4_batched_encoder.settings import Settings

FRAME = S.Media("frame", (21, 27), 70)  # 480p: 567 patches padded to 630, 63 tokens


def _median_ms(fn: Callable[[], object], n: int = 40) -> float:
    return round(statistics.median(timed(fn, "cuda", 0, n)[1]), 3)


def split(vt: torch.nn.Module, videos: int) -> dict:
    media = [FRAME] * (6 * videos)
    pvs, pps = S.make_batch(media, 3 * vt.config.patch_size**2, vt.config.pooling_kernel_size)
    pv, pp = torch.stack(pvs).cuda().bfloat16(), torch.stack(pps).cuda()
    hints = [FRAME.grid[0] * FRAME.grid[1] // vt.config.pooling_kernel_size**2] * len(media)
    enc = BatchedVisionEncoder(vt, replace(Settings.from_env(), mode="fast", cuda_graphs=True))
    for _ in range(5):
        enc.encode(pv, pp, hints)
    if enc.graphs.num_graphs != 1:
        raise SystemExit(f"expected one captured graph, found {enc.graphs.num_graphs}")
    graph = enc.graphs.captured_graphs()[0]
    host = []
    for _ in range(20):  # the call's host time: until it returns, without a sync after it
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        enc.encode(pv, pp, hints)
        host.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    events = event_ms(graph.replay, 0, 20)
    return {
        "videos": videos,
        "encode_ms": _median_ms(lambda: enc.encode(pv, pp, hints)),
        "replay_ms": _median_ms(graph.replay),
        "replay_events_ms": round(statistics.median(events), 3),
        "encode_host_ms": round(statistics.median(host), 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--videos", default="16,1")
    p.add_argument("--preset", default="e4b")
    p.add_argument("--out")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("fast_replay_split: needs CUDA")
    vt = S.build_vision_tower(
        S.vision_config_kwargs(args.preset, None), seed=0, dtype=torch.bfloat16, device="cuda"
    )
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "kernels": Settings.from_env().fast_kernels,
        "rows": [split(vt, int(v)) for v in args.videos.split(",")],
    }
    for r in result["rows"]:
        print(
            f"{r['videos']:>3} videos: encode {r['encode_ms']} ms; "
            f"replay alone {r['replay_ms']} ms (events {r['replay_events_ms']}); "
            f"the call's host time {r['encode_host_ms']} ms"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")


if __name__ == "__main__":
    main()
