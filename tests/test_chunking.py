"""tokenizer_svc.chunking against tiktoken: the windows are slices of tiktoken's ids cut by the
documented rule, and their byte and character spans say exactly what the module doc says."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import shared_vocab
from tests.tokenizer_support import MULTILINGUAL, TRICKY
from tokenizer_svc.chunking import check_window_arguments, chunk, window_bounds

ENGLISH = ("Retrieval pipelines cut long documents into windows of tokens before they embed "
           "them. Each window overlaps the one before it, so that a sentence cut at one edge "
           "is whole in the neighbour. The quick brown fox jumps over the lazy dog; the dog "
           "sleeps on, 42 times in 2024. ")
TEXTS = [ENGLISH * 3, " ".join(MULTILINGUAL), "".join(MULTILINGUAL[12:14]) * 3,
         "🙂🚀日本語" * 20, "a", "", "x" * 300] + [t for t in TRICKY if t]
SHAPES = [(1, 0), (2, 1), (7, 3), (16, 0), (16, 15), (64, 8), (1000, 10)]


@pytest.fixture(scope="module", params=["cl100k_base", "o200k_base"])
def pair(request, device):
    """(our Encoding on the test device, tiktoken's Encoding of the same vocabulary)."""
    import tiktoken
    from tokenizer_svc.encoding import get_encoding
    enc = get_encoding(str(shared_vocab(f"{request.param}.tiktoken")), device=device)
    vocab = enc.vocab
    return enc, tiktoken.Encoding(request.param, pat_str=vocab.pattern,
                                  mergeable_ranks=vocab.ranks,
                                  special_tokens=vocab.special_tokens)


def oracle_windows(ids: list, max_tokens: int, overlap: int) -> list:
    """The rule written the simple way (as LangChain's TokenTextSplitter cuts)."""
    out, start = [], 0
    while start < len(ids):
        end = min(start + max_tokens, len(ids))
        out.append((start, end))
        if end == len(ids):
            break
        start += max_tokens - overlap
    return out


def char_cover(text: str, byte_start: int, byte_end: int) -> tuple[int, int]:
    """The characters holding bytes [byte_start, byte_end) of text's UTF-8."""
    ends = np.cumsum([len(c.encode("utf-8", "surrogatepass")) for c in text])
    return int(np.searchsorted(ends, byte_start, "right")), \
        int(np.searchsorted(ends, byte_end, "left")) + 1 if byte_end else 0


def test_windows_are_tiktokens_ids_cut_by_the_rule(pair):
    enc, reference = pair
    for text in TEXTS:
        want_ids = reference.encode(text)
        data = text.encode("utf-8")
        for max_tokens, overlap in SHAPES:
            got = chunk(enc, text, max_tokens, overlap)
            assert [(c.token_start, c.token_end) for c in got] == \
                oracle_windows(want_ids, max_tokens, overlap), (text[:40], max_tokens, overlap)
            for c in got:
                assert c.ids == want_ids[c.token_start:c.token_end]
                # bytes: exactly the window's tokens
                assert reference.decode_bytes(c.ids) == data[c.byte_start:c.byte_end]
                # characters: every character those bytes touch, no more
                assert (c.start, c.end) == char_cover(text, c.byte_start, c.byte_end)
                assert c.text == text[c.start:c.end]
                if text[c.start:c.end].encode() == data[c.byte_start:c.byte_end]:
                    assert c.text == reference.decode(c.ids)
                else:   # an edge splits a character: decoding shows U+FFFD there
                    assert "\ufffd" in reference.decode(c.ids)


def test_spans_round_trip_where_the_text_splits_cleanly(pair):
    """Encoding text[start:end] alone gives the window's ids when both edges are places where
    the document splits without changing its ids; a split character never round-trips."""
    enc, reference = pair
    text = ENGLISH * 2 + " ".join(MULTILINGUAL)
    ids = reference.encode(text)
    clean = round_trips = 0
    for c in chunk(enc, text, 24, 6):
        edges_clean = all(reference.encode(text[:at]) + reference.encode(text[at:]) == ids
                          for at in (c.start, c.end))
        if edges_clean and text[c.start:c.end].encode() == reference.decode_bytes(c.ids):
            clean += 1
            round_trips += reference.encode(text[c.start:c.end]) == c.ids
    assert clean >= 3 and round_trips == clean


def test_neighbours_share_exactly_the_overlap_and_cover_every_token():
    for n in [0, 1, 2, 5, 16, 17, 100, 1001]:
        for max_tokens, overlap in SHAPES:
            bounds = window_bounds(n, max_tokens, overlap).tolist()
            assert bounds == [list(w) for w in oracle_windows(list(range(n)), max_tokens,
                                                               overlap)]
            covered = set()
            for (a, b), nxt in zip(bounds, bounds[1:] + [None]):
                covered.update(range(a, b))
                if nxt is not None:
                    assert b - a == max_tokens and b - nxt[0] == overlap
            assert covered == set(range(n))


def test_raw_bytes_follow_encode_bytes(pair):
    enc, reference = pair
    data = "ok İstanbul ".encode() + b"\xff\xfe half \xe2\x82" + "🙂 end".encode()
    want = reference._encode_bytes(data)
    got = chunk(enc, data, 3, 1)
    assert [c.ids for c in got] == [want[a:b] for a, b in oracle_windows(want, 3, 1)]
    for c in got:
        assert c.text == data[c.byte_start:c.byte_end] == reference.decode_bytes(c.ids)


def test_special_tokens_follow_tiktokens_arguments(pair):
    enc, reference = pair
    text = "alpha <|endoftext|> beta " * 5
    with pytest.raises(ValueError, match="<|endoftext|>"):
        chunk(enc, text, 4)
    for kwargs in ({"allowed_special": "all"}, {"disallowed_special": ()}):
        want = reference.encode(text, **kwargs)
        got = chunk(enc, text, 4, 1, **kwargs)
        assert [c.ids for c in got] == [want[a:b] for a, b in oracle_windows(want, 4, 1)]
        if kwargs == {"allowed_special": "all"}:   # a special token's span is its text
            eot = reference.eot_token
            assert all("<|endoftext|>" in c.text for c in got if eot in c.ids)


@pytest.mark.parametrize("max_tokens, overlap, field", [
    (0, 0, "max_tokens"), (-3, 0, "max_tokens"), (2.5, 0, "max_tokens"),
    (True, 0, "max_tokens"), (4, -1, "overlap"), (4, 4, "overlap"), (4, 9, "overlap"),
])
def test_bad_arguments_name_the_argument(max_tokens, overlap, field):
    with pytest.raises(ValueError) as info:
        check_window_arguments(max_tokens, overlap)
    assert str(info.value).startswith(field)
    with pytest.raises(ValueError):
        window_bounds(10, max_tokens, overlap)
