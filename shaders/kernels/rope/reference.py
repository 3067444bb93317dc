"""Numpy reference of RoPE (rotate-half, float64).

    for each head's first/second half (lo, hi) at position p with (cos, sin) = table[p]:
        forward  (sign +1): lo' = lo cos - hi sin,  hi' = hi cos + lo sin
        backward (sign -1): the inverse rotation (the transpose of the forward)
"""

from __future__ import annotations

from ..case_support import f64


def rotate(inp, x, sign):
    """float64 rotate-half of the first H*D columns of x[B, T, stride]."""
    B, T, H, D, off = inp["B"], inp["T"], inp["H"], inp["D"], inp["offset"]
    out = f64(x).copy()
    tab = f64(inp["table"])[off:off + T]                      # [T, D/2, 2]
    c, s = tab[None, :, None, :, 0], sign * tab[None, :, None, :, 1]
    q = out[:, :, :H * D].reshape(B, T, H, D)
    lo, hi = q[..., :D // 2].copy(), q[..., D // 2:].copy()
    q[..., :D // 2] = lo * c - hi * s
    q[..., D // 2:] = hi * c + lo * s
    out[:, :, :H * D] = q.reshape(B, T, H * D)
    return out
