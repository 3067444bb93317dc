"""Ladder entries for causal GQA attention (ops.py, 05_attention*.wgsl; references in
reference.py).

Variants cover GQA ratios 1, 2 and 4, T = 1, head dims that need 2 or 4 threads per row,
q/k/v inside one fused qkv buffer (strided tokens), every tensor head-major ([B, H, T, D],
as the trainer binds q/k/v: head_major, sg_head_major), sequences spanning many tiles up to
T = 1024 (what lavapipe does quickly), and peaked softmaxes (scores around 150).
At scores near 1600 the f32 backward still agrees to ~75 dB PSNR: s and lse carry ~1e-4
absolute rounding there, as they do in any f32 implementation.

The plain cases take the op's default path (the fast path when D and the strides allow
vec4, the general kernels otherwise: odd_dim). The *_tiled cases pin the fast path
(05_attention_tiled.wgsl) with the op's default tiles on variants whose D is a multiple of
4; *_tiled_small pins small tiles (many tiles per sequence, query and key tiles of different
sizes) so that every masking branch runs on small sequences, and *_tiled_wide pins tiles
whose output blocks are D/4 vec4 columns wide (every DV branch; the wide dK/dV tiles have
2 invocations for 4 queries: two statistics prefetch registers per invocation).
"""

from __future__ import annotations


import numpy as np

from ...ladder import KernelCase, Launch, register
from . import ops as attention
from . import reference
from ..case_support import f64, fd_consistency, grad_report, run_launch, torch_grads

# (B, T, H, Hkv, D, layout, scale of q and k); layout: "rows" ([B, T, H, D] tensors),
# "fused" (q, k, v parts of one [B, T, (H + 2Hkv) D] buffer, the gradients likewise) or
# "head_major" (q, k, v, o, do and the gradients [B, H, T, D])
SHAPES = {
    "random": (2, 37, 4, 2, 16, "rows", 1.0),
    "mha": (1, 70, 2, 2, 8, "rows", 1.0),
    "gqa4": (2, 19, 4, 1, 32, "rows", 1.0),
    "one": (1, 1, 1, 1, 4, "rows", 1.0),
    "odd_dim": (1, 9, 3, 3, 6, "rows", 1.0),
    "fused": (2, 21, 2, 1, 64, "fused", 1.0),
    "peaked": (1, 40, 2, 1, 16, "rows", 12.0),
    # head dim 24: the reg kernels' loops over D run one written-out run of 4 vec4s and a
    # remainder of 2
    "d24": (1, 33, 3, 1, 24, "rows", 1.0),
    # 18 kv heads: the tiled dK/dV grid's second chunk of 16 heads has 14 spare workgroups
    "heads18": (3, 20, 12, 6, 8, "rows", 1.0),
    "long": (1, 1024, 1, 1, 16, "rows", 1.0),
    "head_major": (2, 37, 4, 2, 16, "head_major", 1.0),
    "bench": (8, 1024, 12, 12, 64, "rows", 1.0),
    "bench_small": (1, 512, 4, 4, 64, "rows", 1.0),
    # the small pinned tiles need head dim <= 32: same work as "bench" in twice the heads
    "bench_d32": (8, 1024, 24, 24, 32, "rows", 1.0),
    "bench_small_d32": (1, 512, 8, 8, 32, "rows", 1.0),
}
VARIANTS = ("random", "mha", "gqa4", "one", "odd_dim", "fused", "peaked", "d24", "heads18",
            "long", "head_major")


def make_inputs(rng, variant):
    B, T, H, Hkv, D, layout, amp = SHAPES[variant]
    inp = {"B": B, "T": T, "H": H, "Hkv": Hkv, "D": D, "layout": layout}

    def tensor(heads, scale=1.0):
        return (rng.standard_normal((B, T, heads, D)) * scale).astype(np.float32)

    q, k, v = tensor(H, amp), tensor(Hkv, amp), tensor(Hkv)
    if layout == "fused":
        inp["qkv"] = np.concatenate([q.reshape(B, T, -1), k.reshape(B, T, -1),
                                     v.reshape(B, T, -1)], axis=-1)
    inp.update(q=q, k=k, v=v, do=tensor(H))
    return inp


def _layout(inp):
    """(offsets of q, k, v in a token row of the fused buffer or None, the op's stride
    arguments) for the variant."""
    T, H, Hkv, D = inp["T"], inp["H"], inp["Hkv"], inp["D"]
    if inp["layout"] == "fused":
        width = (H + 2 * Hkv) * D
        return (0, H * D, (H + Hkv) * D), {"q_stride": width, "kv_stride": width}
    if inp["layout"] == "head_major":
        return None, {"q_stride": attention.head_major(T, H, D),
                      "kv_stride": attention.head_major(T, Hkv, D),
                      "o_stride": attention.head_major(T, H, D)}
    return None, {}


def _group(inp, strides, name):
    """The Strides of tensor group `name` ("q", "kv", "o") under the op's stride arguments."""
    heads = inp["Hkv"] if name == "kv" else inp["H"]
    value = strides.get(f"{name}_stride")
    if isinstance(value, attention.Strides):
        return value
    return attention.token_rows(inp["T"], inp["D"], heads * inp["D"] if value is None
                                else value)


def _scatter(x, s: attention.Strides):
    """x [B, T, heads, D] laid out by `s` in a flat array of the span it needs."""
    B, T, heads, D = x.shape
    out = np.zeros((B - 1) * s.batch + (T - 1) * s.token + (heads - 1) * s.head + D, x.dtype)
    out[_indices(B, T, heads, D, s)] = x
    return out


def _indices(B, T, heads, D, s: attention.Strides):
    return (np.arange(B)[:, None, None, None] * s.batch + np.arange(T)[None, :, None, None]
            * s.token + np.arange(heads)[None, None, :, None] * s.head
            + np.arange(D)[None, None, None, :])


def _parts(dev, flat, offsets):
    """Bindings for the parts of one fused buffer starting at `offsets`: views when the
    offsets are aligned for the device, else shifted copies (same strides, same test)."""
    align = dev.limits["min-storage-buffer-offset-alignment"] // 4
    if all(o % align == 0 for o in offsets):
        buf = dev.upload(flat)
        return [buf.elements(o, flat.size - o) for o in offsets]
    return [dev.upload(flat[o:]) for o in offsets]


def _extract(flat, inp, heads, s: attention.Strides):
    """[B, T, heads, D] from a part's flat contents laid out by `s`."""
    return flat.reshape(-1)[_indices(inp["B"], inp["T"], heads, inp["D"], s)]


def _qkv(dev, inp, dtype=np.float32):
    """q, k, v uploaded in their layout (dtype float16: f16 copies; not for fused layouts)."""
    offsets, strides = _layout(inp)
    if offsets is None:
        return [dev.upload(_scatter(inp[n], _group(inp, strides, "q" if n == "q" else "kv")),
                           dtype=dtype)
                for n in ("q", "k", "v")], strides
    if dtype != np.float32:
        raise ValueError("f16 q, k, v come in separate buffers, not a fused one")
    return _parts(dev, inp["qkv"].reshape(-1), offsets), strides


def tiled_configs(dev, inp, pinned=None):
    """{forward, dq, dkv} configs of the fast path: `pinned` tiles, else the op's defaults."""
    if pinned is not None:
        return dict(pinned)
    T, D = inp["T"], inp["D"]
    out = {}
    for kernel in ("forward", "dq", "dkv"):
        tiles = attention.choose_config(dev, kernel, T, D)
        if tiles is None:
            raise ValueError(f"no tiled {kernel} kernel fits head dim {D} on {dev.name}")
        out[kernel] = attention.format_config(*tiles)
    return out


def forward_launch(dev, inp, tiles=None, configs=None, tensor_cores=False, f16_inputs=False):
    """tensor_cores: the tensor-core forward (config "sgmat"); f16_inputs: q, k, v given to
    it as f16 buffers."""
    B, T, H, Hkv, D = inp["B"], inp["T"], inp["H"], inp["Hkv"], inp["D"]
    (q, k, v), strides = _qkv(dev, inp, np.float16 if f16_inputs else np.float32)
    o, lse = dev.empty((B, T, H, D)), dev.empty((B, H, T))
    config = "sgmat" if tensor_cores else configs["forward"] if configs else None
    return Launch(lambda rec: attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D,
                                                tiles=tiles, config=config, **strides),
                  lambda: _forward_outputs(dev, inp, strides, o, lse))


def _forward_outputs(dev, inp, strides, o, lse):
    return {"o": _extract(dev.download(o), inp, inp["H"], _group(inp, strides, "o")),
            "lse": dev.download(lse)}


def _backward_launch(dev, inp, forward_kwargs: dict, backward_kwargs: dict,
                     f16_inputs: str | None = None) -> Launch:
    """Forward then backward (the backward needs the forward's o and lse), with the given
    kernel choices; the gradients read back per head as the reference gives them.
    f16_inputs: "both" (q, k, v as f16 buffers) or "backward" (the forward on f32 copies of
    the same values, the backward on f16 ones)."""
    B, T, H, Hkv, D = inp["B"], inp["T"], inp["H"], inp["Hkv"], inp["D"]
    (q, k, v), strides = _qkv(dev, inp, np.float16 if f16_inputs else np.float32)
    qkv_forward = _qkv(dev, inp)[0] if f16_inputs == "backward" else (q, k, v)
    offsets, _ = _layout(inp)
    o, lse = dev.empty((B, T, H, D)), dev.empty((B, H, T))
    do = dev.upload(_scatter(inp["do"], _group(inp, strides, "o")))
    if offsets is None:
        dq, dk, dv = (dev.empty((B, T, H, D)), dev.empty((B, T, Hkv, D)),
                      dev.empty((B, T, Hkv, D)))
    else:  # gradients land in one fused [B, T, (H + 2Hkv) D] buffer, like q, k, v
        dq, dk, dv = _parts(dev, np.zeros(inp["qkv"].size, np.float32), offsets)

    def encode(rec):
        attention.forward(rec, *qkv_forward, o, lse, B, T, H, Hkv, D, **forward_kwargs,
                          **strides)
        attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H, Hkv, D,
                           **backward_kwargs, **strides)

    def read():
        sq, skv = _group(inp, strides, "q"), _group(inp, strides, "kv")
        return {"dq": _extract(dev.download(dq), inp, H, sq),
                "dk": _extract(dev.download(dk), inp, Hkv, skv),
                "dv": _extract(dev.download(dv), inp, Hkv, skv)}
    return Launch(encode, read)


def backward_launch(dev, inp, tiles=None, configs=None, tensor_cores=False):
    """Forward then backward on the chosen tiles / configurations (tensor_cores: the first
    tensor-core forward and backward)."""
    tq, tdq, tdkv = tiles or (None, None, None)
    cf, cdq, cdkv = (configs["forward"], configs["dq"], configs["dkv"]) if configs else \
        (None, None, None)
    if tensor_cores:
        cf = "sgmat"
    return _backward_launch(dev, inp, {"tiles": tq, "config": cf},
                            {"tiles_dq": tdq, "tiles_dkv": tdkv, "config_dq": cdq,
                             "config_dkv": cdkv, "tensor_cores": tensor_cores})


def backward_grad(dev, rng, tiles=None, pinned=None, tiled=False):
    inp = make_inputs(rng, "random")
    configs = tiled_configs(dev, inp, pinned) if tiled else None
    got = run_launch(dev, backward_launch(dev, inp, tiles, configs))
    H, Hkv = inp["H"], inp["Hkv"]
    ref = torch_grads(lambda q, k, v: reference.torch_attention(q, k, v, H, Hkv),
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
    inputs=make_inputs, launch=forward_launch, reference=reference.forward_reference,
    variants=VARIANTS, bench_variant_software="bench_small",
    flops=lambda inp: 2.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 2 * inp["H"] + 2 * inp["Hkv"]) + 4.0 * inp["B"] * inp["H"] * inp["T"],
    description="causal GQA attention, online softmax, saves lse"))

register(KernelCase(
    name="attention_backward", family="attention", precision="f32",
    kernels=[(attention.FILE, "attention_backward_prep", {"HD": 16}),
             (attention.FILE, "attention_backward_prep_vec4", {"HD": 16}),
             (attention.FILE, "attention_backward_dq", {"HD": 16, "BQ": 32, "BKV": 16, "WG": 256}),
             (attention.FILE, "attention_backward_dkv", {"HD": 16, "BQ": 16, "BKV": 32, "WG": 256})],
    inputs=make_inputs, launch=backward_launch, reference=reference.backward_reference,
    variants=VARIANTS, bench_variant_software="bench_small", grad=backward_grad,
    flops=lambda inp: 9.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
    description="forward + prep + dQ kernel + dK/dV kernel (timed together)"))

SMALL_TILES = ((8, 8), (8, 16), (8, 8))
register(KernelCase(
    name="attention_backward_t8", family="attention", precision="f32",
    kernels=[(attention.FILE, "attention_backward_dq", {"HD": 16, "BQ": 8, "BKV": 8, "WG": 64})],
    inputs=make_inputs, launch=lambda dev, inp: backward_launch(dev, inp, SMALL_TILES),
    reference=reference.backward_reference, variants=("random", "mha", "gqa4", "one", "odd_dim"),
    bench_variant_software="bench_small",
    grad=lambda dev, rng: backward_grad(dev, rng, SMALL_TILES),
    flops=lambda inp: 9.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
    description="attention forward+backward with 8-row tiles (many tiles per sequence)"))


# ---- the fast kernels (05_attention_tiled.wgsl), pinned ------------------------------------

VARIANTS_TILED = ("random", "mha", "gqa4", "one", "fused", "peaked", "d24", "heads18",
                  "long", "head_major")   # D % 4 == 0
VARIANTS_SMALL = ("random", "mha", "gqa4", "peaked", "long")                   # D in 8..32
SMALL_CONFIGS = {"forward": "16x8", "dq": "8x8", "dkv": "16x8"}
# column tiles of D/4 (D 16: 4 columns): the output blocks are 4 vec4s wide (DV = 4)
WIDE_CONFIGS = {"forward": "16x4", "dq": "8x4", "dkv": "8x4"}


def _tiled_kernels(D, rows=16, cols=16):
    return [(attention.FILE_TILED, attention.TILED_KERNELS[k],
             attention.tiled_constants(k, rows, cols, D),
             attention.template_params(rows, cols, D))
            for k in ("forward", "dq", "dkv")]


register(KernelCase(
    name="attention_forward_tiled", family="attention", precision="f32",
    kernels=_tiled_kernels(16)[:1],
    inputs=make_inputs,
    launch=lambda dev, inp: forward_launch(dev, inp, None, tiled_configs(dev, inp)),
    reference=reference.forward_reference, variants=VARIANTS_TILED, bench_variant_software="bench_small",
    flops=lambda inp: 2.0 * _units(inp),
    bytes=lambda inp: (_bytes(inp, 2 * inp["H"] + 2 * inp["Hkv"])
                       + 4.0 * inp["B"] * inp["H"] * inp["T"]),
    description="fast forward: 4x4 score blocks, vec4 tiles, online softmax, next key tile "
                "prefetched during this tile's math"))

register(KernelCase(
    name="attention_backward_tiled", family="attention", precision="f32",
    kernels=_tiled_kernels(16),
    inputs=make_inputs,
    launch=lambda dev, inp: backward_launch(dev, inp, None, tiled_configs(dev, inp)),
    reference=reference.backward_reference, variants=VARIANTS_TILED, bench_variant_software="bench_small",
    grad=lambda dev, rng: backward_grad(dev, rng, tiled=True),
    flops=lambda inp: 9.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
    description="fast forward + prep + dQ + dK/dV (timed together)"))

register(KernelCase(
    name="attention_backward_tiled_small", family="attention", precision="f32",
    kernels=_tiled_kernels(16, 8, 8),
    inputs=make_inputs,
    launch=lambda dev, inp: backward_launch(dev, inp, None,
                                            tiled_configs(dev, inp, SMALL_CONFIGS)),
    reference=reference.backward_reference, variants=VARIANTS_SMALL, bench_variant="bench_d32",
    bench_variant_software="bench_small_d32",
    grad=lambda dev, rng: backward_grad(dev, rng, pinned=SMALL_CONFIGS, tiled=True),
    flops=lambda inp: 9.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
    description="fast attention with 16x8 / 8x8 tiles (many tiles, uneven diagonal)"))

register(KernelCase(
    name="attention_backward_tiled_wide", family="attention", precision="f32",
    kernels=_tiled_kernels(16, 8, 4),
    inputs=make_inputs,
    launch=lambda dev, inp: backward_launch(dev, inp, None,
                                            tiled_configs(dev, inp, WIDE_CONFIGS)),
    reference=reference.backward_reference, variants=("random", "peaked", "mha"),
    bench_variant="long", bench_variant_software="long",
    grad=lambda dev, rng: backward_grad(dev, rng, pinned=WIDE_CONFIGS, tiled=True),
    flops=lambda inp: 9.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
    description="fast attention, 4-column tiles: 4 output vec4s per row"))

# tiles whose invocations load 32 vec4s of each staged operand per tile: the 32 prefetch
# registers (PF 32) that tiles of head dim 128 need on the H200
DEEP_CONFIGS = {"forward": "4x8", "dq": "4x8", "dkv": "4x8"}

register(KernelCase(
    name="attention_backward_tiled_deep", family="attention", precision="f32",
    kernels=_tiled_kernels(32, 4, 8),
    inputs=make_inputs,
    launch=lambda dev, inp: backward_launch(dev, inp, None,
                                            tiled_configs(dev, inp, DEEP_CONFIGS)),
    reference=reference.backward_reference, variants=("gqa4",), bench_variant="gqa4",
    bench_variant_software="gqa4",
    flops=lambda inp: 9.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
    description="fast attention with 4x8 tiles at head dim 32: 32 prefetch registers"))


# ---- the tensor-core kernels (05_attention_sgmat.wgsl): devices with f16 subgroup matrices --
# Head dims 16, 32 and 64, GQA, fused qkv, T not a multiple of the 64-row tiles, peaked
# softmaxes; f16 operands, so checked at "f16" against the float64 reference.
SGMAT_SHAPES = {"sg_random": (2, 37, 4, 2, 16, "rows", 1.0), "sg_gqa4": (2, 19, 4, 1, 32, "rows", 1.0),
                "sg_fused": (2, 150, 2, 1, 64, "fused", 1.0), "sg_peaked": (1, 40, 2, 1, 16, "rows", 4.0),
                "sg_long": (1, 1024, 2, 2, 64, "rows", 1.0),
                "sg_head_major": (2, 150, 4, 2, 64, "head_major", 1.0)}
SHAPES.update(SGMAT_SHAPES)
VARIANTS_SGMAT = tuple(SGMAT_SHAPES)


def _sgmat_kernels(D):
    return [(attention.FILE_SGMAT, attention.SGMAT_KERNELS[k], {}, attention.sgmat_params(D))
            for k in ("forward", "dq", "dkv")]


register(KernelCase(
    name="attention_forward_sgmat", family="attention", precision="f16",
    kernels=_sgmat_kernels(64)[:1],
    inputs=make_inputs,
    launch=lambda dev, inp: forward_launch(dev, inp, tensor_cores=True),
    reference=reference.forward_reference, variants=VARIANTS_SGMAT,
    bench_variant_software="bench_small", requires=("subgroup-matrix", "shader-f16"),
    bench_precision="subgroup-matrix",
    flops=lambda inp: 2.0 * _units(inp),
    bytes=lambda inp: (_bytes(inp, 2 * inp["H"] + 2 * inp["Hkv"])
                       + 4.0 * inp["B"] * inp["H"] * inp["T"]),
    description="tensor cores: forward, 64 queries x 64 keys per tile, online softmax in f32"))

register(KernelCase(
    name="attention_backward_sgmat", family="attention", precision="f16",
    kernels=_sgmat_kernels(64),
    inputs=make_inputs,
    launch=lambda dev, inp: backward_launch(dev, inp, tensor_cores="staged"),
    reference=reference.backward_reference, variants=VARIANTS_SGMAT,
    bench_variant_software="bench_small", requires=("subgroup-matrix", "shader-f16"),
    bench_precision="subgroup-matrix",
    flops=lambda inp: 9.0 * _units(inp),
    bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]),
    description="tensor cores: forward + prep + dQ + dK/dV (timed together; the pair "
                "tensor_cores='staged' runs, with the f32 forward)"))


# ---- 05_attention_sgmat2.wgsl (the backward only): the same variants. The model
# (tensor_cores=True, ops.sgmat_plan) runs its dQ and dK/dV after the staged forward
# (attention_forward_sgmat) on a device without Dawn's robustness and after the f32 tiled
# forward on one with it: attention_backward_sgmat2 and _small check them on the f32 tiled
# forward's o and lse, attention_backward_sgmat2_staged on the staged forward's (the
# trainer's default). "small" runs 16-key dQ tiles and 16-query dK/dV tiles.
def _sgmat2_kernels(D, **tiles):
    return [(attention.FILE_SGMAT2, attention.SGMAT2_KERNELS[k], {},
             attention.sgmat2_params(D, **tiles)) for k in ("dq", "dkv")]


def sgmat2_backward_launch(dev, inp, sgmat_tiles=None, staged_forward=False,
                           f16_inputs=False):
    """The f32 tiled forward (staged_forward: the staged tensor-core forward), then the
    sgmat2 backward (prep, dQ, dK/dV); f16_inputs: q, k, v as f16 buffers (the f32 forward
    reads f32 copies of the same values)."""
    forward_kwargs = {"config": "sgmat"} if staged_forward else {}
    f16 = ("both" if staged_forward else "backward") if f16_inputs else None
    return _backward_launch(dev, inp, forward_kwargs,
                            {"tensor_cores": "sgmat2-backward", "sgmat_tiles": sgmat_tiles},
                            f16_inputs=f16)


SMALL_SGMAT2 = {"BK": 16, "BQ2": 16}
_SGMAT2 = dict(family="attention", precision="f16", inputs=make_inputs,
               variants=VARIANTS_SGMAT, bench_variant_software="bench_small",
               requires=("subgroup-matrix", "shader-f16"), bench_precision="subgroup-matrix",
               thresholds={"min_cos": 0.9999})
_FWD_COST = dict(flops=lambda inp: 2.0 * _units(inp),
                 bytes=lambda inp: (_bytes(inp, 2 * inp["H"] + 2 * inp["Hkv"])
                                    + 4.0 * inp["B"] * inp["H"] * inp["T"]))
_BWD_COST = dict(flops=lambda inp: 9.0 * _units(inp),
                 bytes=lambda inp: _bytes(inp, 5 * inp["H"] + 4 * inp["Hkv"]))

register(KernelCase(
    name="attention_backward_sgmat2", kernels=_sgmat2_kernels(64),
    launch=lambda dev, inp: sgmat2_backward_launch(dev, inp),
    reference=reference.backward_reference, **_SGMAT2, **_BWD_COST,
    description="f32 tiled forward + prep + tensor cores v2 dQ (64 x 32) + dK/dV (64 keys x "
                "32 queries), timed together (the model with robustness)"))

register(KernelCase(
    name="attention_backward_sgmat2_small", kernels=_sgmat2_kernels(64, **SMALL_SGMAT2),
    launch=lambda dev, inp: sgmat2_backward_launch(dev, inp, sgmat_tiles=SMALL_SGMAT2),
    reference=reference.backward_reference, **_SGMAT2, **_BWD_COST,
    description="f32 tiled forward + the v2 backward with 16-key dQ and 16-query dK/dV tiles"))

Q_DOWN = {"qorder": "down"}

register(KernelCase(
    name="attention_backward_sgmat2_qdown", kernels=_sgmat2_kernels(64, **Q_DOWN),
    launch=lambda dev, inp: sgmat2_backward_launch(dev, inp, sgmat_tiles=Q_DOWN),
    reference=reference.backward_reference, **_SGMAT2, **_BWD_COST,
    description="the v2 backward with dK/dV visiting its query tiles from the last down "
                "(knob qorder='down': an L2 candidate)"))

register(KernelCase(
    name="attention_backward_sgmat2_small_qdown",
    kernels=_sgmat2_kernels(64, **SMALL_SGMAT2, **Q_DOWN),
    launch=lambda dev, inp: sgmat2_backward_launch(dev, inp,
                                                   sgmat_tiles={**SMALL_SGMAT2, **Q_DOWN}),
    reference=reference.backward_reference, **_SGMAT2, **_BWD_COST,
    description="the small-tile v2 backward with qorder='down' (more query tiles per key "
                "tile than the default's, so more of the order is exercised)"))

# The wide backward kernels (attention_backward_dq_sgmat2w / attention_backward_dkv_sgmat2w,
# 128 rows a workgroup: ops.SGMAT2_WIDE_SHAPES "w8" and "w4x2"; "w4" is their 64-row form),
# both at once. At the default tiles they need the H200's 48 KiB; the small rungs (16-key dQ
# tiles, 16-query dK/dV tiles, head dims 16 and 32) fit lavapipe's 32 KiB.
def _sgmat2w_kernels(D, wide, **tiles):
    params = attention.sgmat2_params(D, dq=wide, dkv=wide, **tiles)
    return [(attention.FILE_SGMAT2, attention.SGMAT2_WIDE[k], {}, params) for k in ("dq", "dkv")]


def _rows(wide):
    nsg, kr = attention.SGMAT2_WIDE_SHAPES[wide]
    return 16 * nsg * kr


for _wide in ("w8", "w4x2", "w4"):
    register(KernelCase(
        name=f"attention_backward_sgmat2_{_wide}", kernels=_sgmat2w_kernels(64, _wide),
        launch=lambda dev, inp, _wide=_wide: sgmat2_backward_launch(
            dev, inp, sgmat_tiles={"dq": _wide, "dkv": _wide}),
        reference=reference.backward_reference, **_SGMAT2, **_BWD_COST,
        description=f"f32 tiled forward + prep + the wide dQ and dK/dV kernels, {_wide!r} "
                    f"({_rows(_wide)} rows a workgroup)"))

register(KernelCase(
    name="attention_backward_sgmat2_base",
    kernels=[(attention.FILE_SGMAT2, attention.SGMAT2_KERNELS[k], {},
              attention.sgmat2_params(64, dq="base", dkv="base")) for k in ("dq", "dkv")],
    launch=lambda dev, inp: sgmat2_backward_launch(dev, inp,
                                                   sgmat_tiles={"dq": "base", "dkv": "base"}),
    reference=reference.backward_reference, **_SGMAT2, **_BWD_COST,
    description="f32 tiled forward + prep + the 64-row v2 dQ and dK/dV kernels (the op runs "
                "the 128-row ones where they fit unless tuned or pinned otherwise)"))

for _wide in ("w8", "w4x2"):
    register(KernelCase(
        name=f"attention_backward_sgmat2_{_wide}_small",
        kernels=_sgmat2w_kernels(32, _wide, **SMALL_SGMAT2),
        launch=lambda dev, inp, _wide=_wide: sgmat2_backward_launch(
            dev, inp, sgmat_tiles={"dq": _wide, "dkv": _wide, **SMALL_SGMAT2}),
        reference=reference.backward_reference,
        **{**_SGMAT2, "variants": tuple(v for v in VARIANTS_SGMAT if SHAPES[v][4] <= 32),
           "bench_variant_software": "sg_gqa4"}, **_BWD_COST,
        description=f"the wide dQ and dK/dV kernels ({_wide!r}) with 16-row tiles of the other "
                    "operand at head dims 16 and 32 (fit lavapipe's workgroup memory emulated; "
                    "many tiles per workgroup, GQA)"))

register(KernelCase(
    name="attention_backward_sgmat2_staged",
    kernels=_sgmat_kernels(64)[:1] + _sgmat2_kernels(64),
    launch=lambda dev, inp: sgmat2_backward_launch(dev, inp, staged_forward=True),
    reference=reference.backward_reference, **_SGMAT2, **_BWD_COST,
    description="staged tensor-core forward + prep + v2 dQ + dK/dV, timed together (the "
                "model's default: tensor_cores=True without robustness)"))


# ---- f16 q, k, v (the trainer's head-major copies in f16, ops.takes_f16_operands): the same
# kernels loading f16 tiles. Inputs rounded to f16 first, so the float64 reference sees the
# values the kernels load; no fused layout (f16 copies are separate buffers). The forward
# and the trainer's pair (staged forward, sgmat2 backward) need the H200's 48 KiB of
# workgroup memory; the small-tile sgmat2 backward also runs on lavapipe with emulated
# subgroup matrices (after the f32 tiled forward on f32 copies).
def make_inputs_f16(rng, variant):
    inp = make_inputs(rng, variant)
    for name in ("q", "k", "v"):
        inp[name] = inp[name].astype(np.float16).astype(np.float32)
    return inp


VARIANTS_SGMAT_F16 = tuple(v for v in VARIANTS_SGMAT if SHAPES[v][5] != "fused")
_F16_IN = {**_SGMAT2, "inputs": make_inputs_f16, "variants": VARIANTS_SGMAT_F16}
_PREP_F16 = (attention.FILE, "attention_backward_prep_vec4_f16", {"HD": 64})

register(KernelCase(
    name="attention_forward_sgmat_f16in",
    kernels=[(attention.FILE_SGMAT, attention.SGMAT_KERNELS["forward"], {},
              attention.sgmat_params(64, f16_inputs=True))],
    launch=lambda dev, inp: forward_launch(dev, inp, tensor_cores=True, f16_inputs=True),
    reference=reference.forward_reference, **_F16_IN, **_FWD_COST,
    description="the staged tensor-core forward loading f16 q, k, v (the trainer's)"))

register(KernelCase(
    name="attention_backward_sgmat_f16in",
    kernels=[(attention.FILE_SGMAT, attention.SGMAT_KERNELS[k], {},
              attention.sgmat_params(64, f16_inputs=True)) for k in ("forward", "dq", "dkv")]
    + [_PREP_F16],
    launch=lambda dev, inp: _backward_launch(dev, inp, {"config": "sgmat"},
                                             {"tensor_cores": "staged"}, f16_inputs="both"),
    reference=reference.backward_reference, **_F16_IN, **_BWD_COST,
    description="the staged tensor-core forward and backward on f16 q, k, v (do through "
                "the prep's f16 copy)"))

register(KernelCase(
    name="attention_backward_sgmat2_staged_f16in",
    kernels=([(attention.FILE_SGMAT, attention.SGMAT_KERNELS["forward"], {},
               attention.sgmat_params(64, f16_inputs=True))]
             + _sgmat2_kernels(64, f16_inputs=True) + [_PREP_F16]),
    launch=lambda dev, inp: sgmat2_backward_launch(dev, inp, staged_forward=True,
                                                   f16_inputs=True),
    reference=reference.backward_reference, **_F16_IN, **_BWD_COST,
    description="the trainer's attention on f16 q, k, v: staged forward + prep (do16) + v2 "
                "dQ + dK/dV"))

for _wide in ("w8", "w4x2"):
    register(KernelCase(
        name=f"attention_backward_sgmat2_staged_f16in_{_wide}",
        kernels=([(attention.FILE_SGMAT, attention.SGMAT_KERNELS["forward"], {},
                   attention.sgmat_params(64, f16_inputs=True))]
                 + _sgmat2w_kernels(64, _wide, f16_inputs=True) + [_PREP_F16]),
        launch=lambda dev, inp, _wide=_wide: _backward_launch(
            dev, inp, {"config": "sgmat"},
            {"tensor_cores": "sgmat2-backward", "sgmat_tiles": {"dq": _wide, "dkv": _wide}},
            f16_inputs="both"),
        reference=reference.backward_reference, **_F16_IN, **_BWD_COST,
        description=f"the trainer's attention on f16 q, k, v with the wide dQ and dK/dV "
                    f"kernels ({_wide!r})"))

register(KernelCase(
    name="attention_backward_sgmat2_small_f16in",
    kernels=_sgmat2_kernels(64, f16_inputs=True, **SMALL_SGMAT2) + [_PREP_F16],
    launch=lambda dev, inp: sgmat2_backward_launch(dev, inp, sgmat_tiles=SMALL_SGMAT2,
                                                   f16_inputs=True),
    reference=reference.backward_reference, **_F16_IN, **_BWD_COST,
    description="f32 tiled forward on f32 copies + the small-tile v2 backward loading f16 "
                "q, k, v and the prep's do16 (fits lavapipe's workgroup memory emulated)"))
