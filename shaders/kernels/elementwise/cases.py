"""Ladder entries for the element-wise kernels (infra.wgsl, infra_vec4.wgsl through ops.py;
reference.py): fill, scale, axpy, copy, casts, back-to-back reductions."""

from __future__ import annotations

import numpy as np

from ...ladder import KernelCase, Launch, register
from . import reference

FILE = "infra.wgsl"
FILE_VEC4 = "infra_vec4.wgsl"
EW = 256  # invocations per workgroup of the element-wise kernels

SIZES = {"random": 100_003, "one": 1, "odd": 257, "bench": 1 << 24}


def _vector(rng, variant, dtype=np.float32):
    n = SIZES.get(variant, SIZES["random"])
    x = rng.standard_normal(n).astype(dtype)
    if variant == "odd" and n >= 8:  # special values must survive element-wise kernels
        x[:5] = [np.inf, -np.inf, np.nan, 0.0, -0.0]
    return x


def elementwise(name, *, reference, n_inputs, alpha=1.0, inout=False, dtype_in=np.float32,
                dtype_out=np.float32, precision="exact", requires=(), bytes_per=8):
    """Register an element-wise kernel: inputs x (and y when `inout`), output y."""

    def inputs(rng, variant):
        inp = {"x": _vector(rng, variant).astype(dtype_in), "alpha": np.float32(alpha)}
        if inout:
            inp["y"] = _vector(rng, variant).astype(dtype_out)
        return inp

    def launch(dev, inp):
        n = inp["x"].size
        kern = dev.kernel(FILE, name)
        params = dev.uniform("IIfI", n, 0, float(inp["alpha"]), 0)
        y = dev.upload(inp["y"]) if inout else dev.empty(n, dtype_out)
        x = dev.upload(inp["x"]) if n_inputs else None
        resources = ([x] if x is not None else []) + [y, params]
        return Launch(encode=lambda rec: rec.dispatch(kern, resources, -(-n // EW)),
                      read=lambda: {"y": dev.download(y)})

    register(KernelCase(
        name=name, family="elementwise", precision=precision, kernels=[(FILE, name)],
        inputs=inputs, launch=launch, reference=reference,
        variants=("random", "one", "odd"), requires=requires,
        bytes=lambda inp: inp["x"].size * bytes_per,
        flops=lambda inp: 0.0))


elementwise("fill", n_inputs=0, alpha=3.25, bytes_per=4, reference=reference.fill)
elementwise("scale", n_inputs=1, alpha=-1.75, precision="exact", reference=reference.scale)
elementwise("axpy", n_inputs=1, alpha=0.5, inout=True, precision="f32", bytes_per=12,
            reference=reference.axpy)
elementwise("copy", n_inputs=1, reference=reference.copy)
elementwise("cast_f32_f16", n_inputs=1, dtype_out=np.float16, requires=("shader-f16",),
            bytes_per=6, reference=reference.cast_f32_f16)
elementwise("cast_f16_f32", n_inputs=1, dtype_in=np.float16, requires=("shader-f16",),
            bytes_per=6, reference=reference.cast_f16_f32)


# ---- the same through ops.py: vec4 kernels when n % 4 == 0 -------------------

SIZES_OPS = {"random": 100_004, "one": 4, "odd": 260, "ragged": 1_003, "bench": 1 << 24}


def op_case(name, *, reference, n_inputs, alpha=1.0, inout=False, dtype_in=np.float32,
            dtype_out=np.float32, precision="exact", requires=(), bytes_per=8):
    """Register `name`_op: the basic op over SIZES_OPS (vec4 kernels except `ragged`)."""
    from . import ops as basic

    def vector(rng, variant, dtype):
        x = rng.standard_normal(SIZES_OPS[variant]).astype(dtype)
        if variant == "odd":
            x[:5] = [np.inf, -np.inf, np.nan, 0.0, -0.0]
        return x

    def inputs(rng, variant):
        inp = {"x": vector(rng, variant, dtype_in), "alpha": np.float32(alpha)}
        if inout:
            inp["y"] = vector(rng, variant, dtype_out)
        return inp

    def launch(dev, inp):
        n = inp["x"].size
        y = dev.upload(inp["y"]) if inout else dev.empty(n, dtype_out)
        x = dev.upload(inp["x"])
        fn = getattr(basic, name)
        if name == "fill":
            encode = lambda rec: fn(rec, y, n, float(inp["alpha"]))  # noqa: E731
        elif name in ("scale", "axpy"):
            encode = lambda rec: fn(rec, x, y, n, float(inp["alpha"]))  # noqa: E731
        else:
            encode = lambda rec: fn(rec, x, y, n)  # noqa: E731
        return Launch(encode=encode, read=lambda: {"y": dev.download(y)})

    vec = VEC4_KERNELS.get(name, name + "_vec4")
    register(KernelCase(
        name=name + "_op", family="elementwise", precision=precision,
        kernels=[("infra_vec4.wgsl", vec)], inputs=inputs, launch=launch,
        reference=reference, variants=("random", "one", "odd", "ragged"), requires=requires,
        bytes=lambda inp: inp["x"].size * bytes_per, flops=lambda inp: 0.0,
        description=f"ops.{name}: vec4 kernel, 16 elements per invocation"))


VEC4_KERNELS = {"copy": "copy_vec4x4"}
op_case("fill", n_inputs=0, alpha=3.25, bytes_per=4, reference=reference.fill)
op_case("scale", n_inputs=1, alpha=-1.75, reference=reference.scale)
op_case("axpy", n_inputs=1, alpha=0.5, inout=True, precision="f32", bytes_per=12,
        reference=reference.axpy)
op_case("copy", n_inputs=1, reference=reference.copy)
op_case("cast_f32_f16", n_inputs=1, dtype_out=np.float16, requires=("shader-f16",),
        bytes_per=6, reference=reference.cast_f32_f16)
op_case("cast_f16_f32", n_inputs=1, dtype_in=np.float16, requires=("shader-f16",),
        bytes_per=6, reference=reference.cast_f16_f32)


# ---- copy_rows: a strided part into a strided part (ops.copy_rows) -----------------

# (rows, width, x_stride, y_stride, y_offset): y_offset places the part inside y's rows, as
# dv sits after q and k in a fused [B*T, (H + 2Hkv) D] gradient buffer
COPY_ROWS = {"random": (37, 100, 130, 257, 64), "one": (1, 1, 1, 1, 0),
             "fused": (42, 64, 64, 256, 192), "bench": (8192, 768, 768, 2304, 1536)}


def _copy_rows_inputs(rng, variant):
    rows, width, xs, ys, off = COPY_ROWS[variant]
    return {"x": rng.standard_normal((rows - 1) * xs + width).astype(np.float32),
            "y": rng.standard_normal(off + (rows - 1) * ys + width).astype(np.float32),
            "shape": (rows, width, xs, ys, off)}


def _copy_rows_reference(inp):
    rows, width, xs, ys, off = inp["shape"]
    y = inp["y"].copy()
    for r in range(rows):
        y[off + r * ys: off + r * ys + width] = inp["x"][r * xs: r * xs + width]
    return {"y": y}


def _copy_rows_launch(dev, inp):
    from . import ops as basic
    rows, width, xs, ys, off = inp["shape"]
    x, y = dev.upload(inp["x"]), dev.upload(inp["y"])
    part = y.elements(off, y.nbytes // 4 - off)  # offsets are multiples of 64 floats
    return Launch(encode=lambda rec: basic.copy_rows(rec, x, part, rows, width, xs, ys),
                  read=lambda: {"y": dev.download(y)})


register(KernelCase(
    name="copy_rows", family="elementwise", precision="exact", kernels=[(FILE, "copy_rows")],
    inputs=_copy_rows_inputs, launch=_copy_rows_launch, reference=_copy_rows_reference,
    variants=("random", "one", "fused"),
    bytes=lambda inp: 8 * inp["shape"][0] * inp["shape"][1], flops=lambda inp: 0.0,
    description="ops.copy_rows: rows of one strided part into another (elsewhere kept)"))


# ---- copy_heads: [B, T, heads, D] between two (token, head, batch) layouts -------------

# (B, T, heads, D, x layout, y layout, y offset); layouts: "fused" (the part of a fused qkv
# buffer of token stride 3 heads D), "head_major" ([B, heads, T, D]), "rows" ([B, T, heads, D])
COPY_HEADS = {"to_head_major": (2, 37, 3, 16, "fused", "head_major", 0),
              "from_head_major": (3, 5, 2, 8, "head_major", "fused", 64),
              "scalar": (2, 9, 3, 6, "rows", "head_major", 0),
              "one": (1, 1, 1, 1, "rows", "rows", 0),
              "special": (2, 6, 2, 8, "fused", "head_major", 0),   # large values, NaN, Inf
              "bench": (8, 1024, 12, 64, "fused", "head_major", 0)}


def _head_strides(layout, T, heads, D):
    """(token, head, batch) strides of a layout of COPY_HEADS."""
    if layout == "head_major":
        return (D, T * D, heads * T * D)
    width = 3 * heads * D if layout == "fused" else heads * D
    return (width, D, T * width)


def _span(B, T, heads, D, s):
    return (B - 1) * s[2] + (T - 1) * s[0] + (heads - 1) * s[1] + D


def _copy_heads_inputs(rng, variant, dtype=np.float32):
    """x f32 and y (the elements outside the copy must stay) of dtype; y's offset is
    256 bytes per 64 f32 elements (a storage binding offset must be a multiple of 256)."""
    B, T, heads, D, xl, yl, off = COPY_HEADS[variant]
    xs, ys = _head_strides(xl, T, heads, D), _head_strides(yl, T, heads, D)
    off = off * 4 // np.dtype(dtype).itemsize
    x = rng.standard_normal(_span(B, T, heads, D, xs)).astype(np.float32)
    if variant == "special":  # past the f16 range (clamped there), at its edge, NaN, Inf
        x[:10] = [np.nan, np.inf, -np.inf, 1e5, -1e5, 65504.0, 65519.0, 65520.0, -0.0, 1e-8]
        x[10:] *= 3e4
    return {"x": x, "y": rng.standard_normal(off + _span(B, T, heads, D, ys)).astype(dtype),
            "shape": (B, T, heads, D, xs, ys, off)}


def _copy_heads_reference(inp):
    B, T, heads, D, xs, ys, off = inp["shape"]
    y = inp["y"].copy()
    x = inp["x"] if y.dtype == np.float32 else reference.cast_f32_f16(inp)["y"]
    for b in range(B):
        for t in range(T):
            for h in range(heads):
                src = b * xs[2] + t * xs[0] + h * xs[1]
                dst = off + b * ys[2] + t * ys[0] + h * ys[1]
                y[dst:dst + D] = x[src:src + D]
    return {"y": y}


def _copy_heads_launch(dev, inp):
    from . import ops as basic
    B, T, heads, D, xs, ys, off = inp["shape"]
    x, y = dev.upload(inp["x"]), dev.upload(inp["y"])
    part = y.elements(off, inp["y"].size - off)  # offsets are multiples of 256 bytes
    return Launch(encode=lambda rec: basic.copy_heads(rec, x, part, B, T, heads, D, xs, ys),
                  read=lambda: {"y": dev.download(y)})


register(KernelCase(
    name="copy_heads", family="elementwise", precision="exact",
    kernels=[(FILE, "copy_heads"), (FILE_VEC4, "copy_heads_vec4")],
    inputs=_copy_heads_inputs, launch=_copy_heads_launch, reference=_copy_heads_reference,
    variants=("to_head_major", "from_head_major", "scalar", "one"),
    bytes=lambda inp: 8.0 * np.prod(inp["shape"][:4]), flops=lambda inp: 0.0,
    description="ops.copy_heads: [B, T, heads, D] between layouts (fused part <-> head-major; "
                "vec4 and scalar kernels)"))

# f16 y (the tensor-core attention's v): exactly numpy's rounding of the clamped f32 values
register(KernelCase(
    name="copy_heads_f16", family="elementwise", precision="exact",
    kernels=[(FILE_VEC4, "copy_heads_vec4_f16")], requires=("shader-f16",),
    inputs=lambda rng, variant: _copy_heads_inputs(rng, variant, np.float16),
    launch=_copy_heads_launch, reference=_copy_heads_reference,
    variants=("to_head_major", "from_head_major", "special"),
    bytes=lambda inp: 6.0 * np.prod(inp["shape"][:4]), flops=lambda inp: 0.0,
    description="ops.copy_heads into an f16 y (vec4 kernel; clamped to +-65504, NaN kept)"))


# ---- reduce_rows: wg_sum then wg_max back to back ---------------------------------------

ROW_SHAPES = {"random": (37, 1000), "one": (1, 1), "wide": (3, 100_000), "bench": (4096, 4096)}


def _rows_inputs(rng, variant):
    rows, cols = ROW_SHAPES[variant]
    return {"x": rng.standard_normal((rows, cols)).astype(np.float32)}


def _rows_launch(dev, inp, wg=256):
    rows, cols = inp["x"].shape
    kern = dev.kernel(FILE, "reduce_rows", {"WG": wg})
    x = dev.upload(inp["x"])
    y = dev.empty((rows, 2), np.float32)
    params = dev.uniform("IIfI", rows, cols, 0.0, 0)
    return Launch(encode=lambda rec: rec.dispatch(kern, [x, y, params], rows),
                  read=lambda: {"sum_max": dev.download(y)})


for wg in (64, 256, 1024):
    register(KernelCase(
        name=f"reduce_rows_wg{wg}", family="elementwise", precision="f32",
        description="wg_sum then wg_max back to back (the seed's race, fixed)",
        kernels=[(FILE, "reduce_rows", {"WG": wg})],
        inputs=_rows_inputs, launch=lambda dev, inp, wg=wg: _rows_launch(dev, inp, wg),
        reference=reference.rows_sum_max, variants=("random", "one", "wide"),
        thresholds={"min_psnr": 90.0},
        bytes=lambda inp: inp["x"].nbytes, flops=lambda inp: 2.0 * inp["x"].size))
