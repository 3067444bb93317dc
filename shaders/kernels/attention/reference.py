"""numpy references of the attention family: causal GQA attention forward and backward
(float64), PyTorch's for the gradient rung, KV-cache decoding and cache writes. The ladder
cases (cases.py, decode_cases.py) compare every kernel of shaders/kernels/attention/ with
these."""

from __future__ import annotations

import math

import numpy as np

from ..case_support import f64


def _expand(x, H):
    """[B, T, Hkv, D] -> [B, T, H, D] by repeating each kv head H/Hkv times."""
    return np.repeat(x, H // x.shape[2], axis=2)


def forward_reference_f64(inp):
    q, k, v = f64(inp["q"]), _expand(f64(inp["k"]), inp["H"]), _expand(f64(inp["v"]), inp["H"])
    T, D = inp["T"], inp["D"]
    s = np.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    lse = m + np.log(np.exp(s - m).sum(-1, keepdims=True))
    prob = np.exp(s - lse)
    o = np.einsum("bhts,bshd->bthd", prob, v)
    return o, lse[..., 0], prob


def forward_reference(inp):
    o, lse, _ = forward_reference_f64(inp)
    return {"o": o.astype(np.float32), "lse": lse.astype(np.float32)}


def backward_reference(inp):
    o, _, prob = forward_reference_f64(inp)
    H, Hkv, D = inp["H"], inp["Hkv"], inp["D"]
    q, k, v = f64(inp["q"]), _expand(f64(inp["k"]), H), _expand(f64(inp["v"]), H)
    do = f64(inp["do"])
    dvec = np.einsum("bthd,bthd->bht", do, o)
    dp = np.einsum("bthd,bshd->bhts", do, v)
    ds = prob * (dp - dvec[..., None]) / math.sqrt(D)
    dq = np.einsum("bhts,bshd->bthd", ds, k)
    dk = np.einsum("bhts,bthd->bshd", ds, q)
    dv = np.einsum("bhts,bthd->bshd", prob, do)
    B, T = inp["B"], inp["T"]
    fold = lambda g: g.reshape(B, T, Hkv, H // Hkv, D).sum(3)  # noqa: E731
    return {"dq": dq.astype(np.float32), "dk": fold(dk).astype(np.float32),
            "dv": fold(dv).astype(np.float32)}


def torch_attention(q, k, v, H, Hkv):
    import torch
    rep = H // Hkv
    k = k.repeat_interleave(rep, dim=2)
    v = v.repeat_interleave(rep, dim=2)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


def decode_attention(inp):
    B, H, Hkv, D, n = inp["B"], inp["H"], inp["Hkv"], inp["D"], inp["n_ctx"]
    q = f64(inp["q"][:, :H * D]).reshape(B, H, D)
    k = np.repeat(f64(inp["k_cache"][:, :n]), H // Hkv, axis=2)   # [B, n, H, D]
    v = np.repeat(f64(inp["v_cache"][:, :n]), H // Hkv, axis=2)
    s = np.einsum("bhd,bnhd->bhn", q, k) / math.sqrt(D)
    prob = np.exp(s - s.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    return {"o": np.einsum("bhn,bnhd->bhd", prob, v).astype(np.float32)}


def kv_cache_write(inp):
    B, T, Hkv, D, pos = inp["B"], inp["T"], inp["Hkv"], inp["D"], inp["pos"]
    out = {}
    for name in ("k", "v"):
        cache = inp[name + "_cache"].copy()
        cache[:, pos:pos + T] = inp[name][:, :Hkv * D].reshape(B, T, Hkv * D)
        out[name + "_cache"] = cache
    return out
