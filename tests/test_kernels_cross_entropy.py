"""Fused cross-entropy on the real device: ladder cases and the edges training relies on."""

from __future__ import annotations

import numpy as np
import pytest

from istanbul.shaders.kernels.cross_entropy import ops as ce


def _run(device, logits, targets, vocab, **kw):
    rows = logits.shape[0]
    lg, tg = device.upload(logits), device.upload(targets.astype(np.uint32))
    losses, stats = device.empty(rows), device.empty(4)
    with device.record() as rec:
        ce.forward_backward(rec, lg, tg, losses, stats, rows, vocab, **kw)
    return device.download(losses), device.download(stats), device.download(lg)


def test_target_outside_vocabulary_poisons_only_its_row(device):
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((4, 8)).astype(np.float32)
    losses, stats, grad = _run(device, logits, np.array([1, 9, 2, 3]), 8)
    assert np.isnan(losses[1]) and np.isnan(grad[1]).all()
    assert np.isfinite(losses[[0, 2, 3]]).all() and np.isfinite(grad[[0, 2, 3]]).all()
    assert np.isnan(stats[2])  # the mean is NaN: the step's NaN guard sees it


def test_custom_ignore_index_and_host_scale(device):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((6, 5)).astype(np.float32)
    targets = np.array([0, 3, 0, 4, 1, 0])  # 0 is the padding id here
    losses, stats, grad = _run(device, logits, targets, 5, ignore_index=0,
                               mean_over_valid=False, grad_scale=0.125)
    x = logits.astype(np.float64)
    lse = np.log(np.exp(x).sum(1))
    valid = targets != 0
    want = np.where(valid, lse - x[np.arange(6), targets], 0)
    np.testing.assert_allclose(losses, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(stats[:3], [3, want.sum(), want.sum() / 3], rtol=1e-6)
    g = np.exp(x - lse[:, None])
    g[np.arange(6), targets] -= 1
    np.testing.assert_allclose(grad, np.where(valid[:, None], g * 0.125, 0), atol=1e-7)


def test_many_rows_fold_into_two_dimensions(device):
    rows = 70_000
    logits = np.zeros((rows, 4), np.float32)
    targets = np.arange(rows) % 4
    losses, stats, grad = _run(device, logits, targets, 4)
    np.testing.assert_allclose(losses, np.log(4), rtol=1e-6)
    assert stats[0] == rows
    np.testing.assert_allclose(grad.sum(1), 0, atol=1e-9)


def test_bad_options_are_refused(device):
    buf = device.empty(64)
    with device.record() as rec:
        with pytest.raises(ValueError, match="targets has dtype float32"):
            ce.forward_backward(rec, buf, buf, buf, buf, 2, 4)
        with pytest.raises(ValueError, match="label_smoothing"):
            ce.forward_backward(rec, buf, device.empty(2, np.uint32), buf, buf, 2, 4,
                                label_smoothing=1.0)
        with pytest.raises(ValueError, match="stride 3 < vocab 4"):
            ce.forward_backward(rec, buf, device.empty(2, np.uint32), buf, buf, 2, 4, stride=3)
