"""RMSNorm on the real device: ladder cases and the edges the model relies on."""

from __future__ import annotations

import numpy as np
import pytest

from istanbul.shaders.kernels.rmsnorm import ops as rmsnorm


def test_many_rows_fold_and_weight_gradient_accumulates(device):
    rows, n = 70_000, 4  # more rows than one grid dimension holds
    rng = np.random.default_rng(5)
    x = rng.standard_normal((rows, n)).astype(np.float32)
    dy = rng.standard_normal((rows, n)).astype(np.float32)
    align = device.limits["min-storage-buffer-offset-alignment"] // 4
    params = device.upload(np.concatenate([np.zeros(align, np.float32),
                                           np.array([1.0, 2.0, 0.5, -1.0], np.float32)]))
    w = params.elements(align, n)
    grads = device.zeros(align + n)
    dw = grads.elements(align, n)
    xb, dyb, y, rstd, dx = (device.upload(x), device.upload(dy), device.empty((rows, n)),
                            device.empty(rows), device.empty((rows, n)))
    with device.record() as rec:
        rmsnorm.forward(rec, xb, w, y, rstd, rows, n)
        rmsnorm.backward(rec, xb, w, dyb, rstd, dx, dw, rows, n)
        rmsnorm.backward(rec, xb, w, dyb, rstd, None, dw, rows, n)  # second micro-batch
    r = 1 / np.sqrt(np.mean(x.astype(np.float64) ** 2, 1) + 1e-5)
    np.testing.assert_allclose(device.download(y), x * r[:, None] * [1, 2, 0.5, -1],
                               rtol=1e-5, atol=1e-5)
    want_dw = 2 * np.sum(dy * x * r[:, None], 0)
    np.testing.assert_allclose(device.download(dw), want_dw, rtol=1e-4)
    assert not device.download(grads)[:align].any()  # outside the view: untouched


def test_sizes_are_checked(device):
    with device.record() as rec:
        with pytest.raises(ValueError, match="rmsnorm.forward: rstd holds 1"):
            rmsnorm.forward(rec, device.empty(8), device.empty(4), device.empty(8),
                            device.empty(1), 2, 4)
