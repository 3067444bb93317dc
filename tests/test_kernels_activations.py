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
