"""Numpy references of SwiGLU and GELU (float64, rounded to f32 at the end).

    SwiGLU: h = silu(g) * u with silu(g) = g * sigmoid(g); g and u are the two halves of the
            fused gate|up rows;  dg = dh * u * s * (1 + g (1 - s)),  du = dh * g * s
    GELU (tanh): y = x/2 * (1 + tanh(K (x + C x^3))), K = sqrt(2/pi), C = 0.044715;
            |x| > 20 saturates exactly to max(x, 0)
"""

from __future__ import annotations

import numpy as np

from ..case_support import f64


def split_gate_up(inp, gu):
    rows, F, ld, up = inp["rows"], inp["F"], inp["ld"], inp["up"]
    idx = np.arange(rows)[:, None] * ld + np.arange(F)[None, :]
    return idx, f64(gu)[idx], f64(gu)[idx + up]


def sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def swiglu_reference(inp):
    _, g, u = split_gate_up(inp, inp["gu"])
    with np.errstate(over="ignore"):
        return {"h": (g * sigmoid(g) * u).astype(np.float32)}


def swiglu_f16_reference(inp):
    """h for an f16 output: the float64 result clamped to +-65504 and rounded once to f16
    (as the kernel's store)."""
    _, g, u = split_gate_up(inp, inp["gu"])
    with np.errstate(over="ignore", invalid="ignore"):
        h = g * sigmoid(g) * u
    return {"h": np.clip(h, -65504.0, 65504.0).astype(np.float16)}


def swiglu_backward_reference(inp):
    idx, g, u = split_gate_up(inp, inp["gu"])
    s = sigmoid(g)
    dh = f64(inp["dh"])
    dgu = np.zeros(inp["gu"].size)
    dgu[idx] = dh * u * s * (1 + g * (1 - s))
    dgu[idx + inp["up"]] = dh * g * s
    with np.errstate(over="ignore"):  # "huge": products past f32's range are inf on both sides
        return {"dgu": dgu.astype(np.float32)}


K, C = np.sqrt(2 / np.pi), 0.044715


def gelu_reference(inp):
    x = f64(inp["x"])
    with np.errstate(over="ignore", invalid="ignore"):
        y = 0.5 * x * (1 + np.tanh(K * (x + C * x ** 3)))
    y = np.where(np.abs(x) > 20, np.maximum(x, 0.0), y)  # saturated exactly
    return {"y": y.astype(np.float32)}


def gelu_backward_reference(inp):
    x = np.clip(f64(inp["x"]), -20, 20)
    t = np.tanh(K * (x + C * x ** 3))
    d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * K * (1 + 3 * C * x * x)
    return {"dx": (f64(inp["dy"]) * d).astype(np.float32)}
