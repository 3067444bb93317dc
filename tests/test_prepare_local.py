"""`istanbul prepare` with no server: the GPU encoder in-process (--vocab), into shard files
(--out DIR) that `istanbul train --data DIR` reads, or into Redis; ids identical to tiktoken."""

from __future__ import annotations

import json

import numpy as np

from istanbul.cli import main
from trainer_svc.data import datasets
from trainer_svc.data.files import shard_paths
from trainer_svc.jobs.redis_conn import connect
from trainer_svc.data.shards import decode_shard

from .service_support import write_tiny_vocabulary
from .test_prepare import SAMPLES, reference_ids


def _corpus(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for k, text in enumerate(SAMPLES):
        (docs / f"{k:02d}.txt").write_text(text, encoding="utf-8")
    return docs


def test_prepare_in_process_writes_shard_files_that_train_reads(tmp_path, capsys):
    (tmp_path / "vocab").mkdir()
    vocab = write_tiny_vocabulary(tmp_path / "vocab")
    docs, out = _corpus(tmp_path), tmp_path / "shards"
    assert main(["prepare", str(docs), "--vocab", str(vocab), "--out", str(out),
                 "--shard-tokens", "300", "--no-progress"]) == 0
    assert "in-process" in capsys.readouterr().out
    from tokenizer_svc.vocab import load_vocabulary
    v = load_vocabulary(str(vocab))
    meta = json.loads((out / "dataset.json").read_text())
    assert meta["vocab_hash"] == v.content_hash and meta["documents"] == 4
    ids = np.concatenate([decode_shard(p.read_bytes(), n_vocab=v.n_vocab,
                                       vocab_hash=v.content_hash)
                          for p in shard_paths(str(out))])
    expected = []
    for text in SAMPLES:
        if text:
            expected += [v.eot_token] + reference_ids(vocab, text)
    assert ids.tolist() == expected
    assert (out / "tiny.tiktoken").read_bytes() == vocab.read_bytes()
    # a second prepare into the same folder needs --replace
    assert main(["prepare", str(docs), "--vocab", str(vocab), "--out", str(out),
                 "--no-progress"]) == 1
    assert "pass --replace" in capsys.readouterr().err
    # the folder trains as it is
    assert main(["train", "--data", str(out), "--vocab", str(vocab), "--model", "tiny",
                 "--steps", "2", "--batch", "2", "--seq", "32", "--log-every", "1"]) == 0
    assert "step 2/2 loss=" in capsys.readouterr().out


def test_prepare_in_process_into_redis_and_clear_errors(redis_server, tmp_path, capsys):
    (tmp_path / "vocab").mkdir()
    vocab = write_tiny_vocabulary(tmp_path / "vocab")
    docs = _corpus(tmp_path)
    url = redis_server.url
    handle = connect(url)
    handle.text.flushdb()
    assert main(["prepare", str(docs), "--vocab", str(vocab), "--dataset", "local",
                 "--redis", url, "--no-progress"]) == 0
    info = datasets.get_dataset(handle, "local")
    assert info.documents == 4 and info.tokenizer == "in-process"
    assert main(["prepare", str(docs), "--dataset", "x", "--redis", url]) == 1
    assert "give --tokenizer HOST:PORT" in capsys.readouterr().err
    assert main(["prepare", str(docs), "--vocab", "nope-vocab", "--out",
                 str(tmp_path / "o")]) == 1
    assert "--vocab nope-vocab" in capsys.readouterr().err
    handle.close()
