"""numpy references of the matmul family: what every kernel of shaders/kernels/matmul/ must
compute (the ladder cases in cases.py compare against these in float64)."""

from __future__ import annotations

import numpy as np

from ..case_support import f64


def logical(inp, layout, f16_math=False):
    """The float64 product op(A) @ op(B) of the logical (unpadded) matrices."""
    M, N, K = inp["M"], inp["N"], inp["K"]
    a, b = f64(inp["a"]), f64(inp["b"])
    if f16_math:
        a = f64(np.clip(inp["a"], -65504, 65504).astype(np.float16))
    A = a[:K, :M].T if layout == "tn" else a[:M, :K]
    B = b[:N, :K].T if layout == "nt" else b[:K, :N]
    return A @ B


def tensor_core_matmul(inp, layout):
    """What 03_linear_sgmat.wgsl computes: A and B each rounded to f16 (the forward's A and
    an f32 B first clamped to f16's range), products summed exactly enough (f32
    accumulation), times alpha, then the epilogue."""
    M, N, K, alpha = inp["M"], inp["N"], inp["K"], inp["alpha"]
    with np.errstate(invalid="ignore", over="ignore"):
        a = inp["a"].astype(np.float32)
        if layout == "nt":
            a = np.clip(a, -65504, 65504)
        b = inp["b"]
        if b.dtype != np.float16:
            b = np.clip(b, -65504, 65504) if layout == "nt" else b
        a16, b16 = f64(a.astype(np.float16)), f64(b.astype(np.float16))
    A = a16[:K, :M].T if layout == "tn" else a16[:M, :K]
    B = b16[:N, :K].T if layout == "nt" else b16[:K, :N]
    return epilogue(inp, alpha * (A @ B))


def epilogue(inp, prod):
    N = inp["N"]
    out = f64(inp["out"]).copy()
    if inp["mode"] == "accumulate":
        out[:, :N] += prod
    elif inp["mode"] == "residual":
        out[:, :N] = f64(inp["residual"])[:, :N] + prod
    else:
        out[:, :N] = prod
    return {"out": out.astype(np.float32)}


def matmul(inp, layout, f16_math=False):
    """out after the case's epilogue (store, accumulate, residual), in float64 then f32."""
    return epilogue(inp, inp["alpha"] * logical(inp, layout, f16_math))


def linear_backward_reference(inp):
    dy, w, x = f64(inp["dy"]), f64(inp["w"]), f64(inp["x"])
    return {"dx": (dy @ w).astype(np.float32), "dw": (inp["dw0"] + dy.T @ x).astype(np.float32)}
