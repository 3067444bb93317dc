"""Numpy references of the gradient statistics and AdamW (float64).

    stats: the ranges hold g / unscale; norm_sq = unscale^2 * sum over every range of what
           they hold, squared (the sum in f32), norm, clip = min(1, max_norm / (norm + 1e-6)),
           factor = clip * unscale, flag = 1 when the sum is not finite (the update is skipped)
    AdamW: g *= clip; p *= 1 - lr wd (decayed ranges); m += (1 - b1)(g - m);
           v = b2 v + (1 - b2) g^2;  p -= lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
"""

from __future__ import annotations

import numpy as np

from ..case_support import f64


def stats_reference(inp):
    with np.errstate(over="ignore", invalid="ignore"):
        unscale = float(inp.get("unscale", 1.0))
        sq = sum(float(np.sum(f64(g) ** 2)) for g in inp["grads"])
        scaled_sq = np.float32(sq)   # the f32 sum overflows for "overflow", as on the GPU
        bad = not np.isfinite(scaled_sq)
        norm_sq = np.float64(scaled_sq) * unscale * unscale
        norm = np.sqrt(norm_sq)
        clip = 1.0
        if inp["max_norm"] > 0 and not bad:
            clip = min(1.0, inp["max_norm"] / (norm + 1e-6))
    return {"norm_sq": np.array([norm_sq], np.float32), "norm": np.array([norm], np.float32),
            "factor": np.array([clip * unscale], np.float32),
            "flag": np.array([1 if bad else 0], np.int32),
            "clip": np.array([clip], np.float32)}


HYPER = dict(lr=3e-3, step=3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)


def adamw_reference(inp):
    h = HYPER
    p, g, m, v = (f64(inp[k]).copy() for k in ("params", "grads", "m", "v"))
    if inp["stats"][3] == 0:
        g = g * f64(inp["stats"][2])
        decay = np.concatenate([np.full(c, 1.0 if d else 0.0) for c, d in inp["ranges"]])
        bc1, bc2 = 1 - h["beta1"] ** h["step"], 1 - h["beta2"] ** h["step"]
        p = p * (1 - h["lr"] * h["weight_decay"] * decay)
        m = m + (1 - h["beta1"]) * (g - m)
        v = h["beta2"] * v + (1 - h["beta2"]) * g * g
        p = p - h["lr"] / bc1 * m / (np.sqrt(v) / np.sqrt(bc2) + h["eps"])
    return {"params": p.astype(np.float32), "m": m.astype(np.float32),
            "v": v.astype(np.float32), "mirror_is_f16_of_params": np.array([1], np.int32)}
