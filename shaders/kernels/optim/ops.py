"""Global gradient statistics and the fused multi-tensor AdamW step (12_optim.wgsl).

One parameter buffer holds every tensor (f32), with gradients, first and second moments in
buffers of the same layout and the f16 mirror of the weights (read by the forward pass) at the
same element offsets. A step is:

    optim.grad_stats(rec, [grads], stats, max_norm=1.0)   # stats f32[8]: |g|^2, |g|, factor, flag
    hyper.write(optim.adamw_hyper(lr, step=t, ...))       # host, before the submit
    optim.adamw_ranges(rec, params, grads, m, v, hyper, stats,
                       [(start, count, decay), ...], mirror=mirror16)

`grad_stats` takes whole buffers or views; their partial sums go to a scratch buffer, then
one workgroup writes stats = (|g|^2, |g|, gradient factor, non-finite flag, clip, 0, 0, 0)
with clip = min(1, max_norm / (|g| + 1e-6)) (1 when max_norm <= 0) and factor = clip *
unscale, where `unscale` = 1 / the loss scale the stored gradients carry (f16 training's
dynamic loss scaling; 1 otherwise): |g| is the true gradient's norm, and AdamW multiplies the
stored gradient by the factor. `adamw_ranges` dispatches
once per run of consecutive ranges with the same decay, each through sub-range views of the
four buffers (and the mirror): params/m/v/mirror are updated in place, grads only read, and
nothing at all changes when stats' flag is set (NaN/Inf gradient: the step is skipped).
Range starts must be multiples of `param_alignment(device)` elements (128 is safe on every
device we know). The AdamW kernels need shader-f16.
"""

from __future__ import annotations

import math

import numpy as np

from ..op_support import F16, F32, ceil_div, check, dummy, elements_view, positive, scratch

FILE = "12_optim.wgsl"
EW = 256
MAX_GROUPS = 512


def param_alignment(device) -> int:
    """Elements a range start must be a multiple of (f32 and f16 views, vec4 loads)."""
    align = int(device.limits.get("min-storage-buffer-offset-alignment", 256))
    return max(align // 2, 8)


def adamw_hyper(lr: float, *, step: int, beta1: float = 0.9, beta2: float = 0.95,
                eps: float = 1e-8, weight_decay: float = 0.1) -> np.ndarray:
    """The per-step hyper-parameter buffer contents (f32[8]); step counts from 1."""
    if step < 1:
        raise ValueError(f"adamw_hyper: step counts from 1, got {step}")
    bc1 = 1.0 - beta1 ** step
    bc2 = 1.0 - beta2 ** step
    return np.array([lr, beta1, beta2, eps, weight_decay, lr / bc1, math.sqrt(bc2), 0.0],
                    np.float32)


def _length(res) -> int:
    dtype = np.dtype(res.dtype) if res.dtype is not None else F32
    return res.nbytes // dtype.itemsize


def grad_stats(rec, grads, stats, *, max_norm: float = 0.0, unscale: float = 1.0) -> None:
    """stats = (|g|^2, |g|, factor, flag, clip, 0...) over one or several gradient
    buffers/views holding the gradient times 1 / unscale."""
    op = "grad_stats"
    ranges = grads if isinstance(grads, (list, tuple)) else [grads]
    if not ranges:
        raise ValueError(f"{op}: no gradient ranges")
    check(op, "stats", stats, 8)
    dev = rec.device
    plan = []
    for i, g in enumerate(ranges):
        n = _length(g)
        check(op, f"grads[{i}]", g, n)
        vec = n % 4 == 0 and getattr(g, "offset", 0) % 16 == 0
        count = n // 4 if vec else n
        groups = max(1, min(MAX_GROUPS, ceil_div(count, EW * 16)))
        plan.append((g, vec, count, groups))
    slots = sum(p[3] for p in plan)
    part = scratch(dev, "grad_norm_partials", slots * 4)
    slot0 = 0
    for g, vec, count, groups in plan:
        name = "reduce_norm_sq_vec4" if vec else "reduce_norm_sq"
        params = dev.params("IIIIfffI", count, groups, slot0, 0, 0.0, 0.0, 0.0, 0)
        rec.dispatch(dev.kernel(FILE, name), [g, part, params], groups, label=name)
        slot0 += groups
    if not unscale > 0:
        raise ValueError(f"{op}: unscale must be > 0, got {unscale}")
    params = dev.params("IIIIfffI", 0, slots, 0, 0, float(max_norm), 0.0, float(unscale), 0)
    rec.dispatch(dev.kernel(FILE, "finalize_grad_stats"), [part, stats, params], 1,
                 label="finalize_grad_stats")


def adamw(rec, params, grads, m, v, hyper, stats, n: int, *, mirror=None,
          decay: bool = True) -> None:
    """One AdamW dispatch over n elements of already-sliced views (see adamw_ranges)."""
    op = "adamw"
    positive(op, n=n)
    for name, buf in (("params", params), ("grads", grads), ("m", m), ("v", v)):
        check(op, name, buf, n)
    check(op, "hyper", hyper, 8)
    check(op, "stats", stats, 8)
    if mirror is not None:
        check(op, "mirror", mirror, n, (F16,))
    dev = rec.device
    views = (params, grads, m, v) + ((mirror,) if mirror is not None else ())
    vec = n % 4 == 0 and all(getattr(b, "offset", 0) % 16 == 0 for b in views)
    count = n // 4 if vec else n
    name = "adamw_vec4" if vec else "adamw"
    uniform = dev.params("IIIIfffI", count, 0, 0, int(mirror is not None), 0.0,
                         1.0 if decay else 0.0, 0.0, 0)
    rec.dispatch(dev.kernel(FILE, name),
                 [grads, stats, hyper, params, m, v,
                  mirror if mirror is not None else dummy(dev), uniform],
                 ceil_div(count, EW), label=name)


def merge_ranges(ranges) -> list[tuple[int, int, bool]]:
    """Sorted ranges with neighbours of equal decay joined (fewer dispatches)."""
    merged: list[list] = []
    for start, count, decay in sorted((int(s), int(c), bool(d)) for s, c, d in ranges):
        if merged and merged[-1][0] + merged[-1][1] > start:
            raise ValueError(f"adamw: ranges overlap at element {start}")
        if merged and merged[-1][2] == decay and merged[-1][0] + merged[-1][1] == start:
            merged[-1][1] += count
        else:
            merged.append([start, count, decay])
    return [tuple(r) for r in merged]


def adamw_ranges(rec, params, grads, m, v, hyper, stats, ranges, *, mirror=None) -> None:
    """AdamW over [(start, count, decay)] element ranges of the four (five) whole buffers."""
    dev = rec.device
    align = param_alignment(dev)
    for start, count, decay in merge_ranges(ranges):
        positive("adamw", count=count)
        if start % align:
            raise ValueError(f"adamw: range start {start} is not a multiple of "
                             f"{align} elements (param_alignment of this device)")
        views = [b.elements(start, count) for b in (params, grads, m, v)]
        mview = elements_view(mirror, start, count) if mirror is not None else None
        adamw(rec, *views, hyper, stats, count, mirror=mview, decay=decay)
