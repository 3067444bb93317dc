"""Ladder entries for the matmul family (ops.py, 03_linear*.wgsl; references in reference.py).

Each case runs the same op function the model uses. Variants: ragged shapes that no tile
divides, M=1/K=3 (decode-like), 1x1x1, tile-aligned multi-tile shapes, and strided operands
whose padding holds NaN (a kernel reading outside its rows would poison the result) and whose
output padding must survive untouched. `bench` uses the 124M model's FFN shapes at 8 x 1024
tokens (`bench_small` on software adapters).

The plain cases (matmul_nt, ...) take whatever path the op picks by default: the general
kernel for shapes that cannot be read as vec4 (random, odd, one, strided), the fast path
otherwise (aligned, bench). The *_tiled cases pin the fast path (03_linear_tiled.wgsl,
expanded for the case's register block and FOLD) on vec4-ready shapes only (ragged
multiples of 4, padded leading dimensions, a split-K variant whose K splits into uneven BK
slices) so the kernels face every edge; the cases named after a configuration pin one
register-block shape, slice depth, FOLD or split factor so that each code path (every
register block, all eight prefetch registers) is checked on every device.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ...ladder import KernelCase, Launch, register
from . import ops as linear
from . import reference
from ..case_support import f64, fd_consistency, grad_report, run_launch, torch_grads

# (M, N, K) per variant for the forward (NT) orientation; others permute (see _shape).
SHAPES = {
    "random": (67, 129, 45),
    "odd": (1, 129, 3),
    "one": (1, 1, 1),
    "aligned": (128, 256, 64),
    "strided": (33, 40, 20),
    "bench": (8192, 3072, 768),
    "bench_small": (1024, 768, 768),
    # vec4-ready shapes for the tiled kernels
    "random4": (68, 132, 44),
    "tiny4": (4, 4, 4),
    "strided4": (36, 40, 20),
    "split": (36, 40, 1000),
}
VARIANTS = ("random", "odd", "one", "aligned", "strided")
VARIANTS_TILED = ("random4", "tiny4", "aligned", "strided4", "split")


def _shape(layout, variant):
    """(M, N, K) of the product for a layout: the FFN up-projection's fwd, dX and dW."""
    m, n, k = SHAPES[variant]
    if variant.startswith("bench"):
        return {"nt": (m, n, k), "nn": (m, k, n), "tn": (n, k, m)}[layout]
    return m, n, k


def _stored(rng, rows, cols, ld, dtype=np.float32):
    """A rows x cols matrix stored with leading dimension ld; padding holds NaN."""
    full = np.full((rows, ld), np.nan, dtype=np.float32)
    full[:, :cols] = rng.standard_normal((rows, cols))
    return full.astype(dtype)


def make_inputs(layout, mode, b16, rng, variant, a16=False):
    M, N, K = _shape(layout, variant)
    a_rows, a_cols = (K, M) if layout == "tn" else (M, K)
    b_rows, b_cols = (N, K) if layout == "nt" else (K, N)
    if variant == "strided":
        lda, ldb, ldc = a_cols + 7, b_cols + 5, N + 3
    elif variant == "strided4":   # padded rows that keep 16-byte alignment
        lda, ldb, ldc = a_cols + 8, b_cols + 4, N + 12
    else:
        lda, ldb, ldc = a_cols, b_cols, N
    inp = {"M": M, "N": N, "K": K, "lda": lda, "ldb": ldb, "ldc": ldc, "mode": mode,
           "variant": variant,
           "alpha": 0.75 if mode != "store" else 1.0,
           "a": _stored(rng, a_rows, a_cols, lda, np.float16 if a16 else np.float32),
           "b": _stored(rng, b_rows, b_cols, ldb, np.float16 if b16 else np.float32)}
    out = np.full((M, ldc), -7.0, np.float32)  # sentinel in the padding must survive
    out[:, :N] = rng.standard_normal((M, N)) if mode == "accumulate" else 0.0
    inp["out"] = out
    if mode == "residual":
        res = np.full((M, ldc), 123.0, np.float32)
        res[:, :N] = rng.standard_normal((M, N))
        inp["residual"] = res
    return inp


def variant_config(dev, inp, layout, b16, f16_math, config):
    """The fast-path configuration a case runs: its own, else the op's choice; the `split`
    variant forces three K-splits on top of it so split-K runs on every device."""
    if inp.get("variant") != "split":
        return config
    M, N, K = inp["M"], inp["N"], inp["K"]
    if isinstance(config, linear.SgmatConfig):
        return config.with_splits(3)
    base = linear.MatmulConfig.parse(config) if config is not None else linear.choose_config(
        dev, layout, np.float16 if b16 else np.float32, f16_math, M, N, K)
    return base.with_splits(3)


def make_launch(dev, inp, layout, f16_math=False, tiles=None, config=None, b16=False,
                fast=False):
    a, b, out = dev.upload(inp["a"]), dev.upload(inp["b"]), dev.upload(inp["out"])
    res = dev.upload(inp["residual"]) if "residual" in inp else None
    config = variant_config(dev, inp, layout, b16, f16_math, config)

    def encode(rec):
        linear.matmul(rec, a, b, out, inp["M"], inp["N"], inp["K"], layout=layout,
                      accumulate=inp["mode"] == "accumulate", residual=res,
                      alpha=inp["alpha"], lda=inp["lda"], ldb=inp["ldb"], ldc=inp["ldc"],
                      f16_math=f16_math, tiles=tiles, config=config)
    return Launch(encode, lambda: {"out": dev.download(out)})


def _register(name, layout, mode="store", b16=False, f16_math=False, tiles=None,
              precision="f32", description="", fast=False, config=None):
    """fast False: the op's default path; True: the fast path with `config` (None: the
    op's configuration), compiled for the config's register block by the compile rung."""
    b_dtype = np.float16 if b16 else np.float32
    if fast:
        cfg = linear.MatmulConfig.parse(config or ("32x32x16-4x4-s1" if f16_math
                                                   else "32x32x8-4x4-s1"))
        file, kernel = linear.tiled_kernel_name(layout, b_dtype, f16_math)
        kernels = [(file, kernel, cfg.constants(f16_math), cfg.template_params(f16_math)),
                   (linear.FILE_SPLITK, "matmul_splitk_reduce")]
        variants = VARIANTS_TILED
    else:
        file, kernel = linear.kernel_name(layout, b_dtype, f16_math)
        kernels = [(file, kernel, linear.tile_constants(tiles or (64, 64, 16)))]
        variants = VARIANTS
    register(KernelCase(
        name=name, family="matmul", precision=precision,
        kernels=kernels,
        inputs=lambda rng, v: make_inputs(layout, mode, b16, rng, v),
        launch=lambda dev, inp: make_launch(dev, inp, layout, f16_math, tiles, config, b16,
                                            fast),
        reference=lambda inp: reference.matmul(inp, layout, f16_math),
        variants=variants, bench_variant_software="bench_small",
        requires=("shader-f16",) if f16_math or (b16 and not fast) else (),
        bench_precision="f16" if f16_math else "f32",
        flops=lambda inp: 2.0 * inp["M"] * inp["N"] * inp["K"],
        bytes=lambda inp: (inp["a"].nbytes + inp["b"].nbytes
                           + inp["out"].nbytes * (2 if mode != "store" else 1)
                           + (inp["residual"].nbytes if mode == "residual" else 0)),
        description=description))


_register("matmul_nt", "nt", description="C = A @ B^T (Linear forward)")
_register("matmul_nn", "nn", description="C = A @ B (Linear dX)")
_register("matmul_tn", "tn", description="C = A^T @ B (Linear dW)")
_register("matmul_nt_accumulate", "nt", "accumulate", description="C += alpha A @ B^T")
_register("matmul_tn_accumulate", "tn", "accumulate", description="dW += alpha dy^T @ x")
_register("matmul_nn_accumulate", "nn", "accumulate", description="dX += alpha dy @ W")
_register("matmul_nt_residual", "nt", "residual", description="C = R + alpha A @ B^T")
_register("matmul_nt_t128", "nt", tiles=(128, 128, 8), description="128x128x8 tiles")
_register("matmul_nn_t32", "nn", tiles=(32, 32, 32), description="32x32x32 tiles")
_register("matmul_nt_w16", "nt", b16=True, description="f16 weights, f32 math")
_register("matmul_nn_w16", "nn", b16=True, description="dX from f16 weights, f32 math")
_register("matmul_nt_w16_residual", "nt", "residual", b16=True,
          description="f16 weights, residual epilogue")
_register("matmul_nt_h16", "nt", b16=True, f16_math=True, precision="f16",
          description="packed-f16 multiplies, f32 accumulation (forward)")
_register("matmul_nt_h16_accumulate", "nt", "accumulate", b16=True, f16_math=True,
          precision="f16", description="packed-f16 forward, accumulate epilogue")

# The fast path with the op's configuration (tuned, else the device-class default) or a
# pinned one. (suffix, layout, mode, b16, f16_math, config, what)
FAST_CASES = (
    ("", "nt", "store", False, False, None, "C = A @ B^T (forward)"),
    ("", "nn", "store", False, False, None, "C = A @ B (dX)"),
    ("", "tn", "store", False, False, None, "C = A^T @ B (dW)"),
    ("_accumulate", "tn", "accumulate", False, False, None, "dW += alpha dy^T @ x"),
    ("_accumulate", "nn", "accumulate", False, False, None, "dX += alpha dy @ W"),
    ("_residual", "nt", "residual", False, False, None, "C = R + alpha A @ B^T"),
    ("", "nt_w16", "store", True, False, None, "forward from f16 weights, f32 math"),
    ("", "nn_w16", "store", True, False, None, "dX from f16 weights, f32 math"),
    ("_accumulate", "nn_w16", "accumulate", True, False, None, "dX += dy @ W16"),
    ("", "nt_h16", "store", True, True, None, "packed-f16 forward, f32 accumulation"),
    ("_residual", "nt_h16", "residual", True, True, None, "packed-f16 forward + residual"),
    # one case per register-block shape, slice depth, FOLD and split factor (each fits
    # 32 KiB); 64 invocations with 8x8 blocks (4 loads per operand and slice) and a deep
    # slice (8 prefetch registers for B, 4 for A)
    ("_8x8", "nt", "store", False, False, "128x128x8-8x8-s1", "128x128 tiles, 8x8 blocks"),
    ("_8x4", "nn", "store", False, False, "128x64x16-8x4-s1", "128x64 tiles, 8x4 blocks"),
    ("_4x8", "tn", "store", False, False, "64x128x16-4x8-s1", "64x128 tiles, 4x8 blocks"),
    ("_splitk", "tn", "accumulate", False, False, "64x64x16-4x4-s4", "dW with four K-splits"),
    ("_8x8", "nt_h16", "store", True, True, "128x128x16-8x8-s1-fold16",
     "packed-f16 128x128 tiles, f16 partials of 16 terms (FOLD = BK)"),
    ("_8x4", "nt_h16", "accumulate", True, True, "128x64x32-8x4-s1-fold32",
     "packed-f16 8x4 blocks, f16 partials of 32 terms"),
    ("_4x8", "nt_h16", "residual", True, True, "64x128x32-4x8-s1",
     "packed-f16 4x8 blocks, two folds of 16 per slice, residual epilogue"),
    ("_64wg", "nn", "accumulate", False, False, "64x64x16-8x8-s1",
     "64x64 tiles, 8x8 blocks, 64 invocations"),
    ("_deep", "nt", "store", False, False, "32x64x32-4x8-s1",
     "BK 32 with 64 invocations: every prefetch register"),
    ("_deep", "nt_w16", "residual", True, False, "32x64x32-4x8-s1",
     "f16 weights, BK 32, residual epilogue"),
)

for _suffix, _key, _mode, _b16, _f16, _config, _what in FAST_CASES:
    _register(f"matmul_{_key}_tiled{_suffix}", _key[:2], _mode, b16=_b16, f16_math=_f16,
              fast=True, config=_config, precision="f16" if _f16 else "f32",
              description=f"fast path: {_what}")


# ---- the tensor-core path (03_linear_sgmat.wgsl): devices with f16 subgroup matrices --------
# (suffix, layout, mode, b16, config, what): every layout and epilogue, f32 and f16 B, every
# tile arrangement the tuner may pick (1-16 subgroups, 16 and 32 deep slices, pad 0 and 8),
# one and two slices in flight (-a2), staged and straight stores (-d), one stage (-b1).
SGMAT_CASES = (
    ("", "nt", "store", False, "sg2x2-t4x4-k32-p8-s1", "forward, f32 B rounded"),
    ("", "nt_w16", "residual", True, "sg2x4-t4x4-k16-p8-s1", "forward from f16 weights + residual"),
    ("", "nn_w16", "store", True, "sg4x2-t4x4-k16-p8-s1", "dX from f16 weights"),
    ("_accumulate", "nn", "accumulate", False, "sg2x2-t2x2-k32-p0-s1", "dX += alpha dy @ W"),
    ("", "tn", "accumulate", False, "sg2x2-t4x4-k16-p8-s1", "dW += dy^T @ x"),
    ("_small", "tn", "store", False, "sg1x1-t2x2-k16-p8-s1", "one subgroup, 32x32 tiles"),
    ("_a2", "nt_w16", "residual", True, "sg4x2-t4x4-k16-p8-s1-a2", "two slices in flight"),
    ("_direct", "nn_w16", "store", True, "sg2x2-t4x4-k16-p8-s1-d", "dX, straight stores"),
    ("_direct", "tn", "accumulate", False, "sg4x4-t2x2-k16-p8-s1-a2-d",
     "dW +=, straight stores, two slices in flight"),
    # A in f16 (the LM head's dlogits; _a16 kernels)
    ("", "nn_a16_w16", "store", True, "sg4x4-t2x2-k16-p8-s1-a2-d", "head dX: f16 dlogits, f16 W"),
    ("", "tn_a16", "accumulate", False, "sg2x2-t4x4-k16-p8-s1", "head dW +=: f16 dlogits"),
    ("", "nt_a16_w16", "residual", True, "sg4x2-t4x4-k16-p8-s1-a2", "forward, f16 A"),
    ("", "nn_a16", "accumulate", False, "sg2x2-t2x2-k32-p0-s1", "dX +=, f16 A, f32 B"),
    ("", "nt_a16", "store", False, "sg1x1-t2x2-k16-p8-s1", "forward, f16 A, f32 B clamped"),
    # B in f16 for tn (f16 precision's f16 activations in the weight gradients)
    ("", "tn_w16", "accumulate", True, "sg2x2-t4x4-k16-p8-s1", "dW += dy^T @ x, f16 x"),
    # one stage of BK 32 (-b1, the tuned kernels): 16 subgroups of 2x4 and
    # of 4x2 tiles, 4 of 4x4, split-K, f16 A
    ("_single", "nt_w16", "residual", True, "sg4x4-t2x4-k32-p8-s1-b1", "one stage, 128 x 256"),
    ("_single", "nn_w16", "store", True, "sg4x4-t4x2-k32-p8-s2-b1", "dX, one stage, split-K"),
    ("_single", "tn", "accumulate", False, "sg2x2-t4x4-k32-p8-s4-b1",
     "dW +=, one stage, 4 subgroups, split-K"),
    ("_single", "nn_a16_w16", "store", True, "sg2x2-t4x4-k32-p8-s8-b1",
     "head dX, one stage: f16 dlogits, f16 W"),
    ("_single", "tn_w16", "accumulate", True, "sg2x2-t4x4-k32-p8-s4-b1",
     "dW +=, one stage, split-K, f16 x"),
)


def emulation_config(dev, cfg, layout: str):
    """`cfg`, or on a device that emulates subgroup matrices (a CPU: 32 KiB of workgroup
    memory) where it does not fit, the same configuration with fewer or smaller tiles: every
    flag (slice depth, pad, split-K, slices in flight, direct stores, one stage) kept."""
    if not getattr(dev, "emulated_features", ()) or not cfg.problems(dev, layout):
        return cfg
    for sgr, sgc, ti, tj in ((cfg.sgr, cfg.sgc, min(cfg.ti, 2), min(cfg.tj, 2)),
                             (min(cfg.sgr, 2), min(cfg.sgc, 2), min(cfg.ti, 2), min(cfg.tj, 2)),
                             (1, 1, 2, 2), (1, 1, 1, 1)):
        fit = dataclasses.replace(cfg, sgr=sgr, sgc=sgc, ti=ti, tj=tj)
        if not fit.problems(dev, layout):
            return fit
    return cfg


def _register_sgmat(suffix, key, mode, b16, config, what):
    layout = key[:2]
    a16 = "_a16" in key
    cfg = linear.SgmatConfig.parse(config)
    _, name = linear.kernel_name(layout, np.float16 if b16 else np.float32, tensor_cores=True)
    if a16:
        name = name.replace(f"matmul_{layout}", f"matmul_{layout}_a16")
    register(KernelCase(
        name=f"matmul_{key}_sgmat{suffix}", family="matmul", precision="f32",
        kernels=lambda dev: [(linear.FILE_SGMAT, name + "_sgmat", {},
                              emulation_config(dev, cfg, layout).template_params(layout, a16)),
                             (linear.FILE_SPLITK, "matmul_splitk_reduce")],
        inputs=lambda rng, v: make_inputs(layout, mode, b16, rng, v, a16),
        launch=lambda dev, inp: make_launch(dev, inp, layout,
                                            config=emulation_config(dev, cfg, layout), b16=b16,
                                            fast=True),
        reference=lambda inp: reference.tensor_core_matmul(inp, layout),
        variants=VARIANTS_TILED, bench_variant_software="bench_small",
        requires=("subgroup-matrix", "shader-f16"), bench_precision="subgroup-matrix",
        flops=lambda inp: 2.0 * inp["M"] * inp["N"] * inp["K"],
        bytes=lambda inp: inp["a"].nbytes + inp["b"].nbytes + inp["out"].nbytes,
        description=f"tensor cores: {what} (f16 operands, f32 accumulation)"))


for _case in SGMAT_CASES:
    _register_sgmat(*_case)


# ---- linear backward: dX (matmul_nn) and dW (matmul_tn) against autograd ----------------

LB_SHAPES = {"random": (37, 19, 23), "odd": (1, 3, 129), "bench": (8192, 768, 3072),
             "bench_small": (1024, 768, 768)}


def _lb_inputs(rng, variant):
    tokens, d_in, d_out = LB_SHAPES[variant]
    return {"x": rng.standard_normal((tokens, d_in)).astype(np.float32),
            "w": (rng.standard_normal((d_out, d_in)) * 0.1).astype(np.float32),
            "dy": rng.standard_normal((tokens, d_out)).astype(np.float32),
            "dw0": rng.standard_normal((d_out, d_in)).astype(np.float32)}


def _lb_launch(dev, inp):
    tokens, d_in = inp["x"].shape
    d_out = inp["w"].shape[0]
    x, w, dy = dev.upload(inp["x"]), dev.upload(inp["w"]), dev.upload(inp["dy"])
    dx, dw = dev.empty((tokens, d_in)), dev.upload(inp["dw0"])
    return Launch(lambda rec: linear.linear_backward(rec, dy, x, w, dx, dw, tokens, d_in, d_out),
                  lambda: {"dx": dev.download(dx), "dw": dev.download(dw)})


def _lb_grad(dev, rng):
    inp = _lb_inputs(rng, "random")
    inp["dw0"][:] = 0.0
    tokens, d_in = inp["x"].shape
    d_out = inp["w"].shape[0]
    got = run_launch(dev, _lb_launch(dev, inp))
    ref = torch_grads(lambda x, w: x @ w.T, {"x": inp["x"], "w": inp["w"]}, inp["dy"],
                      ("x", "w"))

    def loss(params):
        y = dev.empty((tokens, d_out))
        x, w = dev.upload(params["x"]), dev.upload(params["w"])
        with dev.record() as rec:
            linear.matmul_nt(rec, x, w, y, tokens, d_out, d_in)
        return float(np.sum(f64(dev.download(y)) * f64(inp["dy"])))

    gap = fd_consistency(loss, {"x": inp["x"], "w": inp["w"]},
                         {"x": got["dx"], "w": got["dw"]}, rng)
    return grad_report({"dx": (got["dx"], ref["x"]), "dw": (got["dw"], ref["w"])}, "f32", gap)


register(KernelCase(
    name="linear_backward", family="matmul", precision="f32",
    kernels=[(linear.FILE, "matmul_nn", linear.tile_constants((32, 32, 16))),
             (linear.FILE, "matmul_tn", linear.tile_constants((32, 32, 16)))],
    inputs=_lb_inputs, launch=_lb_launch, reference=reference.linear_backward_reference,
    variants=("random", "odd"), bench_variant_software="bench_small", grad=_lb_grad,
    flops=lambda inp: 4.0 * inp["x"].shape[0] * inp["x"].shape[1] * inp["w"].shape[0],
    bytes=lambda inp: 2 * (inp["x"].nbytes + inp["w"].nbytes + inp["dy"].nbytes)
    + 2 * inp["dw0"].nbytes,
    description="dX = dy @ W and dW += dy^T @ x (matmul_nn + matmul_tn)"))
