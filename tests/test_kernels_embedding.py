"""Embedding lookup and gradient on the real device: ladder cases and edges."""

from __future__ import annotations

import numpy as np
import pytest

from istanbul.shaders.kernels.embedding import ops as embedding


def test_backward_plan_groups_tokens_by_id_in_position_order():
    plan = embedding.backward_plan(np.array([5, 2, 5, 0, 2, 5], np.uint32))
    tokens = 6
    assert plan[0] == 3                              # distinct ids 0, 2, 5
    assert list(plan[1:1 + tokens]) == [3, 1, 4, 0, 2, 5]
    assert list(plan[1 + tokens:1 + tokens + 4]) == [0, 1, 3, 6]
    assert plan.size == embedding.plan_size(tokens)


def test_more_rows_than_one_grid_dimension(device):
    # 70,000 tokens > 65,535 workgroups along y: the op folds rows into (y, z).
    tokens, vocab, dim = 70_000, 11, 1
    rng = np.random.default_rng(3)
    ids = rng.integers(0, vocab, tokens).astype(np.uint32)
    table = rng.standard_normal((vocab, dim)).astype(np.float32)
    dout = rng.standard_normal((tokens, dim)).astype(np.float32)
    idb, tb, out = device.upload(ids), device.upload(table), device.empty((tokens, dim))
    dtable = device.zeros((vocab, dim))
    plan = device.upload(embedding.backward_plan(ids))
    with device.record() as rec:
        embedding.forward(rec, idb, tb, out, tokens, dim, vocab)
        embedding.backward(rec, plan, idb, device.upload(dout), dtable, tokens, dim, vocab)
    assert np.array_equal(device.download(out), table[ids])
    want = np.zeros((vocab, dim))
    np.add.at(want, ids, dout.astype(np.float64))
    np.testing.assert_allclose(device.download(dtable), want, rtol=1e-4, atol=1e-3)


def test_wrong_dtypes_and_sizes_are_named(device):
    with device.record() as rec:
        with pytest.raises(ValueError, match="ids has dtype float32"):
            embedding.forward(rec, device.empty(4), device.empty(8), device.empty(8), 4, 2, 4)
        with pytest.raises(ValueError, match="plan holds"):
            embedding.backward(rec, device.empty(3, np.uint32), device.empty(4, np.uint32),
                               device.empty(8), device.empty(8), 4, 2, 4)
