"""RoPE on the real device: ladder cases, round trip, table, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

from istanbul.shaders.kernels.rope import ops as rope


def test_forward_then_backward_is_identity_and_preserves_norms(device):
    rng = np.random.default_rng(7)
    B, T, H, D = 2, 9, 3, 16
    x = rng.standard_normal((B, T, H, D)).astype(np.float32)
    buf, table = device.upload(x), device.upload(rope.rope_table(T, D))
    with device.record() as rec:
        rope.forward(rec, buf, table, B, T, H, D)
    rotated = device.download(buf)
    np.testing.assert_allclose(np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1),
                               rtol=1e-5)
    assert np.array_equal(rotated[:, 0], x[:, 0])  # position 0 is the identity
    with device.record() as rec:
        rope.backward(rec, buf, table, B, T, H, D)
    np.testing.assert_allclose(device.download(buf), x, atol=1e-5)


def test_table_matches_the_llama_frequencies():
    tab = rope.rope_table(5, 8, base=10000.0)
    assert tab.shape == (5, 4, 2)
    angle = 3 * 10000.0 ** (-2 / 8)
    np.testing.assert_allclose(tab[3, 1], [np.cos(angle), np.sin(angle)], rtol=1e-6)
    with pytest.raises(ValueError, match="even"):
        rope.rope_table(4, 7)


def test_positions_past_the_table_are_refused(device):
    table = device.upload(rope.rope_table(4, 8))
    with device.record() as rec:
        with pytest.raises(ValueError, match="table holds"):
            rope.forward(rec, device.empty(8), table, 1, 1, 1, 8, pos_offset=4)
