"""Numpy reference of the fused cross-entropy (float64).

    per row with target t (rows whose target is the ignore index count for nothing):
        lse = log sum exp(x),  loss = lse - (1 - eps) x_t - eps/V sum(x) + z lse^2
        dlogits = ((1 + 2 z lse) softmax(x) - eps/V - (1 - eps) onehot(t)) / (valid rows)
    stats = [valid rows, sum of losses, mean loss, 0]
"""

from __future__ import annotations

import numpy as np

from ..case_support import f64
from .ops import IGNORE


def forward_backward_reference(inp):
    vocab, eps, z = inp["vocab"], inp["eps"], inp["z"]
    x = f64(inp["logits"])[:, :vocab]
    t = inp["targets"]
    valid = t != IGNORE
    m = x.max(1, keepdims=True)
    lse = (m + np.log(np.exp(x - m).sum(1, keepdims=True)))[:, 0]
    rows = np.arange(x.shape[0])
    xt = x[rows, np.where(valid, t, 0)]
    loss = np.where(valid, lse - (1 - eps) * xt - eps / vocab * x.sum(1) + z * lse ** 2, 0.0)
    count = int(valid.sum())
    scale = 1.0 / max(count, 1)
    prob = np.exp(x - lse[:, None])
    g = (1 + 2 * z * lse)[:, None] * prob - eps / vocab
    g[rows[valid], t[valid]] -= 1 - eps
    g = np.where(valid[:, None], g * scale, 0.0)
    dlogits = np.zeros(inp["logits"].shape)
    dlogits[:, :vocab] = g
    stats = np.array([count, loss.sum(), loss.sum() / max(count, 1), 0.0])
    return {"losses": loss.astype(np.float32), "stats": stats.astype(np.float32),
            "dlogits": dlogits.astype(np.float32)}


def loss_only_reference(inp):
    ref = forward_backward_reference(inp)
    del ref["dlogits"]
    return ref
