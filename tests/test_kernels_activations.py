"""SwiGLU and GELU on the real device: ladder cases and edges."""

from __future__ import annotations

import numpy as np
import pytest

from istanbul.shaders.kernels.activations import ops as activations


def test_saturated_inputs_stay_finite(device):
    x = np.array([-3e38, -1e4, -88.0, 88.0, 1e4, 3e38, -0.0, 1e-30], np.float32)
    xb, y, dx = device.upload(x), device.empty(8), device.empty(8)
    gu = device.upload(np.concatenate([x, np.ones(8, np.float32)]))
    h, dgu = device.empty(8), device.empty(16)
    with device.record() as rec:
        activations.gelu_forward(rec, xb, y, 8)
        activations.gelu_backward(rec, xb, device.upload(np.ones(8, np.float32)), dx, 8)
        activations.swiglu_forward(rec, gu, h, 1, 8)
        activations.swiglu_backward(rec, gu, device.upload(np.ones(8, np.float32)), dgu, 1, 8)
    for out in (y, dx, h, dgu):
        assert np.isfinite(device.download(out)).all()
    np.testing.assert_array_equal(device.download(y)[[0, 1, 4, 5]], x[[0, 0, 4, 5]] * [0, 0, 1, 1])
    np.testing.assert_array_equal(device.download(dx)[[0, 1, 4, 5]], [0, 0, 1, 1])


def test_swiglu_layout_is_checked(device):
    with device.record() as rec:
        with pytest.raises(ValueError, match="gate_up holds 10"):
            activations.swiglu_forward(rec, device.empty(10), device.empty(6), 2, 3)


def _needs_f16(device):
    if not device.has("shader-f16"):
        pytest.skip(f"{device.name} lacks shader-f16, which swiglu's f16 h needs")


@pytest.mark.parametrize("layout", ["fused", "halves"])
def test_swiglu_f16_h_is_the_f32_h_clamped_and_rounded(device, layout):
    _needs_f16(device)
    rng = np.random.default_rng(17)
    rows, F = 7, 64
    ld, up = (2 * F, F) if layout == "fused" else (F, rows * F)
    size = (rows - 1) * ld + up + F
    gu = rng.standard_normal(size) * 10.0 ** rng.uniform(-5, 3.5, size)
    gu[:6] = [3e38, 1e4, -1e4, np.nan, np.inf, 0.0]   # gates: overflow, NaN, inf
    gu = gu.astype(np.float32)
    gub = device.upload(gu)
    h32, h16 = device.empty((rows, F)), device.empty((rows, F), np.float16)
    with device.record() as rec:
        for h in (h32, h16):
            activations.swiglu_forward(rec, gub, h, rows, F, ld=ld, up_offset=up)
    want, got = device.download(h32), device.download(h16)
    assert got.dtype == np.float16
    finite = np.isfinite(want)
    assert np.abs(want[finite]).max() > 65504         # the test covers the clamp
    nan = np.isnan(want)
    assert nan[0, 3]                                  # a NaN gate gives a NaN h
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(
        got[~nan].view(np.uint16),
        np.clip(want[~nan], -65504, 65504).astype(np.float16).view(np.uint16))
    assert np.isfinite(got[~nan]).all()               # f32 inf (g = 3e38, inf) clamps too


def test_swiglu_f16_h_needs_a_vec4_layout_and_shader_f16(device):
    from types import SimpleNamespace
    with device.record() as rec:
        with pytest.raises(ValueError, match=r"swiglu_forward: an f16 h is written by the vec4 "
                                             r"kernel only, which needs F, ld and up_offset "
                                             r"multiples of 4 \(F = 6, ld = 12, up_offset = 6\)"):
            activations.swiglu_forward(rec, device.empty(24), device.empty(12, np.float16),
                                       2, 6)
        with pytest.raises(ValueError, match="swiglu_forward: gate_up has dtype float16"):
            activations.swiglu_forward(rec, device.empty(16, np.float16),
                                       device.empty(8, np.float16), 1, 8)
    no_f16 = SimpleNamespace(device=SimpleNamespace(has=lambda feature: False, name="dev0"))
    with pytest.raises(ValueError, match="swiglu_forward: an f16 h needs a device with "
                                         "shader-f16; dev0 lacks it: use an f32 h"):
        activations.swiglu_forward(no_f16, device.empty(16), device.empty(8, np.float16), 1, 8)
