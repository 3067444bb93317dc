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


# ---- embedding ---------------------------------------------------------------------------------

def embedding(rec, ids, table, out, tokens: int, dim: int, vocab: int) -> None:
    """out[t] = table[ids[t]] (table: the f32 master rows)."""
    _family("embedding").forward(rec, ids, table, out, tokens, dim, vocab)


def embedding_plan_size(tokens: int) -> int:
    return _family("embedding").plan_size(tokens)


def embedding_plan(ids) -> np.ndarray:
    """Host-side grouping of token positions by id that the backward needs."""
    return _family("embedding").backward_plan(ids)


def embedding_backward(rec, plan, ids, dout, dtable, tokens: int, dim: int, vocab: int) -> None:
    """dtable[id] += sum of dout rows with that id (deterministic, no atomics)."""
    _family("embedding").backward(rec, plan, ids, dout, dtable, tokens, dim, vocab)


# ---- RMSNorm -----------------------------------------------------------------------------------

def rmsnorm(rec, x, gain, y, rstd, rows: int, d: int, eps: float) -> None:
    """y = x * rstd * gain with rstd = 1/sqrt(mean(x^2) + eps) saved per row."""
    _family("rmsnorm").forward(rec, x, gain, y, rstd, rows, d, eps)


def rmsnorm_backward(rec, x, gain, rstd, dy, dx, dgain, rows: int, d: int, *,
                     accumulate_dx: bool) -> None:
    """dx (=|+=) d/dx; dgain += sum over rows of dy * x * rstd."""
    _family("rmsnorm").backward(rec, x, gain, dy, rstd, dx, dgain, rows, d,
                                accumulate_dx=accumulate_dx)


# ---- RoPE --------------------------------------------------------------------------------------

def rope_table(device, max_positions: int, head_dim: int, theta: float):
    """The (cos, sin) table the rope kernels read (computed once in float64 on the host)."""
    return device.upload(_family("rope").rope_table(max_positions, head_dim, theta),
                         label="rope table")


def rope(rec, x, table, B: int, T: int, H: int, hd: int, *, pos0: int = 0) -> None:
    """Rotate x[B, T, H, hd] in place (pairs i, i + hd/2) at positions pos0 + t."""
    _family("rope").forward(rec, x, table, B, T, H, hd, pos_offset=pos0)


def rope_backward(rec, dx, table, B: int, T: int, H: int, hd: int) -> None:
    _family("rope").backward(rec, dx, table, B, T, H, hd)


# ---- SwiGLU ------------------------------------------------------------------------------------

def swiglu(rec, gate_up, out, rows: int, F: int) -> None:
    """out[r, c] = silu(g[r, c]) * u[r, c], gate_up row r = [g (F values) | u (F values)]."""
    _family("activations").swiglu_forward(rec, gate_up, out, rows, F)


def swiglu_backward(rec, gate_up, dout, dgate_up, rows: int, F: int) -> None:
    """dgate_up (laid out like gate_up) from dout."""
    _family("activations").swiglu_backward(rec, gate_up, dout, dgate_up, rows, F)


# ---- attention ---------------------------------------------------------------------------------

def attention(rec, q, k, v, out, lse, B: int, T: int, H: int, KV: int, hd: int) -> None:
    """Causal GQA attention: q [B,T,H,hd], k/v [B,T,KV,hd] -> out [B,T,H,hd], lse [B,H,T]."""
    _family("attention").forward(rec, q, k, v, out, lse, B, T, H, KV, hd)


def attention_backward(rec, q, k, v, out, lse, dout, dq, dk, dv, B: int, T: int, H: int,
                       KV: int, hd: int) -> None:
    """dq, dk, dv (written, not accumulated) from dout and the forward's saved tensors."""
    _family("attention").backward(rec, q, k, v, out, dout, lse, dq, dk, dv, B, T, H, KV, hd)


def has_attention_decode() -> bool:
    return hasattr(_family("attention"), "decode")


def attention_decode(rec, q, k_cache, v_cache, out, n_ctx: int, H: int, KV: int,
                     hd: int) -> None:
    """One query row [H, hd] against the first n_ctx rows of a KV cache [S, KV, hd]."""
    _family("attention").decode(rec, q, k_cache, v_cache, out, n_ctx, H, KV, hd)


# ---- cross-entropy -----------------------------------------------------------------------------

def cross_entropy(rec, logits, targets, losses, stats, rows: int, vocab: int, *,
                  grad_scale: float, label_smoothing: float = 0.0, z_loss: float = 0.0,
                  with_grad: bool = True) -> None:
    """Per-token losses; logits are overwritten in place by grad_scale * d(sum of losses).

    Loss per token: (1 - eps) * nll + eps * (lse - mean(logits)) + z * lse^2 over all
    `vocab` columns. stats (4 floats) receives (rows, loss sum, mean, 0).
    """
    _family("cross_entropy").forward_backward(
        rec, logits, targets, losses, stats, rows, vocab, grad="inplace" if with_grad
        else "none", label_smoothing=label_smoothing, z_loss=z_loss, grad_scale=grad_scale,
        mean_over_valid=False)
