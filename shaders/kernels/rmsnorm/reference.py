"""Numpy references of RMSNorm (float64, rounded to f32 at the end), and the torch forward
the grad rung differentiates.

    forward:  rstd = 1 / sqrt(mean(x^2) + eps),  y = x * rstd * w
    backward: g = dy * w,  dx = rstd * (g - xhat * mean(g * xhat)) (+ dx0),
              dw = dw0 + sum over rows of dy * xhat,  xhat = x * rstd
"""

from __future__ import annotations

import numpy as np

from ..case_support import f64


EPS = 1e-5


def forward_reference(inp):
    x = f64(inp["x"])
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=1) + EPS)
    return {"y": (x * rstd[:, None] * f64(inp["w"])).astype(np.float32),
            "rstd": rstd.astype(np.float32)}


def backward_reference(inp, accumulate):
    x, w, dy = f64(inp["x"]), f64(inp["w"]), f64(inp["dy"])
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=1) + EPS)[:, None]
    xhat = x * rstd
    g = dy * w
    dx = rstd * (g - xhat * np.mean(g * xhat, axis=1, keepdims=True))
    if accumulate:
        dx = dx + f64(inp["dx0"])
    dw = f64(inp["dw0"]) + np.sum(dy * xhat, axis=0)
    return {"dx": dx.astype(np.float32), "dw": dw.astype(np.float32)}


def torch_rmsnorm(x, w):
    import torch
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w
