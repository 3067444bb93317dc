"""RoPE on the real device: ladder cases, round trip, table, and bad input."""

from __future__ import annotations

from types import SimpleNamespace

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


def _needs_f16(device):
    if not device.has("shader-f16"):
        pytest.skip(f"{device.name} lacks shader-f16, which rope's f16 out needs")


@pytest.mark.parametrize("fn", [rope.forward, rope.backward], ids=["forward", "backward"])
def test_f16_out_is_the_f32_out_rounded_and_clamped(device, fn):
    _needs_f16(device)
    rng = np.random.default_rng(11)
    B, T, H, D = 2, 6, 3, 16
    W = 3 * H * D                                  # fused qkv rows; q is their first part
    x = rng.standard_normal((B, T, W)) * 10.0 ** rng.uniform(-7, 5, (B, T, W))
    x[0, 0, :4] = [1e6, -1e6, 7e4, -65519.0]       # position 0 rotates by 0: y = x there
    x = x.astype(np.float32)
    xb, table = device.upload(x), device.upload(rope.rope_table(T, D))
    head_major = (D, T * D, H * T * D)
    y32, y16 = device.empty(B * H * T * D), device.empty(B * H * T * D, np.float16)
    with device.record() as rec:
        for out in (y32, y16):
            fn(rec, xb, table, B, T, H, D, token_stride=W, out=out, out_strides=head_major)
    want, got = device.download(y32), device.download(y16)
    assert got.dtype == np.float16 and np.isfinite(got).all()
    np.testing.assert_array_equal(got, np.clip(want, -65504, 65504).astype(np.float16))
    assert got[:4].tolist() == [65504, -65504, 65504, -65504]
    assert np.array_equal(device.download(xb), x)   # x is only read


def test_f16_needs_an_f32_x_a_vec4_layout_and_shader_f16(device):
    T, D = 2, 8
    table = device.upload(rope.rope_table(T, D))
    x32, x16, y16 = device.empty(T * D), device.empty(T * D, np.float16), \
        device.empty(T * D, np.float16)
    with device.record() as rec:
        for out in (None, y16):   # in place, and into an out
            with pytest.raises(ValueError, match=r"rope.forward: x has dtype float16; .*"
                                                 r"\(only `out` may be f16\)"):
                rope.forward(rec, x16, table, 1, T, 1, D, out=out)
        with pytest.raises(ValueError, match=r"rope.backward: an f16 out is written by the vec4 "
                                             r"kernel only, which needs D % 8 == 0 \(D = 6\)"):
            rope.backward(rec, x32, table, 1, 2, 1, 6, out=y16)
        with pytest.raises(ValueError, match=r"every x and out stride a multiple of 4 "
                                             r"\(x \(10, 8, 20\), out \(8, 8, 16\)\)"):
            rope.forward(rec, device.empty(20), table, 1, T, 1, D, token_stride=10, out=y16,
                         out_strides=(8, 8, 16))
    no_f16 = SimpleNamespace(device=SimpleNamespace(has=lambda feature: False, name="dev0"))
    with pytest.raises(ValueError, match="rope.forward: an f16 out needs a device with "
                                         "shader-f16; dev0 lacks it: use an f32 out"):
        rope.forward(no_f16, x32, table, 1, T, 1, D, out=y16)
