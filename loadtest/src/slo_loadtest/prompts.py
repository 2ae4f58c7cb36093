"""Text prompts of about N tokens, without downloading a tokenizer.

Without a tokenizer, a prompt is N words drawn from short, common English words, each of which
is a single token (with its leading space) in SentencePiece/BPE vocabularies of the Gemma, Llama
and GPT families; so N words are about N tokens. With a local tokenizer directory
(``--tokenizer``), each prompt is trimmed or extended until it encodes to exactly N tokens.

Every row starts with its own id and a seeded word order, so no two rows share a prefix block
(prefix caching cannot hide prefill work) unless ``unique`` is off.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

_WORDS_TEXT = """
    the of and to in is was for on are with as be at by this had not but from or have an
    they which one you were all she there would their we him been has when who will no more
    if out so up said what its about than into them can only other time new some could these
    two may first then do any like my now over such our man me even most made after also did
    many off before must well back through years much where your way down should because
    long each just state people those too how little good world very still own see men work
    year day get here between both life being under never know same last another while us
    might great old off come since against go came right used take three small large house
    found part place case point week water room land city hand high end road light open
    black white green blue red sea tree book story word game line page cat dog bird fish car
    door wall floor table
"""
WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())


def _word_prompt(
    rng: random.Random, header: str, n_words: int, vocab: tuple[str, ...] = WORDS
) -> str:
    words = [rng.choice(vocab) for _ in range(max(0, n_words))]
    return (header + " " + " ".join(words)).strip()


class PromptBuilder:
    """Builds the text part of each row."""

    def __init__(self, tokens: int, seed: int, tokenizer_path: str | Path | None = None) -> None:
        if tokens < 1:
            raise ValueError("prompt tokens must be >= 1")
        self.tokens = tokens
        self.seed = seed
        self._count: Callable[[str], int] | None = None
        self.words: tuple[str, ...] = WORDS
        if tokenizer_path:
            self._count, self.words = _local_tokenizer(Path(tokenizer_path))

    @property
    def exact(self) -> bool:
        return self._count is not None

    def build(self, row: int, unique: bool = True) -> str:
        key = row if unique else 0
        rng = random.Random(f"{self.seed}:{key}")
        header = f"Request {key}." if unique else "Request."
        # The header counts as ~3 tokens; the rest are one-token words.
        n_words = max(1, self.tokens - 3)
        text = _word_prompt(rng, header, n_words, self.words)
        if self._count is None:
            return text
        return self._fit(text, rng, header)

    def _fit(self, text: str, rng: random.Random, header: str) -> str:
        assert self._count is not None
        words = text[len(header) :].split()
        for _ in range(8):
            have = self._count(header + " " + " ".join(words))
            if have == self.tokens:
                break
            if have > self.tokens:
                cut = max(1, have - self.tokens)
                if cut >= len(words):
                    words = words[:1]
                    break
                words = words[:-cut]
            else:
                words.extend(rng.choice(self.words) for _ in range(self.tokens - have))
        return (header + " " + " ".join(words)).strip()


def _local_tokenizer(path: Path) -> tuple[Callable[[str], int], tuple[str, ...]]:
    """A token counter and a list of plain words that are one token each in this tokenizer.

    Words come from the tokenizer's own vocabulary when the English list does not tokenize one
    word per token (e.g. the tiny test model's word-level vocabulary, where unknown English
    words would vanish)."""
    if not path.is_dir():
        raise ValueError(f"tokenizer directory {path} does not exist")
    from transformers import AutoTokenizer  # local import: transformers is heavy

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    def one_token(word: str) -> bool:
        ids = tok.encode(" " + word, add_special_tokens=False)
        return len(ids) == 1 and ids[0] != tok.unk_token_id

    english = [w for w in WORDS[:60] if one_token(w)]
    if len(english) >= 50:
        return count, WORDS
    plain = sorted({w.lstrip("▁Ġ") for w in tok.get_vocab() if w.lstrip("▁Ġ").isalnum()})
    vocab = tuple(w for w in plain[:4000] if one_token(w))
    if len(vocab) < 20:
        raise ValueError(f"tokenizer {path} has too few plain one-token words to build prompts")
    return count, vocab
