"""The matmul family on the real device: every ladder case, plus the edges the model relies on."""

from __future__ import annotations

import numpy as np
import pytest

from shaders.ladder import check_case, load_cases
from shaders.ops import linear


def family_cases(family):
    return [c.name for c in load_cases().values() if c.family == family]


@pytest.mark.parametrize("name", family_cases("linear"))
def test_linear_case_climbs_the_ladder(device, name):
    results = check_case(device, load_cases()[name])
    failed = [r.line() for r in results if r.ok is False]
    assert not failed, failed
    assert any(r.rung == "correct" and r.ok for r in results)


def test_weight_as_sub_range_of_one_parameter_buffer(device):
    # The model binds each weight as a view into one parameter buffer (and its f16 mirror).
    rng = np.random.default_rng(1)
    align = device.limits["min-storage-buffer-offset-alignment"]
    start = 3 * align  # elements; a multiple of the alignment in both f32 and f16 bytes
    M, N, K = 9, 17, 24
    params = rng.standard_normal(start + N * K + 50).astype(np.float32)
    w = params[start:start + N * K].reshape(N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    buf, mirror = device.upload(params), device.upload(params.astype(np.float16))
    xb, y32, y16 = device.upload(x), device.empty((M, N)), device.empty((M, N))
    with device.record() as rec:
        linear.matmul_nt(rec, xb, buf.elements(start, N * K), y32, M, N, K)
        linear.matmul_nt(rec, xb, mirror.elements(start, N * K), y16, M, N, K)
    np.testing.assert_allclose(device.download(y32), x.astype(np.float64) @ w.T,
                               rtol=1e-5, atol=1e-5)
    w16 = w.astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(device.download(y16), x.astype(np.float64) @ w16.T,
                               rtol=1e-5, atol=1e-5)


def test_accumulate_adds_each_micro_batch(device):
    rng = np.random.default_rng(2)
    dy = rng.standard_normal((2, 40, 12)).astype(np.float32)
    x = rng.standard_normal((2, 40, 7)).astype(np.float32)
    dw = device.zeros((12, 7))
    with device.record() as rec:
        for i in range(2):
            linear.matmul_tn(rec, device.upload(dy[i]), device.upload(x[i]), dw, 12, 7, 40,
                             accumulate=True)
    want = sum(dy[i].astype(np.float64).T @ x[i] for i in range(2))
    np.testing.assert_allclose(device.download(dw), want, rtol=1e-5, atol=1e-4)


def test_bad_operands_are_named(device):
    a, b, c = device.empty(10), device.empty(12), device.empty(4)
    with device.record() as rec:
        with pytest.raises(ValueError, match="matmul_nt: a holds 10"):
            linear.matmul_nt(rec, a, b, c, 2, 2, 6)
        with pytest.raises(ValueError, match="out holds 4"):
            linear.matmul_nn(rec, a, b, c, 2, 3, 4)
        with pytest.raises(ValueError, match="M must be >= 1"):
            linear.matmul_tn(rec, a, b, c, 0, 2, 2)
        with pytest.raises(ValueError, match="exclusive"):
            linear.matmul_nt(rec, a, b, c, 1, 1, 1, accumulate=True, residual=b)
        with pytest.raises(ValueError, match="f16_math"):
            linear.matmul_nt(rec, a, b, c, 1, 1, 1, f16_math=True)
        with pytest.raises(ValueError, match="dtype"):
            linear.matmul_nt(rec, device.empty(4, np.uint32), b, c, 1, 1, 1)
        with pytest.raises(ValueError, match="multiples of 8"):
            linear.matmul_nt(rec, a, b, c, 1, 1, 1, tiles=(12, 64, 16))
        with pytest.raises(ValueError, match="workgroup memory"):
            linear.matmul_nt(rec, a, b, c, 1, 1, 1, tiles=(128, 128, 64))
