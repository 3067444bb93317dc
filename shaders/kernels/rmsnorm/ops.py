"""RMSNorm forward and backward (02_rmsnorm.wgsl).

Layouts (row-major, contiguous): x, y, dy, dx f32[rows, n] with rows = B*T; w, dw f32[n]
(views into the parameter/gradient buffers); rstd f32[rows] saved by the forward for the
backward.

    rmsnorm.forward(rec, x, w, y, rstd, rows, n, eps=1e-5)      # y f32, or f16 (below)
    rmsnorm.backward(rec, x, w, dy, rstd, dx, dw, rows, n, accumulate_dx=False)

y = x / sqrt(mean(x^2) + eps) * w (Llama's RMSNorm, f32 throughout). The backward writes dx
(or adds it into dx: the residual stream's gradient in a pre-norm block) and adds the weight
gradient into dw (two deterministic stages through a scratch buffer; dw may be None).

Kernels: rows whose length is a multiple of 4 (16-byte-aligned views, n <= 4 * 256 * 4)
run the rows kernels (02_rmsnorm_forward.wgsl's rmsnorm_forward_rows, 02_rmsnorm_rows.wgsl's
backward): several rows per workgroup, each row read once (the backward computes dx and the
dw partials from the same registers); others run one row per workgroup (02_rmsnorm.wgsl, the
forward's vec4 kernel in 02_rmsnorm_forward.wgsl). `path="rows"` or `path="general"` forces
one (tests, benchmarks).

f16 output: pass an f16 `y` (e.g. device.empty((rows, n), np.float16)) and the forward runs
the f16 variant of the kernel it picks (rmsnorm_forward_rows_f16 or rmsnorm_forward_vec4_f16;
the scalar kernel has none, so n % 4 == 0 and 16-byte-aligned views are needed; the device
needs shader-f16). The tensor-core matmuls read the norm's output as f16, rounding an f32 A
to f16 when staging anyway: an f16 y gives them the same values at half the bytes. The norm
is computed in f32 and rounded to nearest once at the store; values beyond the f16 range
clamp to +-65504 (as basic.cast_f32_f16) and NaN stays NaN. x, w and rstd stay f32.
"""

from __future__ import annotations

from ..op_support import (F16, F32, ceil_div, check, dummy, f16_output, positive, row_grid,
                          row_workgroup, scratch, vec_width)

FILE = "02_rmsnorm.wgsl"
FILE_ROWS = "02_rmsnorm_rows.wgsl"
FILE_FORWARD = "02_rmsnorm_forward.wgsl"   # the vec4 forwards, y f32 or f16
CW = 64
ROWS_MAX_C = 4        # vec4 columns per invocation (MAX_C in the WGSL)
ROWS_MAX_WG = 256


def rows_shape(n: int) -> tuple[int, int] | None:
    """(WG, C) of the rows kernels for rows of n floats, or None if they do not apply."""
    if n % 4:
        return None
    n4 = n // 4
    wg = min(ROWS_MAX_WG, max(32, -(-n4 // 32) * 32))
    c = -(-n4 // wg)
    return (wg, c) if c <= ROWS_MAX_C else None


def _use_rows(path, n, *views) -> bool:
    ok = rows_shape(n) is not None and all(getattr(v, "offset", 0) % 16 == 0 for v in views
                                           if v is not None)
    if path == "rows" and not ok:
        raise ValueError(f"rmsnorm: the rows kernels need n % 4 == 0, n <= "
                         f"{4 * ROWS_MAX_WG * ROWS_MAX_C} and 16-byte-aligned views (n={n})")
    if path not in (None, "rows", "general"):
        raise ValueError(f"rmsnorm: path must be 'rows', 'general' or None, got {path!r}")
    return ok and path != "general"


def block_rows(device, rows: int) -> int:
    """Rows per workgroup of the backward: about 1024 workgroups on a GPU, fewer on CPUs."""
    target = 64 if device.info.is_software else 1024
    return max(4, -(-ceil_div(rows, target) // 4) * 4)


def forward(rec, x, w, y, rstd, rows: int, n: int, eps: float = 1e-5, *,
            path: str | None = None) -> None:
    """y[r] = x[r] * rstd[r] * w, rstd[r] = 1/sqrt(mean(x[r]^2) + eps); y f32 or f16."""
    op = "rmsnorm.forward"
    positive(op, rows=rows, n=n)
    check(op, "x", x, rows * n)
    check(op, "w", w, n)
    f16 = check(op, "y", y, rows * n, dtypes=(F32, F16)) == F16
    check(op, "rstd", rstd, rows)
    dev = rec.device
    if f16:   # the rows kernel and the vec4 one have f16 variants, the scalar one none
        f16_output(op, "y", dev, vec_width(n, x, w, y) == 4, f"n % 4 == 0 (n = {n})",
                   (x, w, y))
    suffix = "_f16" if f16 else ""
    if _use_rows(path, n, x, w, y):
        wg, c = rows_shape(n)
        name = "rmsnorm_forward_rows" + suffix
        kern = dev.kernel(FILE_FORWARD, name, {"WG": wg, "C": c})
        params = dev.params("IIIIfIII", rows, n // 4, n, 0, float(eps), 0, 0, 0)
        rec.dispatch(kern, [x, w, y, rstd, params], row_grid(dev, ceil_div(rows, 4)),
                     label=name)
        return
    width = vec_width(n, x, w, y)
    name = ("rmsnorm_forward_vec4" if width == 4 else "rmsnorm_forward") + suffix
    kern = dev.kernel(FILE_FORWARD if width == 4 else FILE, name,
                      {"WG": row_workgroup(n // width)})
    params = dev.params("IIIIfIII", rows, n // width, n, 0, float(eps), 0, 0, 0)
    rec.dispatch(kern, [x, w, y, rstd, params], row_grid(dev, rows), label=name)


def backward(rec, x, w, dy, rstd, dx, dw, rows: int, n: int, *,
             accumulate_dx: bool = False, path: str | None = None) -> None:
    """dx (=, +=) the input gradient; dw += sum over rows of dy * x * rstd (if dw is given)."""
    op = "rmsnorm.backward"
    positive(op, rows=rows, n=n)
    for name, buf, count in (("x", x, rows * n), ("w", w, n), ("dy", dy, rows * n),
                             ("rstd", rstd, rows)):
        check(op, name, buf, count)
    dev = rec.device
    if dx is not None:
        check(op, "dx", dx, rows * n)
    if dw is not None:
        check(op, "dw", dw, n)
    if dx is None and dw is None:
        return
    if _use_rows(path, n, x, w, dy, dx, dw):
        _backward_rows(rec, x, w, dy, rstd, dx, dw, rows, n, accumulate_dx)
        return
    if dx is not None:
        width = vec_width(n, x, w, dy, dx)
        name = "rmsnorm_backward_vec4" if width == 4 else "rmsnorm_backward"
        kern = dev.kernel(FILE, name, {"WG": row_workgroup(n // width)})
        params = dev.params("IIIIfIII", rows, n // width, n, int(accumulate_dx), 0.0, 0, 0, 0)
        rec.dispatch(kern, [x, w, dy, rstd, dx, params], row_grid(dev, rows), label=name)
    if dw is not None:
        rows_per_block = max(32, ceil_div(rows, 1024))
        blocks = ceil_div(rows, rows_per_block)
        part = scratch(dev, "rmsnorm_dw", blocks * n * 4)
        k1 = dev.kernel(FILE, "rmsnorm_dw_partial")
        p1 = dev.params("IIIIfIII", rows, n, n, rows_per_block, 0.0, 0, 0, 0)
        rec.dispatch(k1, [x, dy, rstd, part, p1], (ceil_div(n, CW), blocks, 1),
                     label="rmsnorm_dw_partial")
        k2 = dev.kernel(FILE, "rmsnorm_dw_reduce")
        p2 = dev.params("IIIIfIII", rows, n, n, blocks, 0.0, 0, 0, 0)
        rec.dispatch(k2, [part, dw, p2], ceil_div(n, CW), label="rmsnorm_dw_reduce")


def _backward_rows(rec, x, w, dy, rstd, dx, dw, rows, n, accumulate_dx) -> None:
    dev = rec.device
    wg, c = rows_shape(n)
    rb = block_rows(dev, rows)
    blocks = ceil_div(rows, rb)
    mode = (1 if accumulate_dx else 0) | (2 if dx is not None else 0) | \
        (4 if dw is not None else 0)
    part = scratch(dev, "rmsnorm_dw_rows", blocks * n * 4) if dw is not None else dummy(dev)
    kern = dev.kernel(FILE_ROWS, "rmsnorm_backward_rows", {"WG": wg, "C": c, "RB": rb})
    params = dev.params("IIIIfIII", rows, n // 4, n, mode, 0.0, 0, 0, 0)
    rec.dispatch(kern, [x, w, dy, rstd, dx if dx is not None else dummy(dev), part, params],
                 row_grid(dev, blocks), label="rmsnorm_backward_rows")
    if dw is not None:
        red = dev.kernel(FILE_ROWS, "rmsnorm_dw_reduce_rows")
        rp = dev.params("IIIIfIII", rows, n // 4, n, blocks, 0.0, 0, 0, 0)
        rec.dispatch(red, [part, dw, rp], ceil_div(n // 4, 16), label="rmsnorm_dw_reduce_rows")
