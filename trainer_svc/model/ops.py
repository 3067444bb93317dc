"""The kernels the model records, under the names and argument orders the model uses.

Each function records one or a few dispatches into a Recorder (`rec`); operands are Buffers or
BufferViews (sub-ranges of the parameter, gradient and moment buffers); all shapes are
row-major, rows = B*T tokens. The WGSL and its numpy reference live with the kernels in
`shaders/ops/<family>.py`, `shaders/wgsl/` and the ladder (`istanbul kernels check`); this
module only adapts their calling conventions to the model's:

    linear(x, W, y, M, N, K)          y[M,N]  = x[M,K] · W[N,K]ᵀ  (+ residual R[M,N])
    linear_dx(dy, W, dx, M, K, N)     dx[M,K] (=|+=) dy[M,N] · W[N,K]
    linear_dw(dy, x, dW, N, K, M)     dW[N,K] += dy[M,N]ᵀ · x[M,K]

W may be the f32 master weights or the f16 mirror (then read as f16, f32 arithmetic).
"""

from __future__ import annotations

import importlib

import numpy as np

INFRA = "infra.wgsl"
EW = 256


def _family(name: str):
    """The op module shaders.ops.<name> (kernels branch); a clear error while it is absent."""
    try:
        return importlib.import_module(f"shaders.ops.{name}")
    except ModuleNotFoundError as exc:
        raise NotImplementedError(
            f"kernel family shaders/ops/{name}.py is not in this build yet; the model needs "
            "it (merge the kernels branch)") from exc


# ---- infrastructure (foundation kernels) ------------------------------------------------------

def fill(rec, buf, value: float, n: int) -> None:
    kern = rec.device.kernel(INFRA, "fill")
    rec.dispatch(kern, [buf, rec.device.params("IIfI", n, 0, float(value), 0)], -(-n // EW),
                 label="fill")


def cast_f16(rec, src, dst, n: int) -> None:
    kern = rec.device.kernel(INFRA, "cast_f32_f16")
    rec.dispatch(kern, [src, dst, rec.device.params("IIfI", n, 0, 0.0, 0)], -(-n // EW),
                 label="cast_f32_f16")


def copy(rec, src, dst, n: int) -> None:
    kern = rec.device.kernel(INFRA, "copy")
    rec.dispatch(kern, [src, dst, rec.device.params("IIfI", n, 0, 0.0, 0)], -(-n // EW),
                 label="copy")


# ---- matmuls ---------------------------------------------------------------------------------

def linear(rec, x, w, y, M: int, N: int, K: int, *, residual=None) -> None:
    _family("linear").matmul_nt(rec, x, w, y, M, N, K, residual=residual)


def linear_dx(rec, dy, w, dx, M: int, K: int, N: int, *, accumulate: bool = False) -> None:
    _family("linear").matmul_nn(rec, dy, w, dx, M, K, N, accumulate=accumulate)


def linear_dw(rec, dy, x, dw, N: int, K: int, M: int) -> None:
    _family("linear").matmul_tn(rec, dy, x, dw, N, K, M, accumulate=True)
