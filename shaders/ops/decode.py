"""Decoding with a KV cache: cache writes and single-query attention (05_attention_decode.wgsl).

Layouts (f32): k_cache, v_cache [B, Tmax, Hkv, D] contiguous (per sequence Tmax positions);
new keys/values [B, T, Hkv, D] with token stride src_stride (the k or v part of a fused
[B*T, (H+2Hkv)*D] projection: bind views starting at the part); q [B, H, D] with batch
stride q_stride (one new token per sequence); o [B, H, D] contiguous. All sequences of a
batch share the cache length n_ctx (positions 0..n_ctx-1 are attended, the new token's
included: write it first).

    decode.cache_write(rec, k_new, v_new, k_cache, v_cache, B, T, Hkv, D, pos=0, t_max=Tmax)
    ... rope.forward on q and k_new with pos_offset = position, before the write ...
    decode.attention(rec, q, k_cache, v_cache, o, B, H, Hkv, D, n_ctx=pos + 1, t_max=Tmax)

The attention splits the cache into chunks of 128 positions (one workgroup each, a
partial softmax per chunk into a scratch buffer) and combines them in a second dispatch, so
long contexts use many workgroups even at batch 1 (flash-decoding).
"""

from __future__ import annotations

import math

from ..kernels.op_support import ceil_div, check, grid2d, positive, scratch

FILE = "05_attention_decode.wgsl"
CHUNK = 128   # = WG of decode_partial


def _params(dev, B, H, Hkv, D, n_ctx, t_max, stride, pos, chunks, scale):
    return dev.params("IIIIIIIIIfII", B, H, Hkv, D, n_ctx, t_max, stride, pos, chunks,
                      float(scale), 0, 0)


def cache_write(rec, k_src, v_src, k_cache, v_cache, B: int, T: int, Hkv: int, D: int, *,
                pos: int, t_max: int, src_stride: int | None = None) -> None:
    """Copy T new tokens' keys and values into the caches at positions pos..pos+T-1."""
    op = "decode.cache_write"
    positive(op, B=B, T=T, Hkv=Hkv, D=D, t_max=t_max)
    if pos < 0 or pos + T > t_max:
        raise ValueError(f"{op}: positions {pos}..{pos + T - 1} do not fit a cache of {t_max}")
    stride = Hkv * D if src_stride is None else int(src_stride)
    if stride < Hkv * D:
        raise ValueError(f"{op}: src_stride {stride} < Hkv*D = {Hkv * D}")
    for name, buf in (("k_src", k_src), ("v_src", v_src)):
        check(op, name, buf, (B * T - 1) * stride + Hkv * D)
    for name, buf in (("k_cache", k_cache), ("v_cache", v_cache)):
        check(op, name, buf, B * t_max * Hkv * D)
    dev = rec.device
    params = _params(dev, B, 0, Hkv, D, T, t_max, stride, pos, 0, 0.0)
    rec.dispatch(dev.kernel(FILE, "kv_cache_write"), [k_src, v_src, k_cache, v_cache, params],
                 ceil_div(B * T * Hkv * D, 256), label="kv_cache_write")


def attention(rec, q, k_cache, v_cache, o, B: int, H: int, Hkv: int, D: int, *, n_ctx: int,
              t_max: int, scale: float | None = None, q_stride: int | None = None) -> None:
    """o[b, h] = softmax(q[b, h] . k_cache[b, :n_ctx] * scale) v_cache[b, :n_ctx]."""
    op = "decode.attention"
    positive(op, B=B, H=H, Hkv=Hkv, D=D, n_ctx=n_ctx, t_max=t_max)
    if H % Hkv:
        raise ValueError(f"{op}: H={H} is not a multiple of Hkv={Hkv}")
    if D > 256:
        raise ValueError(f"{op}: head dim {D} > 256")
    if n_ctx > t_max:
        raise ValueError(f"{op}: n_ctx {n_ctx} exceeds the cache capacity {t_max}")
    stride = H * D if q_stride is None else int(q_stride)
    if stride < H * D:
        raise ValueError(f"{op}: q_stride {stride} < H*D = {H * D}")
    check(op, "q", q, (B - 1) * stride + H * D)
    for name, buf in (("k_cache", k_cache), ("v_cache", v_cache)):
        check(op, name, buf, B * t_max * Hkv * D)
    check(op, "o", o, B * H * D)
    dev = rec.device
    chunks = ceil_div(n_ctx, CHUNK)
    part = scratch(dev, "decode_partials", B * H * chunks * (D + 2) * 4)
    params = _params(dev, B, H, Hkv, D, n_ctx, t_max, stride, 0, chunks,
                     1 / math.sqrt(D) if scale is None else scale)
    consts = {"WG": CHUNK}
    rec.dispatch(dev.kernel(FILE, "decode_partial", consts), [q, k_cache, v_cache, part, params],
                 grid2d(dev, op, chunks, B * H), label="decode_partial")
    rec.dispatch(dev.kernel(FILE, "decode_combine", consts), [part, o, params],
                 grid2d(dev, op, B * H, 1), label="decode_combine")
