"""Long pieces merged in windows and stitched (bpe_encode.wgsl, "Long pieces"): ids equal to
tiktoken's on adversarial single pieces, with windows small enough that every piece has many
seams, and the retry path taken when seams do not stitch.

Small windows (LONG_WINDOW 320 = 2^6 5, overlap 48, for vocabularies whose longest token is
128 bytes) put a seam every 320 bytes, so pieces of a few kilobytes exercise what a megabyte
exercises with the default window (encode.LONG_WINDOW).
"""

from __future__ import annotations

import random
import unicodedata

import numpy as np
import pytest

from tokenizer_svc.encoding import Encoding, get_encoding
from istanbul.shaders.kernels.bpe.encode import GpuEncoder

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
    windowed_enc = Encoding(vocab, device)   # not get_encoding's cached, shared one
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
    assert odd.last_profile.long_widened >= 2   # aligned windows of 321 bytes fail as well


def test_many_long_pieces_in_scratch_groups(windowed, device):
    """Scratch too small for all windows at once: groups of whole pieces, each stitched."""
    vocab, enc, _, tik = windowed
    grouped = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern,
                         long_window=WINDOW, long_overlap=OVERLAP)
    grouped.scratch_limit_words = 5 * 2400
    pieces = list(adversarial_pieces(vocab, 1500).values())
    docs = [p + " and " + q for p, q in zip(pieces, reversed(pieces))]
    assert _encode(grouped, [d.encode() for d in docs]) == [tik.encode_ordinary(d) for d in docs]
    # runs one character into their piece: the aligned second round works group by group
    # ("x": its token period, 8 bytes, divides the 320-byte window)
    grouped.profile = True
    prefixed = [first + "x" * n for first in (" ", "<", "Q", "-") for n in (1500, 1700)]
    assert _encode(grouped, [d.encode() for d in prefixed]) == \
        [tik.encode_ordinary(d) for d in prefixed]
    assert grouped.last_profile.long_retried > 0 and grouped.last_profile.long_widened == 0


def test_default_windows_on_a_long_piece(windowed):
    """The shipped window: a 40 KB piece is dozens of windows."""
    vocab, enc, _, tik = windowed
    for kind in ("vocabulary words", "one letter", "CJK"):
        text = adversarial_pieces(vocab, 40_000)[kind]
        assert enc.encode_ordinary(text) == tik.encode_ordinary(text), kind


# one-character runs whose token periods the shipped window must divide (a seam that does not
# stitch costs the piece a merge with 7x longer windows): every printable ASCII character,
# whitespace runs (spaces repeat every 128 bytes in cl100k/o200k), 2-, 3- and 4-byte characters
RUN_UNITS = [chr(c) for c in range(33, 127)] + [
    " ", "\t", "\n", "\r\n", " \n", "\u3000", "\u00a0", "中", "é", "я", "ا", "😀", "あ",
    "한", "ह", "ß", "ñ", "λ", "ж", "ש", "ก", "👍🏽"]


def test_shipped_window_stitches_one_character_runs_without_retries(windowed, device):
    """Every run of RUN_UNITS long enough for three seams at the shipped window stitches at
    every seam (no piece merged again), the ids equal tiktoken's."""
    vocab, enc, _, tik = windowed
    shipped = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern)
    shipped.profile = True
    n = 3 * shipped.long_window + shipped.long_overlap + 7
    docs = [(u * (n // len(u) + 1))[:n] for u in RUN_UNITS]
    docs += [adversarial_pieces(vocab, n)[k] for k in ("random letters", "vocabulary words")]
    got = _encode(shipped, [d.encode() for d in docs])
    for d, ids in zip(docs, got):
        assert ids == tik.encode_ordinary(d), repr(d[:8])
    assert shipped.last_profile.long_windows >= 3 * len(docs)
    assert shipped.last_profile.long_retried == 0


def test_runs_after_another_first_character_stitch_on_aligned_windows(windowed, device):
    """A run that starts one character into its piece (" xxxx", "<!!!!", "Qxxxx") tokenizes
    in a phase that character sets, so windows at multiples of the window size never share
    a token; the driver merges such a piece once more with windows started on a token
    boundary of its first window, and those stitch: nothing is merged with longer windows or
    whole (which would cost a 1 MB piece seconds)."""
    vocab, enc, _, tik = windowed
    shipped = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern)
    shipped.profile = True
    n = 3 * shipped.long_window + shipped.long_overlap + 7
    units = [u for u in RUN_UNITS if u.strip() and len(u) == 1][::3]
    docs = [first + (u * (n // len(u) + 1))[:n]
            for u in units for first in (" ", "<", "Q")]
    got = _encode(shipped, [d.encode() for d in docs])
    for d, ids in zip(docs, got):
        assert ids == tik.encode_ordinary(d), repr(d[:8])
    assert shipped.last_profile.long_retried > 0      # some of them needed the second round
    assert shipped.last_profile.long_widened == 0


def test_window_must_exceed_overlap_plus_longest_token(windowed, device):
    _, enc, _, _ = windowed
    with pytest.raises(ValueError, match="long_window .* must exceed long_overlap"):
        GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern,
                   long_window=100, long_overlap=48)


def _workgroup_merge_only(device, enc, short: bool = True) -> GpuEncoder:
    """The shipped windows merged by bpe_merge_long_wg alone (the heap merge's dispatches
    replaced by it, no budget): every window must be merged by the workgroup kernel, or the
    ids come out wrong. Forced here on lavapipe, where the heap merge is the default.
    `short`: windows of at most WG_SHORT_LONG_MAX bytes go to the kernel's short build
    (workgroups of 32, arrays of 256) first, as on GPUs; else all to the full build."""
    wg = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern)
    assert wg.k_long_wg is not None and wg.long_window + wg.long_overlap <= 768
    assert wg.k_long_wg_short is not None
    wg.long_wg = True
    wg.long_wg_short = short
    wg.k_long = wg.k_long_sg = wg.k_long_wg
    wg.long_budget = 0xFFFFFFFF
    wg.profile = True
    return wg


@pytest.mark.parametrize("short", [True, False], ids=["short-build-first", "full-build-only"])
def test_workgroup_merge_equals_tiktoken_on_long_pieces(windowed, device, short):
    """bpe_merge_long_wg (a window's parts in workgroup memory, one workgroup per window)
    gives tiktoken's ids on one-character runs, random letters, vocabulary words, CJK, a
    period of 11 and a cascade at the window's end, across seams; with windows of up to 256
    bytes in its short build first and without it (pieces of 255-257 bytes on both sides of
    that build's limit)."""
    vocab, enc, _, tik = windowed
    wg = _workgroup_merge_only(device, enc, short)
    n = 3 * wg.long_window + wg.long_overlap + 7
    pieces = adversarial_pieces(vocab, n)
    medium = adversarial_pieces(vocab, 256)
    docs = [(u * (n // len(u) + 1))[:n] for u in RUN_UNITS[::4]]
    docs += [pieces[k] for k in ("random letters", "vocabulary words", "CJK", "period 11",
                                 "cascade ending", "two letters", "digits")]
    docs += ["short " + "ab" * 40 + " words", "x" * 65, "y" * 575, "z" * 577]
    docs += ["w" * 255, "w" * 256, "w" * 257, medium["CJK"] + " " + medium["random letters"],
             medium["vocabulary words"][:200] + "." + medium["vocabulary words"][:256]]
    got = _encode(wg, [d.encode() for d in docs])
    for d, ids in zip(docs, got):
        assert ids == tik.encode_ordinary(d), repr(d[:12])
    assert wg.last_profile.long_retried == 0   # retries' longer windows would need the heap
    assert wg.last_profile.long_windows >= 3 * len(RUN_UNITS[::4])
    assert ("merge_long_wg_short" in wg.last_profile.gpu) == short


def test_workgroup_merge_in_bytes_mode(windowed, device):
    vocab, _, _, tik = windowed
    wg_enc = Encoding(vocab, device)   # not get_encoding's cached, shared one
    wg_enc.backend.encoder = _workgroup_merge_only(device, wg_enc)
    rng = random.Random(21)
    for d in [rng.randbytes(500), b"ok " + rng.randbytes(700) + b" tail", b"\xff" * 300,
              "é".encode() * 300]:
        assert wg_enc.encode_bytes(d) == tik._encode_bytes(d)
