"""Rotary position embedding, in place (04_rope.wgsl).

Pairing is rotate-half (Hugging Face Llama): dimension i rotates with i + D/2, angle
pos * base^(-2i/D). Layout: x f32 [B, T, H, D] (element (b,t,h,d) at
(b*T + t)*token_stride + h*D + d; token_stride defaults to H*D, larger for the q or k part of
a fused qkv buffer, bound as a view starting at that part). The table f32[T_max, D/2, 2]
of (cos, sin) is computed once on the host in float64 (rope_table) and uploaded; build the
PyTorch reference from the same table for bit-level parity.

    table = dev.upload(rope.rope_table(T_max, D))
    rope.forward(rec, q, table, B, T, H, D)              # q rotated in place
    rope.backward(rec, dq, table, B, T, H, D)            # dq <- R^T dq in place
    rope.forward(rec, k_new, table, B, 1, Hkv, D, pos_offset=t)   # decoding at position t

Four pairs per invocation with vec4 loads (rope_vec4) when D % 8 == 0, the token stride is
a multiple of 4 and the views are 16-byte aligned; one pair per invocation otherwise.
"""

from __future__ import annotations

import numpy as np

from ..op_support import ceil_div, check, positive

FILE = "04_rope.wgsl"
EW = 256


def rope_table(max_positions: int, head_dim: int, base: float = 10000.0) -> np.ndarray:
    """f32[max_positions, head_dim/2, 2]: (cos, sin) of pos * base^(-2i/head_dim)."""
    if head_dim % 2:
        raise ValueError(f"rope: head_dim must be even, got {head_dim}")
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1).astype(np.float32)


def _rope(rec, x, table, B, T, H, D, token_stride, pos_offset, sign, op):
    positive(op, B=B, T=T, H=H, D=D)
    if D % 2:
        raise ValueError(f"{op}: head dim D must be even, got {D}")
    token_stride = H * D if token_stride is None else int(token_stride)
    if token_stride < H * D:
        raise ValueError(f"{op}: token_stride {token_stride} < H*D = {H * D}")
    check(op, "x", x, (B * T - 1) * token_stride + H * D)
    check(op, "table", table, (pos_offset + T) * D)
    dev = rec.device
    vec = (D % 8 == 0 and token_stride % 4 == 0
           and all(getattr(v, "offset", 0) % 16 == 0 for v in (x, table)))
    kern = dev.kernel(FILE, "rope_vec4" if vec else "rope")
    params = dev.params("IIIIIIfI", B * T, T, H, D // 2, token_stride, int(pos_offset),
                        float(sign), 0)
    pairs_per_invocation = 4 if vec else 1
    rec.dispatch(kern, [table, x, params],
                 ceil_div(B * T * H * (D // 2) // pairs_per_invocation, EW), label=op)


def forward(rec, x, table, B: int, T: int, H: int, D: int, *, token_stride: int | None = None,
            pos_offset: int = 0) -> None:
    """Rotate x[B, T, H, D] in place by the angles of positions pos_offset + t."""
    _rope(rec, x, table, B, T, H, D, token_stride, pos_offset, 1.0, "rope.forward")


def backward(rec, dx, table, B: int, T: int, H: int, D: int, *,
             token_stride: int | None = None, pos_offset: int = 0) -> None:
    """Gradient of forward, in place: dx <- R(pos)^T dx (the inverse rotation)."""
    _rope(rec, dx, table, B, T, H, D, token_stride, pos_offset, -1.0, "rope.backward")
