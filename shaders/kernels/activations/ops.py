"""SwiGLU and GELU, forward and backward (06_activations.wgsl).

SwiGLU reads gate g and up u from ONE buffer `gate_up`: row r's gate at r*ld + c and its up
at r*ld + up_offset + c (c < F). The default (ld = 2F, up_offset = F) is the fused
[rows, 2F] output of a single matmul with W13 = [W_gate; W_up] stacked as [2F, d]. For two
separate [rows, F] halves stored one after the other use ld = F, up_offset = rows*F.
h, dh: f32[rows, F]; dgate_up: laid out exactly like gate_up.

    activations.swiglu_forward(rec, gate_up, h, rows, F)       # h = silu(g) * u, f32 or f16
    activations.swiglu_backward(rec, gate_up, dh, dgate_up, rows, F)
    activations.gelu_forward(rec, x, y, n)                     # GPT-2 tanh GELU
    activations.gelu_backward(rec, x, dy, dx, n)

f16 output: pass an f16 `h` (e.g. device.empty((rows, F), np.float16)) and swiglu_forward
runs swiglu_forward_vec4_f16 (vec4 layouts only: F, ld and up_offset multiples of 4 and
16-byte-aligned views; the device needs shader-f16). The tensor-core matmul that reads h
rounds an f32 A to f16 when staging anyway: an f16 h gives it the same values at half the
bytes. h is computed in f32 and rounded to nearest once at the store; values beyond the f16
range clamp to +-65504 (as basic.cast_f32_f16) and NaN stays NaN. gate_up stays f32.
"""

from __future__ import annotations

from ..op_support import F16, F32, ceil_div, check, f16_output, positive

FILE = "06_activations.wgsl"
EW = 256


def _width(*counts, views=()) -> int:
    if any(int(c) % 4 for c in counts) or any(getattr(v, "offset", 0) % 16 for v in views):
        return 1
    return 4


def _swiglu_layout(op, rows, F, ld, up_offset):
    positive(op, rows=rows, F=F)
    ld = 2 * F if ld is None else int(ld)
    up_offset = F if up_offset is None else int(up_offset)
    if ld < F:
        raise ValueError(f"{op}: ld {ld} < F {F}")
    return ld, up_offset, (rows - 1) * ld + up_offset + F


def swiglu_forward(rec, gate_up, h, rows: int, F: int, *, ld: int | None = None,
                   up_offset: int | None = None) -> None:
    """h[r, c] = silu(gate[r, c]) * up[r, c]; h f32 or f16."""
    op = "swiglu_forward"
    ld, up_offset, need = _swiglu_layout(op, rows, F, ld, up_offset)
    check(op, "gate_up", gate_up, need)
    f16 = check(op, "h", h, rows * F, dtypes=(F32, F16)) == F16
    w = _width(F, ld, up_offset, views=(gate_up, h))
    dev = rec.device
    name = op + ("_vec4" if w == 4 else "")
    if f16:
        f16_output(op, "h", dev, w == 4, f"F, ld and up_offset multiples of 4 (F = {F}, "
                   f"ld = {ld}, up_offset = {up_offset})", (gate_up, h))
        name += "_f16"
    params = dev.params("IIII", rows, F // w, ld // w, up_offset // w)
    rec.dispatch(dev.kernel(FILE, name), [gate_up, h, params], ceil_div(rows * F // w, EW),
                 label=name)


def swiglu_backward(rec, gate_up, dh, dgate_up, rows: int, F: int, *, ld: int | None = None,
                    up_offset: int | None = None) -> None:
    """dgate_up (same layout as gate_up) from dh[rows, F]; overwrites, never accumulates."""
    op = "swiglu_backward"
    ld, up_offset, need = _swiglu_layout(op, rows, F, ld, up_offset)
    check(op, "gate_up", gate_up, need)
    check(op, "dh", dh, rows * F)
    check(op, "dgate_up", dgate_up, need)
    w = _width(F, ld, up_offset, views=(gate_up, dh, dgate_up))
    dev = rec.device
    name = op + ("_vec4" if w == 4 else "")
    params = dev.params("IIII", rows, F // w, ld // w, up_offset // w)
    rec.dispatch(dev.kernel(FILE, name), [gate_up, dh, dgate_up, params],
                 ceil_div(rows * F // w, EW), label=name)


def gelu_forward(rec, x, y, n: int) -> None:
    """y = gelu_tanh(x) over n elements."""
    positive("gelu_forward", n=n)
    check("gelu_forward", "x", x, n)
    check("gelu_forward", "y", y, n)
    w = _width(n, views=(x, y))
    dev = rec.device
    name = "gelu_forward" + ("_vec4" if w == 4 else "")
    rec.dispatch(dev.kernel(FILE, name), [x, y, dev.params("IIII", 1, n // w, 0, 0)],
                 ceil_div(n // w, EW), label=name)


def gelu_backward(rec, x, dy, dx, n: int) -> None:
    """dx = dy * gelu_tanh'(x) over n elements."""
    positive("gelu_backward", n=n)
    for name, buf in (("x", x), ("dy", dy), ("dx", dx)):
        check("gelu_backward", name, buf, n)
    w = _width(n, views=(x, dy, dx))
    dev = rec.device
    name = "gelu_backward" + ("_vec4" if w == 4 else "")
    rec.dispatch(dev.kernel(FILE, name), [x, dy, dx, dev.params("IIII", 1, n // w, 0, 0)],
                 ceil_div(n // w, EW), label=name)
