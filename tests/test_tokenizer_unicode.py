"""The Unicode class tables agree with tiktoken's and tokenizers' own regex engines, code point
by code point.

The tables are committed (shaders/kernels/bpe/data/unicode_classes*.json); these tests probe the
installed tiktoken and tokenizers again. If either moves to a new Unicode version they fail,
and `python scripts/gen_unicode_table.py` regenerates the tables.
"""

from __future__ import annotations

import numpy as np
import pytest
import regex

from istanbul.shaders.kernels.bpe import unicode_table as U
from tokenizer_svc.reference import PreTokenizer, ReferenceTokenizer

from .tokenizer_support import SHARED, TRAINED, tiktoken_twin, vocabulary_for


@pytest.fixture(scope="module")
def everything():
    return U.all_code_points_text()


@pytest.mark.parametrize("name", U.CLASSES)
def test_class_matches_tiktoken_on_every_code_point(name, everything):
    probed = np.zeros(U.MAX_CP, dtype=bool)
    probed[sorted(U.probe_tiktoken(U.PROBE_PATTERNS[name], everything))] = True
    table = U.load_table().members(name)
    differ = np.flatnonzero(probed != table)
    assert differ.size == 0, (f"{name}: {differ.size} code points differ from tiktoken, first "
                              f"{[hex(c) for c in differ[:10]]}; run scripts/gen_unicode_table.py")


def test_contraction_case_folds_match_tiktoken(everything):
    table = U.load_table()
    for letter in U.CONTRACTION_LETTERS:
        assert sorted(U.probe_tiktoken(f"(?i:{letter})", everything)) == table.case_folds[letter]
    # bpe_encode.wgsl's `ci` hard-codes: the ASCII pair, and U+017F for s. Nothing else.
    for letter, folds in table.case_folds.items():
        expected = {ord(letter), ord(letter.upper())} | ({0x17F} if letter == "s" else set())
        assert set(folds) == expected


def test_gpu_class_bytes_and_two_level_table():
    table = U.load_table()
    cb = table.class_bytes
    m = {n: table.members(n) for n in U.CLASSES}
    assert np.array_equal(m["L"], m["Lu"] | m["Ll"] | m["Lt"] | m["Lm"] | m["Lo"])
    assert not (m["L"] & m["N"]).any() and not (m["L"] & m["S"]).any()
    assert not (m["N"] & m["S"]).any() and not (m["M"] & (m["L"] | m["N"] | m["S"])).any()
    assert np.array_equal((cb & U.BIT_UP) != 0, m["Lu"] | m["Lt"] | m["Lm"] | m["Lo"] | m["M"])
    assert np.array_equal((cb & U.BIT_LO) != 0, m["Ll"] | m["Lm"] | m["Lo"] | m["M"])
    stage1, stage2 = table.two_level()
    cps = np.arange(U.MAX_CP)
    words = stage2[stage1[cps >> 8].astype(np.int64) * 64 + ((cps & 255) >> 2)]
    rebuilt = (words >> ((cps & 3) * 8).astype(np.uint32)) & 0xFF
    assert np.array_equal(rebuilt.astype(np.uint8), cb)
    assert stage1[0] == 0   # bpe_encode.wgsl's class_of reads code points 0-255 from block 0


@pytest.mark.parametrize("spec", SHARED + TRAINED[:3])
def test_reference_follows_tiktoken_where_regex_module_does_not(spec, everything):
    """Python's `regex` has a newer Unicode: letters for it are not for tiktoken. The reference
    rewrites the classes, so it agrees with tiktoken; the raw `regex` pattern would not."""
    table = U.load_table()
    letters = table.members("L")
    regex_letters = {ord(c) for c in regex.findall(r"\p{L}", everything)}
    disagree = [c for c in sorted(regex_letters) if not letters[c]][::50]
    assert disagree, "regex and tiktoken agree everywhere: this test no longer tests anything"
    text = " ".join(f"a{chr(c)}b {chr(c)}x" for c in disagree)
    vocab = vocabulary_for(spec)
    assert ReferenceTokenizer(vocab).encode_ordinary(text) == \
        tiktoken_twin(vocab).encode_ordinary(text)
    assert PreTokenizer(vocab).split(text) != regex.findall(vocab.pattern, text)


# ---- the tokenizers family (tokenizer.json) ------------------------------------------

@pytest.mark.parametrize("key", ["L", "N", "P", "Symbol", "M", "S"])
def test_tokenizers_table_matches_oniguruma(key, everything):
    probed = np.zeros(U.MAX_CP, dtype=bool)
    probed[sorted(U.probe_tokenizers(U.HF_PROBE_PATTERNS[key], everything))] = True
    differ = np.flatnonzero(probed != U.load_table("tokenizers").members(key))
    assert differ.size == 0, f"{key}: {differ.size} differ, e.g. {[hex(c) for c in differ[:8]]}"


def test_digits_table_matches_tokenizers(everything):
    probed = np.zeros(U.MAX_CP, dtype=bool)
    probed[sorted(U.probe_digits(everything))] = True
    assert np.array_equal(probed, U.load_table("tokenizers").members("RustNumeric"))


def test_single_word_rule_uses_rust_word_characters(everything):
    """single_word reads tiktoken's probed `\\w` (the same Rust regex engine): check it is
    `tokenizers`' own."""
    probed = np.zeros(U.MAX_CP, dtype=bool)
    probed[sorted(U.probe_single_word(everything))] = True
    assert np.array_equal(probed, U.load_table("tiktoken").members("W"))


def test_regex_module_disagrees_with_oniguruma(everything):
    """Without the table the reference would be wrong: the regex module's letters differ.
    Which ones depends on the regex module's Unicode version (regex 2026.11 lists U+0558
    first; the older regex on the H200 machine has no U+0558 and lists U+088F first), so only
    the count is asserted: thousands either way."""
    letters = U.load_table("tokenizers").members("L")
    newer = [ord(c) for c in regex.findall(r"\p{L}", everything) if not letters[ord(c)]]
    assert len(newer) > 1000, [hex(c) for c in newer[:8]]
