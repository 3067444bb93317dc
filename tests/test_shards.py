"""Shard format: round trip, and every malformed shard refused with a clear error."""

import numpy as np
import pytest

from trainer_svc.data.shards import HEADER_SIZE, ShardError, decode_shard, encode_shard

VHASH = "ab" * 32


def test_round_trip_uint16_and_uint32():
    ids = np.array([0, 5, 65535, 3], np.uint32)
    blob = encode_shard(ids, VHASH, 65536)
    assert len(blob) == HEADER_SIZE + 2 * ids.size
    assert np.array_equal(decode_shard(blob, n_vocab=65536, vocab_hash=VHASH), ids)
    big = np.array([0, 70000, 199999], np.uint32)
    blob = encode_shard(big, VHASH, 200019)
    assert len(blob) == HEADER_SIZE + 4 * big.size
    assert np.array_equal(decode_shard(blob, n_vocab=200019), big)


def test_empty_shard():
    assert decode_shard(encode_shard(np.array([], np.uint32), VHASH, 10), n_vocab=10).size == 0


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b[:HEADER_SIZE - 1], "shorter than"),
    (lambda b: b"XXXXXXXX" + b[8:], "bad magic"),
    (lambda b: b[:-1], "truncated"),
    (lambda b: b + b"\0\0", "truncated or padded"),
    (lambda b: b[:8] + b"\x09\x00" + b[10:], "version"),
    (lambda b: b[:10] + b"\x03" + b[11:], "dtype"),
])
def test_malformed_shards_are_refused(mutate, message):
    blob = encode_shard(np.arange(10, dtype=np.uint32), VHASH, 100)
    with pytest.raises(ShardError, match=message):
        decode_shard(mutate(blob), n_vocab=100)


def test_ids_outside_vocabulary_and_wrong_vocabulary():
    blob = encode_shard(np.array([1, 2, 99], np.uint32), VHASH, 100)
    with pytest.raises(ShardError, match="outside the vocabulary"):
        decode_shard(blob, n_vocab=50)
    with pytest.raises(ShardError, match="another vocabulary"):
        decode_shard(blob, n_vocab=100, vocab_hash="cd" * 32)
    with pytest.raises(ShardError, match="outside"):
        encode_shard(np.array([100]), VHASH, 100)
