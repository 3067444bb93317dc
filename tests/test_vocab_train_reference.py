"""The training contract (shaders/kernels/bpe_train/merges.py) on the CPU reference trainer.

Hand-checked examples pin the semantics; a brute-force trainer written here (recount every
pair from scratch after every merge) checks the incremental reference on random corpora.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from istanbul.shaders.kernels.bpe_train.merges import (CorpusExhausted, Merge, TrainingError,
                                                       TrainingResult, check_request, merge_piece,
                                                       tokens_from_merges)
from tokenizer_svc.training import cpu_reference, vocabulary_from

A, B, C = ord("a"), ord("b"), ord("c")


def brute_force(pieces: dict, n_tokens: int, cap=None) -> list:
    """The contract, literally: count all pairs, take the best, apply it everywhere, repeat."""
    tokens = [bytes([i]) for i in range(256)]
    words = Counter({tuple(p): n for p, n in pieces.items()})
    merges = []
    while len(tokens) < n_tokens:
        counts = Counter()
        for w, n in words.items():
            for pair in zip(w, w[1:]):
                if cap is None or len(tokens[pair[0]]) + len(tokens[pair[1]]) <= cap:
                    counts[pair] += n
        if not counts:
            raise CorpusExhausted("exhausted", len(tokens))
        (a, b), count = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        merges.append(Merge(a, b, len(tokens), count))
        tokens.append(tokens[a] + tokens[b])
        new = Counter()
        for w, n in words.items():
            new[tuple(merge_piece(list(w), a, b, len(tokens) - 1))] += n
        words = new
    return merges


# ---- hand-checked ---------------------------------------------------------------------------

def test_merge_application_on_overlapping_runs():
    assert merge_piece([A, A, A], A, A, 256) == [256, A]
    assert merge_piece([A, A, A, A], A, A, 256) == [256, 256]
    assert merge_piece([A, A, A, A, A], A, A, 256) == [256, 256, A]
    assert merge_piece([A, B, A, B], A, B, 256) == [256, 256]
    assert merge_piece([B, A, B, A], A, B, 256) == [B, 256, A]
    assert merge_piece([A], A, A, 256) == [A]


def test_aaa_counts_the_pair_twice_but_merges_once():
    result = cpu_reference.train({b"aaa": 1}, 257)
    assert result.merges == [Merge(A, A, 256, 2)]
    with pytest.raises(CorpusExhausted):  # [aa, a]: (aa, a) is the only pair left ...
        cpu_reference.train({b"aaa": 1}, 259)  # ... and after it nothing remains
    assert cpu_reference.train({b"aaa": 1}, 258).merges[1] == Merge(256, A, 257, 1)


def test_aaaa_counts_three_then_pairs_up():
    result = cpu_reference.train({b"aaaa": 1}, 258)
    assert result.merges == [Merge(A, A, 256, 3), Merge(256, 256, 257, 1)]
    assert result.tokens[257] == b"aaaa"


def test_abab_counts_ab_twice_and_ba_once():
    result = cpu_reference.train({b"abab": 1}, 258)
    assert result.merges == [Merge(A, B, 256, 2), Merge(256, 256, 257, 1)]


def test_counts_are_weighted_by_piece_occurrences():
    result = cpu_reference.train({b"ab": 3, b"cb": 2, b"ac": 4}, 257)
    assert result.merges == [Merge(A, C, 256, 4)]
    result = cpu_reference.train({b"ab": 3, b"cb": 2, b"abcb": 1}, 257)
    assert result.merges == [Merge(A, B, 256, 4)]  # 3 + 1 beats (c, b): 2 + 1


def test_ties_lowest_left_then_lowest_right():
    assert cpu_reference.train({b"cd": 1, b"ab": 1}, 257).merges[0] == Merge(A, B, 256, 1)
    assert cpu_reference.train({b"bc": 1, b"ba": 1}, 257).merges[0] == Merge(B, A, 256, 1)
    # new tokens have higher ids than bytes, so they lose ties to byte pairs
    r = cpu_reference.train({b"zz": 2, b"aa": 2, b"qaa": 2}, 258)
    assert r.merges == [Merge(A, A, 256, 4), Merge(ord("q"), 256, 257, 2)]


def test_max_token_bytes_caps_merged_length():
    with pytest.raises(CorpusExhausted) as info:
        cpu_reference.train({b"aaaaaaaa": 5}, 260, max_token_bytes=4)
    assert info.value.supported_tokens == 258  # aa, aaaa; (aaaa, aaaa) would be 8 bytes
    result = cpu_reference.train({b"aaaaaaaa": 5, b"abcabc": 1}, 260, max_token_bytes=4)
    assert max(len(t) for t in result.tokens) <= 4
    assert result.tokens[256:] == [b"aa", b"aaaa", b"ab", b"abc"]  # not abcabc (6 bytes)


def test_special_tokens_follow_the_last_merge_in_order():
    result = cpu_reference.train({b"hello": 2}, 258)
    vocab = vocabulary_from(result, "v", "x", ["<|end|>", "<|pad|>"])
    assert vocab.special_tokens == {"<|end|>": 258, "<|pad|>": 259}
    assert vocab.n_vocab == 260
    assert vocab.ranks[b"el"] == 256 and vocab.ranks[bytes([0])] == 0  # ties: lowest left


def test_tokens_from_merges_refuses_a_merge_that_repeats_a_token():
    good = [Merge(A, A, 256, 3), Merge(256, A, 257, 1)]
    assert tokens_from_merges(good)[257] == b"aaa"
    with pytest.raises(AssertionError, match="rule 5"):
        tokens_from_merges(good + [Merge(A, 256, 258, 1)])  # "a" + "aa" == "aaa" again
    with pytest.raises(AssertionError):
        tokens_from_merges([Merge(A, A, 300, 1)])


def test_training_result_ranks_are_ids():
    result = TrainingResult(merges=[Merge(A, B, 256, 1)], tokens=tokens_from_merges(
        [Merge(A, B, 256, 1)]))
    assert result.ranks()[b"ab"] == 256 and result.n_tokens == 257


@pytest.mark.parametrize("size,specials,cap,match", [
    (256, [], None, "at least 257"),
    (100, [], None, "at least 257"),
    (258, ["<a>", "<b>"], None, "at least 259"),
    (1000, ["<a>", "<a>"], None, "given twice"),
    (1000, [""], None, "non-empty"),
    (1000, [], 1, "allows no merge"),
])
def test_bad_requests_are_refused(size, specials, cap, match):
    with pytest.raises(TrainingError, match=match):
        check_request(size, specials, cap)


def test_exhaustion_names_the_size_the_corpus_supports():
    with pytest.raises(CorpusExhausted, match=r"at most 259 \(asked for 1001\)") as info:
        cpu_reference.train({b"ab": 1, b"abc": 1}, 1000, n_specials=1)
    assert info.value.supported_tokens == 259


def test_pieces_of_one_byte_hold_no_pair():
    with pytest.raises(CorpusExhausted):
        cpu_reference.train({b"a": 100, b"b": 3}, 300)


# ---- against the brute force ----------------------------------------------------------------

corpora = st.dictionaries(
    st.binary(min_size=1, max_size=14).map(lambda b: bytes(97 + x % 4 for x in b)),
    st.integers(1, 6), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None)
@given(pieces=corpora, extra=st.integers(1, 25), cap=st.sampled_from([None, 2, 3, 5]))
def test_incremental_reference_equals_brute_force(pieces, extra, cap):
    def run(trainer):
        try:
            return trainer(pieces, 256 + extra, cap)
        except CorpusExhausted as exc:
            return ("exhausted", exc.supported_tokens)
    fast = run(lambda p, n, c: cpu_reference.train(p, n, c).merges)
    assert fast == run(brute_force)


def test_reference_equals_brute_force_on_real_text():
    from tokenizer_svc.patterns import PATTERNS
    from tokenizer_svc.training.corpus import pieces_of_text
    import textwrap
    text = open(textwrap.__file__, encoding="utf-8").read()
    pieces = pieces_of_text(text, PATTERNS["cl100k"])
    assert cpu_reference.train(pieces, 400).merges == brute_force(pieces, 400)
