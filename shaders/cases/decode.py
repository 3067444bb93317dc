"""Ladder entries for decoding: KV-cache writes and single-query attention (ops/decode.py)."""

from __future__ import annotations

import math

import numpy as np

from ..ladder import KernelCase, Launch, register
from ..ops import decode
from ..kernels.case_support import f64

# (B, H, Hkv, D, n_ctx, t_max, q_stride_extra)
SHAPES = {
    "random": (2, 4, 2, 16, 37, 64, 0),
    "gqa4": (3, 4, 1, 32, 130, 130, 0),
    "one": (1, 1, 1, 4, 1, 8, 0),
    "odd_dim": (1, 3, 3, 6, 9, 16, 0),
    "strided": (2, 2, 1, 8, 20, 32, 40),
    "long": (1, 2, 1, 16, 1000, 1024, 0),
    "bench": (8, 12, 12, 64, 1024, 1024, 0),
    "bench_small": (8, 12, 12, 64, 1024, 1024, 0),
}
VARIANTS = ("random", "gqa4", "one", "odd_dim", "strided", "long")


def make_inputs(rng, variant):
    B, H, Hkv, D, n_ctx, t_max, extra = SHAPES[variant]
    q_stride = H * D + extra
    q = np.full((B, q_stride), np.nan, np.float32)   # padding must never be read
    q[:, :H * D] = rng.standard_normal((B, H * D))
    kc = rng.standard_normal((B, t_max, Hkv, D)).astype(np.float32)
    vc = rng.standard_normal((B, t_max, Hkv, D)).astype(np.float32)
    kc[:, n_ctx:] = np.nan   # positions past n_ctx must never be read
    vc[:, n_ctx:] = np.nan
    return {"B": B, "H": H, "Hkv": Hkv, "D": D, "n_ctx": n_ctx, "t_max": t_max,
            "q_stride": q_stride, "q": q, "k_cache": kc, "v_cache": vc}


def reference(inp):
    B, H, Hkv, D, n = inp["B"], inp["H"], inp["Hkv"], inp["D"], inp["n_ctx"]
    q = f64(inp["q"][:, :H * D]).reshape(B, H, D)
    k = np.repeat(f64(inp["k_cache"][:, :n]), H // Hkv, axis=2)   # [B, n, H, D]
    v = np.repeat(f64(inp["v_cache"][:, :n]), H // Hkv, axis=2)
    s = np.einsum("bhd,bnhd->bhn", q, k) / math.sqrt(D)
    prob = np.exp(s - s.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    return {"o": np.einsum("bhn,bnhd->bhd", prob, v).astype(np.float32)}


def make_launch(dev, inp):
    q, kc, vc = dev.upload(inp["q"]), dev.upload(inp["k_cache"]), dev.upload(inp["v_cache"])
    o = dev.empty((inp["B"], inp["H"], inp["D"]))
    return Launch(lambda rec: decode.attention(rec, q, kc, vc, o, inp["B"], inp["H"],
                                               inp["Hkv"], inp["D"], n_ctx=inp["n_ctx"],
                                               t_max=inp["t_max"], q_stride=inp["q_stride"]),
                  lambda: {"o": dev.download(o)})


register(KernelCase(
    name="decode_attention", family="decode", precision="f32",
    kernels=[(decode.FILE, "decode_partial", {"WG": decode.CHUNK}),
             (decode.FILE, "decode_combine", {"WG": decode.CHUNK})],
    inputs=make_inputs, launch=make_launch, reference=reference, variants=VARIANTS,
    bench_variant_software="bench_small",
    flops=lambda inp: 4.0 * inp["B"] * inp["H"] * inp["n_ctx"] * inp["D"],
    bytes=lambda inp: 8.0 * inp["B"] * inp["n_ctx"] * inp["Hkv"] * inp["D"],
    description="one query per sequence over a KV cache, split into 128-position chunks"))


# ---- cache write ----------------------------------------------------------------------------

WRITES = {"prefill": (2, 9, 2, 8, 0, 16, 0), "step": (3, 1, 1, 4, 5, 8, 12),
          "full": (1, 4, 2, 6, 0, 4, 0), "bench": (8, 1024, 12, 64, 0, 1024, 0),
          "bench_small": (8, 1024, 12, 64, 0, 1024, 0)}


def write_inputs(rng, variant):
    B, T, Hkv, D, pos, t_max, extra = WRITES[variant]
    stride = Hkv * D + extra
    return {"B": B, "T": T, "Hkv": Hkv, "D": D, "pos": pos, "t_max": t_max, "stride": stride,
            "k": rng.standard_normal((B * T, stride)).astype(np.float32),
            "v": rng.standard_normal((B * T, stride)).astype(np.float32),
            "k_cache": rng.standard_normal((B, t_max, Hkv * D)).astype(np.float32),
            "v_cache": rng.standard_normal((B, t_max, Hkv * D)).astype(np.float32)}


def write_reference(inp):
    B, T, Hkv, D, pos = inp["B"], inp["T"], inp["Hkv"], inp["D"], inp["pos"]
    out = {}
    for name in ("k", "v"):
        cache = inp[name + "_cache"].copy()
        cache[:, pos:pos + T] = inp[name][:, :Hkv * D].reshape(B, T, Hkv * D)
        out[name + "_cache"] = cache
    return out


def write_launch(dev, inp):
    k, v = dev.upload(inp["k"]), dev.upload(inp["v"])
    kc, vc = dev.upload(inp["k_cache"]), dev.upload(inp["v_cache"])
    return Launch(lambda rec: decode.cache_write(rec, k, v, kc, vc, inp["B"], inp["T"],
                                                 inp["Hkv"], inp["D"], pos=inp["pos"],
                                                 t_max=inp["t_max"], src_stride=inp["stride"]),
                  lambda: {"k_cache": dev.download(kc), "v_cache": dev.download(vc)})


register(KernelCase(
    name="kv_cache_write", family="decode", precision="exact",
    kernels=[(decode.FILE, "kv_cache_write")], inputs=write_inputs, launch=write_launch,
    reference=write_reference, variants=("prefill", "step", "full"),
    bytes=lambda inp: 16.0 * inp["B"] * inp["T"] * inp["Hkv"] * inp["D"],
    description="new keys/values into the caches at positions pos.."))
