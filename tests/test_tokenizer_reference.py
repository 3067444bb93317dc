"""The CPU reference against tiktoken itself, and the rules the GPU relies on.

Differential on the real vocabularies (../shared/vocab, skipped when absent) and always on
vocabularies trained here (tests/tokenizer_support.py).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from istanbul.shaders.kernels.bpe.cuts import cut_rule
from istanbul.shaders.kernels.bpe.reference import bpe_merges, bpe_ranks
from istanbul.shaders.kernels.bpe.unicode_table import all_code_points_text
from tokenizer_svc.patterns import PATTERNS
from tokenizer_svc.reference import (DisallowedSpecialTokenError, PreTokenizer,
                                     ReferenceTokenizer, exact_pattern, hf_isolated_split)

from .tokenizer_support import (MULTILINGUAL, SHARED, TRAINED, TRICKY, corpus_docs, long_runs,
                                tiktoken_twin, vocabulary_for)

VOCABS = SHARED + TRAINED
TRICKY_CHARS = list("'sSſlLvVrReEdDmMtT \t\r\n0123456789/!?.ʕªǅ\u0301\u00a0\u3000日üß") + \
    ["\u200d", "👍", "\U0001F3FD", "\u2028", "\x85"]
TEXT = st.text(alphabet=st.one_of(st.characters(), st.sampled_from(TRICKY_CHARS)), max_size=60)


@pytest.fixture(scope="module", params=VOCABS)
def pair(request):
    vocab = vocabulary_for(request.param)
    return ReferenceTokenizer(vocab), tiktoken_twin(vocab)


def test_reference_matches_tiktoken_on_corpus(pair):
    ref, tik = pair
    for text in TRICKY + MULTILINGUAL + corpus_docs()[:30]:
        assert ref.encode_ordinary(text) == tik.encode_ordinary(text), repr(text[:80])


def test_reference_matches_tiktoken_on_long_runs(pair):
    ref, tik = pair
    for text in long_runs(600):  # the GPU tests take the 10k runs
        assert ref.split(text) and ref.encode_ordinary(text) == tik.encode_ordinary(text)


@settings(max_examples=60, deadline=None)
@given(text=TEXT)
def test_reference_matches_tiktoken_hypothesis(pair, text):
    ref, tik = pair
    assert ref.encode_ordinary(text) == tik.encode_ordinary(text)


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=40))
def test_encode_bytes_is_tiktokens_rule(pair, data):
    ref, tik = pair
    assert ref.encode_bytes(data) == tik._encode_bytes(data)


def test_special_tokens_follow_tiktoken(pair):
    ref, tik = pair
    text = "a<|endoftext|>b <|endoftext|>\n<|endoftext|>"
    assert ref.encode(text, allowed_special="all") == tik.encode(text, allowed_special="all")
    assert ref.encode(text, disallowed_special=()) == tik.encode(text, disallowed_special=())
    assert ref.encode(text, allowed_special={"<|endoftext|>"}) == \
        tik.encode(text, allowed_special={"<|endoftext|>"})
    with pytest.raises(ValueError) as ours:
        ref.encode(text)
    with pytest.raises(ValueError) as theirs:
        tik.encode(text)
    assert str(ours.value) == str(theirs.value)
    assert isinstance(ours.value, DisallowedSpecialTokenError)
    assert ref.encode_ordinary(text) == tik.encode_ordinary(text)


@pytest.mark.parametrize("pattern", ["gpt2", "cl100k", "o200k"])
def test_gpu_cut_rules_are_piece_boundaries(pattern):
    """Every position the GPU may start a segment at is a piece boundary of the reference,
    over every code point in order and over random mixtures of the rules' corner characters."""
    import random
    rng = random.Random(pattern)
    everything = all_code_points_text()
    texts = [everything[i:i + 200] for i in range(0, len(everything), 200)][::3]
    texts += ["".join(rng.choice(TRICKY_CHARS) for _ in range(50)) for _ in range(1500)]
    texts += TRICKY + MULTILINGUAL + corpus_docs()[:20]
    from tokenizer_svc.vocab import Vocabulary
    pre = PreTokenizer(Vocabulary(name="bytes", ranks={bytes([i]): i for i in range(256)},
                                  pattern=PATTERNS[pattern]))
    checked = 0
    for text in texts:
        bounds, pos = set(), 0
        for piece in pre.split(text):
            bounds.add(pos)
            pos += len(piece)
        for i in range(1, len(text)):
            nxt = ord(text[i + 1]) if i + 1 < len(text) else None
            if cut_rule(ord(text[i - 1]), ord(text[i]), nxt, pattern):
                checked += 1
                assert i in bounds, (pattern, text[max(0, i - 4):i + 4], i)
    assert checked > 10_000


def test_bpe_ranks_whole_piece_and_leftmost_lowest():
    ranks = {bytes([i]): i for i in range(256)}
    ranks[b"ab"] = 300
    ranks[b"bc"] = 301
    ranks[b"abc"] = 302
    assert bpe_ranks(b"abc", ranks) == [302]           # whole-piece shortcut
    assert bpe_ranks(b"abcab", ranks) == [302, 300]     # ab first (lower rank), then abc
    ranks[b"aa"] = 256
    assert bpe_ranks(b"aaa", ranks) == [256, ord("a")]  # leftmost among equals


def test_bpe_merges_only_listed_pairs_in_list_order():
    ranks = {bytes([i]): i for i in range(256)}
    ranks.update({b"ab": 300, b"bc": 301, b"abc": 302})
    merges = {(b"b", b"c"): 0, (b"a", b"bc"): 1, (b"a", b"b"): 2}
    assert bpe_merges(b"abc", ranks, merges) == [302]
    assert bpe_merges(b"abc", ranks, {(b"a", b"b"): 0}) == [300, ord("c")]  # ab+c not listed
    assert bpe_merges(b"abc", ranks, {}, ignore_merges=True) == [302]


def test_isolated_split_keeps_gaps():
    import regex
    assert hf_isolated_split(["ab12cd3"], regex.compile(r"\d+")) == ["ab", "12", "cd", "3"]


def test_exact_pattern_rewrites_classes_only():
    rewritten = exact_pattern(PATTERNS["cl100k"])
    assert r"\p{" not in rewritten and r"\s" not in rewritten
    with pytest.raises(ValueError):
        exact_pattern(r"[\S]")
