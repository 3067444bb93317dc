"""tokenizer.json vocabularies: parity with Hugging Face `tokenizers` (CPU pre-tokenization,
GPU merges), on DeepSeek's file (../shared/vocab) and on small files written here."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tokenizer_svc.encoding import get_encoding
from tokenizer_svc.vocab import bytes_to_unicode, load_vocabulary

from .tokenizer_support import MULTILINGUAL, TRICKY, corpus_docs, load_trained

ALPHABET = st.sampled_from(list("abcXYZ 019.,!?'\n\t-_/日本語한국äöüßçİı€😀\u0301"))


def hf_file(tmp_path, *, merge_syntax: str, ignore_merges: bool = False, use_split: bool = True):
    """A byte-level BPE tokenizer.json built from the trained gpt2-pattern ranks."""
    ranks = load_trained("gpt2").ranks
    to_str = bytes_to_unicode()
    enc = lambda b: "".join(to_str[x] for x in b)  # noqa: E731
    vocab = {enc(t): i for t, i in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if rank < 256:
            continue
        for k in range(1, len(token)):
            a, b = token[:k], token[k:]
            if ranks.get(a, 1 << 30) < rank and ranks.get(b, 1 << 30) < rank:
                merges.append(f"{enc(a)} {enc(b)}" if merge_syntax == "string" else [enc(a), enc(b)])
                break
    n = len(vocab)
    added = [{"id": n, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True},
             {"id": n + 1, "content": "<pad>", "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}]
    steps = [{"type": "Split", "pattern": {"Regex": r"\p{N}{1,3}"}, "behavior": "Isolated",
              "invert": False}] if use_split else []
    steps.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True})
    data = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": {"type": "Sequence", "pretokenizers": steps},
            "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True,
                                                "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
                      "vocab": vocab, "merges": merges}}
    path = tmp_path / f"tok-{merge_syntax}-{ignore_merges}.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    return path


def check_parity(path, device, texts):
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(str(path))
    enc = get_encoding(load_vocabulary(path), device=device)
    assert enc.backend.kind == "gpu"
    for text in texts:
        assert enc.encode(text, allowed_special="all") == \
            hf.encode(text, add_special_tokens=False).ids, repr(text[:60])
    return enc, hf


@pytest.mark.parametrize("merge_syntax", ["string", "list"])
def test_small_tokenizer_json_matches_tokenizers(tmp_path, device, merge_syntax):
    texts = TRICKY + MULTILINGUAL + corpus_docs()[:15] + ["a<|endoftext|>b<pad> 12345"]
    check_parity(hf_file(tmp_path, merge_syntax=merge_syntax), device, texts)


def test_ignore_merges_uses_whole_words(tmp_path, device):
    path = hf_file(tmp_path, merge_syntax="string", ignore_merges=True, use_split=False)
    vocab = load_vocabulary(path)
    assert vocab.hf_ignore_merges
    check_parity(path, device, TRICKY + MULTILINGUAL)


def test_deepseek_matches_tokenizers(device):
    from tests.conftest import shared_vocab
    path = shared_vocab("deepseek_tokenizer.json")
    texts = [t for t in TRICKY + MULTILINGUAL + corpus_docs()[:30]
             if t.encode("utf-8", "surrogatepass") == t.encode("utf-8", "ignore")]
    texts.append("<｜begin▁of▁sentence｜>Hello 12345 你好世界<｜end▁of▁sentence｜>")
    enc, hf = check_parity(path, device, texts)
    ids = hf.encode("round trip: 日本語 ok", add_special_tokens=False).ids
    assert enc.decode(ids) == "round trip: 日本語 ok"


@pytest.fixture(scope="module")
def deepseek(device):
    from tests.conftest import shared_vocab
    from tokenizers import Tokenizer
    path = shared_vocab("deepseek_tokenizer.json")
    return get_encoding(load_vocabulary(path), device=device), Tokenizer.from_file(str(path))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=ALPHABET, max_size=60))
def test_deepseek_hypothesis(deepseek, text):
    enc, hf = deepseek
    assert enc.encode_ordinary(text) == hf.encode(text, add_special_tokens=False).ids
