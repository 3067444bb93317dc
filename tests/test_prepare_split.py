"""Cutting large files for the tokenizer service must not change a single token id.

`prepare` sends a file larger than the service's per-document limit in pieces cut after a
newline between a printable ASCII character and an ASCII letter. Checked here with tiktoken
itself on the real GPT-2, cl100k and o200k vocabularies and patterns.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainer_svc.data.prepare import is_safe_point, split_document

from .conftest import SHARED_VOCAB, shared_vocab

SEEDS = SHARED_VOCAB.parent / "seeds"


def corpus() -> bytes:
    parts = [Path(os.__file__).read_bytes()]                  # Python source: code, comments
    if SEEDS.is_dir():
        parts += [p.read_bytes() for p in sorted(SEEDS.glob("*.txt"))]   # Turkish prose
    # Adversarial: Unicode spaces, blank lines, punctuation before newline and slash,
    # contractions, digits, spaces before non-letters.
    parts.append("ünicode satırı\n\u3000\nİstanbul\n .\n/yol\n\n\nA\nx\u00a0y z\u3000w "
                 "it's 'll don't  two  spaces .x 12 34\nx/y\n).\nÖz\n\tTab\n".encode() * 80)
    return b"\n".join(parts)


@pytest.mark.shared_vocab
@pytest.mark.parametrize("name", ["gpt2", "cl100k_base", "o200k_base"])
def test_pieces_tokenize_exactly_like_the_whole_file(name):
    tiktoken = pytest.importorskip("tiktoken")
    from tokenizer_svc.vocab import load_vocabulary
    vocab = load_vocabulary(shared_vocab(f"{name}.tiktoken"))
    enc = tiktoken.Encoding(name, pat_str=vocab.pattern, mergeable_ranks=vocab.ranks,
                            special_tokens=vocab.special_tokens)
    data = corpus()
    whole = enc.encode_ordinary(data.decode())
    # What prepare does with a small per-document limit.
    pieces, unsafe = split_document(data, 600)
    assert unsafe == 0 and len(pieces) > 100
    assert b"".join(pieces) == data and all(0 < len(p) <= 600 for p in pieces)
    assert [i for p in pieces for i in enc.encode_ordinary(p.decode())] == whole
    # Stronger: cut at every safe point at once.
    points = [p for p in range(len(data)) if is_safe_point(data, p)]
    assert len(points) > 2000
    bounds = [0, *points, len(data)]
    joined = [i for a, b in zip(bounds, bounds[1:]) for i in enc.encode_ordinary(
        data[a:b].decode())]
    assert joined == whole


def test_no_safe_point_falls_back_to_character_boundaries():
    data = ("ğ" * 1000).encode()                     # one long line of 2-byte characters
    pieces, unsafe = split_document(data, 301)
    assert unsafe == len(pieces) - 1 > 0
    assert all(p.decode() for p in pieces)           # never inside a UTF-8 sequence
    assert b"".join(pieces) == data
    assert split_document(b"short", 10) == ([b"short"], 0)
