"""TokenStream: batch shape, deterministic order, exact resume, the schedule."""

import json
import math

import numpy as np
import pytest

from trainer_svc.data.stream import DataError, TokenStream
from trainer_svc.training.schedule import learning_rate


def _shards():
    return [np.arange(0, 100, dtype=np.uint32), np.arange(1000, 1007, dtype=np.uint32),
            np.arange(2000, 2050, dtype=np.uint32)]


def test_rows_are_consecutive_windows_that_skip_short_tails():
    s = TokenStream(_shards(), batch=3, seq=8)
    b = s.next_batch()
    assert b.shape == (3, 9) and b.dtype == np.uint32
    np.testing.assert_array_equal(b[0], np.arange(0, 9))
    np.testing.assert_array_equal(b[1], np.arange(8, 17))  # window advances by T
    rows = [s.next_batch() for _ in range(20)]
    flat = np.concatenate([r for r in rows])
    # shard 1 (7 tokens) is too short for a window and never appears
    assert not np.isin(flat, np.arange(1000, 1007)).any()
    assert s.epoch >= 1
    # every target of shard 0 is predicted once per epoch: 12 windows of 8 in 100 tokens
    assert s.tokens_per_epoch() == 12 * 8 + 6 * 8


def test_resume_from_json_position_continues_exactly():
    a = TokenStream(_shards(), batch=4, seq=5)
    for _ in range(7):
        a.next_batch()
    saved = json.loads(json.dumps(a.position))
    expected = [a.next_batch() for _ in range(9)]
    b = TokenStream(_shards(), batch=4, seq=5, position=saved)
    for want in expected:
        np.testing.assert_array_equal(b.next_batch(), want)


def test_accumulated_batches_and_bad_inputs():
    s = TokenStream(_shards(), batch=2, seq=4)
    assert s.next_accumulated(3).shape == (3, 2, 5)
    with pytest.raises(DataError, match="seq\\+1"):
        TokenStream(_shards(), batch=1, seq=200)
    with pytest.raises(DataError, match="outside the vocabulary"):
        TokenStream(_shards(), batch=1, seq=4, vocab_size=512)
    with pytest.raises(DataError, match="position"):
        TokenStream(_shards(), batch=1, seq=4, position={"epoch": 0, "shard": 9, "offset": 0})
    with pytest.raises(DataError, match="position"):
        TokenStream(_shards(), batch=1, seq=4, position={"epoch": 0})


def test_warmup_then_cosine():
    kw = dict(lr=1.0, min_lr=0.1, warmup=10, steps=110)
    assert learning_rate(0, **kw) == pytest.approx(0.1)
    assert learning_rate(9, **kw) == pytest.approx(1.0)
    assert learning_rate(10, **kw) == pytest.approx(1.0)
    assert learning_rate(60, **kw) == pytest.approx(0.55)
    assert learning_rate(110, **kw) == pytest.approx(0.1)
    assert learning_rate(500, **kw) == pytest.approx(0.1)
    lrs = [learning_rate(s, **kw) for s in range(10, 111)]
    assert all(x >= y for x, y in zip(lrs, lrs[1:]))
    assert math.isclose(learning_rate(3, lr=2.0, min_lr=0.0, warmup=0, steps=10),
                        2.0 * 0.5 * (1 + math.cos(math.pi * 0.3)))
