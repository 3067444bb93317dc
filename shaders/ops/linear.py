"""The matmul family (03_linear.wgsl, 03_linear_h16.wgsl): every Linear layer's three products.

All matrices are row-major with a leading dimension `ld*` (elements between consecutive rows,
default: the row length, i.e. contiguous). With PyTorch's Linear convention, a weight W is
[N_out, K_in] and

    forward   y[M, N]  = x[M, K] @ W[N, K]^T     matmul_nt(rec, x, W, y, M, N, K)
    dX        dx[M, K] = dy[M, N] @ W[N, K]      matmul_nn(rec, dy, W, dx, M, K, N)
    dW        dW[N, K] += dy[M, N]^T @ x[M, K]   matmul_tn(rec, dy, x, dW, N, K, M, accumulate=True)

where M = B*T tokens. Epilogues: `accumulate=True` adds into `out` (gradient accumulation,
in-place residual adds `x += attn @ Wo^T`), `residual=R` writes `out = R + alpha*A@B`
(out-of-place residual, R laid out like out), `alpha` scales the product.

f16 weights: pass the f16 mirror view as `b` (dtype float16). matmul_nt/matmul_nn then read
it as f16 and compute in f32 (kernels *_w16: only the weight's f16 rounding is lost).
`f16_math=True` (matmul_nt only) also rounds A to f16 and multiplies in packed vec4<f16>
with f32 accumulation per K-slice (kernel matmul_nt_h16): the mixed-precision forward path,
not for gradients (their magnitudes fall below f16's range). Both need `shader-f16`.

Tiles: `tiles=(BM, BN, BK)` (BM, BN in {32, 64, 128}, BK >= 1) or None for a choice by
shape (`default_tiles`); the autotuner of issue 10 will pass its own.
"""

from __future__ import annotations

import numpy as np

from ._common import F16, F32, ceil_div, check, dummy, grid2d, positive, workgroup_storage

FILE = "03_linear.wgsl"
FILE_H16 = "03_linear_h16.wgsl"
MODES = {"store": 0, "accumulate": 1, "residual": 2}


def default_tiles(M: int, N: int, K: int) -> tuple[int, int, int]:
    """(BM, BN, BK) by shape: big tiles for big matrices, small ones so tiny shapes waste less."""
    def side(n):
        return 128 if n >= 1024 else 64 if n >= 64 else 32
    return side(M), side(N), 16


def kernel_name(layout: str, b_dtype, f16_math: bool = False) -> tuple[str, str]:
    """(file, kernel) for a layout ("nn", "nt", "tn"), B's dtype and the f16-math flag."""
    b_dtype = np.dtype(b_dtype)
    if layout not in ("nn", "nt", "tn"):
        raise ValueError(f"matmul layout must be nn, nt or tn, got {layout!r}")
    if f16_math:
        if layout != "nt" or b_dtype != F16:
            raise ValueError("f16_math needs layout nt and an f16 B (the weight mirror)")
        return FILE_H16, "matmul_nt_h16"
    if b_dtype == F16:
        if layout == "tn":
            raise ValueError("matmul_tn has no f16-B variant (it computes weight gradients)")
        return FILE, f"matmul_{layout}_w16"
    return FILE, f"matmul_{layout}"


def tile_constants(tiles) -> dict:
    bm, bn, bk = (int(t) for t in tiles)
    if bm % 8 or bn % 8 or bm < 8 or bn < 8 or bk < 1:
        raise ValueError(f"matmul tiles {tiles}: BM and BN must be multiples of 8, BK >= 1")
    return {"BM": bm, "BN": bn, "BK": bk, "WG": (bm // 8) * (bn // 8)}


def matmul(rec, a, b, out, M: int, N: int, K: int, *, layout: str, accumulate: bool = False,
           residual=None, alpha: float = 1.0, lda: int | None = None, ldb: int | None = None,
           ldc: int | None = None, f16_math: bool = False, tiles=None) -> None:
    """Record out[M,N] (=, +=) alpha * op(A) @ op(B) (+ residual); see the module docstring."""
    op = f"matmul_{layout}"
    positive(op, M=M, N=N, K=K)
    if accumulate and residual is not None:
        raise ValueError(f"{op}: accumulate and residual are exclusive (accumulate is out += ...)")
    a_rows, a_cols = (K, M) if layout == "tn" else (M, K)
    b_rows, b_cols = (N, K) if layout == "nt" else (K, N)
    lda = a_cols if lda is None else lda
    ldb = b_cols if ldb is None else ldb
    ldc = N if ldc is None else ldc
    if lda < a_cols or ldb < b_cols or ldc < N:
        raise ValueError(f"{op}: leading dimensions lda={lda} ldb={ldb} ldc={ldc} are shorter "
                         f"than the rows ({a_cols}, {b_cols}, {N})")
    check(op, "a", a, (a_rows - 1) * lda + a_cols)
    b_dtype = check(op, "b", b, (b_rows - 1) * ldb + b_cols, (F32, F16))
    check(op, "out", out, (M - 1) * ldc + N)
    if residual is not None:
        check(op, "residual", residual, (M - 1) * ldc + N)
    file, name = kernel_name(layout, b_dtype, f16_math)
    tiles = tiles or default_tiles(M, N, K)
    constants = tile_constants(tiles)
    dev = rec.device
    staged = (constants["BM"] + constants["BN"]) * constants["BK"] * (2 if f16_math else 4)
    if staged > workgroup_storage(dev) - 1024:
        raise ValueError(f"{op}: tiles {tuple(tiles)} stage {staged} bytes, more than the "
                         f"device's workgroup memory allows ({workgroup_storage(dev)})")
    kern = dev.kernel(file, name, constants)
    mode = MODES["residual"] if residual is not None else MODES["accumulate" if accumulate
                                                              else "store"]
    params = dev.params("IIIIfIII", M, N, K, mode, float(alpha), lda, ldb, ldc)
    res = residual if residual is not None else dummy(dev)
    grid = grid2d(dev, op, ceil_div(N, constants["BN"]), ceil_div(M, constants["BM"]))
    rec.dispatch(kern, [a, b, res, out, params], grid, label=name)


def matmul_nn(rec, a, b, out, M, N, K, **kw) -> None:
    """out[M,N] = alpha * a[M,K] @ b[K,N] (b f32, or f16 read into f32 math)."""
    matmul(rec, a, b, out, M, N, K, layout="nn", **kw)


def matmul_nt(rec, a, b, out, M, N, K, **kw) -> None:
    """out[M,N] = alpha * a[M,K] @ b[N,K]^T (Linear forward with b = W[N_out, K_in])."""
    matmul(rec, a, b, out, M, N, K, layout="nt", **kw)


def matmul_tn(rec, a, b, out, M, N, K, **kw) -> None:
    """out[M,N] = alpha * a[K,M]^T @ b[K,N] (Linear dW: dW[N_out,K_in] += dy^T @ x)."""
    matmul(rec, a, b, out, M, N, K, layout="tn", **kw)


def linear_backward(rec, dy, x, w, dx, dw, tokens: int, d_in: int, d_out: int, *,
                    accumulate_dx: bool = False, accumulate_dw: bool = True) -> None:
    """Backward of y = x @ W^T: dx (=, +=) dy @ W and dW (+=) dy^T @ x.

    dy [tokens, d_out], x [tokens, d_in], w [d_out, d_in] (f32, or the f16 mirror),
    dx [tokens, d_in], dw [d_out, d_in] (f32). Either of dx/dw may be None to skip it.
    """
    if dx is not None:
        matmul_nn(rec, dy, w, dx, tokens, d_in, d_out, accumulate=accumulate_dx)
    if dw is not None:
        matmul_tn(rec, dy, x, dw, d_out, d_in, tokens, accumulate=accumulate_dw)
