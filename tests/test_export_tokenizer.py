"""The exported tokenizer.json encodes exactly like tiktoken does with the same ranks."""

import glob
import sysconfig

import pytest
import tiktoken

from tests.conftest import shared_vocab
from tokenizer_svc.vocab import load_vocabulary
from trainer_svc.training.export_hf import tokenizer_json


def test_gpt2_ranks_become_an_identical_hf_tokenizer():
    vocab = load_vocabulary(shared_vocab("gpt2.tiktoken"))
    enc = tiktoken.Encoding(name="gpt2-test", pat_str=vocab.pattern,
                            mergeable_ranks=vocab.ranks, special_tokens=vocab.special_tokens)
    tok = tokenizer_json(vocab)
    files = sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/*.py"))[:12]
    text = "".join(open(f, encoding="utf-8").read() for f in files)
    text += " Steven J. Bethard héllo wörld 日本語 🤖  \n\n\t x"
    assert tok.encode(text, add_special_tokens=False).ids == enc.encode_ordinary(text)
    assert tok.decode(enc.encode_ordinary(text)) == text
    assert tok.token_to_id("<|endoftext|>") == 50256


@pytest.mark.parametrize("name", ["cl100k_base.tiktoken", "o200k_base.tiktoken"])
def test_digit_runs_and_possessive_patterns_export_exactly(name):
    """tiktoken's `\\p{N}{1,3}+` is possessive; Oniguruma reads `{1,3}+` as `({1,3})+`, which
    split "2025" as "20" "25" in the exported cl100k tokenizer."""
    vocab = load_vocabulary(shared_vocab(name))
    enc = tiktoken.Encoding(name="x", pat_str=vocab.pattern, mergeable_ranks=vocab.ranks,
                            special_tokens={})
    tok = tokenizer_json(vocab)
    text = ("In 2025, 1234567 users paid $99.95 (12,345,678.9) on 2026-12-06 at 23:59:59; "
            "x1y22z333w4444 ٣٤٥٦٧ १२३४५ 一二三 ¹²³⁴ 0000000000000\n  \t 42")
    assert tok.encode(text, add_special_tokens=False).ids == enc.encode_ordinary(text)
