"""Ladder entries for RoPE (ops.py, reference.py, 04_rope.wgsl)."""

from __future__ import annotations

import numpy as np

from ...ladder import KernelCase, Launch, register
from ..case_support import f64, fd_consistency, grad_report, run_launch, torch_grads
from . import ops as rope
from .reference import rotate

# (B, T, H, D, parts, pos_offset): parts > 1 puts x inside a fused [.., parts*H*D] row
# (the rest must stay untouched); pos_offset shifts positions as in decoding.
SHAPES = {"random": (2, 7, 3, 8, 1, 0), "odd": (1, 1, 1, 2, 1, 0), "fused": (2, 5, 2, 6, 3, 0),
          "offset": (3, 3, 2, 4, 1, 100), "long": (1, 600, 1, 16, 1, 0),
          "bench": (8, 1024, 12, 64, 1, 0), "bench_small": (8, 1024, 12, 64, 1, 0),
          # D % 8 == 0: the vec4 kernel inside a fused row and at a position offset
          "fused8": (2, 5, 2, 16, 3, 0), "offset8": (3, 3, 2, 8, 1, 100)}
VARIANTS = ("random", "odd", "fused", "offset", "long", "fused8", "offset8")


def make_inputs(rng, variant):
    B, T, H, D, parts, offset = SHAPES[variant]
    return {"B": B, "T": T, "H": H, "D": D, "offset": offset, "stride": parts * H * D,
            "x": rng.standard_normal((B, T, parts * H * D)).astype(np.float32),
            "table": rope.rope_table(offset + T + 3, D)}


def make_launch(dev, inp, sign):
    x, table = dev.upload(inp["x"]), dev.upload(inp["table"])
    fn = rope.forward if sign > 0 else rope.backward
    return Launch(lambda rec: fn(rec, x, table, inp["B"], inp["T"], inp["H"], inp["D"],
                                 token_stride=inp["stride"], pos_offset=inp["offset"]),
                  lambda: {"x": dev.download(x)})


def backward_grad(dev, rng, variant="fused"):
    inp = make_inputs(rng, variant)
    dy = rng.standard_normal(inp["x"].shape).astype(np.float32)
    got = run_launch(dev, make_launch(dev, dict(inp, x=dy), -1.0))["x"]
    import torch
    B, T, H, D = inp["B"], inp["T"], inp["H"], inp["D"]
    tab = torch.tensor(f64(inp["table"])[:T])

    def forward(x):
        q = x[:, :, :H * D].reshape(B, T, H, D)
        c, s = tab[None, :, None, :, 0], tab[None, :, None, :, 1]
        lo, hi = q[..., :D // 2], q[..., D // 2:]
        rot = torch.cat([lo * c - hi * s, hi * c + lo * s], -1).reshape(B, T, H * D)
        return torch.cat([rot, x[:, :, H * D:]], -1)

    ref = torch_grads(forward, {"x": inp["x"]}, dy, ("x",))["x"]

    def loss(params):
        out = run_launch(dev, make_launch(dev, dict(inp, x=params["x"]), 1.0))["x"]
        return float(np.sum(f64(out) * f64(dy)))

    gap = fd_consistency(loss, {"x": inp["x"]}, {"x": got}, rng)
    return grad_report({"dx": (got, ref)}, "f32", gap)


def _both_grads(dev, rng):
    """Grad checks of the scalar kernel (D = 6) and the vec4 kernel (D = 16), both fused."""
    a, b = backward_grad(dev, rng, "fused"), backward_grad(dev, rng, "fused8")
    worse = a if a.get("psnr", 1e9) <= b.get("psnr", 1e9) else b
    return dict(worse, ok=bool(a["ok"] and b["ok"]),
                detail=f"scalar: {a['detail']} | vec4: {b['detail']}")


# ---- out of place, between layouts (the trainer's q/k: fused part <-> head-major) -------
# (B, T, H, D, x layout, out layout, pos_offset); layouts: "fused" (the first part of rows
# of 3 H D), "head_major" ([B, H, T, D]); out's other elements must stay as they were.
OUT_SHAPES = {"to_head_major": (2, 5, 2, 6, "fused", "head_major", 0),
              "to_head_major8": (2, 5, 2, 16, "fused", "head_major", 3),
              "from_head_major8": (3, 4, 2, 8, "head_major", "fused", 0),
              "bench": (8, 1024, 12, 64, "fused", "head_major", 0)}
OUT_VARIANTS = ("to_head_major", "to_head_major8", "from_head_major8")


def _layout_strides(layout, T, H, D):
    return (D, T * D, H * T * D) if layout == "head_major" else (3 * H * D, D, 3 * T * H * D)


def _positions(B, T, H, D, s):
    return (np.arange(B)[:, None, None, None] * s[2] + np.arange(T)[None, :, None, None] * s[0]
            + np.arange(H)[None, None, :, None] * s[1] + np.arange(D)[None, None, None, :])


def _span(B, T, H, D, s):
    return (B - 1) * s[2] + (T - 1) * s[0] + (H - 1) * s[1] + D


def make_out_inputs(rng, variant):
    B, T, H, D, xl, yl, offset = OUT_SHAPES[variant]
    xs, ys = _layout_strides(xl, T, H, D), _layout_strides(yl, T, H, D)
    return {"B": B, "T": T, "H": H, "D": D, "offset": offset, "xs": xs, "ys": ys,
            "x": rng.standard_normal(_span(B, T, H, D, xs)).astype(np.float32),
            "y": rng.standard_normal(_span(B, T, H, D, ys)).astype(np.float32),
            "table": rope.rope_table(offset + T + 3, D)}


def out_reference(inp, sign):
    """x unchanged, y with the rotated values in place: f32, or for an f16 y the float64
    result rounded once to f16, clamped to +-65504 as the kernel."""
    B, T, H, D = inp["B"], inp["T"], inp["H"], inp["D"]
    x = inp["x"][_positions(B, T, H, D, inp["xs"])].reshape(B, T, H * D)
    y = f64(inp["y"]).copy()
    y[_positions(B, T, H, D, inp["ys"])] = rotate(inp, x, sign).reshape(B, T, H, D)
    if inp["y"].dtype == np.float16:
        return {"x": inp["x"], "y": np.clip(y, -65504.0, 65504.0).astype(np.float16)}
    return {"x": inp["x"], "y": y.astype(np.float32)}


def make_out_launch(dev, inp, sign):
    x, y, table = dev.upload(inp["x"]), dev.upload(inp["y"]), dev.upload(inp["table"])
    fn = rope.forward if sign > 0 else rope.backward
    return Launch(lambda rec: fn(rec, x, table, inp["B"], inp["T"], inp["H"], inp["D"],
                                 strides=inp["xs"], pos_offset=inp["offset"], out=y,
                                 out_strides=inp["ys"]),
                  lambda: {"x": dev.download(x), "y": dev.download(y)})


for direction, sign in (("forward", 1.0), ("backward", -1.0)):
    register(KernelCase(
        name=f"rope_{direction}_out", family="rope", precision="f32",
        kernels=[(rope.FILE, "rope_out"), (rope.FILE, "rope_vec4_out")],
        inputs=make_out_inputs, launch=lambda dev, inp, s=sign: make_out_launch(dev, inp, s),
        reference=lambda inp, s=sign: out_reference(inp, s),
        variants=OUT_VARIANTS, bench_variant_software="bench",
        flops=lambda inp: 3.0 * inp["B"] * inp["T"] * inp["H"] * inp["D"],
        bytes=lambda inp: 2 * 4 * inp["B"] * inp["T"] * inp["H"] * inp["D"]
        + 4 * inp["T"] * inp["D"],
        description=f"rotate-half RoPE {direction} into another layout (x read only)"))


# ---- f16 out: the trainer's q and k for the tensor-core attention (f16 tiles) --------
# (B, T, H, D, pos_offset, sign, scale): fused rows of 3 H D in, head-major f16 out (vec4
# kernel only: D % 8 == 0); scale 5e4 pushes rotated values past 65504, where they clamp.
F16_SHAPES = {"forward": (2, 5, 2, 16, 0, 1.0, 1.0), "backward": (2, 5, 2, 16, 0, -1.0, 1.0),
              "forward_offset": (3, 4, 2, 8, 3, 1.0, 1.0),
              "backward_offset": (3, 4, 2, 8, 3, -1.0, 1.0),
              "overflow": (2, 6, 2, 8, 0, 1.0, 5e4), "bench": (8, 1024, 12, 64, 0, 1.0, 1.0)}


def make_f16_inputs(rng, variant):
    B, T, H, D, offset, sign, scale = F16_SHAPES[variant]
    xs, ys = _layout_strides("fused", T, H, D), _layout_strides("head_major", T, H, D)
    return {"B": B, "T": T, "H": H, "D": D, "offset": offset, "sign": sign, "xs": xs, "ys": ys,
            "x": (scale * rng.standard_normal(_span(B, T, H, D, xs))).astype(np.float32),
            "y": rng.standard_normal(_span(B, T, H, D, ys)).astype(np.float16),
            "table": rope.rope_table(offset + T + 3, D)}


register(KernelCase(
    name="rope_out_f16", family="rope", precision="f16",
    # within f16 rounding: f32 math then one rounding may land one f16 ulp (2^-10 relative)
    # from the float64 result rounded once
    thresholds={"max_rel": 2.0 ** -10},
    kernels=[(rope.FILE, "rope_vec4_out_f16")], requires=("shader-f16",),
    inputs=make_f16_inputs, launch=lambda dev, inp: make_out_launch(dev, inp, inp["sign"]),
    reference=lambda inp: out_reference(inp, inp["sign"]),
    variants=("forward", "backward", "forward_offset", "backward_offset", "overflow"),
    bench_variant_software="bench",
    flops=lambda inp: 3.0 * inp["B"] * inp["T"] * inp["H"] * inp["D"],
    bytes=lambda inp: (4 + 2) * inp["B"] * inp["T"] * inp["H"] * inp["D"]
    + 4 * inp["T"] * inp["D"],
    description="rotate-half RoPE forward/backward from fused rows into head-major f16 "
                "(the tensor-core attention's q and k)"))


for direction, sign in (("forward", 1.0), ("backward", -1.0)):
    register(KernelCase(
        name=f"rope_{direction}", family="rope", precision="f32",
        kernels=[(rope.FILE, "rope"), (rope.FILE, "rope_vec4")],
        inputs=make_inputs, launch=lambda dev, inp, s=sign: make_launch(dev, inp, s),
        reference=lambda inp, s=sign: {"x": rotate(inp, inp["x"], s).astype(np.float32)},
        variants=VARIANTS, bench_variant_software="bench_small",
        grad=_both_grads if sign < 0 else None,
        flops=lambda inp: 3.0 * inp["B"] * inp["T"] * inp["H"] * inp["D"],
        bytes=lambda inp: 2 * 4 * inp["B"] * inp["T"] * inp["H"] * inp["D"]
        + 4 * inp["T"] * inp["D"],
        description=f"rotate-half RoPE {direction}, in place"))
