"""Ladder entries for gradient statistics and AdamW (ops.py, reference.py, 12_optim.wgsl).

grad_stats is checked at "f32-loose": its sum of squares runs over up to ~1e8 values, each
invocation summing a strided share sequentially (relative error ~1e-6 typical, 1e-4 bound).
"""

from __future__ import annotations

import numpy as np

from ...ladder import KernelCase, Launch, register
from . import ops as optim
from .reference import HYPER, adamw_reference, stats_reference

# grad_stats: (sizes of the ranges, fill, max_norm)
STATS = {
    "random": ((100_003,), None, 1.0),
    "vec": ((4096,), None, 1e6),
    "ranges": ((1000, 37, 4096), None, 5.0),
    "nan": ((999,), "nan", 1.0),
    "inf": ((1024,), "inf", 1.0),
    "overflow": ((64,), "huge", 1.0),
    "zero": ((128,), "zero", 1.0),
    "one": ((1,), None, 0.0),
    "scaled": ((4096, 100), "scaled", 1.0),      # loss-scaled gradients (f16 training)
    "scaled_overflow": ((256,), "scaled_inf", 1.0),   # an f16 overflow came back as inf
    "bench": ((124_000_000,), None, 1.0),
    "bench_small": ((16_000_000,), None, 1.0),
}
STATS_VARIANTS = ("random", "vec", "ranges", "nan", "inf", "overflow", "zero", "one",
                  "scaled", "scaled_overflow")
LOSS_SCALE = 32768.0   # the "scaled" variants: the ranges hold the gradient times this


def stats_inputs(rng, variant):
    sizes, fill, max_norm = STATS[variant]
    gs = [(rng.standard_normal(n) * 0.01).astype(np.float32) for n in sizes]
    if fill == "nan":
        gs[0][500] = np.nan
    elif fill == "inf":
        gs[0][3] = -np.inf
    elif fill == "huge":
        gs[0][:] = 1e20   # finite, but the squares overflow f32
    elif fill == "zero":
        gs[0][:] = 0.0
    unscale = 1.0
    if fill in ("scaled", "scaled_inf"):
        gs = [g * np.float32(LOSS_SCALE) for g in gs]
        unscale = 1.0 / LOSS_SCALE
        if fill == "scaled_inf":
            gs[0][17] = np.inf
    return {"grads": gs, "max_norm": max_norm, "unscale": unscale}


def stats_launch(dev, inp):
    """All ranges live in one buffer, each at an aligned offset (like the real grads)."""
    align = optim.param_alignment(dev)
    starts, total = [], 0
    for g in inp["grads"]:
        starts.append(total)
        total += -(-g.size // align) * align
    flat = np.zeros(total, np.float32)
    for s, g in zip(starts, inp["grads"]):
        flat[s:s + g.size] = g
    buf, stats = dev.upload(flat), dev.empty(8)
    views = [buf.elements(s, g.size) for s, g in zip(starts, inp["grads"])]

    def read():
        out = dev.download(stats)
        return {"norm_sq": out[0:1], "norm": out[1:2], "factor": out[2:3],
                "flag": out[3:4].astype(np.int32), "clip": out[4:5]}
    return Launch(lambda rec: optim.grad_stats(rec, views, stats, max_norm=inp["max_norm"],
                                               unscale=inp["unscale"]), read)


register(KernelCase(
    name="grad_stats", family="optim", precision="f32-loose",
    kernels=[(optim.FILE, "reduce_norm_sq"), (optim.FILE, "reduce_norm_sq_vec4"),
             (optim.FILE, "finalize_grad_stats")],
    inputs=stats_inputs, launch=stats_launch, reference=stats_reference,
    variants=STATS_VARIANTS, bench_variant_software="bench_small",
    flops=lambda inp: 2.0 * sum(g.size for g in inp["grads"]),
    bytes=lambda inp: 4.0 * sum(g.size for g in inp["grads"]),
    description="reduce_norm_sq -> finalize_grad_stats: |g|, clip, gradient factor (clip "
                "x unscale of loss-scaled gradients), NaN/Inf flag"))


# ---- AdamW ----------------------------------------------------------------------------------

# (ranges as (count, decay), flag, clip)
ADAMW = {
    "random": (((1000, True),), 0.0, 0.5),
    "odd": (((1001, True),), 0.0, 1.0),
    "ranges": (((300, True), (17, False), (64, False), (5000, True)), 0.0, 0.8),
    "skip": (((512, True),), 1.0, 1.0),
    "one": (((1, False),), 0.0, 1.0),
    "bench": (((124_000_000, True),), 0.0, 1.0),
    "bench_small": (((8_000_000, True),), 0.0, 1.0),
}
ADAMW_VARIANTS = ("random", "odd", "ranges", "skip", "one")


def adamw_inputs(rng, variant):
    ranges, flag, clip = ADAMW[variant]
    total = sum(c for c, _ in ranges)
    return {"ranges": ranges, "stats": np.array([0, 0, clip, flag, 0, 0, 0, 0], np.float32),
            "params": rng.standard_normal(total).astype(np.float32) * 0.1,
            "grads": rng.standard_normal(total).astype(np.float32) * 0.01,
            "m": rng.standard_normal(total).astype(np.float32) * 1e-3,
            "v": np.abs(rng.standard_normal(total)).astype(np.float32) * 1e-5}


def layout(dev, ranges):
    """Aligned (start, count, decay) for the ranges, and the buffer length."""
    align = optim.param_alignment(dev)
    out, at = [], 0
    for count, decay in ranges:
        out.append((at, count, decay))
        at += -(-count // align) * align
    return out, at


def adamw_launch(dev, inp):
    placed, total = layout(dev, inp["ranges"])

    def spread(x):
        full = np.zeros(total, np.float32)
        at = 0
        for start, count, _ in placed:
            full[start:start + count] = x[at:at + count]
            at += count
        return full

    def gather(x):
        return np.concatenate([x[s:s + c] for s, c, _ in placed])

    bufs = {k: dev.upload(spread(inp[k])) for k in ("params", "grads", "m", "v")}
    mirror = dev.upload(spread(inp["params"]).astype(np.float16))
    stats = dev.upload(inp["stats"])
    hyper = dev.upload(optim.adamw_hyper(HYPER["lr"], step=HYPER["step"], beta1=HYPER["beta1"],
                                         beta2=HYPER["beta2"], eps=HYPER["eps"],
                                         weight_decay=HYPER["weight_decay"]))

    def encode(rec):
        optim.adamw_ranges(rec, bufs["params"], bufs["grads"], bufs["m"], bufs["v"], hyper,
                           stats, placed, mirror=mirror)

    def read():
        out = {k: gather(dev.download(bufs[k])) for k in ("params", "m", "v")}
        cast = gather(dev.download(mirror))
        out["mirror_is_f16_of_params"] = np.array(
            [int(np.array_equal(cast, out["params"].astype(np.float16)))], np.int32)
        return out
    return Launch(encode, read)


register(KernelCase(
    name="adamw", family="optim", precision="f32",
    kernels=[(optim.FILE, "adamw"), (optim.FILE, "adamw_vec4")],
    inputs=adamw_inputs, launch=adamw_launch, reference=adamw_reference,
    variants=ADAMW_VARIANTS, bench_variant_software="bench_small", requires=("shader-f16",),
    flops=lambda inp: 18.0 * inp["params"].size,
    bytes=lambda inp: 30.0 * inp["params"].size,
    description="multi-tensor AdamW over sub-ranges, writes the f16 mirror, skips on flag"))
