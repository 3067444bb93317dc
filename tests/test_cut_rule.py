"""One cut rule (shaders/kernels/bpe/cuts.py) for the GPU's segments, the encoder's oversize
split, the service's chunks and `istanbul prepare`: the implementations agree position by
position, and cutting at the rule's split points never changes an id."""

from __future__ import annotations

import random

import numpy as np
import pytest

from istanbul.shaders.kernels.bpe.cuts import cut_mask, digit_group_starts, is_cut, split_points
from istanbul.shaders.kernels.bpe.encode import ENCODE_FILE, NONE, GpuEncoder
from istanbul.shaders.kernels.bpe.unicode_table import BIT_N, load_table
from tokenizer_svc.encoding import get_encoding
from trainer_svc.data.prepare import is_safe_point, split_document

from .tokenizer_support import MULTILINGUAL, TRICKY, tiktoken_twin, vocabulary_for

CORNERS = list("'sSſlLdDaBǅx \t\r\n\n\n  0123/!?.,ʕªǅ\u0301\u00a0\u3000日üßİ") + \
    ["\u200d", "👍", "\u2028", "\x85", "x\n\nA", "a \n b", "\r\n\r\n"]
CHUNK = 8   # (chunks of <= 5 bytes can overrun on 4-byte characters: a known pre-existing limit)


def adversarial(seed: int, n: int = 400) -> str:
    rng = random.Random(seed)
    parts = [rng.choice(CORNERS) for _ in range(n)]
    return "".join(parts) + "".join(TRICKY) + "".join(MULTILINGUAL)


# runs of digits: ASCII, Arabic-Indic (2 bytes), fullwidth (3), mathematical (4), mixed, runs
# ending at a document's end and starting at the next one's start, letters between
DIGIT_DOCS = ["7" * 301, "x" + "1234567890" * 37 + "y", "\u0663" * 95 + " " + "\uff11" * 70,
              "\U0001d7d8" * 41, "0\u0661\uff12\U0001d7dc" * 23 + ".", "12", "345" * 40,
              "99" * 80, "a1" * 50 + "5" * 64]


def expected_first_cuts(docs: list[str], chunk: int, pattern: str, lookback: int) -> list[int]:
    """The first segment start of every chunk of the joined documents as bpe_cuts and then
    bpe_digit_cuts leave it: a document start or a rule cut, else (cl100k, o200k; a chunk whose
    characters are all digits, its run's start at most `lookback` chunks back) the first
    digit-group start (cuts.digit_group_starts). The look-back ends in the chunk holding the character before the run (or the run's first digit, at a document start)."""
    data = "".join(docs).encode()
    classes = load_table().class_bytes
    rule, groups, digit, run_start = set(), set(), {}, {}
    doc_starts = set(np.cumsum([0] + [len(d.encode()) for d in docs]).tolist())
    at = 0
    for doc in docs:
        raw = doc.encode()
        rule.add(at)
        rule.update(at + p for p in range(1, len(raw)) if is_cut(raw, p, pattern))
        groups.update(at + g for g in digit_group_starts(doc, pattern))
        start = None
        for ch in doc:
            is_digit = bool(int(classes[ord(ch)]) & BIT_N)
            start = (at if start is None else start) if is_digit else None
            digit[at], run_start[at] = is_digit, start
            at += len(ch.encode())
    out = []
    for c in range(-(-len(data) // chunk)):
        chars = [p for p in range(c * chunk, min((c + 1) * chunk, len(data))) if p in digit]
        cut = next((p for p in chars if p in rule), None)
        first = chars[0] if chars else 0
        seen_from = run_start[first] if run_start.get(first) in doc_starts else \
            (run_start.get(first) or 1) - 1   # the look-back's last chunk holds this byte
        if cut is None and chars and all(digit[p] for p in chars) and \
                seen_from // chunk >= c - lookback:
            cut = next((p for p in chars if p in groups), None)
        out.append(NONE if cut is None else cut)
    return out


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k"])
def test_gpu_is_cut_is_the_python_rule(device, pattern):
    """bpe_cuts reports the first cut of every chunk of CHUNK bytes: exactly the first byte of the
    chunk where cuts.is_cut says so (the document start counts as a cut), or where bpe_digit_cuts starts a digit group (chunks of digits only, cl100k and o200k)."""
    vocab = vocabulary_for(f"trained-{pattern}")
    tables = get_encoding(vocab, device=device).backend.tables
    encoder = GpuEncoder(device, tables, pattern, chunk=CHUNK)
    text = adversarial(len(pattern))
    data = np.frombuffer(text.encode(), np.uint8)
    encoder.encode_docs(data, np.array([0, data.size]))
    n_chunks = -(-data.size // CHUNK)
    cuts = device.download(encoder.pool.get("cuts", 16).view(0, 16 * n_chunks), np.uint32)
    gpu = cuts.reshape(-1, 4)[:, 0].tolist()
    cpu = expected_first_cuts([text], CHUNK, pattern, 4096)
    diff = [(c, gpu[c], cpu[c]) for c in range(n_chunks) if gpu[c] != cpu[c]]
    assert not diff, diff[:10]
    assert sum(c != NONE for c in cpu) > n_chunks // 4


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k"])
@pytest.mark.parametrize("lookback", [4096, 3])
def test_digit_runs_are_cut_at_their_groups(device, pattern, lookback):
    """bpe_digit_cuts gives a chunk inside a run of digits its first digit-group start as a
    segment start (cl100k, o200k; gpt2 keeps a run as one piece), looking back at most
    DIGIT_LOOKBACK chunks for the run's start (3: a long run keeps its serial walk beyond),
    and the ids stay tiktoken's."""
    vocab = vocabulary_for(f"trained-{pattern}")
    tik = tiktoken_twin(vocab)
    tables = get_encoding(vocab, device=device).backend.tables
    encoder = GpuEncoder(device, tables, pattern, chunk=CHUNK)
    if encoder.k_digit_cuts is not None:
        encoder.k_digit_cuts = device.kernel(
            ENCODE_FILE, "bpe_digit_cuts",
            {"PATTERN": {"cl100k": 1, "o200k": 2}[pattern], "DIGIT_LOOKBACK": lookback})
    docs = DIGIT_DOCS + [adversarial(3, 200)]
    raw = [d.encode() for d in docs]
    data = np.frombuffer(b"".join(raw), np.uint8)
    starts = np.cumsum([0] + [len(r) for r in raw])
    ids, offsets = encoder.encode_docs(data, starts)
    assert [ids[offsets[k]:offsets[k + 1]].tolist() for k in range(len(docs))] == \
        [tik.encode_ordinary(d) for d in docs]
    n_chunks = -(-data.size // CHUNK)
    cuts = device.download(encoder.pool.get("cuts", 16).view(0, 16 * n_chunks), np.uint32)
    gpu = cuts.reshape(-1, 4)[:, 0].tolist()
    cpu = expected_first_cuts(docs, CHUNK, pattern, lookback)
    diff = [(c, gpu[c], cpu[c]) for c in range(n_chunks) if gpu[c] != cpu[c]]
    assert not diff, diff[:10]
    inside = sum(c != NONE and c not in set(starts.tolist()) and
                 not is_cut(data.tobytes(), c, pattern) for c in cpu)
    assert (inside > 100) if pattern != "gpt2" and lookback > 3 else True
    assert (inside == 0) if pattern == "gpt2" else True


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
