"""Causal multi-head attention with GQA, forward and backward (05_attention.wgsl).

Layouts (f32, row-major; B batch, T sequence, H query heads, Hkv kv heads, D head dim):

    q, dq   [B, T, H, D]    element (b,t,h,d) at (b*T + t)*q_stride + h*D + d  (q_stride = H*D)
    k, v    [B, T, Hkv, D]  ... at (b*T + t)*kv_stride + h*D + d              (kv_stride = Hkv*D)
    dk, dv  like k, v (same kv_stride)
    o, do   [B, T, H, D]    token stride o_stride (default H*D): o feeds the Wo matmul as
                            [B*T, H*D]
    lse     [B, H, T]       natural-log log-sum-exp of each query's scaled scores

Query head h uses kv head h // (H // Hkv) (Hugging Face's repeat_kv grouping). With a fused
qkv projection output [B*T, (H + 2*Hkv)*D] bind q, k and v as views starting at their part
and pass q_stride = kv_stride = (H + 2*Hkv)*D; dq/dk/dv may likewise be views into one
fused gradient buffer (then feed it to the fused projection's backward).

    attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D)
    attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H, Hkv, D)

scale defaults to 1/sqrt(D). The backward writes (never accumulates) dq, dk, dv; it runs a
prep dispatch (dvec = rowsum(do * o) into a scratch buffer), the dQ kernel and the dK/dV
kernel (which sums the H/Hkv query heads of each kv head itself: deterministic, no atomics).
"""

from __future__ import annotations

import math

from ._common import ceil_div, check, grid2d, positive, scratch, workgroup_storage

FILE = "05_attention.wgsl"
MAX_COLS, MAX_ROWS = 32, 16


def _threads_per_row(D: int) -> int:
    for tpr in (8, 4, 2, 1):
        if D % tpr == 0 and D // tpr <= MAX_COLS:
            return tpr
    raise ValueError(f"attention: head dim {D} is too large (at most {8 * MAX_COLS})")


def _floats(kernel: str, rows: int, other: int, D: int) -> int:
    """Workgroup floats of a kernel; rows = BQ (forward, dq) or BKV (dkv), other the tile."""
    pad = D + 1
    if kernel == "forward":
        return rows * pad + 2 * other * pad + rows * (other + 1)
    if kernel == "dq":
        return 2 * rows * pad + 2 * other * pad + rows * (other + 1)
    return 2 * rows * pad + 2 * other * pad + 2 * rows * (other + 1) + 2 * other


def choose_tiles(device, D: int, kernel: str, tiles=None) -> dict:
    """Override constants {HD, BQ, BKV, WG} for kernel "forward", "dq" or "dkv".

    `tiles=(rows, other)` forces a shape (rows: BQ for forward/dq, BKV for dkv); otherwise the
    largest tiles that fit the device's workgroup memory (1 KiB kept for the preamble).
    """
    tpr = _threads_per_row(D)
    budget = (workgroup_storage(device) - 1024) // 4
    max_wg = min(256, int(device.limits.get("max-compute-invocations-per-workgroup", 256)))
    if tiles is not None:
        shapes = [tuple(int(t) for t in tiles)]
    else:
        shapes = [(r, o) for r in (32, 16, 8, 4) for o in (32, 16, 8, 4)]
    for rows, other in shapes:
        ok = (rows * tpr <= max_wg and other % tpr == 0 and other // tpr <= MAX_ROWS
              and _floats(kernel, rows, other, D) <= budget)
        if ok:
            bq, bkv = (rows, other) if kernel != "dkv" else (other, rows)
            return {"HD": D, "BQ": bq, "BKV": bkv, "WG": rows * tpr}
        if tiles is not None:
            raise ValueError(f"attention {kernel}: tiles {tiles} do not fit head dim {D} "
                             f"(threads per row {tpr}, workgroup memory {budget * 4} bytes)")
    raise ValueError(f"attention {kernel}: no tile fits head dim {D} in "
                     f"{budget * 4} bytes of workgroup memory")


def _layout(op, B, T, H, Hkv, D, q_stride, kv_stride, o_stride):
    positive(op, B=B, T=T, H=H, Hkv=Hkv, D=D)
    if H % Hkv:
        raise ValueError(f"{op}: H={H} is not a multiple of Hkv={Hkv}")
    q_stride = H * D if q_stride is None else int(q_stride)
    kv_stride = Hkv * D if kv_stride is None else int(kv_stride)
    o_stride = H * D if o_stride is None else int(o_stride)
    if q_stride < H * D or kv_stride < Hkv * D or o_stride < H * D:
        raise ValueError(f"{op}: token strides ({q_stride}, {kv_stride}, {o_stride}) are "
                         f"shorter than the rows ({H * D}, {Hkv * D}, {H * D})")
    rows = B * T - 1
    return (q_stride, kv_stride, o_stride,
            rows * q_stride + H * D, rows * kv_stride + Hkv * D, rows * o_stride + H * D)


def _params(dev, B, T, H, Hkv, strides, scale):
    return dev.params("IIIIIIIIfIII", B, T, H, Hkv, strides[0], strides[1], strides[2], 0,
                      float(scale), 0, 0, 0)


def forward(rec, q, k, v, o, lse, B: int, T: int, H: int, Hkv: int, D: int, *,
            scale: float | None = None, q_stride: int | None = None,
            kv_stride: int | None = None, o_stride: int | None = None, tiles=None) -> None:
    """o = causal softmax(q k^T * scale) v per head; lse saved for the backward."""
    op = "attention.forward"
    *strides, nq, nkv, no = _layout(op, B, T, H, Hkv, D, q_stride, kv_stride, o_stride)
    check(op, "q", q, nq)
    check(op, "k", k, nkv)
    check(op, "v", v, nkv)
    check(op, "o", o, no)
    check(op, "lse", lse, B * H * T)
    dev = rec.device
    consts = choose_tiles(dev, D, "forward", tiles)
    kern = dev.kernel(FILE, "attention_forward", consts)
    params = _params(dev, B, T, H, Hkv, strides, 1 / math.sqrt(D) if scale is None else scale)
    rec.dispatch(kern, [q, k, v, o, lse, params],
                 grid2d(dev, op, ceil_div(T, consts["BQ"]), B * H), label="attention_forward")


def backward(rec, q, k, v, o, do, lse, dq, dk, dv, B: int, T: int, H: int, Hkv: int, D: int,
             *, scale: float | None = None, q_stride: int | None = None,
             kv_stride: int | None = None, o_stride: int | None = None,
             tiles_dq=None, tiles_dkv=None) -> None:
    """dq, dk, dv (written, not accumulated) from do and the forward's q, k, v, o, lse."""
    op = "attention.backward"
    *strides, nq, nkv, no = _layout(op, B, T, H, Hkv, D, q_stride, kv_stride, o_stride)
    for name, buf, count in (("q", q, nq), ("k", k, nkv), ("v", v, nkv), ("o", o, no),
                             ("do", do, no), ("lse", lse, B * H * T), ("dq", dq, nq),
                             ("dk", dk, nkv), ("dv", dv, nkv)):
        check(op, name, buf, count)
    dev = rec.device
    params = _params(dev, B, T, H, Hkv, strides, 1 / math.sqrt(D) if scale is None else scale)
    dvec = scratch(dev, "attention_dvec", B * H * T * 4)
    prep = dev.kernel(FILE, "attention_backward_prep", {"HD": D})
    rec.dispatch(prep, [o, do, dvec, params], ceil_div(B * T * H, 256),
                 label="attention_backward_prep")
    c_dq = choose_tiles(dev, D, "dq", tiles_dq)
    rec.dispatch(dev.kernel(FILE, "attention_backward_dq", c_dq),
                 [q, k, v, do, lse, dvec, dq, params],
                 grid2d(dev, op, ceil_div(T, c_dq["BQ"]), B * H), label="attention_backward_dq")
    c_kv = choose_tiles(dev, D, "dkv", tiles_dkv)
    rec.dispatch(dev.kernel(FILE, "attention_backward_dkv", c_kv),
                 [q, k, v, do, lse, dvec, dk, dv, params],
                 grid2d(dev, op, ceil_div(T, c_kv["BKV"]), B * Hkv),
                 label="attention_backward_dkv")
