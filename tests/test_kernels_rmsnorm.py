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


def _needs_f16(device):
    if not device.has("shader-f16"):
        pytest.skip(f"{device.name} lacks shader-f16, which rmsnorm's f16 y needs")


def _assert_f16_of(got, want32):
    """got (f16) is want32 clamped to +-65504 and rounded to nearest, bit for bit; NaN kept."""
    assert got.dtype == np.float16
    want = np.clip(want32, -65504, 65504).astype(np.float16)
    nan = np.isnan(want32)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))


@pytest.mark.parametrize("path,n", [("rows", 96), ("general", 96), (None, 5000)],
                         ids=["rows", "general", "wide"])
def test_f16_y_is_the_f32_y_clamped_and_rounded(device, path, n):
    _needs_f16(device)
    rng = np.random.default_rng(13)
    rows = 9
    x = rng.standard_normal((rows, n)) * 10.0 ** rng.uniform(-6, 4, (rows, n))
    x[3] = 0.0                                     # y = 0: rstd = 1/sqrt(eps)
    x[4, :3] = np.nan                              # a NaN row stays NaN
    w = rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 5, n)
    w[:2] = [1e6, -1e6]                            # past 65504: clamps
    x, w = x.astype(np.float32), w.astype(np.float32)
    xb, wb = device.upload(x), device.upload(w)
    y32, y16 = device.empty((rows, n)), device.empty((rows, n), np.float16)
    r32, r16 = device.empty(rows), device.empty(rows)
    with device.record() as rec:
        rmsnorm.forward(rec, xb, wb, y32, r32, rows, n, path=path)
        rmsnorm.forward(rec, xb, wb, y16, r16, rows, n, path=path)
    want, got = device.download(y32), device.download(y16)
    assert np.abs(want[~np.isnan(want)]).max() > 65504     # the test covers the clamp
    _assert_f16_of(got, want)
    assert np.isnan(got[4]).all() and np.isfinite(np.delete(got, 4, 0)).all()
    np.testing.assert_array_equal(device.download(r16), device.download(r32))  # rstd f32


def test_f16_y_needs_vec4_rows_an_f32_x_and_shader_f16(device):
    from types import SimpleNamespace
    w = device.empty(13)
    with device.record() as rec:
        with pytest.raises(ValueError, match=r"rmsnorm.forward: an f16 y is written by the vec4 "
                                             r"kernel only, which needs n % 4 == 0 \(n = 13\)"):
            rmsnorm.forward(rec, device.empty(26), w, device.empty(26, np.float16),
                            device.empty(2), 2, 13)
        with pytest.raises(ValueError, match=r"rmsnorm.forward: x has dtype float16, expected "
                                             "float32"):
            rmsnorm.forward(rec, device.empty(8, np.float16), device.empty(4),
                            device.empty(8, np.float16), device.empty(2), 2, 4)
        with pytest.raises(ValueError, match="rmsnorm.forward: rstd has dtype float16"):
            rmsnorm.forward(rec, device.empty(8), device.empty(4),
                            device.empty(8, np.float16), device.empty(2, np.float16), 2, 4)
    no_f16 = SimpleNamespace(device=SimpleNamespace(has=lambda feature: False, name="dev0"))
    with pytest.raises(ValueError, match="rmsnorm.forward: an f16 y needs a device with "
                                         "shader-f16; dev0 lacks it: use an f32 y"):
        rmsnorm.forward(no_f16, device.empty(8), device.empty(4), device.empty(8, np.float16),
                        device.empty(2), 2, 4)
