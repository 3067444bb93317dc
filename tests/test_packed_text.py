"""PackedText: the documents' bytes as one virtual array that the encoder joins range by
range (tokenizer_svc/packed_text.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from tokenizer_svc.packed_text import PackedText, byte_range


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
