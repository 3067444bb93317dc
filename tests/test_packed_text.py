"""PackedText: the documents' bytes as one virtual array that the encoder joins range by
range (shaders/kernels/bpe/packed_text.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from istanbul.shaders.kernels.bpe.packed_text import (LazyPackedText, PackedRange, PackedText,
                                                      byte_range)


def _packed(parts):
    starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    return PackedText(parts, starts), b"".join(parts)


def test_every_range_equals_the_joined_bytes():
    rng = random.Random(3)
    parts = [rng.randbytes(rng.choice([0, 0, 1, 2, 5, 17, 64])) for _ in range(40)]
    packed, joined = _packed(parts)
    assert len(packed) == len(joined) and packed.tobytes() == joined
    for lo in range(len(joined) + 1):
        for hi in range(lo, min(len(joined), lo + 90) + 1):
            assert packed.range(lo, hi).tobytes() == joined[lo:hi], (lo, hi)


def test_a_range_inside_one_part_is_a_view_not_a_copy():
    parts = [b"", b"abcdef", b"", b"ghij"]
    packed, _ = _packed(parts)
    view = packed.range(1, 4)
    assert view.tobytes() == b"bcd" and not view.flags.owndata
    assert np.shares_memory(view, np.frombuffer(parts[1], np.uint8))


@pytest.mark.parametrize("str_share", [0.5, 1.0], ids=["mixed", "str-only"])
@pytest.mark.parametrize("group", [PackedRange.GROUP, 24])
@pytest.mark.parametrize("str_first", [True, False], ids=["str-join", "bytes-join"])
def test_a_range_writes_its_parts_where_they_go(monkeypatch, str_share, group, str_first):
    """PackedRange.write_into puts bytes [lo, hi) into the front of a buffer, part by part
    (str parts encoded, bytes parts copied), touching nothing after them: every range of
    mixed parts, and of str parts only, equals the joined bytes, in groups of the default
    size and of 24 bytes (many groups, some all str), a group of str parts joined as str and
    encoded once (JOIN_STR_FIRST) or each part encoded."""
    monkeypatch.setattr(PackedRange, "GROUP", group)
    monkeypatch.setattr(PackedRange, "JOIN_STR_FIRST", str_first)
    rng = random.Random(5)
    parts = [rng.randbytes(rng.choice([0, 1, 3, 9, 40])) if rng.random() >= str_share else
             "".join(rng.choice("ab \n") for _ in range(rng.choice([0, 2, 7, 33])))
             for _ in range(30)]
    starts = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    packed = PackedText(parts, starts)
    joined = b"".join(p if isinstance(p, bytes) else p.encode() for p in parts)
    for lo in range(0, len(joined) + 1, 3):
        for hi in range(lo, min(len(joined), lo + 120) + 1, 7):
            r = PackedRange(packed, lo, hi)
            dst = np.full(r.size + 5, 0xEE, np.uint8)
            r.write_into(dst)
            assert r.size == hi - lo and dst[:r.size].tobytes() == joined[lo:hi], (lo, hi)
            assert (dst[r.size:] == 0xEE).all() and r.array().tobytes() == joined[lo:hi]
    with pytest.raises(IndexError):
        PackedRange(packed, 0, len(joined) + 1)


def test_bad_ranges_and_starts_are_refused():
    packed, _ = _packed([b"ab", b"cd"])
    with pytest.raises(IndexError):
        packed.range(3, 5)
    with pytest.raises(IndexError):
        packed.range(2, 1)
    with pytest.raises(ValueError, match="2 parts need 3 starts"):
        PackedText([b"a", b"b"], np.array([0, 2]))


def test_byte_range_takes_arrays_too():
    data = np.frombuffer(b"hello world", np.uint8)
    assert byte_range(data, 6, 11).tobytes() == b"world"
    packed, _ = _packed([b"hello", b" ", b"world"])
    assert byte_range(packed, 4, 7).tobytes() == b"o w"


def test_ascii_str_parts_are_encoded_when_their_range_is_joined():
    """_pack_utf8 keeps ASCII texts as str (their length is their UTF-8 length) and encodes
    only the others: every range, the segments and the whole equal the encoded join; a lone
    surrogate anywhere gives None (the caller's per-text path), one non-ASCII text too."""
    from tokenizer_svc.encoding import _pack_utf8
    rng = random.Random(4)
    alphabet = ["a", "b", " ", "\n", "é", "日", "😀", "\x00", "\x7f"]
    texts = ["".join(rng.choice(alphabet[:4] if rng.random() < 0.6 else alphabet)
                     for _ in range(rng.choice([0, 1, 3, 9, 30]))) for _ in range(60)]
    packed, starts = _pack_utf8(texts)
    joined = "".join(texts).encode()
    assert any(type(p) is str for p in packed.parts) and any(type(p) is bytes for p in packed.parts)
    assert starts[-1] == len(joined) and packed.tobytes() == joined
    assert packed.segments() == [t.encode() for t in texts]
    for lo in range(0, len(joined) + 1, 3):
        for hi in range(lo, min(len(joined), lo + 70) + 1, 2):
            assert packed.range(lo, hi).tobytes() == joined[lo:hi], (lo, hi)
    assert _pack_utf8(["abc", "x\ud800y", "é"]) is None
    one, st = _pack_utf8(["abc", "日本", ""])
    assert one.parts == ["abc", "日本".encode(), ""] and st.tolist() == [0, 3, 9, 9]
    assert _pack_utf8([])[1].tolist() == [0]


def _replace_surrogates(text: str) -> bytes:
    return text.encode("utf-8", "replace")


def test_a_lazy_pack_learns_starts_only_as_far_as_it_is_read():
    """LazyPackedText: `reach(p)` makes exact every start up to the first one past p (and no
    further than the characters could need), the unknown ones stay above every known one
    (the array stays sorted), `size` bounds the bytes until the last start is known and is
    exact then; ranges, segments and the whole equal the encoded texts, a text with a lone
    surrogate going through the given encode function, every other text through str.encode."""
    rng = random.Random(8)
    alphabet = ["a", "b", " ", "\n", "é", "日", "😀", "\x00", "\x7f", "\ud800"]
    for _ in range(60):
        texts = ["".join(rng.choice(alphabet[:4] if rng.random() < 0.5 else alphabet)
                         for _ in range(rng.choice([0, 1, 3, 9, 30])))
                 for _ in range(rng.randrange(0, 40))]
        want = [_replace_surrogates(t) for t in texts]
        joined = b"".join(want)
        exact = np.concatenate([[0], np.cumsum([len(w) for w in want])]).astype(np.int64)
        lazy = LazyPackedText(texts, encode=_replace_surrogates)
        assert lazy.size_lower <= len(joined) <= lazy.size
        assert lazy.largest_bound() >= max(map(len, want), default=0)
        pos = 0
        while pos <= len(joined) + 3:
            lazy.reach(pos)
            k = lazy.known
            assert k == len(texts) or lazy.starts[k] > pos
            assert lazy.starts[:k + 1].tolist() == exact[:k + 1].tolist()
            assert (np.diff(lazy.starts) >= 0).all()
            assert lazy.size_lower <= lazy.estimated_size() <= lazy.size
            # none learnt past the documents whose characters fit before pos
            assert k <= max(1, int(np.searchsorted(np.cumsum([len(t) for t in texts]), pos,
                                                   side="right")) + 1)
            pos += rng.randrange(0, 25)
        lazy.reach(len(joined))   # every document starts at or before the end
        assert lazy.size == lazy.estimated_size() == len(joined)
        assert lazy.starts.tolist() == exact.tolist()
        fresh = LazyPackedText(texts, encode=_replace_surrogates)
        for lo in range(0, len(joined) + 1, 5):
            hi = min(len(joined), lo + rng.randrange(0, 40))
            assert fresh.range(lo, hi).tobytes() == joined[lo:hi], (lo, hi)
            dst = np.zeros(hi - lo, np.uint8)
            PackedRange(fresh, lo, hi).write_into(dst)
            assert dst.tobytes() == joined[lo:hi]
        again = LazyPackedText(texts, encode=_replace_surrogates)
        assert again.segments() == want and again.known == len(texts)
        assert LazyPackedText(texts, encode=_replace_surrogates).tobytes() == joined


def test_a_lazy_pack_of_a_big_batch_encodes_only_the_front_for_a_small_range():
    texts = ["日本語のテキスト " * 20] * 500 + ["tail"]
    lazy = LazyPackedText(texts)
    assert lazy.range(0, 10).tobytes() == texts[0].encode()[:10]
    assert 0 < lazy.known < 5 and type(lazy.parts[-2]) is str   # the rest not encoded yet
    assert LazyPackedText([]).size == 0 and LazyPackedText([]).tobytes() == b""
