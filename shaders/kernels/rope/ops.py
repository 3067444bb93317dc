"""Rotary position embedding, in place or into another layout (04_rope.wgsl).

Pairing is rotate-half (Hugging Face Llama): dimension i rotates with i + D/2, angle
pos * base^(-2i/D). Layout: x f32 [B, T, H, D] (element (b,t,h,d) at
(b*T + t)*token_stride + h*D + d; token_stride defaults to H*D, larger for the q or k part of
a fused qkv buffer, bound as a view starting at that part), or any (token, head, batch)
`strides` (element at b*batch + t*token + h*head + d, e.g. head-major [B, H, T, D]:
(D, T*D, H*T*D)). With `out` the rotated values go there, laid out by `out_strides` (default
x's), and x is only read: the trainer rotates q and k from the fused qkv rows into
head-major buffers for the tensor-core attention, and the gradients back. The table
f32[T_max, D/2, 2] of (cos, sin) is computed once on the host in float64 (rope_table) and
uploaded; build the PyTorch reference from the same table for bit-level parity.

    table = dev.upload(rope.rope_table(T_max, D))
    rope.forward(rec, q, table, B, T, H, D)              # q rotated in place
    rope.backward(rec, dq, table, B, T, H, D)            # dq <- R^T dq in place
    rope.forward(rec, k_new, table, B, 1, Hkv, D, pos_offset=t)   # decoding at position t
    rope.forward(rec, q, table, B, T, H, D, token_stride=W, out=q_hm,
                 out_strides=(D, T * D, H * T * D))      # fused part -> head-major

Four pairs per invocation with vec4 loads (rope_vec4, rope_vec4_out) when D % 8 == 0, every
stride is a multiple of 4 and the views are 16-byte aligned; one pair per invocation
otherwise.

`out` may be f16 (rope_vec4_out_f16, vec4 layouts only, the device needs shader-f16): the
tensor-core attention loads f16 tiles of q and k, half the bytes. The rotation is computed
in f32 and rounded to nearest once at the store; values beyond the f16 range clamp to
+-65504 (as basic.cast_f32_f16) and NaN stays NaN. x and the in-place rope stay f32.
"""

from __future__ import annotations

import numpy as np

from ..op_support import F16, F32, ceil_div, check, dtype_of, f16_output, positive

FILE = "04_rope.wgsl"
EW = 256


def rope_table(max_positions: int, head_dim: int, base: float = 10000.0) -> np.ndarray:
    """f32[max_positions, head_dim/2, 2]: (cos, sin) of pos * base^(-2i/head_dim)."""
    if head_dim % 2:
        raise ValueError(f"rope: head_dim must be even, got {head_dim}")
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.stack([np.cos(angles), np.sin(angles)], axis=-1).astype(np.float32)


def _strides(op, name, T, H, D, token_stride, strides):
    """(token, head, batch) of a tensor given a token stride or explicit strides."""
    if strides is not None:
        if token_stride is not None:
            raise ValueError(f"{op}: give {name} token_stride or strides, not both")
        s = tuple(int(v) for v in strides)
        if len(s) != 3 or min(s) < 0:
            raise ValueError(f"{op}: {name} strides {s} must be 3 (token, head, batch) >= 0")
        return s
    token_stride = H * D if token_stride is None else int(token_stride)
    if token_stride < H * D:
        raise ValueError(f"{op}: token_stride {token_stride} < H*D = {H * D}")
    return token_stride, D, T * token_stride


def _span(B, T, H, D, s):
    return (B - 1) * s[2] + (T - 1) * s[0] + (H - 1) * s[1] + D


def _rope(rec, x, table, B, T, H, D, token_stride, pos_offset, sign, op, strides=None,
          out=None, out_strides=None):
    positive(op, B=B, T=T, H=H, D=D)
    if D % 2:
        raise ValueError(f"{op}: head dim D must be even, got {D}")
    xs = _strides(op, "x", T, H, D, token_stride, strides)
    if dtype_of(x) != F32:
        raise ValueError(f"{op}: x has dtype {dtype_of(x)}; x is read (and rotated in place) "
                         "as f32: pass an f32 x (only `out` may be f16)")
    check(op, "x", x, _span(B, T, H, D, xs))
    check(op, "table", table, (pos_offset + T) * D)
    ys = xs if out_strides is None else _strides(op, "out", T, H, D, None, out_strides)
    views = [x, table]
    f16 = False
    if out is not None:
        f16 = check(op, "out", out, _span(B, T, H, D, ys), dtypes=(F32, F16)) == F16
        views.append(out)
    elif out_strides is not None:
        raise ValueError(f"{op}: out_strides without out")
    dev = rec.device
    vec = (D % 8 == 0 and all(v % 4 == 0 for v in xs + ys)
           and all(getattr(v, "offset", 0) % 16 == 0 for v in views))
    name = ("rope_vec4" if vec else "rope") + ("_out" if out is not None else "")
    if f16:
        f16_output(op, "out", dev, vec, f"D % 8 == 0 (D = {D}), every x and out stride a "
                   f"multiple of 4 (x {xs}, out {ys})", views)
        name += "_f16"
    params = dev.params("IIIIIfIIIIII", B * T, T, H, D // 2, int(pos_offset), float(sign),
                        *xs, *ys)
    pairs_per_invocation = 4 if vec else 1
    rec.dispatch(dev.kernel(FILE, name), [table, x] + ([out] if out is not None else [])
                 + [params], ceil_div(B * T * H * (D // 2) // pairs_per_invocation, EW),
                 label=op)


def forward(rec, x, table, B: int, T: int, H: int, D: int, *, token_stride: int | None = None,
            pos_offset: int = 0, strides=None, out=None, out_strides=None) -> None:
    """Rotate x[B, T, H, D] by the angles of positions pos_offset + t: in place, or into
    `out` (f32 or f16, laid out by `out_strides`, default x's) with x unchanged."""
    _rope(rec, x, table, B, T, H, D, token_stride, pos_offset, 1.0, "rope.forward", strides,
          out, out_strides)


def backward(rec, dx, table, B: int, T: int, H: int, D: int, *,
             token_stride: int | None = None, pos_offset: int = 0, strides=None, out=None,
             out_strides=None) -> None:
    """Gradient of forward: dx <- R(pos)^T dx (the inverse rotation), in place or into
    `out` as forward."""
    _rope(rec, dx, table, B, T, H, D, token_stride, pos_offset, -1.0, "rope.backward", strides,
          out, out_strides)
