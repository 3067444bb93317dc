"""Datasets in Redis: packing documents into shards, metadata, and refusing bad shards."""

from __future__ import annotations

import numpy as np
import pytest

from trainer_svc.data import datasets
from trainer_svc.jobs import keys
from trainer_svc.data.datasets import DatasetError, DatasetWriter
from trainer_svc.data.shards import HEADER_SIZE, ShardError, read_header, vocab_hash_prefix


VHASH = "0123456789abcdef" * 4


def write(handle, name="web", docs=None, shard_tokens=7, n_vocab=100, eot=99, **kw):
    docs = docs if docs is not None else [np.arange(5), np.arange(10, 13), np.arange(20, 29)]
    w = DatasetWriter(handle, name, vocab_hash=VHASH, n_vocab=n_vocab, eot_id=eot,
                      shard_tokens=shard_tokens, vocab_name="test", tokenizer="local", **kw)
    for doc in docs:
        w.add_document(doc)
    return w.close(), docs


def test_documents_are_packed_with_end_of_text_separators(handle):
    info, docs = write(handle)
    expected = np.concatenate([np.concatenate([[99], d]) for d in docs])
    assert info.tokens == expected.size == 20 and info.documents == 3
    assert info.shards == 3 and info.state == "ready" and info.vocab_hash == VHASH
    got = [datasets.load_shard(handle, info, i, n_vocab=100, vocab_hash=VHASH)
           for i in range(info.shards)]
    assert [g.size for g in got] == [7, 7, 6]
    assert np.array_equal(np.concatenate(got), expected)
    header = read_header(handle.binary.get(keys.shard("web", 0)))
    assert header.itemsize == 2 and header.vocab_hash == vocab_hash_prefix(VHASH)
    # Reading does not consume: the same shard again, byte for byte.
    again = datasets.load_shard(handle, info, 0, n_vocab=100, vocab_hash=VHASH)
    assert np.array_equal(again, got[0])
    assert [d.name for d in datasets.list_datasets(handle)] == ["web"]


def test_large_vocabularies_use_uint32(handle):
    info, _ = write(handle, name="big", docs=[np.array([70000, 5])], n_vocab=200_000,
                    eot=199_999, shard_tokens=100)
    assert read_header(handle.binary.get(keys.shard("big", 0))).itemsize == 4
    ids = datasets.load_shard(handle, info, 0, n_vocab=200_000, vocab_hash=VHASH)
    assert ids.tolist() == [199_999, 70000, 5]


def test_existing_names_need_replace_and_replace_removes_old_shards(handle):
    write(handle, shard_tokens=2)
    assert handle.text.exists(keys.shard("web", 9))
    with pytest.raises(DatasetError, match="already exists; pass --replace"):
        write(handle)
    info, _ = write(handle, shard_tokens=100, replace=True)
    assert info.shards == 1
    assert not handle.text.exists(keys.shard("web", 1))


def test_unfinished_and_missing_datasets(handle):
    w = DatasetWriter(handle, "half", vocab_hash=VHASH, n_vocab=100, eot_id=99, shard_tokens=4)
    w.add_document(np.arange(10))
    with pytest.raises(DatasetError, match="not ready"):
        datasets.get_dataset(handle, "half")
    with pytest.raises(DatasetError, match="being prepared by another process"):
        DatasetWriter(handle, "half", vocab_hash=VHASH, n_vocab=100, eot_id=99)
    with pytest.raises(DatasetError, match="no dataset 'nope'.*istanbul prepare"):
        datasets.get_dataset(handle, "nope")
    with pytest.raises(DatasetError, match="ids outside the vocabulary"):
        w.add_document(np.array([100]))
    with pytest.raises(DatasetError, match="no tokens"):
        DatasetWriter(handle, "empty", vocab_hash=VHASH, n_vocab=100, eot_id=99).close()
    with pytest.raises(DatasetError, match="not allowed"):
        DatasetWriter(handle, "a:shard", vocab_hash=VHASH, n_vocab=100, eot_id=99)


def test_bad_shards_in_redis_are_refused_with_their_name(handle):
    info, _ = write(handle)
    blob = handle.binary.get(keys.shard("web", 1))
    handle.binary.set(keys.shard("web", 1), blob[:-3])
    with pytest.raises(ShardError, match="dataset 'web' shard 1: truncated"):
        datasets.load_shard(handle, info, 1, n_vocab=100, vocab_hash=VHASH)
    with pytest.raises(ShardError, match="another vocabulary"):
        datasets.load_shard(handle, info, 0, n_vocab=100, vocab_hash="ff" * 32)
    with pytest.raises(ShardError, match="outside the vocabulary of 50"):
        datasets.load_shard(handle, info, 0, n_vocab=50, vocab_hash=VHASH)
    handle.binary.delete(keys.shard("web", 2))
    with pytest.raises(ShardError, match="shard 2 is missing"):
        datasets.load_shard(handle, info, 2, n_vocab=100, vocab_hash=VHASH)
    assert len(blob) > HEADER_SIZE


def test_vocabulary_files_travel_with_the_dataset(handle):
    w = DatasetWriter(handle, "v", vocab_hash=VHASH, n_vocab=100, eot_id=99)
    w.add_document(np.arange(3))
    w.attach_vocabulary({"my.tiktoken": b"abc", "my.tiktoken.json": b"{}"})
    info = w.close()
    assert info.vocab_files == ("my.tiktoken", "my.tiktoken.json")
    assert datasets.vocabulary_files(handle, "v") == {"my.tiktoken": b"abc",
                                                      "my.tiktoken.json": b"{}"}
    assert datasets.delete_dataset(handle, "v") >= 3
    assert datasets.list_datasets(handle) == []
