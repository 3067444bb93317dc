"""Long pieces merged in windows and stitched (bpe_encode.wgsl, "Long pieces"): ids equal to
tiktoken's on adversarial single pieces, with windows small enough that every piece has many
seams, and the retry path taken when seams do not stitch.

Small windows (LONG_WINDOW 320 = 2^6 5, overlap 48, for vocabularies whose longest token is
128 bytes) put a seam every 320 bytes, so pieces of a few kilobytes exercise what a megabyte
exercises with the default 5760.
"""

from __future__ import annotations

import random
import unicodedata

import numpy as np
import pytest

from tokenizer_svc.encoding import get_encoding
from tokenizer_svc.gpu_encode import GpuEncoder

from .tokenizer_support import tiktoken_twin, vocabulary_for

WINDOW, OVERLAP = 320, 48


def _letters(rng: random.Random, n: int) -> str:
    """n random code points that Python calls letters, from every script (one letter piece
    in all three patterns, up to the few where tiktoken's tables disagree)."""
    out = []
    while len(out) < n:
        c = chr(rng.randrange(0x41, 0x2FFFF))
        if unicodedata.category(c).startswith("L"):
            out.append(c)
    return "".join(out)


def _vocab_words(vocab, rng: random.Random, n: int) -> str:
    """Concatenated letter-only tokens of the vocabulary: merges that compete across the
    tokens' edges, the input most likely to make a window's right end cascade leftwards."""
    words = [b.decode() for b in vocab.ranks if len(b) >= 3 and b.isalpha() and b.isascii()]
    out, size = [], 0
    while size < n:
        w = rng.choice(words)
        out.append(w)
        size += len(w)
    return "".join(out)


def adversarial_pieces(vocab, n: int) -> dict[str, str]:
    rng = random.Random(19)
    return {
        "one letter": "x" * n,
        "two letters": "ab" * (n // 2),
        "digits": "7" * n,                       # one piece in gpt2; groups of 3 otherwise
        "spaces": "a" + " " * n + "b",
        "newlines and spaces": "a" + "\n  " * (n // 3) + "b",
        "equals signs": "=" * n,
        "CJK": ("日本語中文한국어" * n)[: n // 3],
        "random letters": _letters(rng, n // 3),
        "vocabulary words": _vocab_words(vocab, rng, n),
        "period 11": ("abcdefghijk" * n)[:n],
        "cascade ending": "ab" * (n // 2) + "c",
    }


@pytest.fixture(scope="module", params=["gpt2", "cl100k_base", "o200k_base"])
def windowed(request, device):
    vocab = vocabulary_for(request.param)
    enc = get_encoding(vocab, device=device)
    small = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern,
                       long_window=WINDOW, long_overlap=OVERLAP)
    small.profile = True
    return vocab, enc, small, tiktoken_twin(vocab)


def _encode(encoder, docs: list[bytes]):
    starts = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    ids, offsets = encoder.encode_docs(b"".join(docs), starts)
    return [ids[offsets[i]:offsets[i + 1]].tolist() for i in range(len(docs))]


def test_adversarial_single_pieces_across_many_seams(windowed):
    vocab, _, small, tik = windowed
    pieces = adversarial_pieces(vocab, 4000)
    got = _encode(small, [p.encode() for p in pieces.values()])
    for (kind, text), ids in zip(pieces.items(), got):
        assert ids == tik.encode_ordinary(text), kind
    # the windows were used: pieces of 4 KB make about a dozen windows each
    assert small.last_profile.long_windows >= 8 * len(pieces)


def test_random_bytes_in_bytes_mode_across_seams(windowed, device):
    vocab, enc, small, tik = windowed
    rng = random.Random(20)
    data = [rng.randbytes(3000), b"ok " + rng.randbytes(2500) + b" tail", b"\xff" * 2000]
    windowed_enc = get_encoding(vocab, device=device)
    windowed_enc.backend.encoder = small
    for d in data:
        assert windowed_enc.encode_bytes(d) == tik._encode_bytes(d)


def test_seams_that_do_not_stitch_are_merged_again(windowed, device):
    """A window of 321 bytes (odd) never matches the 8-byte token period of "x" runs or the
    64-byte one of "=" runs: every seam fails, the pieces are merged again with windows 7x
    longer (still odd), then as one window; the ids stay exact."""
    _, enc, _, tik = windowed
    odd = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern,
                     long_window=321, long_overlap=OVERLAP)
    odd.profile = True
    docs = ["x" * 5000, "=" * 3000, "tokenizer " * 50]
    assert _encode(odd, [d.encode() for d in docs]) == [tik.encode_ordinary(d) for d in docs]
    assert odd.last_profile.long_retried >= 2


def test_many_long_pieces_in_scratch_groups(windowed, device):
    """Scratch too small for all windows at once: groups of whole pieces, each stitched."""
    vocab, enc, _, tik = windowed
    grouped = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern,
                         long_window=WINDOW, long_overlap=OVERLAP)
    grouped.scratch_limit_words = 5 * 2400
    pieces = list(adversarial_pieces(vocab, 1500).values())
    docs = [p + " and " + q for p, q in zip(pieces, reversed(pieces))]
    assert _encode(grouped, [d.encode() for d in docs]) == [tik.encode_ordinary(d) for d in docs]


def test_default_windows_on_a_long_piece(windowed):
    """The shipped window (5760 bytes): a 40 KB piece is seven windows."""
    vocab, enc, _, tik = windowed
    for kind in ("vocabulary words", "one letter", "CJK"):
        text = adversarial_pieces(vocab, 40_000)[kind]
        assert enc.encode_ordinary(text) == tik.encode_ordinary(text), kind


def test_window_must_exceed_overlap_plus_longest_token(windowed, device):
    _, enc, _, _ = windowed
    with pytest.raises(ValueError, match="long_window .* must exceed long_overlap"):
        GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern,
                   long_window=100, long_overlap=48)
