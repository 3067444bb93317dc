"""Element-wise helpers over infra.wgsl, recordable inside a step (no extra submits).

    basic.fill(rec, grads, n, 0.0)              # zero the gradients at the start of a step
    basic.axpy(rec, x, y, n, alpha)             # y += alpha * x (e.g. an out-of-place residual)
    basic.scale(rec, x, y, n, alpha)            # y = alpha * x
    basic.copy(rec, x, y, n)
    basic.copy_rows(rec, x, y, rows, width, x_stride, y_stride)   # strided part -> strided part
    basic.copy_heads(rec, x, y, B, T, H, D, x_strides, y_strides)   # [B,T,H,D] re-laid out
    basic.cast_f32_f16(rec, x, y16, n)          # the initial f16 weight mirror (clamped)
    basic.cast_f16_f32(rec, x16, y, n)

All take Buffers or BufferViews of at least n elements (f32 unless named 16). When n is a
multiple of 4 and the views are 16-byte aligned (f16: 8-byte) the vec4 kernels of
infra_vec4.wgsl run (16 elements per invocation); otherwise those of infra.wgsl (one each).

copy_heads also writes an f16 y (copy_heads_vec4_f16, vec4 layouts only, the device needs
shader-f16), converted as cast_f32_f16: the tensor-core attention loads f16 tiles of v, half
the bytes.
"""

from __future__ import annotations

from ..op_support import F16, F32, ceil_div, check, f16_output, positive

FILE = "infra.wgsl"
FILE_VEC4 = "infra_vec4.wgsl"
EW = 256
VEC4_PER_INVOCATION = 4
VEC4_NAMES = {"copy": "copy_vec4x4"}


def _run(rec, name, resources, n, alpha=0.0):
    dev = rec.device
    if n % 4 == 0 and all(getattr(r, "offset", 0) % 16 == 0 for r in resources):
        vec_name = VEC4_NAMES.get(name, name + "_vec4")
        params = dev.params("IIfI", n // 4, 0, float(alpha), 0)
        rec.dispatch(dev.kernel(FILE_VEC4, vec_name), list(resources) + [params],
                     ceil_div(n // 4, EW * VEC4_PER_INVOCATION), label=vec_name)
        return
    params = dev.params("IIfI", n, 0, float(alpha), 0)
    rec.dispatch(dev.kernel(FILE, name), list(resources) + [params], ceil_div(n, EW),
                 label=name)


def fill(rec, y, n: int, value: float = 0.0) -> None:
    positive("fill", n=n)
    check("fill", "y", y, n)
    _run(rec, "fill", [y], n, value)


def scale(rec, x, y, n: int, alpha: float) -> None:
    positive("scale", n=n)
    check("scale", "x", x, n)
    check("scale", "y", y, n)
    _run(rec, "scale", [x, y], n, alpha)


def axpy(rec, x, y, n: int, alpha: float = 1.0) -> None:
    positive("axpy", n=n)
    check("axpy", "x", x, n)
    check("axpy", "y", y, n)
    _run(rec, "axpy", [x, y], n, alpha)


def copy(rec, x, y, n: int) -> None:
    positive("copy", n=n)
    check("copy", "x", x, n)
    check("copy", "y", y, n)
    _run(rec, "copy", [x, y], n)


def copy_rows(rec, x, y, rows: int, width: int, x_stride: int, y_stride: int) -> None:
    """y[r * y_stride + e] = x[r * x_stride + e] for r < rows, e < width (f32): e.g. one
    tensor's rows into its part of a fused buffer whose rows interleave several tensors."""
    op = "copy_rows"
    positive(op, rows=rows, width=width)
    for name, stride in (("x_stride", x_stride), ("y_stride", y_stride)):
        if stride < width:
            raise ValueError(f"{op}: {name} {stride} < width {width}: rows would overlap")
    check(op, "x", x, (rows - 1) * x_stride + width)
    check(op, "y", y, (rows - 1) * y_stride + width)
    if rows * width >= 1 << 32 or (rows - 1) * max(x_stride, y_stride) + width >= 1 << 32:
        raise ValueError(f"{op}: {rows} rows of stride {max(x_stride, y_stride)} exceed the "
                         "kernel's 32-bit element indexes; copy in parts")
    dev = rec.device
    params = dev.params("IIII", rows, width, x_stride, y_stride)
    rec.dispatch(dev.kernel(FILE, "copy_rows"), [x, y, params], ceil_div(rows * width, EW),
                 label="copy_rows")


def copy_heads(rec, x, y, B: int, T: int, heads: int, D: int, x_strides, y_strides) -> None:
    """y = x for a [B, T, heads, D] f32 tensor whose element (b, t, h, d) sits at
    b*batch + t*token + h*head + d in each, with (token, head, batch) = x_strides and
    y_strides: e.g. the v part of a fused qkv buffer into head-major [B, heads, T, D] rows.
    vec4s when D, every stride and the views' offsets allow (16 bytes). y may be f16
    (rounded to nearest, clamped to +-65504, NaN kept): vec4 layouts only, on a device with
    shader-f16."""
    op = "copy_heads"
    positive(op, B=B, T=T, heads=heads, D=D)
    spans = []
    for name, s in (("x", x_strides), ("y", y_strides)):
        if len(s) != 3 or any(int(v) < 0 for v in s):
            raise ValueError(f"{op}: {name}_strides {tuple(s)} must be 3 (token, head, batch) "
                             "strides >= 0")
        spans.append((B - 1) * s[2] + (T - 1) * s[0] + (heads - 1) * s[1] + D)
    check(op, "x", x, spans[0])
    f16 = check(op, "y", y, spans[1], dtypes=(F32, F16)) == F16
    n = B * T * heads * D
    if max(spans + [n]) >= 1 << 32:
        raise ValueError(f"{op}: {n} elements spanning {max(spans)} exceed the kernel's 32-bit "
                         "element indexes; copy in parts")
    dev = rec.device
    vec = (D % 4 == 0 and all(int(v) % 4 == 0 for v in (*x_strides, *y_strides))
           and all(getattr(r, "offset", 0) % 16 == 0 for r in (x, y)))
    name = "copy_heads_vec4" if vec else "copy_heads"
    if f16:
        f16_output(op, "y", dev, vec, f"D % 4 == 0 (D = {D}), every stride a multiple of 4 "
                   f"(x {tuple(x_strides)}, y {tuple(y_strides)})", (x, y))
        name += "_f16"
    unit = 4 if vec else 1
    xs = [int(v) // unit for v in x_strides]
    ys = [int(v) // unit for v in y_strides]
    params = dev.params("I" * 12, n // unit, T, heads, D // unit, *xs, *ys, 0, 0)
    rec.dispatch(dev.kernel(FILE_VEC4 if vec else FILE, name), [x, y, params],
                 ceil_div(n // unit, EW), label=name)


def cast_f32_f16(rec, x, y, n: int) -> None:
    positive("cast_f32_f16", n=n)
    check("cast_f32_f16", "x", x, n)
    check("cast_f32_f16", "y", y, n, (F16,))
    _run(rec, "cast_f32_f16", [x, y], n)


def cast_f16_f32(rec, x, y, n: int) -> None:
    positive("cast_f16_f32", n=n)
    check("cast_f16_f32", "x", x, n, (F16,))
    check("cast_f16_f32", "y", y, n, (F32,))
    _run(rec, "cast_f16_f32", [x, y], n)
