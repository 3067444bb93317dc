"""Vocabulary files: .tiktoken (+ sidecar), known names, and clear errors for bad files."""

from __future__ import annotations

import base64

import pytest

from tokenizer_svc.vocab import VocabularyError, load_vocabulary, save_vocabulary

from .tokenizer_support import load_trained


def tiktoken_lines(tokens):
    return "".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens))


BYTES = [bytes([i]) for i in range(256)]


@pytest.mark.parametrize("content, message", [
    (tiktoken_lines(BYTES) + "!!notbase64 256\n", "bad base64"),
    (tiktoken_lines(BYTES) + f"{base64.b64encode(b'a').decode()} 256\n", "appears twice"),
    (tiktoken_lines(BYTES) + f"{base64.b64encode(b'zz').decode()} 300\n", "not contiguous"),
    (tiktoken_lines(BYTES[:200]), "256 single-byte tokens"),
    (tiktoken_lines(BYTES) + "YWI= x\n", "not an integer"),
])
def test_malformed_tiktoken_files_are_refused_clearly(tmp_path, content, message):
    path = tmp_path / "bad.tiktoken"
    path.write_text(content)
    with pytest.raises(VocabularyError, match=message) as err:
        load_vocabulary(path, pattern="gpt2")
    assert str(path) in str(err.value)


def test_unknown_pattern_and_missing_pattern(tmp_path):
    path = tmp_path / "v.tiktoken"
    path.write_text(tiktoken_lines(BYTES))
    with pytest.raises(VocabularyError, match="no pattern known"):
        load_vocabulary(path)
    with pytest.raises(VocabularyError, match="neither a known name"):
        load_vocabulary(path, pattern="(unclosed")
    assert load_vocabulary(path, pattern="o200k").pattern_name == "o200k"


def test_trained_vocabulary_round_trips_through_its_sidecar(tmp_path):
    vocab = load_trained("o200k")
    path = tmp_path / "mine.tiktoken"
    save_vocabulary(vocab, path)
    again = load_vocabulary(path)
    assert again.ranks == vocab.ranks and again.special_tokens == vocab.special_tokens
    assert again.pattern_name == "o200k" and again.content_hash == vocab.content_hash


def test_known_names_resolve_through_the_vocab_dir(monkeypatch):
    from tests.conftest import shared_vocab
    directory = shared_vocab("cl100k_base.tiktoken").parent
    monkeypatch.setenv("ISTANBUL_VOCAB_DIR", str(directory))
    vocab = load_vocabulary("cl100k_base")
    assert vocab.name == "cl100k_base" and vocab.special_tokens["<|endofprompt|>"] == 100276
    with pytest.raises(VocabularyError, match="not a known name"):
        load_vocabulary("cl200k_nothing")


def test_a_planted_file_in_tiktokens_cache_is_refused(tmp_path, monkeypatch):
    """tiktoken's cache defaults to the world-writable /tmp/data-gym-cache: a known name is
    read from there only when the file has tiktoken's published sha256."""
    import hashlib
    from tokenizer_svc.patterns import KNOWN_VOCABULARIES
    from tokenizer_svc.vocab import VocabularyError, load_vocabulary, tiktoken_cache_file
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ISTANBUL_VOCAB_DIR", str(tmp_path / "empty"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    known = KNOWN_VOCABULARIES["gpt2"]
    planted = tiktoken_cache_file(known.url)
    planted.write_bytes(b"".join(b"%s %d\n" % (base64.b64encode(bytes([i])), i)
                                 for i in range(256)))
    with pytest.raises(VocabularyError, match="sha256"):
        load_vocabulary("gpt2")
    from tests.conftest import shared_vocab
    real = shared_vocab("gpt2.tiktoken").read_bytes()
    assert hashlib.sha256(real).hexdigest() == known.sha256
    planted.write_bytes(real)
    assert load_vocabulary("gpt2").n_vocab == 50257
