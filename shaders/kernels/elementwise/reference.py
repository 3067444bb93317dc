"""Numpy references of the element-wise kernels; each maps a case's inputs to its outputs.

    fill:  y = alpha               scale: y = alpha x          axpy: y += alpha x (float64)
    copy:  y = x                   cast_f32_f16: clamped to +-65504, NaN kept
    cast_f16_f32: exact            rows: per row (sum in float64, max)
"""

from __future__ import annotations

import numpy as np


def fill(inp):
    return {"y": np.full(inp["x"].size, inp["alpha"], np.float32)}


def scale(inp):
    return {"y": (inp["alpha"] * inp["x"]).astype(np.float32)}


def axpy(inp):
    return {"y": (inp["alpha"].astype(np.float64) * inp["x"] + inp["y"]).astype(np.float32)}


def copy(inp):
    return {"y": inp["x"].copy()}


def cast_f32_f16(inp):
    x = inp["x"]
    with np.errstate(invalid="ignore"):
        return {"y": np.where(np.isnan(x), x, np.clip(x, -65504.0, 65504.0)).astype(np.float16)}


def cast_f16_f32(inp):
    return {"y": inp["x"].astype(np.float32)}


def rows_sum_max(inp):
    x = inp["x"].astype(np.float64)
    return {"sum_max": np.stack([x.sum(1), x.max(1)], axis=1).astype(np.float32)}
