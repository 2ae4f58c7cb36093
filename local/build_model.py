"""Write a random-weight Gemma 4 model directory that vLLM serves without hub access.

The directory has the real Gemma 4 multimodal architecture (`Gemma4ForConditionalGeneration`),
the real processor (image, video and audio-feature sections), a word-level tokenizer carrying
every special token the Gemma 4 processor looks up, and a chat template that emits the image and
video placeholders per content item.

Tokenizer ids: the special tokens first, then `WORDS` (w0..w1999 and a few words; prompts are
made of these), then filler tokens `x_<id>` up to the config's `vocab_size` (4096 for the tiny
text preset, 262144 for E4B). So every id the model can emit decodes to non-empty text: a model
sampling from near-uniform logits (dummy weights) streams content, and a load test can measure
TTFT and ITL. The fillers are not alphanumeric, so a load test that picks prompt words from the
tokenizer's vocabulary (slo_loadtest.prompts) still picks only `WORDS`.

Weights: `--weights random` writes seeded transformers-initialised weights (std 0.02; ~1 MB for
the tiny presets), so outputs depend on every input and a changed image embedding changes the
logprobs; their special and filler rows are shrunk so greedy outputs are `WORDS`. `--weights
dummy` writes none: vLLM's `--load-format dummy` fills them with uniform(-1e-3, 1e-3), which
costs nothing at E4B size but makes every logit nearly equal (greedy decoding emits `<pad>`
whatever the model is shown; sampling emits mostly fillers), so it is for timing only.

    python local/build_model.py --vision tiny --text tiny --weights random --out .cache/models/tiny
    python local/build_model.py --vision e4b  --text e4b  --out /tmp/gemma4-e4b-dummy
    python local/build_model.py --vision e4b  --text e4b  --weights random --device cuda \
        --out /tmp/gemma4-e4b       # on a GPU host: real logits at E4B size (~16 GB)

Vision presets come from the plugin (`gemma4_batched_encoder.presets.VISION_PRESETS`) so the
verifier, the benchmarks and the served model agree on what `tiny` and `e4b` mean.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, models, pre_tokenizers

# Special tokens, in the names the Gemma 4 tokenizer config uses. The processor reads
# image/boi/eoi/audio/boa/eoa from the tokenizer and adds <|video|> itself; without boa/eoa it
# raises even with audio off.
SPECIAL_TOKENS: dict[str, str] = {
    "pad_token": "<pad>",
    "eos_token": "<eos>",
    "bos_token": "<bos>",
    "unk_token": "<unk>",
    "mask_token": "<mask>",
    "sot_token": "<|turn>",
    "eot_token": "<turn|>",
    "soc_token": "<|channel>",
    "eoc_token": "<channel|>",
    "think_token": "<|think|>",
    "boi_token": "<|image>",
    "eoi_token": "<image|>",
    "image_token": "<|image|>",
    "boa_token": "<|audio>",
    "eoa_token": "<audio|>",
    "audio_token": "<|audio|>",
    "video_token": "<|video|>",
}
# Ordinary words: prompts made of these tokenize to exactly one token per word, so a load test
# can size a ~500-token prompt without a model-specific tokenizer.
WORDS = [f"w{i}" for i in range(2000)] + ["user", "model", "system", "video", "image", "describe"]
# Filler token of each id past specials + WORDS: never a special (<...>) or a word (w<n>, letters).
FILLER = "x_{}"

TEXT_PRESETS: dict[str, dict[str, Any]] = {
    # Two layers, hidden 64: starts in ~40 s and answers in ~0.1 s on 2 CPU cores.
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "global_head_dim": 32,
        "hidden_size_per_layer_input": 16,
        "num_kv_shared_layers": 0,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 512,
        "max_position_embeddings": 8192,
    },
    # google/gemma-4-E4B-it's text model (42 layers, [5 sliding + 1 full] x 7, 18 KV-shared).
    "e4b": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 42,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "global_head_dim": 512,
        "hidden_size_per_layer_input": 256,
        "num_kv_shared_layers": 18,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 7,
        "sliding_window": 512,
        "max_position_embeddings": 131072,
    },
}

# Gemma-style chat template: turns are <|turn>role ... <turn|>; each image/video content item
# becomes its placeholder, which vLLM's Gemma 4 processor expands into soft tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<|turn>' + role + '\n' }}"
    "{%- if message['content'] is string -%}"
    "{{ message['content'] }}"
    "{%- else -%}"
    "{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'text' -%}{{ item['text'] }}"
    "{%- elif item['type'] in ('image', 'image_url') -%}{{ '\n<|image|>\n' }}"
    "{%- elif item['type'] in ('video', 'video_url') -%}{{ '\n<|video|>\n' }}"
    "{%- elif item['type'] in ('audio', 'input_audio', 'audio_url') -%}{{ '\n<|audio|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<turn|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|turn>model\n' }}{%- endif -%}"
)


def _vision_presets() -> dict[str, dict[str, Any]]:
    try:
        from gemma4_batched_encoder.presets import VISION_PRESETS
    except ImportError as exc:  # the plugin is part of the dev environment (make venv)
        raise SystemExit(
            f"gemma4_batched_encoder cannot be imported ({exc}): run `make venv` first"
        ) from exc
    return VISION_PRESETS


def vocab_size(text: dict[str, Any]) -> int:
    """The model's vocabulary: E4B's 262144 for large text presets, 4096 for small ones."""
    return 262144 if text["hidden_size"] >= 1024 else 4096


def build_tokenizer(out: Path, size: int) -> dict[str, int]:
    """Write tokenizer.json + tokenizer_config.json; return the special tokens' ids.

    The vocabulary has exactly `size` ids: specials, WORDS, then fillers (see the module doc)."""
    specials = list(dict.fromkeys(SPECIAL_TOKENS.values()))
    named = specials + WORDS
    if size < len(named):
        raise ValueError(f"vocab_size {size} is smaller than the {len(named)} named tokens")
    vocab = {tok: i for i, tok in enumerate(named)}
    vocab.update((FILLER.format(i), i) for i in range(len(named), size))
    if len(vocab) != size:
        raise ValueError("a filler token collides with a special token or a word")
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    tok.save(str(out / "tokenizer.json"))
    config = {
        "backend": "tokenizers",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "processor_class": "Gemma4Processor",
        "padding_side": "left",
        "model_max_length": 131072,
        "chat_template": CHAT_TEMPLATE,
        **{k: v for k, v in SPECIAL_TOKENS.items() if k != "video_token"},
        "extra_special_tokens": {"video_token": SPECIAL_TOKENS["video_token"]},
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE + "\n")
    return {name: vocab[token] for name, token in SPECIAL_TOKENS.items()}


def model_config(
    text: dict[str, Any], vision: dict[str, Any], ids: dict[str, int], size: int
) -> dict:
    text_config = {
        "model_type": "gemma4_text",
        "vocab_size": size,
        "vocab_size_per_layer_input": size,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": True,
        "pad_token_id": ids["pad_token"],
        "eos_token_id": [ids["eos_token"], ids["eot_token"]],
        "bos_token_id": ids["bos_token"],
        "use_bidirectional_attention": "vision",
        # E4B's full-attention layers have global_head_dim 512, so transformers >= 5.17 treats
        # head_dim as per-layer and raises when vLLM 0.26 reads config.head_dim (seen on the
        # H200); the global value is the one vLLM means there.
        "allow_global_per_layer_attribute_access": True,
        **text,
    }
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        # Without a transformers_version >= 5, transformers 5 takes a local tokenizer of more than
        # 100000 ids (E4B's, with the fillers) for an old Mistral one and warns of a bad regex.
        "transformers_version": "5.5.0",
        "dtype": "bfloat16",
        "text_config": text_config,
        "vision_config": {"model_type": "gemma4_vision", **vision},
        "audio_config": None,
        "boi_token_id": ids["boi_token"],
        "eoi_token_id": ids["eoi_token"],
        "image_token_id": ids["image_token"],
        "video_token_id": ids["video_token"],
        "boa_token_id": ids["boa_token"],
        "eoa_token_index": ids["eoa_token"],
        "audio_token_id": ids["audio_token"],
        "pad_token_id": ids["pad_token"],
        "eos_token_id": [ids["eos_token"], ids["eot_token"]],
        "bos_token_id": ids["bos_token"],
        "tie_word_embeddings": True,
    }


def processor_config(vision: dict[str, Any]) -> dict:
    common = {
        "patch_size": vision.get("patch_size", 16),
        "pooling_kernel_size": vision.get("pooling_kernel_size", 3),
        "do_convert_rgb": True,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
        "resample": 3,
    }
    return {
        "processor_class": "Gemma4Processor",
        "image_seq_length": vision.get("default_output_length", 280),
        "audio_seq_length": 750,
        "audio_ms_per_token": 40,
        "image_processor": {
            "image_processor_type": "Gemma4ImageProcessor",
            "max_soft_tokens": vision.get("default_output_length", 280),
            "do_normalize": False,
            **common,
        },
        "video_processor": {
            "video_processor_type": "Gemma4VideoProcessor",
            "max_soft_tokens": 70,
            "num_frames": 32,
            "do_sample_frames": True,
            "do_normalize": True,
            **common,
        },
        "feature_extractor": {
            "feature_extractor_type": "Gemma4AudioFeatureExtractor",
            "feature_size": 128,
            "sampling_rate": 16000,
        },
    }


def write_random_weights(out: Path, seed: int, device: str = "cpu") -> None:
    """model.safetensors with transformers' own initialisation of this config, in bf16.

    ``device="cuda"`` builds and initialises the model on the GPU: E4B (~8B parameters, 32 GB in
    fp32 while initialising) then takes seconds instead of many CPU minutes. The values depend on
    the device's random generator, so a seed names one set of weights per device."""
    import tempfile

    import torch
    from transformers import AutoConfig, Gemma4ForConditionalGeneration

    torch.manual_seed(seed)
    with torch.device(device):
        model = Gemma4ForConditionalGeneration(AutoConfig.from_pretrained(out))
    # Only the word rows keep their scale: special tokens (first in the vocabulary) and the
    # fillers after WORDS (up to the config's vocab_size) get their tied embedding rows shrunk,
    # which puts their logits near 0, below the best of 2000 random word logits. So greedy
    # decoding emits words: streamed text is never empty (special tokens decode to nothing) and
    # is made of WORDS, not fillers (which would decode to x_<id>).
    n_special = len(set(SPECIAL_TOKENS.values()))
    with torch.no_grad():
        embeddings = model.get_input_embeddings().weight
        embeddings[:n_special] *= 0.01
        embeddings[n_special + len(WORDS) :] *= 0.01
    # save_pretrained also rewrites config.json; keep ours, take only the weights.
    with tempfile.TemporaryDirectory() as tmp:
        model.to(torch.bfloat16).save_pretrained(tmp)
        for shard in Path(tmp).glob("*.safetensors*"):
            shard.chmod(0o644)
            shard.replace(out / shard.name)
    write_kv_shared_weights(out, model.config.text_config)


KV_SHARED_SHARD = "kv-shared-layers.safetensors"


def write_kv_shared_weights(out: Path, text_config: Any) -> None:
    """What vLLM 0.26.0 allocates in KV-shared layers but transformers never makes: k_norm (ones)
    and k_proj / v_proj (zeros), in a shard of their own.

    A layer that reuses another layer's KV has no k_norm, k_proj or v_proj in transformers.
    vLLM 0.26.0 allocates all three in every layer: it refuses a checkpoint without k_norm
    ("Following weights were not initialized from checkpoint: {...k_norm.weight}", seen on the
    H200), and loading q_proj alone marks its fused qkv_proj loaded, leaving the K and V rows as
    uninitialised memory that differs per process (found with vLLM 0.26.0 on the CPU). A shared
    layer never uses them, so their values do not matter; writing them leaves no per-process
    state in the loaded model. vLLM versions that do not allocate them skip the extra keys."""
    import torch
    from safetensors.torch import save_file

    shared = text_config.num_kv_shared_layers
    if not shared:
        return
    first = text_config.num_hidden_layers - shared
    # transformers >= 5.17 keeps the per-layer width and KV heads (global_head_dim and
    # num_global_key_value_heads on full attention)
    per_layer = getattr(text_config, "per_layer_config", None)
    tensors = {}
    for i in range(first, text_config.num_hidden_layers):
        layer = per_layer[i] if per_layer else text_config
        dim, kv_heads = layer.head_dim, layer.num_key_value_heads
        prefix = f"model.language_model.layers.{i}.self_attn"
        tensors[f"{prefix}.k_norm.weight"] = torch.ones(dim, dtype=torch.bfloat16)
        # as transformers builds them in the unshared layers (v_proj absent where K doubles as V)
        sliding = text_config.layer_types[i] == "sliding_attention"
        projections = ["k_proj"]
        if not (getattr(text_config, "attention_k_eq_v", False) and not sliding):
            projections.append("v_proj")
        for proj in projections:
            shape = (kv_heads * dim, text_config.hidden_size)
            tensors[f"{prefix}.{proj}.weight"] = torch.zeros(shape, dtype=torch.bfloat16)
            if text_config.attention_bias:
                tensors[f"{prefix}.{proj}.bias"] = torch.zeros(shape[0], dtype=torch.bfloat16)
    path = out / KV_SHARED_SHARD
    save_file(tensors, str(path), metadata={"format": "pt"})
    path.chmod(0o644)


def has_weights(model_dir: Path) -> bool:
    return any(model_dir.glob("*.safetensors"))


def build(
    vision_preset: str,
    text_preset: str,
    out: Path,
    weights: str = "dummy",
    seed: int = 0,
    device: str = "cpu",
    uniform_head_dim: bool = False,
) -> Path:
    vision_presets = _vision_presets()
    if vision_preset not in vision_presets:
        raise SystemExit(f"unknown vision preset {vision_preset!r}: {sorted(vision_presets)}")
    if text_preset not in TEXT_PRESETS:
        raise SystemExit(f"unknown text preset {text_preset!r}: {sorted(TEXT_PRESETS)}")
    if weights not in ("dummy", "random"):
        raise SystemExit(f"unknown --weights {weights!r}: dummy | random")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.safetensors*"):
        stale.unlink()
    text = dict(TEXT_PRESETS[text_preset])
    if uniform_head_dim:
        text["global_head_dim"] = text["head_dim"]
    size = vocab_size(text)
    ids = build_tokenizer(out, size)
    vision = dict(vision_presets[vision_preset])
    files = {
        "config.json": model_config(text, vision, ids, size),
        "processor_config.json": processor_config(vision),
        "generation_config.json": {
            "bos_token_id": ids["bos_token"],
            "eos_token_id": [ids["eos_token"], ids["eot_token"]],
            "pad_token_id": ids["pad_token"],
        },
    }
    for name, content in files.items():
        (out / name).write_text(json.dumps(content, indent=2) + "\n")
    if weights == "random":
        write_random_weights(out, seed, device)
    return out


def fingerprint() -> str:
    """Changes whenever this builder or the presets change (Makefile/test caches key on it)."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps(_vision_presets(), sort_keys=True).encode())
    return digest.hexdigest()[:12]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vision", default="tiny", help="vision preset: tiny | e4b")
    parser.add_argument("--text", default="tiny", help="text preset: tiny | e4b")
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    parser.add_argument(
        "--weights",
        choices=("dummy", "random"),
        default="dummy",
        help="random: write seeded weights (E4B: ~16 GB, use --device cuda); "
        "dummy: none (--load-format dummy)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --weights random")
    parser.add_argument(
        "--device", default="cpu", help="where --weights random initialises: cpu | cuda"
    )
    parser.add_argument(
        "--uniform-head-dim",
        action="store_true",
        help="full-attention layers get head_dim, not global_head_dim (E4B: 256, not 512); "
        "vLLM 0.26.0 refused transformers 5.17's 512-wide norms of random E4B weights",
    )
    args = parser.parse_args(argv)
    path = build(
        args.vision,
        args.text,
        args.out,
        args.weights,
        args.seed,
        args.device,
        args.uniform_head_dim,
    )
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
