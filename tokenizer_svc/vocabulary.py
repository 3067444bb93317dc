"""The vocabulary value every loader returns and every encoder reads (a bottom module: the
loaders in vocab.py and hf/tokenizer_json.py and the reference encoder all import it)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from functools import cached_property

from .patterns import pattern_name_for


class VocabularyError(ValueError):
    """A vocabulary file that cannot be used; the message names the file and the problem."""


@dataclass
class Vocabulary:
    name: str
    ranks: dict  # bytes -> int
    pattern: str
    special_tokens: dict = field(default_factory=dict)  # str -> int
    pattern_name: str | None = None
    merges: dict | None = None  # (bytes, bytes) -> priority, HF-style vocabularies only
    hf_splits: list | None = None  # [regex, ...] for HF Split pre-tokenizers
    hf_ignore_merges: bool = False  # HF BPE `ignore_merges`: a piece in the vocab is one token
    hf: object | None = None  # hf.tokenizer_json.HFConfig of a tokenizer.json (normalizer, ...)
    source: str = ""
    explicit_n_vocab: int | None = None

    def __post_init__(self):
        if self.pattern_name is None and self.hf_splits is None:
            self.pattern_name = pattern_name_for(self.pattern)

    @property
    def n_vocab(self) -> int:
        """One past the largest id (ordinary or special), as tiktoken's `n_vocab`."""
        top = max(self.ranks.values(), default=-1)
        top = max([top, *self.special_tokens.values()])
        return max(top + 1, self.explicit_n_vocab or 0)

    @property
    def unicode_family(self) -> str:
        """Whose Unicode tables the pre-tokenizer follows (unicode_table.FAMILIES)."""
        return "tokenizers" if self.hf is not None else "tiktoken"

    @property
    def eot_token(self) -> int | None:
        return self.special_tokens.get("<|endoftext|>")

    @cached_property
    def decoder(self) -> dict:
        """id -> bytes for ordinary and special tokens (an id that is both, as a tokenizer.json
        added token can be, decodes as the ordinary token: what its ByteLevel decoder gives)."""
        table = {i: text.encode("utf-8") for text, i in self.special_tokens.items()}
        if self.hf is not None:
            table.update(self.hf.added_bytes)
        table.update((i, b) for b, i in self.ranks.items())
        return table

    @cached_property
    def content_hash(self) -> str:
        """sha256 over ranks, merges, pattern and special tokens: the vocabulary's identity.

        Shards and checkpoints record it, so data tokenized with one vocabulary is never
        trained or decoded with another.
        """
        h = hashlib.sha256()
        for token, rank in sorted(self.ranks.items(), key=lambda kv: kv[1]):
            h.update(rank.to_bytes(4, "little") + len(token).to_bytes(2, "little") + token)
        if self.merges:
            for (a, b), p in sorted(self.merges.items(), key=lambda kv: kv[1]):
                h.update(b"M" + p.to_bytes(4, "little") + len(a).to_bytes(2, "little") + a + b)
        h.update(b"P" + json.dumps(self.hf_splits or self.pattern).encode())
        h.update(b"S" + json.dumps(sorted(self.special_tokens.items())).encode())
        if self.hf_ignore_merges:
            h.update(b"I")
        if self.hf is not None:
            h.update(b"H" + self.hf.identity().encode())
        return h.hexdigest()

    def describe(self) -> dict:
        return {"name": self.name, "n_vocab": self.n_vocab, "pattern": self.pattern_name or "custom",
                "special_tokens": self.special_tokens, "hash": self.content_hash,
                "source": self.source}
