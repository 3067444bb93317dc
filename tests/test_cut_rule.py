"""One cut rule (tokenizer_svc/cuts.py) for the GPU's segments, the encoder's oversize split,
the service's chunks and `istanbul prepare`: the implementations agree position by position,
and cutting at the rule's split points never changes an id."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tokenizer_svc.cuts import cut_mask, is_cut, split_points
from tokenizer_svc.encoding import get_encoding
from tokenizer_svc.gpu_encode import NONE, GpuEncoder
from trainer_svc.prepare import is_safe_point, split_document

from .tokenizer_support import MULTILINGUAL, TRICKY, tiktoken_twin, vocabulary_for

CORNERS = list("'sSſlLdD \t\r\n\n\n  0123/!?.,ʕªǅ\u0301\u00a0\u3000日üßİ") + \
    ["\u200d", "👍", "\u2028", "\x85", "x\n\nA", "a \n b", "\r\n\r\n"]
CHUNK = 8   # (chunks of <= 5 bytes can overrun on 4-byte characters: a known pre-existing limit)


def adversarial(seed: int, n: int = 400) -> str:
    rng = random.Random(seed)
    parts = [rng.choice(CORNERS) for _ in range(n)]
    return "".join(parts) + "".join(TRICKY) + "".join(MULTILINGUAL)


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k"])
def test_gpu_is_cut_is_the_python_rule(device, pattern):
    """bpe_cuts reports the first cut of every chunk of CHUNK bytes: exactly the first byte of the
    chunk where tokenizer_svc.cuts.is_cut says so (the document start counts as a cut)."""
    vocab = vocabulary_for(f"trained-{pattern}")
    tables = get_encoding(vocab, device=device).backend.tables
    encoder = GpuEncoder(device, tables, pattern, chunk=CHUNK)
    data = np.frombuffer(adversarial(len(pattern)).encode(), np.uint8)
    encoder.encode_docs(data, np.array([0, data.size]))
    n_chunks = -(-data.size // CHUNK)
    cuts = device.download(encoder.pool.get("cuts", 16).view(0, 16 * n_chunks), np.uint32)
    gpu = cuts.reshape(-1, 4)[:, 0].tolist()
    cpu = [next((p for p in range(c * CHUNK, min((c + 1) * CHUNK, data.size))
                 if p == 0 or is_cut(data, p, pattern)), NONE) for c in range(n_chunks)]
    diff = [(c, gpu[c], cpu[c]) for c in range(n_chunks) if gpu[c] != cpu[c]]
    assert not diff, diff[:10]
    assert sum(c != NONE for c in cpu) > n_chunks // 4


@pytest.mark.parametrize("name", ["trained-gpt2", "trained-cl100k", "trained-o200k"])
def test_split_points_keep_every_id(name):
    vocab = vocabulary_for(name)
    tik = tiktoken_twin(vocab)
    text = adversarial(7, 3000)
    data = text.encode()
    whole = tik.encode_ordinary(text)
    for pattern in (vocab.pattern_name, None):
        points = [p for p in range(len(data)) if is_cut(data, p, pattern, split=True)]
        assert len(points) > 300
        bounds = [0, *points, len(data)]
        assert [i for a, b in zip(bounds, bounds[1:])
                for i in tik.encode_ordinary(data[a:b].decode())] == whole, pattern
    ends, unsafe = split_points(data, 256, vocab.pattern_name)
    assert unsafe == 0 and ends[-1] == len(data)


def test_segment_cuts_are_not_all_split_points():
    """A cut after two newlines before a letter is a boundary inside one text but not
    between two documents ("x\\n\\n" alone ends in one piece "\\n\\n")."""
    data = b"x\n\nA"
    assert is_cut(data, 3, "gpt2") and not is_cut(data, 3, "gpt2", split=True)
    assert not is_safe_point(data, 3)


def test_prepare_uses_the_rule_and_stops_at_invalid_utf8():
    data = ("word " * 50).encode() + b"\xff" + ("more " * 50).encode()
    pieces, unsafe = split_document(data, 40)
    assert b"".join(pieces) == data
    first_bad = data.index(b"\xff")
    offsets = np.cumsum([len(p) for p in pieces])[:-1]
    assert all(is_safe_point(data, int(p)) for p in offsets if p < first_bad)
    # after the first invalid byte tiktoken merges the rest as one piece: no safe cut there
    assert unsafe == sum(1 for p in offsets if p > first_bad)


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k", None])
@pytest.mark.parametrize("split", [False, True])
def test_vectorized_rule_is_the_scalar_rule(pattern, split):
    text = adversarial(11, 1500)
    data = text.encode()
    offsets = np.cumsum([0] + [len(c.encode()) for c in text])
    mask = cut_mask(text, pattern, split=split)
    assert mask.tolist() == [is_cut(data, int(offsets[i]), pattern, split=split)
                             for i in range(1, len(text))]
