"""Ladder entries for RMSNorm (ops.py, reference.py, 02_rmsnorm*.wgsl).

The plain cases take the op's default path (the rows kernels for n % 4 == 0: random, huge,
tiny, bench; the general kernels for odd, one, wide); the *_general and *_rows cases force
one path on every variant it can run.
"""

from __future__ import annotations

import numpy as np

from ...ladder import KernelCase, Launch, register
from ..case_support import f64, fd_consistency, grad_report, run_launch, torch_grads
from . import ops as rmsnorm
from .reference import EPS, backward_reference, forward_reference, torch_rmsnorm

# (rows, n, scale of x): "huge" 1e4-sized inputs, "tiny" inputs whose squares underflow.
# "one" (n = 1) is scaled so x^2 ~ eps: for |x| >> sqrt(eps), dx = rstd*g*eps/(x^2+eps) is a
# cancellation that no f32 implementation (PyTorch's included) resolves.
SHAPES = {"random": (37, 96, 1.0), "odd": (5, 13, 1.0), "one": (1, 1, 3e-3),
          "wide": (3, 5000, 1.0), "huge": (8, 64, 1e4), "tiny": (4, 20, 1e-20),
          "bench": (8192, 768, 1.0), "bench_small": (2048, 768, 1.0),
          "rows4": (37, 4096, 1.0), "few": (3, 8, 1.0), "overflow": (6, 64, 1.0),
          "wide_overflow": (3, 5000, 1.0)}
VARIANTS = ("random", "odd", "one", "wide", "huge", "tiny")
VARIANTS_ROWS = ("random", "huge", "tiny", "rows4", "few")   # n % 4 == 0, n <= 4096
# f16 y (n % 4 == 0): the rows kernel, "wide*" the general vec4 kernel (n > 4096); "*overflow"
# scales w by 3e4 so that some of y lies past 65504, where it clamps.
VARIANTS_F16 = ("random", "huge", "tiny", "rows4", "few", "overflow", "wide", "wide_overflow")


def make_inputs(rng, variant):
    rows, n, scale = SHAPES[variant]
    w_scale = 3e4 if variant.endswith("overflow") else 1.0
    return {"x": (rng.standard_normal((rows, n)) * scale).astype(np.float32),
            "w": (w_scale * (1.0 + 0.1 * rng.standard_normal(n))).astype(np.float32),
            "dy": rng.standard_normal((rows, n)).astype(np.float32),
            "dx0": rng.standard_normal((rows, n)).astype(np.float32),
            "dw0": rng.standard_normal(n).astype(np.float32)}


def forward_launch(dev, inp, path=None, y_dtype=np.float32):
    rows, n = inp["x"].shape
    x, w = dev.upload(inp["x"]), dev.upload(inp["w"])
    y, rstd = dev.empty((rows, n), y_dtype), dev.empty(rows)
    return Launch(lambda rec: rmsnorm.forward(rec, x, w, y, rstd, rows, n, EPS, path=path),
                  lambda: {"y": dev.download(y), "rstd": dev.download(rstd)})


def backward_launch(dev, inp, accumulate=False, path=None):
    rows, n = inp["x"].shape
    rstd_host = forward_reference(inp)["rstd"]
    x, w, dy = dev.upload(inp["x"]), dev.upload(inp["w"]), dev.upload(inp["dy"])
    rstd = dev.upload(rstd_host)
    dx = dev.upload(inp["dx0"]) if accumulate else dev.empty((rows, n))
    dw = dev.upload(inp["dw0"])
    return Launch(lambda rec: rmsnorm.backward(rec, x, w, dy, rstd, dx, dw, rows, n,
                                               accumulate_dx=accumulate, path=path),
                  lambda: {"dx": dev.download(dx), "dw": dev.download(dw)})


def backward_grad(dev, rng, path=None):
    inp = make_inputs(rng, "random")
    inp["dw0"][:] = 0.0
    rows, n = inp["x"].shape
    # the backward starts from the GPU forward's rstd, as in training
    fwd = run_launch(dev, forward_launch(dev, inp, path))
    x, w, dy = dev.upload(inp["x"]), dev.upload(inp["w"]), dev.upload(inp["dy"])
    dx, dw = dev.empty((rows, n)), dev.zeros(n)
    with dev.record() as rec:
        rmsnorm.backward(rec, x, w, dy, dev.upload(fwd["rstd"]), dx, dw, rows, n, path=path)
    got = {"x": dev.download(dx), "w": dev.download(dw)}
    ref = torch_grads(torch_rmsnorm, {"x": inp["x"], "w": inp["w"]}, inp["dy"], ("x", "w"))

    def loss(params):
        out = run_launch(dev, forward_launch(dev, dict(inp, **params), path))["y"]
        return float(np.sum(f64(out) * f64(inp["dy"])))

    gap = fd_consistency(loss, {"x": inp["x"], "w": inp["w"]}, got, rng)
    return grad_report({"dx": (got["x"], ref["x"]), "dw": (got["w"], ref["w"])}, "f32", gap)


register(KernelCase(
    name="rmsnorm_forward", family="rmsnorm", precision="f32",
    kernels=[(rmsnorm.FILE, "rmsnorm_forward", {"WG": 64}),
             (rmsnorm.FILE_FORWARD, "rmsnorm_forward_vec4", {"WG": 64})],
    inputs=make_inputs, launch=forward_launch, reference=forward_reference,
    variants=VARIANTS, bench_variant_software="bench_small",
    flops=lambda inp: 4.0 * inp["x"].size,
    bytes=lambda inp: 2 * inp["x"].nbytes + inp["x"].shape[0] * 4,
    description="y = x * rsqrt(mean(x^2) + eps) * w, saves rstd"))


def forward_f16_reference(inp):
    """y: the float64 result clamped to +-65504 and rounded once to f16 (as the kernel's
    store); rstd f32."""
    x = f64(inp["x"])
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=1) + EPS)
    y = np.clip(x * rstd[:, None] * f64(inp["w"]), -65504.0, 65504.0)
    return {"y": y.astype(np.float16), "rstd": rstd.astype(np.float32)}


register(KernelCase(
    name="rmsnorm_forward_f16", family="rmsnorm", precision="f16",
    # within f16 rounding: f32 math then one rounding may land one f16 ulp (2^-10 relative)
    # from the float64 result rounded once
    thresholds={"max_rel": 2.0 ** -10},
    kernels=[(rmsnorm.FILE_FORWARD, "rmsnorm_forward_rows_f16", {"WG": 64, "C": 1}),
             (rmsnorm.FILE_FORWARD, "rmsnorm_forward_vec4_f16", {"WG": 64})],
    requires=("shader-f16",), inputs=make_inputs,
    launch=lambda dev, inp: forward_launch(dev, inp, y_dtype=np.float16),
    reference=forward_f16_reference, variants=VARIANTS_F16,
    bench_variant_software="bench_small",
    flops=lambda inp: 4.0 * inp["x"].size,
    bytes=lambda inp: 1.5 * inp["x"].nbytes + inp["x"].shape[0] * 4,
    description="RMSNorm forward into an f16 y (the tensor-core matmuls' A; clamped to "
                "+-65504, NaN kept), rstd f32"))

for accumulate in (False, True):
    register(KernelCase(
        name="rmsnorm_backward" + ("_accumulate" if accumulate else ""), family="rmsnorm",
        precision="f32",
        kernels=[(rmsnorm.FILE, "rmsnorm_backward", {"WG": 64}),
                 (rmsnorm.FILE, "rmsnorm_backward_vec4", {"WG": 64}),
                 (rmsnorm.FILE, "rmsnorm_dw_partial"), (rmsnorm.FILE, "rmsnorm_dw_reduce")],
        inputs=make_inputs,
        launch=lambda dev, inp, a=accumulate: backward_launch(dev, inp, a),
        reference=lambda inp, a=accumulate: backward_reference(inp, a),
        variants=VARIANTS, bench_variant_software="bench_small",
        grad=None if accumulate else backward_grad,
        flops=lambda inp: 10.0 * inp["x"].size,
        bytes=lambda inp, a=accumulate: (3 + a) * inp["x"].nbytes,   # x, dy, dx (+ dx read)
        description="dx (" + ("+=" if accumulate else "=") + ") and dw += of RMSNorm"))


# ---- one path forced -------------------------------------------------------------------------

for path, variants, kernels in (
        ("general", VARIANTS, [(rmsnorm.FILE_FORWARD, "rmsnorm_forward_vec4", {"WG": 64})]),
        ("rows", VARIANTS_ROWS, [(rmsnorm.FILE_FORWARD, "rmsnorm_forward_rows",
                                  {"WG": 64, "C": 1}),
                                 (rmsnorm.FILE_ROWS, "rmsnorm_backward_rows",
                                  {"WG": 64, "C": 1, "RB": 8}),
                                 (rmsnorm.FILE_ROWS, "rmsnorm_dw_reduce_rows")])):
    register(KernelCase(
        name=f"rmsnorm_forward_{path}", family="rmsnorm", precision="f32", kernels=kernels,
        inputs=make_inputs, launch=lambda dev, inp, p=path: forward_launch(dev, inp, p),
        reference=forward_reference, variants=variants, bench_variant_software="bench_small",
        flops=lambda inp: 4.0 * inp["x"].size,
        bytes=lambda inp: 2 * inp["x"].nbytes + inp["x"].shape[0] * 4,
        description=f"RMSNorm forward, {path} kernels"))
    for accumulate in (False, True):
        register(KernelCase(
            name=f"rmsnorm_backward_{path}" + ("_accumulate" if accumulate else ""),
            family="rmsnorm", precision="f32", kernels=kernels,
            inputs=make_inputs,
            launch=lambda dev, inp, a=accumulate, p=path: backward_launch(dev, inp, a, p),
            reference=lambda inp, a=accumulate: backward_reference(inp, a),
            variants=variants, bench_variant_software="bench_small",
            grad=None if accumulate else (lambda dev, rng, p=path: backward_grad(dev, rng, p)),
            flops=lambda inp: 10.0 * inp["x"].size,
            bytes=lambda inp, a=accumulate: (3 + a) * inp["x"].nbytes,
            description=f"RMSNorm dx and dw, {path} kernels"))
