"""Ladder entries for SwiGLU and GELU (ops.py, reference.py, 06_activations.wgsl)."""

from __future__ import annotations

import numpy as np

from ...ladder import KernelCase, Launch, register
from ..case_support import f64, fd_consistency, grad_report, run_launch, torch_grads
from . import ops as activations
from .reference import (gelu_backward_reference, gelu_reference, split_gate_up,
                        swiglu_backward_reference, swiglu_f16_reference, swiglu_reference)

# SwiGLU (rows, F, layout, scale): "fused" [rows, 2F]; "halves" two [rows, F] blocks;
# "huge" saturates sigmoid at +-1e4 and beyond.
SWIGLU = {"random": (37, 24, "fused", 2.0), "odd": (3, 5, "fused", 2.0),
          "halves": (6, 8, "halves", 2.0), "huge": (4, 16, "fused", 1e4),
          "one": (1, 1, "fused", 1.0), "bench": (8192, 2048, "fused", 1.0),
          "bench_small": (2048, 2048, "fused", 1.0), "overflow": (5, 32, "fused", 400.0)}
SWIGLU_VARIANTS = ("random", "odd", "halves", "huge", "one")
# f16 h (vec4 layouts only): "overflow" puts part of h past 65504, "huge" nearly all of it
# (and f32 inf for g = 3e38), where it clamps.
SWIGLU_F16_VARIANTS = ("random", "halves", "overflow", "huge")
GELU = {"random": (1001, 3.0), "vec": (1024, 3.0), "huge": (64, 1e4), "extreme": (8, 1e30),
        "one": (1, 1.0), "bench": (8192 * 3072, 1.0), "bench_small": (2048 * 3072, 1.0)}
GELU_VARIANTS = ("random", "vec", "huge", "extreme", "one")


def _layout(rows, F, kind):
    return (2 * F, F) if kind == "fused" else (F, rows * F)


def swiglu_inputs(rng, variant):
    rows, F, kind, scale = SWIGLU[variant]
    ld, up = _layout(rows, F, kind)
    size = (rows - 1) * ld + up + F
    gu = (rng.standard_normal(size) * scale).astype(np.float32)
    if variant == "huge":
        gu[:4] = [3e38, -3e38, 1e4, -1e4]
    return {"rows": rows, "F": F, "ld": ld, "up": up, "gu": gu,
            "dh": rng.standard_normal((rows, F)).astype(np.float32)}


def swiglu_launch(dev, inp, h_dtype=np.float32):
    gu, h = dev.upload(inp["gu"]), dev.empty((inp["rows"], inp["F"]), h_dtype)
    return Launch(lambda rec: activations.swiglu_forward(rec, gu, h, inp["rows"], inp["F"],
                                                         ld=inp["ld"], up_offset=inp["up"]),
                  lambda: {"h": dev.download(h)})


def swiglu_backward_launch(dev, inp):
    gu, dh = dev.upload(inp["gu"]), dev.upload(inp["dh"])
    dgu = dev.zeros(inp["gu"].size)
    return Launch(lambda rec: activations.swiglu_backward(rec, gu, dh, dgu, inp["rows"],
                                                          inp["F"], ld=inp["ld"],
                                                          up_offset=inp["up"]),
                  lambda: {"dgu": dev.download(dgu)})


def swiglu_grad(dev, rng):
    inp = swiglu_inputs(rng, "random")
    got = run_launch(dev, swiglu_backward_launch(dev, inp))["dgu"]
    import torch
    idx = torch.tensor(split_gate_up(inp, inp["gu"])[0])

    def forward(gu):
        g, u = gu[idx], gu[idx + inp["up"]]
        return torch.nn.functional.silu(g) * u

    ref = torch_grads(forward, {"gu": inp["gu"]}, inp["dh"], ("gu",))["gu"]

    def loss(params):
        h = run_launch(dev, swiglu_launch(dev, dict(inp, gu=params["gu"])))["h"]
        return float(np.sum(f64(h) * f64(inp["dh"])))

    gap = fd_consistency(loss, {"gu": inp["gu"]}, {"gu": got}, rng, rel_step=1e-3)
    return grad_report({"dgu": (got, ref)}, "f32", gap)


def gelu_inputs(rng, variant):
    n, scale = GELU[variant]
    x = (rng.standard_normal(n) * scale).astype(np.float32)
    if variant == "extreme":
        x[:4] = [3e38, -3e38, 0.0, -0.0]
    return {"x": x, "dy": rng.standard_normal(n).astype(np.float32)}


def gelu_launch(dev, inp):
    x, y = dev.upload(inp["x"]), dev.empty(inp["x"].size)
    return Launch(lambda rec: activations.gelu_forward(rec, x, y, inp["x"].size),
                  lambda: {"y": dev.download(y)})


def gelu_backward_launch(dev, inp):
    x, dy, dx = dev.upload(inp["x"]), dev.upload(inp["dy"]), dev.empty(inp["x"].size)
    return Launch(lambda rec: activations.gelu_backward(rec, x, dy, dx, inp["x"].size),
                  lambda: {"dx": dev.download(dx)})


def gelu_grad(dev, rng):
    inp = gelu_inputs(rng, "random")
    got = run_launch(dev, gelu_backward_launch(dev, inp))["dx"]
    import torch
    ref = torch_grads(lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
                      {"x": inp["x"]}, inp["dy"], ("x",))["x"]

    def loss(params):
        y = run_launch(dev, gelu_launch(dev, dict(inp, x=params["x"])))["y"]
        return float(np.sum(f64(y) * f64(inp["dy"])))

    gap = fd_consistency(loss, {"x": inp["x"]}, {"x": got}, rng, rel_step=1e-3)
    return grad_report({"dx": (got, ref)}, "f32", gap)


def _kernels(prefix):
    return [(activations.FILE, prefix), (activations.FILE, prefix + "_vec4")]


register(KernelCase(
    name="swiglu_forward", family="activations", precision="f32",
    kernels=_kernels("swiglu_forward"), inputs=swiglu_inputs, launch=swiglu_launch,
    reference=swiglu_reference, variants=SWIGLU_VARIANTS, bench_variant_software="bench_small",
    flops=lambda inp: 6.0 * inp["rows"] * inp["F"],
    bytes=lambda inp: 12.0 * inp["rows"] * inp["F"], description="h = silu(gate) * up"))
register(KernelCase(
    name="swiglu_forward_f16", family="activations", precision="f16",
    # within f16 rounding: f32 math then one rounding may land one f16 ulp (2^-10 relative)
    # from the float64 result rounded once
    thresholds={"max_rel": 2.0 ** -10},
    kernels=[(activations.FILE, "swiglu_forward_vec4_f16")], requires=("shader-f16",),
    inputs=swiglu_inputs, launch=lambda dev, inp: swiglu_launch(dev, inp, np.float16),
    reference=swiglu_f16_reference, variants=SWIGLU_F16_VARIANTS,
    bench_variant_software="bench_small",
    flops=lambda inp: 6.0 * inp["rows"] * inp["F"],
    bytes=lambda inp: 10.0 * inp["rows"] * inp["F"],
    description="h = silu(gate) * up into an f16 h (the tensor-core W2 matmul's A; clamped "
                "to +-65504, NaN kept)"))
register(KernelCase(
    name="swiglu_backward", family="activations", precision="f32",
    kernels=_kernels("swiglu_backward"), inputs=swiglu_inputs, launch=swiglu_backward_launch,
    reference=swiglu_backward_reference, variants=SWIGLU_VARIANTS,
    bench_variant_software="bench_small", grad=swiglu_grad,
    flops=lambda inp: 12.0 * inp["rows"] * inp["F"],
    bytes=lambda inp: 20.0 * inp["rows"] * inp["F"], description="d(gate, up) of SwiGLU"))
register(KernelCase(
    name="gelu_forward", family="activations", precision="f32",
    kernels=_kernels("gelu_forward"), inputs=gelu_inputs, launch=gelu_launch,
    reference=gelu_reference, variants=GELU_VARIANTS, bench_variant_software="bench_small",
    flops=lambda inp: 12.0 * inp["x"].size, bytes=lambda inp: 8.0 * inp["x"].size,
    description="GPT-2 tanh GELU"))
register(KernelCase(
    name="gelu_backward", family="activations", precision="f32",
    kernels=_kernels("gelu_backward"), inputs=gelu_inputs, launch=gelu_backward_launch,
    reference=gelu_backward_reference, variants=GELU_VARIANTS,
    bench_variant_software="bench_small", grad=gelu_grad,
    flops=lambda inp: 20.0 * inp["x"].size, bytes=lambda inp: 12.0 * inp["x"].size,
    description="dx = dy * gelu'(x)"))
