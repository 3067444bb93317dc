"""The element-wise op wrappers (infra kernels) record into one pass with size checks."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from istanbul.shaders.kernels.elementwise import ops as basic


def test_helpers_compose_in_one_recording(device):
    rng = np.random.default_rng(0)
    n = 1000
    x = rng.standard_normal(n).astype(np.float32)
    xb, y, z, h = device.upload(x), device.upload(np.ones(n, np.float32)), device.empty(n), \
        device.empty(n, np.float16)
    with device.record() as rec:
        basic.axpy(rec, xb, y, n, 2.0)          # y = 1 + 2x
        basic.scale(rec, y, z, n, 0.5)          # z = 0.5 + x
        basic.cast_f32_f16(rec, z, h, n)
        basic.fill(rec, y, n // 2, 0.0)         # first half zeroed
        basic.copy(rec, xb, y, 3)
    np.testing.assert_allclose(device.download(z), 0.5 + x.astype(np.float64), rtol=1e-6,
                               atol=1e-6)
    assert np.array_equal(device.download(h), device.download(z).astype(np.float16))
    out = device.download(y)
    assert np.array_equal(out[:3], x[:3]) and not out[3:n // 2].any()
    np.testing.assert_allclose(out[n // 2:], 1 + 2 * x[n // 2:].astype(np.float64), rtol=1e-6,
                               atol=1e-6)


def test_sizes_and_dtypes_are_checked(device):
    with device.record() as rec:
        with pytest.raises(ValueError, match="fill: y holds 4"):
            basic.fill(rec, device.empty(4), 5)
        with pytest.raises(ValueError, match="dtype float32, expected float16"):
            basic.cast_f32_f16(rec, device.empty(4), device.empty(4), 4)


def test_bench_uses_the_software_variant_on_software_adapters(device):
    from istanbul.shaders.ladder import KernelCase, Launch, Roofline, bench_case
    asked = []

    def inputs(rng, variant):
        asked.append(variant)
        return {"x": np.ones(256, np.float32)}

    def launch(dev, inp):
        x, y = dev.upload(inp["x"]), dev.empty(256)
        return Launch(lambda rec: basic.copy(rec, x, y, 256), lambda: {"y": dev.download(y)})

    case = KernelCase(name="copy_probe", family="test", precision="exact", kernels=[],
                      inputs=inputs, launch=launch, reference=lambda inp: {"y": inp["x"]},
                      bench_variant_software="bench_small", bytes=lambda inp: 2048.0)
    row = bench_case(device, case, Roofline(copy_gbs=1.0, fma_tflops={"f32": 1.0}))
    want = "bench_small" if device.info.is_software else "bench"
    assert asked == [want] and row["variant"] == want and row["us"] > 0


def test_copy_rows_checks_strides_and_sizes(device):
    x, y = device.empty(40), device.empty(40)
    with device.record() as rec:
        with pytest.raises(ValueError, match="copy_rows: x_stride 3 < width 4: rows would "
                                             "overlap"):
            basic.copy_rows(rec, x, y, 2, 4, 3, 8)
        with pytest.raises(ValueError, match="copy_rows: y holds 40"):
            basic.copy_rows(rec, x, y, 5, 4, 4, 10)


def test_copy_heads_into_f16_rounds_clamps_and_keeps_nan(device):
    if not device.has("shader-f16"):
        pytest.skip(f"{device.name} lacks shader-f16, which copy_heads' f16 y needs")
    rng = np.random.default_rng(5)
    B, T, heads, D = 2, 7, 3, 8
    xs, ys = (3 * heads * D, D, 3 * T * heads * D), (D, T * D, heads * T * D)  # fused -> hm
    size = 3 * B * T * heads * D
    x = (rng.standard_normal(size) * 10.0 ** rng.uniform(-7, 5, size)).astype(np.float32)
    x[:7] = [np.nan, 1e5, -1e5, np.inf, -np.inf, 65519.0, -65520.0]
    xb, n = device.upload(x), B * T * heads * D
    y32, y16 = device.empty(n), device.empty(n, np.float16)
    with device.record() as rec:
        for y in (y32, y16):
            basic.copy_heads(rec, xb, y, B, T, heads, D, xs, ys)
    want, got = device.download(y32), device.download(y16)
    np.testing.assert_array_equal(got, np.clip(want, -65504, 65504).astype(np.float16))
    assert np.isnan(got[0]) and got[1:7].tolist() == [65504, -65504, 65504, -65504, 65504,
                                                     -65504]


def test_copy_heads_f16_needs_an_f32_x_a_vec4_layout_and_shader_f16(device):
    rows = (16, 8, 32)   # (token, head, batch) of [1, 2, 2, 8]
    x32, x16, y16 = device.empty(32), device.empty(32, np.float16), \
        device.empty(32, np.float16)
    with device.record() as rec:
        with pytest.raises(ValueError, match="copy_heads: x has dtype float16, expected "
                                             "float32"):
            basic.copy_heads(rec, x16, y16, 1, 2, 2, 8, rows, rows)
        with pytest.raises(ValueError, match=r"copy_heads: an f16 y is written by the vec4 "
                                             r"kernel only, which needs D % 4 == 0 \(D = 6\)"):
            basic.copy_heads(rec, x32, y16, 1, 2, 2, 6, (12, 6, 24), (12, 6, 24))
        with pytest.raises(ValueError, match=r"every stride a multiple of 4 \(x \(18, 8, 36\), "
                                             r"y \(16, 8, 32\)\)"):
            basic.copy_heads(rec, device.empty(36), y16, 1, 2, 2, 8, (18, 8, 36), rows)
    no_f16 = SimpleNamespace(device=SimpleNamespace(has=lambda feature: False, name="dev0"))
    with pytest.raises(ValueError, match="copy_heads: an f16 y needs a device with "
                                         "shader-f16; dev0 lacks it: use an f32 y"):
        basic.copy_heads(no_f16, x32, y16, 1, 2, 2, 8, rows, rows)
