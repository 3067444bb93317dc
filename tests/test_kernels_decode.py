"""Decoding on the real device: ladder cases and agreement with the training attention."""

from __future__ import annotations

import numpy as np
import pytest

from istanbul.shaders.kernels.attention import ops as attention
from istanbul.shaders.kernels.attention import decode


def test_prefill_then_steps_match_full_causal_attention(device):
    rng = np.random.default_rng(4)
    B, T, H, Hkv, D, t_max = 2, 150, 4, 2, 16, 160
    qkv = rng.standard_normal((B, T, (H + 2 * Hkv) * D)).astype(np.float32)
    q, k, v = (np.ascontiguousarray(qkv[..., a:b]) for a, b in
               ((0, H * D), (H * D, (H + Hkv) * D), ((H + Hkv) * D, (H + 2 * Hkv) * D)))
    o, lse = device.empty((B, T, H, D)), device.empty((B, H, T))
    with device.record() as rec:
        attention.forward(rec, device.upload(q), device.upload(k), device.upload(v), o, lse,
                          B, T, H, Hkv, D)
    full = device.download(o)
    kc, vc = device.zeros((B, t_max, Hkv, D)), device.zeros((B, t_max, Hkv, D))
    prefill = T - 3
    with device.record() as rec:
        decode.cache_write(rec, device.upload(k[:, :prefill]), device.upload(v[:, :prefill]),
                           kc, vc, B, prefill, Hkv, D, pos=0, t_max=t_max)
    for t in range(prefill, T):
        out = device.empty((B, H, D))
        with device.record() as rec:
            decode.cache_write(rec, device.upload(k[:, t]), device.upload(v[:, t]), kc, vc,
                               B, 1, Hkv, D, pos=t, t_max=t_max)
            decode.attention(rec, device.upload(q[:, t]), kc, vc, out, B, H, Hkv, D,
                             n_ctx=t + 1, t_max=t_max)
        np.testing.assert_allclose(device.download(out), full[:, t], rtol=1e-5, atol=1e-6)


def test_cache_bounds_are_checked(device):
    buf = device.empty(4096)
    with device.record() as rec:
        with pytest.raises(ValueError, match="do not fit a cache of 8"):
            decode.cache_write(rec, buf, buf, buf, buf, 1, 2, 1, 4, pos=7, t_max=8)
        with pytest.raises(ValueError, match="exceeds the cache capacity"):
            decode.attention(rec, buf, buf, buf, buf, 1, 1, 1, 4, n_ctx=9, t_max=8)
