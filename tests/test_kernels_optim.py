"""Gradient statistics and AdamW on the real device: ladder cases, PyTorch parity, NaN skip."""

from __future__ import annotations

import numpy as np
import pytest

from istanbul.shaders.kernels.optim import ops as optim


def _model(device, rng):
    """Three tensors in one buffer: a matrix, a norm weight (no decay), another matrix."""
    align = optim.param_alignment(device)
    shapes = [(24, 10), (10,), (7, 13)]
    ranges, at = [], 0
    for i, shape in enumerate(shapes):
        count = int(np.prod(shape))
        ranges.append((at, count, i != 1))
        at += -(-count // align) * align
    params = np.zeros(at, np.float32)
    for start, count, _ in ranges:
        params[start:start + count] = rng.standard_normal(count) * 0.1
    return shapes, ranges, params


def test_five_steps_match_torch_adamw_with_clipping(device):
    import torch
    rng = np.random.default_rng(0)
    shapes, ranges, params = _model(device, rng)
    grads_per_step = [rng.standard_normal(params.size).astype(np.float32) * 0.5
                      for _ in range(5)]
    lr, wd, max_norm = 1e-2, 0.1, 1.0
    # PyTorch: same tensors, clip_grad_norm_ then AdamW, in float32
    tensors = [torch.tensor(params[s:s + c].copy(), requires_grad=True) for s, c, _ in ranges]
    opt = torch.optim.AdamW([{"params": [t], "weight_decay": wd if d else 0.0}
                             for t, (_, _, d) in zip(tensors, ranges)],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    # istanbul: one buffer each for params, grads, m, v, plus the f16 mirror
    p, g = device.upload(params), device.zeros(params.size)
    m, v = device.zeros(params.size), device.zeros(params.size)
    mirror, stats = device.upload(params.astype(np.float16)), device.empty(8)
    hyper = device.empty(8)
    norms = []
    for step, grad in enumerate(grads_per_step, start=1):
        for t, (s, c, _) in zip(tensors, ranges):
            t.grad = torch.tensor(grad[s:s + c])
        norms.append(float(torch.nn.utils.clip_grad_norm_(tensors, max_norm)))
        opt.step()
        masked = np.zeros_like(grad)
        for s, c, _ in ranges:
            masked[s:s + c] = grad[s:s + c]
        g.write(masked)
        hyper.write(optim.adamw_hyper(lr, step=step, weight_decay=wd))
        with device.record() as rec:
            optim.grad_stats(rec, g, stats, max_norm=max_norm)
            optim.adamw_ranges(rec, p, g, m, v, hyper, stats, ranges, mirror=mirror)
        got = device.download(stats)
        np.testing.assert_allclose(got[1], norms[-1], rtol=1e-5)
        assert got[3] == 0.0
    out, out16 = device.download(p), device.download(mirror)
    for t, (s, c, _) in zip(tensors, ranges):
        np.testing.assert_allclose(out[s:s + c], t.detach().numpy(), rtol=2e-5, atol=2e-7)
        assert np.array_equal(out16[s:s + c], out[s:s + c].astype(np.float16))


def test_nan_gradient_skips_the_whole_update(device):
    rng = np.random.default_rng(1)
    shapes, ranges, params = _model(device, rng)
    grad = rng.standard_normal(params.size).astype(np.float32)
    grad[ranges[2][0] + 3] = np.nan
    m0 = rng.standard_normal(params.size).astype(np.float32)
    p, g, m = device.upload(params), device.upload(grad), device.upload(m0)
    v, mirror = device.upload(np.abs(m0)), device.upload(params.astype(np.float16))
    stats, hyper = device.empty(8), device.upload(optim.adamw_hyper(1e-2, step=1))
    with device.record() as rec:
        optim.grad_stats(rec, g, stats, max_norm=1.0)
        optim.adamw_ranges(rec, p, g, m, v, hyper, stats, ranges, mirror=mirror)
    assert device.download(stats)[3] == 1.0
    assert np.array_equal(device.download(p), params)
    assert np.array_equal(device.download(m), m0)
    assert np.array_equal(device.download(v), np.abs(m0))
    assert np.array_equal(device.download(mirror), params.astype(np.float16))


def test_ranges_are_validated(device):
    buf = device.empty(4096)
    align = optim.param_alignment(device)
    with device.record() as rec:
        with pytest.raises(ValueError, match="not a multiple"):
            optim.adamw_ranges(rec, buf, buf, buf, buf, buf, buf, [(align + 1, 4, True)])
        with pytest.raises(ValueError, match="overlap"):
            optim.adamw_ranges(rec, buf, buf, buf, buf, buf, buf, [(0, 100, True),
                                                                   (50, 10, False)])
    assert optim.merge_ranges([(64, 10, True), (0, 64, True), (74, 6, False)]) == \
        [(0, 74, True), (74, 6, False)]
    with pytest.raises(ValueError, match="step counts from 1"):
        optim.adamw_hyper(1e-3, step=0)
