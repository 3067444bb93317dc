"""RMSNorm forward and backward (02_rmsnorm.wgsl).

Layouts (row-major, contiguous): x, y, dy, dx f32[rows, n] with rows = B*T; w, dw f32[n]
(views into the parameter/gradient buffers); rstd f32[rows] saved by the forward for the
backward.

    rmsnorm.forward(rec, x, w, y, rstd, rows, n, eps=1e-5)
    rmsnorm.backward(rec, x, w, dy, rstd, dx, dw, rows, n, accumulate_dx=False)

y = x / sqrt(mean(x^2) + eps) * w (Llama's RMSNorm, f32 throughout). The backward writes dx
(or adds it into dx: the residual stream's gradient in a pre-norm block) and adds the weight
gradient into dw (two deterministic stages through a scratch buffer; dw may be None).
"""

from __future__ import annotations

from ._common import ceil_div, check, positive, row_grid, row_workgroup, scratch, vec_width

FILE = "02_rmsnorm.wgsl"
CW = 64


def forward(rec, x, w, y, rstd, rows: int, n: int, eps: float = 1e-5) -> None:
    """y[r] = x[r] * rstd[r] * w, rstd[r] = 1/sqrt(mean(x[r]^2) + eps)."""
    op = "rmsnorm.forward"
    positive(op, rows=rows, n=n)
    check(op, "x", x, rows * n)
    check(op, "w", w, n)
    check(op, "y", y, rows * n)
    check(op, "rstd", rstd, rows)
    width = vec_width(n, x, w, y)
    dev = rec.device
    name = "rmsnorm_forward_vec4" if width == 4 else "rmsnorm_forward"
    kern = dev.kernel(FILE, name, {"WG": row_workgroup(n // width)})
    params = dev.params("IIIIfIII", rows, n // width, n, 0, float(eps), 0, 0, 0)
    rec.dispatch(kern, [x, w, y, rstd, params], row_grid(dev, rows), label=name)


def backward(rec, x, w, dy, rstd, dx, dw, rows: int, n: int, *,
             accumulate_dx: bool = False) -> None:
    """dx (=, +=) the input gradient; dw += sum over rows of dy * x * rstd (if dw is given)."""
    op = "rmsnorm.backward"
    positive(op, rows=rows, n=n)
    for name, buf, count in (("x", x, rows * n), ("w", w, n), ("dy", dy, rows * n),
                             ("rstd", rstd, rows)):
        check(op, name, buf, count)
    dev = rec.device
    if dx is not None:
        check(op, "dx", dx, rows * n)
        width = vec_width(n, x, w, dy, dx)
        name = "rmsnorm_backward_vec4" if width == 4 else "rmsnorm_backward"
        kern = dev.kernel(FILE, name, {"WG": row_workgroup(n // width)})
        params = dev.params("IIIIfIII", rows, n // width, n, int(accumulate_dx), 0.0, 0, 0, 0)
        rec.dispatch(kern, [x, w, dy, rstd, dx, params], row_grid(dev, rows), label=name)
    if dw is not None:
        check(op, "dw", dw, n)
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
