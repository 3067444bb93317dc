"""The kernels the model records, under the names and argument orders the model uses.

Each function records one or a few dispatches into a Recorder (`rec`); operands are Buffers or
BufferViews (sub-ranges of the parameter, gradient and moment buffers); all shapes are
row-major, rows = B*T tokens. The WGSL, its numpy reference and its ladder cases live with the
op module in `shaders/kernels/<family>/` (matmul and attention: `shaders/ops/`, `shaders/wgsl/`,
`shaders/cases/`; `istanbul kernels check`); this module only adapts their calling
conventions to the model's:

    linear(x, W, y, M, N, K)          y[M,N]  = x[M,K] · W[N,K]ᵀ  (+ residual R[M,N])
    linear_dx(dy, W, dx, M, K, N)     dx[M,K] (=|+=) dy[M,N] · W[N,K]
    linear_dw(dy, x, dW, N, K, M)     dW[N,K] += dy[M,N]ᵀ · x[M,K]

W may be the f32 master weights or the f16 mirror (then read as f16, f32 arithmetic).
"""

from __future__ import annotations

import importlib

import numpy as np

# Where each family's op module lives: shaders/kernels/<family>/ops.py; matmul, attention and
# decoding in shaders/ops/ until they move into the same layout.
FAMILY_MODULES = {
    "basic": "shaders.kernels.elementwise.ops",
    **{f: f"shaders.kernels.{f}.ops"
       for f in ("embedding", "rmsnorm", "rope", "activations", "cross_entropy", "optim")},
    **{f: f"shaders.ops.{f}" for f in ("linear", "attention", "decode")},
}


def _family(name: str):
    """The op module of kernel family `name`."""
    return importlib.import_module(FAMILY_MODULES[name])


# ---- element-wise helpers ---------------------------------------------------------------------

def fill(rec, buf, value: float, n: int) -> None:
    _family("basic").fill(rec, buf, n, value)


def cast_f16(rec, src, dst, n: int) -> None:
    """dst (f16) = src (f32) clamped to f16's range: the initial weight mirror."""
    _family("basic").cast_f32_f16(rec, src, dst, n)


def copy(rec, src, dst, n: int) -> None:
    _family("basic").copy(rec, src, dst, n)


# ---- matmuls ---------------------------------------------------------------------------------

def linear(rec, x, w, y, M: int, N: int, K: int, *, residual=None,
           f16_math: bool = False) -> None:
    """`f16_math` (f16 W only): x rounded to f16 too, packed-f16 products, f32 accumulation."""
    _family("linear").matmul_nt(rec, x, w, y, M, N, K, residual=residual, f16_math=f16_math)


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


def rope(rec, x, table, B: int, T: int, H: int, hd: int, *, pos0: int = 0,
         stride: int | None = None) -> None:
    """Rotate x[B, T, H, hd] in place (pairs i, i + hd/2) at positions pos0 + t.

    `stride`: elements between tokens when x is the q or k part of a fused qkv buffer.
    """
    _family("rope").forward(rec, x, table, B, T, H, hd, pos_offset=pos0, token_stride=stride)


def rope_backward(rec, dx, table, B: int, T: int, H: int, hd: int, *,
                  stride: int | None = None) -> None:
    _family("rope").backward(rec, dx, table, B, T, H, hd, token_stride=stride)


# ---- SwiGLU ------------------------------------------------------------------------------------

def swiglu(rec, gate_up, out, rows: int, F: int) -> None:
    """out[r, c] = silu(g[r, c]) * u[r, c], gate_up row r = [g (F values) | u (F values)]."""
    _family("activations").swiglu_forward(rec, gate_up, out, rows, F)


def swiglu_backward(rec, gate_up, dout, dgate_up, rows: int, F: int) -> None:
    """dgate_up (laid out like gate_up) from dout."""
    _family("activations").swiglu_backward(rec, gate_up, dout, dgate_up, rows, F)


# ---- attention ---------------------------------------------------------------------------------

def attention(rec, q, k, v, out, lse, B: int, T: int, H: int, KV: int, hd: int, *,
              stride: int | None = None) -> None:
    """Causal GQA attention: q [B,T,H,hd], k/v [B,T,KV,hd] -> out [B,T,H,hd], lse [B,H,T].

    `stride`: token stride of q, k and v when they are parts of one fused qkv buffer.
    """
    _family("attention").forward(rec, q, k, v, out, lse, B, T, H, KV, hd, q_stride=stride,
                                 kv_stride=stride)


def attention_backward(rec, q, k, v, out, lse, dout, dq, dk, dv, B: int, T: int, H: int,
                       KV: int, hd: int, *, stride: int | None = None) -> None:
    """dq, dk, dv (written, not accumulated) from dout and the forward's saved tensors."""
    _family("attention").backward(rec, q, k, v, out, dout, lse, dq, dk, dv, B, T, H, KV, hd,
                                  q_stride=stride, kv_stride=stride)


def kv_cache_write(rec, k, v, k_cache, v_cache, T: int, KV: int, hd: int, *, pos: int,
                   t_max: int) -> None:
    """Rows pos..pos+T-1 of the caches [t_max, KV, hd] = the new k, v [T, KV, hd]."""
    _family("decode").cache_write(rec, k, v, k_cache, v_cache, 1, T, KV, hd, pos=pos,
                                  t_max=t_max)


def attention_decode(rec, q, k_cache, v_cache, out, H: int, KV: int, hd: int, *, n_ctx: int,
                     t_max: int) -> None:
    """One query [H, hd] against the first n_ctx positions of the caches (flash-decoding)."""
    _family("decode").attention(rec, q, k_cache, v_cache, out, 1, H, KV, hd, n_ctx=n_ctx,
                                t_max=t_max)


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


# ---- optimizer ---------------------------------------------------------------------------------

STATS_FLOATS = 8  # (|g|^2, |g|, clip scale, non-finite flag, 0, 0, 0, 0)


def grad_stats(rec, grads, stats, *, max_norm: float) -> None:
    """Global L2 norm of the gradients, clip = min(1, max_norm/(norm + 1e-6)), NaN/Inf flag."""
    _family("optim").grad_stats(rec, grads, stats, max_norm=max_norm)


def adamw_hyper(lr: float, *, step: int, beta1: float, beta2: float, eps: float,
                weight_decay: float) -> np.ndarray:
    """The 8 floats the AdamW kernel reads for this step (written by the host each step)."""
    return _family("optim").adamw_hyper(lr, step=step, beta1=beta1, beta2=beta2, eps=eps,
                                        weight_decay=weight_decay)


def adamw(rec, params, grads, m, v, hyper, stats, ranges, *, mirror=None) -> None:
    """AdamW over [(start, count, decay)] ranges of the one-buffer layout, gradients scaled
    by the clip factor; params, m, v (and the f16 mirror) untouched when the flag is set:

        m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        p = p (1 - lr wd [decay]) - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)
    """
    _family("optim").adamw_ranges(rec, params, grads, m, v, hyper, stats, ranges,
                                  mirror=mirror)
