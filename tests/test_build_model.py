"""local/build_model.py: every id the model can emit decodes to text; specials and WORDS keep
their ids; the tiny random model's greedy outputs are WORDS."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer, decoders

import build_model  # local/build_model.py (root conftest puts local/ on sys.path)
import media

SPECIALS = list(dict.fromkeys(build_model.SPECIAL_TOKENS.values()))
# The ids the tiny random model's weights (and any cached load-test result) were made with.
PINNED = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<turn|>": 6, "<|image|>": 12}
PINNED |= {"<|video|>": 16, "w0": 17, "w1999": 2016, "user": 2017, "describe": 2022}


@pytest.fixture(scope="module", params=["tiny", "e4b"])
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(preset, model dir) without weights: tokenizer and config only, about a second for E4B."""
    preset = request.param
    out = build_model.build(preset, preset, tmp_path_factory.mktemp(preset), weights="dummy")
    return preset, out


def test_every_id_decodes_to_text_except_specials(built) -> None:
    from transformers import AutoTokenizer

    preset, out = built
    config = json.loads((out / "config.json").read_text())
    size = config["text_config"]["vocab_size"]
    assert size == {"tiny": 4096, "e4b": 262144}[preset]
    assert config["text_config"]["vocab_size_per_layer_input"] == size
    tok = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert len(tok) == size
    texts = tok.batch_decode([[i] for i in range(size)], skip_special_tokens=True)
    assert [i for i, text in enumerate(texts) if not text] == list(range(len(SPECIALS)))
    assert len(set(texts[len(SPECIALS) :])) == size - len(SPECIALS)  # each id its own text
    named = len(SPECIALS) + len(build_model.WORDS)
    assert texts[len(SPECIALS) : named] == build_model.WORDS
    assert texts[named] == f"x_{named}" and texts[-1] == f"x_{size - 1}"


def test_specials_and_words_keep_their_ids(built) -> None:
    _, out = built
    vocab = Tokenizer.from_file(str(out / "tokenizer.json")).get_vocab()
    assert [vocab[t] for t in SPECIALS + build_model.WORDS] == list(range(2023))
    assert {t: vocab[t] for t in PINNED} == PINNED
    config = json.loads((out / "config.json").read_text())
    assert config["image_token_id"] == 12 and config["video_token_id"] == 16
    assert config["eos_token_id"] == [1, 6] and config["text_config"]["pad_token_id"] == 0


def test_sampled_ids_stream_text_as_vllm_detokenizes_them(built) -> None:
    """vLLM's incremental detokenizer (a DecodeStream primed with the prompt) yields text for
    every sampled id past the specials, which is what a load test's TTFT and ITL need."""
    _, out = built
    size = json.loads((out / "config.json").read_text())["text_config"]["vocab_size"]
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    prompt = tok.encode("<bos><|turn>user\nw1 w2<turn|>\n<|turn>model\n").ids
    assert tok.token_to_id("<unk>") not in prompt
    stream = decoders.DecodeStream(ids=prompt, skip_special_tokens=True)
    rng = random.Random(0)
    sampled = [rng.randrange(len(SPECIALS), size) for _ in range(200)]
    assert all(stream.step(tok, i) for i in sampled)


def test_prompt_words_from_the_tokenizer_are_words(built) -> None:
    """Fillers are not alphanumeric, so load-test prompts stay made of WORDS."""
    from slo_loadtest.prompts import PromptBuilder

    _, out = built
    builder = PromptBuilder(100, seed=1, tokenizer_path=out)
    assert builder.exact and set(builder.words) == set(build_model.WORDS)


@pytest.mark.e2e
def test_tiny_random_model_greedy_outputs_are_words(vllm_server) -> None:
    """The shrunk special and filler rows keep the random model's greedy tokens real WORDS."""
    import httpx

    url = media.data_url("image/png", media.png_bytes(320, 240, seed=3))
    contents = [
        " ".join(f"w{i * 7 % 2000}" for i in range(60)),
        [{"type": "text", "text": "describe"}, media.image_part(url)],
    ]
    words = set(build_model.WORDS)
    for content in contents:
        body = {
            "model": vllm_server.model,
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 10, "min_tokens": 10, "ignore_eos": True, "temperature": 0.0,
        }  # fmt: skip
        resp = httpx.post(f"{vllm_server.base_url}/chat/completions", json=body, timeout=120)
        assert resp.status_code == 200, resp.text
        text = resp.json()["choices"][0]["message"]["content"]
        assert len(text.split()) == 10 and set(text.split()) <= words, text


def test_kv_shared_layers_get_what_vllm_026_allocates(tmp_path) -> None:
    """transformers leaves k_norm, k_proj and v_proj out of KV-shared layers; the extra shard adds
    exactly those, shaped as transformers shapes the same layer type's tensors elsewhere
    (global_head_dim and num_global_key_value_heads on full attention)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, Gemma4ForConditionalGeneration

    out = build_model.build("tiny", "tiny", tmp_path / "m")
    config = json.loads((out / "config.json").read_text())
    text = config["text_config"]
    text.update(
        num_hidden_layers=4, num_kv_shared_layers=2, global_head_dim=64, attention_k_eq_v=False
    )
    text["layer_types"] = ["sliding_attention", "full_attention"] * 2
    (out / "config.json").write_text(json.dumps(config))
    hf_config = AutoConfig.from_pretrained(out)
    with torch.device("meta"):
        own = Gemma4ForConditionalGeneration(hf_config).state_dict()
    build_model.write_kv_shared_weights(out, hf_config.text_config)
    with safe_open(str(out / build_model.KV_SHARED_SHARD), "pt") as f:
        added = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (not iterable)
    name = "model.language_model.layers.{}.self_attn.{}.weight"
    kinds = ("k_norm", "k_proj", "v_proj")
    assert set(added) == {name.format(i, k) for i in (2, 3) for k in kinds}
    assert not set(added) & set(own)
    for kind in kinds:
        # Same shape as transformers' own tensor in the unshared layer of the same type.
        for shared, unshared in ((2, 0), (3, 1)):
            got = added[name.format(shared, kind)]
            assert tuple(got.shape) == tuple(own[name.format(unshared, kind)].shape), kind
            assert bool((got == (1 if kind == "k_norm" else 0)).all())
    assert tuple(added[name.format(3, "k_norm")].shape) == (64,)
    assert (out / build_model.KV_SHARED_SHARD).stat().st_mode & 0o777 == 0o644


def test_uniform_head_dim_gives_full_attention_the_sliding_width(tmp_path) -> None:
    out = build_model.build("e4b", "e4b", tmp_path / "m", uniform_head_dim=True)
    text = json.loads((out / "config.json").read_text())["text_config"]
    assert text["global_head_dim"] == text["head_dim"] == 256
    default = build_model.build("e4b", "e4b", tmp_path / "d")
    text = json.loads((default / "config.json").read_text())["text_config"]
    assert text["global_head_dim"] == 512
