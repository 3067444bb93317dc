"""`istanbul prepare` through a real gRPC tokenizer service into a real Redis server."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from istanbul.cli import main
from trainer_svc.data import datasets
from trainer_svc.jobs.redis_conn import connect

from .redis_helpers import free_port
from .service_support import start_server, write_tiny_vocabulary

SAMPLES = [
    "İstanbul'da sabah erkenden vapura bindik; martılar simit için çığlık atıyordu.\n" * 20,
    "def tokenize(text):\n    return [ranks[p] for p in pattern.findall(text)]\n" * 30,
    "The quick brown fox <|endoftext|> jumps over the lazy dog.\n" * 10,  # a literal special
    "",                                                                   # empty: skipped
    "ünicode: ğüşöçı ĞÜŞÖÇİ 🙂 日本語\n",
]


@pytest.fixture(scope="module")
def vocab_path(tmp_path_factory) -> Path:
    return write_tiny_vocabulary(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="module")
def service(device, vocab_path):
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.service.config import Limits
    enc = get_encoding(str(vocab_path), device=device)
    # A small per-document limit, so the long sample goes in pieces.
    srv = start_server(enc, device, limits=Limits(max_text_bytes=700))
    yield srv
    srv.stop()


@pytest.fixture
def corpus(tmp_path) -> list[Path]:
    files = []
    for k, text in enumerate(SAMPLES):
        path = tmp_path / "docs" / f"{k:02d}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        files.append(path)
    return files


def reference_ids(vocab_path: Path, text: str) -> list[int]:
    """The same vocabulary through tiktoken itself: independent of the service's GPU code."""
    import tiktoken
    from tokenizer_svc.vocab import load_vocabulary
    vocab = load_vocabulary(str(vocab_path))
    enc = tiktoken.Encoding("ref", pat_str=vocab.pattern, mergeable_ranks=vocab.ranks,
                            special_tokens=vocab.special_tokens)
    return enc.encode_ordinary(text)


def test_prepare_stores_exact_ids_in_shards(redis_server, service, vocab_path, corpus, capsys):
    handle = connect(redis_server.url)
    handle.text.flushdb()
    code = main(["prepare", str(corpus[0].parent), "--tokenizer", service.target,
                 "--dataset", "docs", "--redis", redis_server.url, "--shard-tokens", "300",
                 "--vocab", str(vocab_path), "--no-progress"])
    assert code == 0
    out = capsys.readouterr().out
    assert "dataset docs:" in out and "skipped 1 empty file" in out
    info = datasets.get_dataset(handle, "docs")
    from tokenizer_svc.vocab import load_vocabulary
    vocab = load_vocabulary(str(vocab_path))
    assert info.vocab_hash == vocab.content_hash and info.n_vocab == vocab.n_vocab
    assert info.eot_id == vocab.eot_token and info.documents == 4
    ids = np.concatenate([datasets.load_shard(handle, info, i, n_vocab=info.n_vocab,
                                              vocab_hash=info.vocab_hash)
                          for i in range(info.shards)])
    expected = []
    for text in SAMPLES:
        if text:
            expected += [vocab.eot_token] + reference_ids(vocab_path, text)
    assert ids.tolist() == expected
    assert info.shards == -(-len(expected) // 300)
    # The vocabulary travels with the dataset (checkpoints copy it).
    files = datasets.vocabulary_files(handle, "docs")
    assert files["tiny.tiktoken"] == vocab_path.read_bytes()
    assert "tiny.tiktoken.json" in files
    # Reading shards consumed nothing.
    assert datasets.get_dataset(handle, "docs").shards == info.shards
    handle.close()


def test_prepare_refuses_bad_requests_clearly(redis_server, service, vocab_path, corpus,
                                             tmp_path, capsys):
    url = redis_server.url
    connect(url).text.flushdb()
    base = ["--tokenizer", service.target, "--redis", url, "--no-progress"]
    assert main(["prepare", str(corpus[0]), "--dataset", "one", *base]) == 0
    # without --vocab a vocabulary the machine does not know by name is not stored: said so
    assert "the dataset stores no vocabulary" in capsys.readouterr().err
    assert datasets.vocabulary_files(connect(url), "one") == {}
    assert main(["prepare", str(corpus[0]), "--dataset", "one", *base]) == 1
    assert "already exists; pass --replace" in capsys.readouterr().err
    assert main(["prepare", str(corpus[1]), "--dataset", "one", "--replace", *base]) == 0
    assert main(["prepare", str(tmp_path / "missing.txt"), "--dataset", "x", *base]) == 1
    assert "missing.txt: no such file" in capsys.readouterr().err
    assert main(["prepare", str(corpus[0]), "--dataset", "x", "--eot", "<|nope|>", *base]) == 1
    assert "is not a special token" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    other = write_tiny_vocabulary(tmp_path / "other")
    sidecar = Path(str(other) + ".json")
    sidecar.write_text(sidecar.read_text().replace("<|fim|>", "<|other|>"))
    assert main(["prepare", str(corpus[0]), "--dataset", "x", "--vocab", str(other), *base]) == 1
    assert "is not the vocabulary the tokenizer service uses" in capsys.readouterr().err
    assert main(["prepare", str(corpus[0]), "--dataset", "x", "--vocab", "gpt2-nope", *base]) == 1
    assert "no such file or known vocabulary" in capsys.readouterr().err
    dead = f"127.0.0.1:{free_port()}"
    assert main(["prepare", str(corpus[0]), "--dataset", "x", "--tokenizer", dead,
                 "--redis", url, "--no-progress"]) == 1
    assert f"tokenizer service at {dead}" in capsys.readouterr().err
    assert [d.name for d in datasets.list_datasets(connect(url))] == ["one"]


def test_a_known_service_vocabulary_is_stored_without_vocab(monkeypatch, capsys):
    """The service reports a known vocabulary this machine has: prepare stores it as --vocab
    would (hash checked), so checkpoints can generate text; another hash is not stored."""
    from tokenizer_svc.vocab import load_vocabulary
    from trainer_svc.cli_jobs import _service_vocabulary_files
    from trainer_svc.data.prepare import TokenizerSource
    from .conftest import shared_vocab
    path = shared_vocab("gpt2.tiktoken")
    monkeypatch.setenv("ISTANBUL_VOCAB_DIR", str(path.parent))
    vocab = load_vocabulary(str(path))

    def source(vocab_hash: str) -> TokenizerSource:
        return TokenizerSource("gpt2", vocab_hash, vocab.n_vocab, vocab.special_tokens,
                               vocab.eot_token, 1 << 20, "127.0.0.1:1", lambda docs: iter(()))

    files = _service_vocabulary_files(source(vocab.content_hash))
    assert files is not None and files["gpt2.tiktoken"] == path.read_bytes()
    assert capsys.readouterr().err == ""
    assert _service_vocabulary_files(source("0" * 64)) is None
    assert "the dataset stores no vocabulary" in capsys.readouterr().err
