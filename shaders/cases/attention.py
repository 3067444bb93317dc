"""Ladder entries for causal GQA attention (shaders/ops/attention.py, 05_attention.wgsl).

Variants cover GQA ratios 1, 2 and 4, T = 1, head dims that need 2 or 4 threads per row,
q/k/v inside one fused qkv buffer (strided tokens), sequences spanning many tiles up to
T = 1024 (what lavapipe does quickly), and peaked softmaxes (scores around 150).
At scores near 1600 the f32 backward still agrees to ~75 dB PSNR: s and lse carry ~1e-4
absolute rounding there, as they do in any f32 implementation.

The plain cases take the op's default path (the fast path when D and the strides allow
vec4, the general kernels otherwise: odd_dim). The fast path has two implementations of one
tiling: the *_reg cases pin the named-register kernels (05_attention_reg.wgsl, the default),
the *_tiled cases the private-array loop kernels (05_attention_tiled.wgsl, "-loop" configs),
with the op's default tiles on variants whose D is a multiple of 4; the *_small cases pin
small tiles (many tiles per sequence, query and key tiles of different sizes) so that every
masking branch runs on small sequences, and *_reg_wide pins tiles whose output blocks are
D/4 vec4 columns wide (every DV branch of the reg kernels). The *_pf and *_db cases pin the
staged variants of the reg kernels ("-pf": register prefetch of the next tile; "-db": the
same with two workgroup stages) at default, small and wide tiles (the wide dK/dV tiles have
2 invocations for 4 queries: two statistics prefetch registers per invocation).
"""

from __future__ import annotations

import math

import numpy as np

from ..ladder import KernelCase, Launch, register
from ..ops import attention
from ..kernels.case_support import f64, fd_consistency, grad_report, run_launch, torch_grads

# (B, T, H, Hkv, D, fused, scale of q and k)
SHAPES = {
    "random": (2, 37, 4, 2, 16, False, 1.0),
    "mha": (1, 70, 2, 2, 8, False, 1.0),
    "gqa4": (2, 19, 4, 1, 32, False, 1.0),
    "one": (1, 1, 1, 1, 4, False, 1.0),
    "odd_dim": (1, 9, 3, 3, 6, False, 1.0),
    "fused": (2, 21, 2, 1, 64, True, 1.0),
    "peaked": (1, 40, 2, 1, 16, False, 12.0),
    # head dim 24: the reg kernels' loops over D run one written-out run of 4 vec4s and a
    # remainder of 2
    "d24": (1, 33, 3, 1, 24, False, 1.0),
    # 18 kv heads: the tiled dK/dV grid's second chunk of 16 heads has 14 spare workgroups
    "heads18": (3, 20, 12, 6, 8, False, 1.0),
    "long": (1, 1024, 1, 1, 16, False, 1.0),
    "bench": (8, 1024, 12, 12, 64, False, 1.0),
    "bench_small": (1, 512, 4, 4, 64, False, 1.0),
    # the small pinned tiles need head dim <= 32: same work as "bench" in twice the heads
    "bench_d32": (8, 1024, 24, 24, 32, False, 1.0),
    "bench_small_d32": (1, 512, 8, 8, 32, False, 1.0),
}
VARIANTS = ("random", "mha", "gqa4", "one", "odd_dim", "fused", "peaked", "d24", "heads18",
            "long")


def make_inputs(rng, variant):
    B, T, H, Hkv, D, fused, amp = SHAPES[variant]
    inp = {"B": B, "T": T, "H": H, "Hkv": Hkv, "D": D, "fused": fused}

    def tensor(heads, scale=1.0):
        return (rng.standard_normal((B, T, heads, D)) * scale).astype(np.float32)

    q, k, v = tensor(H, amp), tensor(Hkv, amp), tensor(Hkv)
    if fused:
        inp["qkv"] = np.concatenate([q.reshape(B, T, -1), k.reshape(B, T, -1),
                                     v.reshape(B, T, -1)], axis=-1)
    inp.update(q=q, k=k, v=v, do=tensor(H))
    return inp


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


def _layout(inp):
    """(offsets of q, k, v in a token row, token strides) for the variant."""
    H, Hkv, D = inp["H"], inp["Hkv"], inp["D"]
    if inp["fused"]:
        width = (H + 2 * Hkv) * D
        return (0, H * D, (H + Hkv) * D), {"q_stride": width, "kv_stride": width}
    return None, {}


def _parts(dev, flat, offsets):
    """Bindings for the parts of one fused buffer starting at `offsets`: views when the
    offsets are aligned for the device, else shifted copies (same strides, same test)."""
    align = dev.limits["min-storage-buffer-offset-alignment"] // 4
    if all(o % align == 0 for o in offsets):
        buf = dev.upload(flat)
        return [buf.elements(o, flat.size - o) for o in offsets]
    return [dev.upload(flat[o:]) for o in offsets]


def _extract(flat, inp, heads, stride):
    """[B, T, heads, D] from a part's flat contents with token stride `stride`."""
    B, T, D = inp["B"], inp["T"], inp["D"]
    idx = np.arange(B * T)[:, None] * stride + np.arange(heads * D)[None, :]
    return flat.reshape(-1)[idx].reshape(B, T, heads, D)


def _qkv(dev, inp):
    offsets, strides = _layout(inp)
    if offsets is None:
        return [dev.upload(inp[n]) for n in ("q", "k", "v")], strides
    return _parts(dev, inp["qkv"].reshape(-1), offsets), strides


def tiled_configs(dev, inp, pinned=None, impl="loop"):
    """{forward, dq, dkv} configs of the fast path in implementation `impl` ("reg", "loop",
    "pf" or "db"): `pinned` tiles, else the op's defaults (for "db", the first default tile
    shape whose two stages fit the device)."""
    suffix = "-" + impl
    if pinned is not None:
        return {k: v + suffix for k, v in pinned.items()}
    T, D = inp["T"], inp["D"]
    out = {}
    for kernel in ("forward", "dq", "dkv"):
        if impl in attention.STAGED:
            fits = [t for t in attention.TILED_DEFAULTS[kernel]
                    if not attention.tiled_problems(dev, kernel, *t, D, impl)]
            tiles = fits[0] if fits else None
        else:
            tiles = attention.choose_tiled(dev, kernel, T, D)
        if tiles is None:
            raise ValueError(f"no tiled {kernel} kernel fits head dim {D} on {dev.name}")
        out[kernel] = "%dx%d" % tiles + suffix
    return out


def forward_launch(dev, inp, tiles=None, configs=None):
    B, T, H, Hkv, D = inp["B"], inp["T"], inp["H"], inp["Hkv"], inp["D"]
    (q, k, v), strides = _qkv(dev, inp)
    o, lse = dev.empty((B, T, H, D)), dev.empty((B, H, T))
    config = configs["forward"] if configs else None
    return Launch(lambda rec: attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D,
                                                tiles=tiles, config=config, **strides),
                  lambda: {"o": dev.download(o), "lse": dev.download(lse)})


def backward_launch(dev, inp, tiles=None, configs=None):
    """Forward then backward (the backward needs the forward's o and lse)."""
    B, T, H, Hkv, D = inp["B"], inp["T"], inp["H"], inp["Hkv"], inp["D"]
    (q, k, v), strides = _qkv(dev, inp)
    offsets, _ = _layout(inp)
    o, lse, do = dev.empty((B, T, H, D)), dev.empty((B, H, T)), dev.upload(inp["do"])
    if offsets is None:
        dq, dk, dv = (dev.empty((B, T, H, D)), dev.empty((B, T, Hkv, D)),
                      dev.empty((B, T, Hkv, D)))
    else:  # gradients land in one fused [B, T, (H + 2Hkv) D] buffer, like q, k, v
        dq, dk, dv = _parts(dev, np.zeros(inp["qkv"].size, np.float32), offsets)
    tq, tdq, tdkv = tiles or (None, None, None)
    cf, cdq, cdkv = (configs["forward"], configs["dq"], configs["dkv"]) if configs else \
        (None, None, None)

    def encode(rec):
        attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D, tiles=tq, config=cf,
                          **strides)
        attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H, Hkv, D,
                           tiles_dq=tdq, tiles_dkv=tdkv, config_dq=cdq, config_dkv=cdkv,
                           **strides)

    def read():
        stride_q = strides.get("q_stride", H * D)
        stride_kv = strides.get("kv_stride", Hkv * D)
        return {"dq": _extract(dev.download(dq), inp, H, stride_q),
                "dk": _extract(dev.download(dk), inp, Hkv, stride_kv),
                "dv": _extract(dev.download(dv), inp, Hkv, stride_kv)}
    return Launch(encode, read)


def torch_attention(q, k, v, H, Hkv):
    import torch
    rep = H // Hkv
    k = k.repeat_interleave(rep, dim=2)
    v = v.repeat_interleave(rep, dim=2)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


def backward_grad(dev, rng, tiles=None, pinned=None, tiled=False, impl="loop"):
    inp = make_inputs(rng, "random")
    configs = tiled_configs(dev, inp, pinned, impl) if tiled else None
    got = run_launch(dev, backward_launch(dev, inp, tiles, configs))
    H, Hkv = inp["H"], inp["Hkv"]
    ref = torch_grads(lambda q, k, v: torch_attention(q, k, v, H, Hkv),
                      {"q": inp["q"], "k": inp["k"], "v": inp["v"]}, inp["do"], ("q", "k", "v"))

    def loss(params):
        out = run_launch(dev, forward_launch(dev, dict(inp, **params), None, configs))["o"]
        return float(np.sum(f64(out) * f64(inp["do"])))

    gap = fd_consistency(loss, {"q": inp["q"], "k": inp["k"], "v": inp["v"]},
                         {"q": got["dq"], "k": got["dk"], "v": got["dv"]}, rng, rel_step=1e-3)
    return grad_report({"dq": (got["dq"], ref["q"]), "dk": (got["dk"], ref["k"]),
                        "dv": (got["dv"], ref["v"])}, "f32", gap)


def _units(inp):
    """B*H*T^2*D: the multiply-adds of one causal T x T x D product, counted as FLOPs."""
    return float(inp["B"] * inp["H"] * inp["T"] ** 2 * inp["D"])


def _bytes(inp, tensors):
    return 4.0 * inp["B"] * inp["T"] * inp["D"] * tensors


register(KernelCase(
    name="attention_forward", family="attention", precision="f32",
    kernels=[(attention.FILE, "attention_forward", {"HD": 16, "BQ": 32, "BKV": 32, "WG": 256})],
    inputs=make_inputs, launch=forward_launch, reference=forward_reference,
    variants=VARIANTS, bench_variant_software="bench_small",
    flops=lambda inp: 2.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 2 * inp["H"] + 2 * inp["Hkv"]) + 4.0 * inp["B"] * inp["H"] * inp["T"],
    description="causal GQA attention, online softmax, saves lse"))

register(KernelCase(
    name="attention_backward", family="attention", precision="f32",
    kernels=[(attention.FILE, "attention_backward_prep", {"HD": 16}),
             (attention.FILE, "attention_backward_dq", {"HD": 16, "BQ": 32, "BKV": 16, "WG": 256}),
             (attention.FILE, "attention_backward_dkv", {"HD": 16, "BQ": 16, "BKV": 32, "WG": 256})],
    inputs=make_inputs, launch=backward_launch, reference=backward_reference,
    variants=VARIANTS, bench_variant_software="bench_small", grad=backward_grad,
    flops=lambda inp: 9.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
    description="forward + prep + dQ kernel + dK/dV kernel (timed together)"))

SMALL_TILES = ((8, 8), (8, 16), (8, 8))
register(KernelCase(
    name="attention_backward_t8", family="attention", precision="f32",
    kernels=[(attention.FILE, "attention_backward_dq", {"HD": 16, "BQ": 8, "BKV": 8, "WG": 64})],
    inputs=make_inputs, launch=lambda dev, inp: backward_launch(dev, inp, SMALL_TILES),
    reference=backward_reference, variants=("random", "mha", "gqa4", "one", "odd_dim"),
    bench_variant_software="bench_small",
    grad=lambda dev, rng: backward_grad(dev, rng, SMALL_TILES),
    flops=lambda inp: 9.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
    description="attention forward+backward with 8-row tiles (many tiles per sequence)"))


# ---- the tiled kernels (05_attention_tiled.wgsl), pinned ------------------------------------

VARIANTS_TILED = ("random", "mha", "gqa4", "one", "fused", "peaked", "d24", "heads18",
                  "long")   # D % 4 == 0
VARIANTS_SMALL = ("random", "mha", "gqa4", "peaked", "long")                   # D in 8..32
SMALL_CONFIGS = {"forward": "16x8", "dq": "8x8", "dkv": "16x8"}


def _tiled_kernels(D):
    return [(attention.FILE_TILED, attention.TILED_KERNELS[k],
             attention.tiled_constants(k, 16, 16, D)) for k in ("forward", "dq", "dkv")]


register(KernelCase(
    name="attention_forward_tiled", family="attention", precision="f32",
    kernels=_tiled_kernels(16)[:1],
    inputs=make_inputs,
    launch=lambda dev, inp: forward_launch(dev, inp, None, tiled_configs(dev, inp)),
    reference=forward_reference, variants=VARIANTS_TILED, bench_variant_software="bench_small",
    flops=lambda inp: 2.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 2 * inp["H"] + 2 * inp["Hkv"]) + 4.0 * inp["B"] * inp["H"] * inp["T"],
    description="tiled forward: 4x4 score blocks, vec4 tiles, online softmax"))

register(KernelCase(
    name="attention_backward_tiled", family="attention", precision="f32",
    kernels=_tiled_kernels(16),
    inputs=make_inputs,
    launch=lambda dev, inp: backward_launch(dev, inp, None, tiled_configs(dev, inp)),
    reference=backward_reference, variants=VARIANTS_TILED, bench_variant_software="bench_small",
    grad=lambda dev, rng: backward_grad(dev, rng, tiled=True),
    flops=lambda inp: 9.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
    description="tiled forward + prep + dQ + dK/dV (timed together)"))

register(KernelCase(
    name="attention_backward_tiled_small", family="attention", precision="f32",
    kernels=[(attention.FILE_TILED, attention.TILED_KERNELS["dq"],
              attention.tiled_constants("dq", 8, 8, 16))],
    inputs=make_inputs,
    launch=lambda dev, inp: backward_launch(dev, inp, None,
                                            tiled_configs(dev, inp, SMALL_CONFIGS, "loop")),
    reference=backward_reference, variants=VARIANTS_SMALL, bench_variant="bench_d32",
    bench_variant_software="bench_small_d32",
    grad=lambda dev, rng: backward_grad(dev, rng, pinned=SMALL_CONFIGS, tiled=True),
    flops=lambda inp: 9.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
    description="tiled attention with 16x8 / 8x8 tiles (many tiles, uneven diagonal)"))


# ---- the named-register kernels (05_attention_reg.wgsl), pinned: "reg" and its staged
# variants "-pf" / "-db" (the same sums in the same order) ---------------------------------

# column tiles of D/4 (D 16: 4 columns): the output blocks are 4 vec4s wide (DV = 4)
WIDE_CONFIGS = {"forward": "16x4", "dq": "8x4", "dkv": "8x4"}


def _reg_kernels(impl, D, rows=16, cols=16):
    return [(attention.FILE_REG, attention.impl_kernel(k, impl)[1],
             attention.tiled_constants(k, rows, cols, D)) for k in ("forward", "dq", "dkv")]


def _register_reg(impl):
    what = {"reg": "named-register", "pf": "register-prefetched",
            "db": "register-prefetched two-stage"}[impl]
    how = (": 4x4 score blocks, vec4 tiles, online softmax" if impl == "reg" else
           f" (-{impl}): next key tile loaded during this tile's math")
    register(KernelCase(
        name=f"attention_forward_{impl}", family="attention", precision="f32",
        kernels=_reg_kernels(impl, 16)[:1],
        inputs=make_inputs,
        launch=lambda dev, inp: forward_launch(dev, inp, None,
                                               tiled_configs(dev, inp, None, impl)),
        reference=forward_reference, variants=VARIANTS_TILED,
        bench_variant_software="bench_small",
        flops=lambda inp: 2.0 * _units(inp),
        bytes=lambda inp: (_bytes(inp, 2 * inp["H"] + 2 * inp["Hkv"])
                           + 4.0 * inp["B"] * inp["H"] * inp["T"]),
        description=f"{what} forward{how}"))

    register(KernelCase(
        name=f"attention_backward_{impl}", family="attention", precision="f32",
        kernels=_reg_kernels(impl, 16),
        inputs=make_inputs,
        launch=lambda dev, inp: backward_launch(dev, inp, None,
                                                tiled_configs(dev, inp, None, impl)),
        reference=backward_reference, variants=VARIANTS_TILED,
        bench_variant_software="bench_small",
        grad=lambda dev, rng: backward_grad(dev, rng, tiled=True, impl=impl),
        flops=lambda inp: 9.0 * _units(inp),
        bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
        description=f"{what} forward + prep + dQ + dK/dV (-{impl}, timed together)"))

    register(KernelCase(
        name=f"attention_backward_{impl}_small", family="attention", precision="f32",
        kernels=_reg_kernels(impl, 16, 8, 8),
        inputs=make_inputs,
        launch=lambda dev, inp: backward_launch(dev, inp, None,
                                                tiled_configs(dev, inp, SMALL_CONFIGS, impl)),
        reference=backward_reference, variants=VARIANTS_SMALL, bench_variant="bench_d32",
        bench_variant_software="bench_small_d32",
        grad=lambda dev, rng: backward_grad(dev, rng, pinned=SMALL_CONFIGS, tiled=True,
                                            impl=impl),
        flops=lambda inp: 9.0 * _units(inp),
        bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
        description=f"{what} attention (-{impl}) with 16x8 / 8x8 tiles (many tiles)"))

    register(KernelCase(
        name=f"attention_backward_{impl}_wide", family="attention", precision="f32",
        kernels=_reg_kernels(impl, 16, 8, 4),
        inputs=make_inputs,
        launch=lambda dev, inp: backward_launch(dev, inp, None,
                                                tiled_configs(dev, inp, WIDE_CONFIGS, impl)),
        reference=backward_reference, variants=("random", "peaked", "mha"),
        bench_variant="long", bench_variant_software="long",
        grad=lambda dev, rng: backward_grad(dev, rng, pinned=WIDE_CONFIGS, tiled=True,
                                            impl=impl),
        flops=lambda inp: 9.0 * _units(inp),
        bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
        description=f"{what} attention (-{impl}), 4-column tiles: 4 output vec4s per row"))


for _impl in ("reg",) + attention.STAGED:
    _register_reg(_impl)
