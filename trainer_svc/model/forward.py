"""The transformer blocks' forward pass: ONE recording used by training and by generation.

    acts = [BlockActs.allocate(dev, rows, cfg, f"L{i}").rows(rows, batch) for i ...]  # training
    record_blocks(rec, cfg, weights, acts, x_final, ids, B, T, rope_table)
    shared = BlockActs.allocate(dev, max_seq, cfg, "gen").rows(T, 1)                 # generation
    record_blocks(rec, cfg, weights, [shared] * n_layers, shared.x, ids, 1, T, rope_table,
                  pos0=pos, caches=kv_caches)

Activations are (rows = B*T, features) row-major. Per layer i (x_i the residual stream):
    h    = rmsnorm(x_i) · attn_norm         (rstd saved)
    [q|k|v] = h · [Wq; Wk; Wv]ᵀ ;  q, k = RoPE(q), RoPE(k)   (rotated q, k saved)
                 (one matmul into one buffer when d and kv are multiples of 64, else three)
                 Training (BlockBuffers with head_major): RoPE writes q and k, and a copy v,
                 into head-major [B, H, T, D] buffers, the layer's saved q, k, v (the
                 projection's output is scratch shared by the layers): the attention kernels
                 load 64-row tiles of one head, contiguous there (a shorter step);
                 f16 where the attention runs on the tensor cores (half the bytes loaded).
    a    = causal_attention(q, k, v)        (log-sum-exp saved)
    xa   = x_i + a · Woᵀ                    (residual-fused matmul)
                 (training on tensor cores may keep h, h2 and s, which only feed matmuls, in
                 f16: the values the tensor-core matmuls round to anyway, half the bytes;
                 GpuModel's f16_activations)
    h2   = rmsnorm(xa) · ffn_norm
    [g|u] = h2 · [Wgate; Wup]ᵀ  (one matmul) ;  s = silu(g) * u
    x_i+1 = xa + s · Wdownᵀ
With KV caches (generation) k and v of the new positions are appended to layer i's cache
after RoPE, and a single new token (T == 1) attends to the whole cache instead of running
the batched causal attention. Training keeps each layer's activations (the backward reads
them); generation passes the same buffers for every layer (layer i+1 reads x where layer i
wrote it). The final norm and the head are the caller's: training runs the chunked head
over every row (lm_head.py), generation only the last row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from istanbul.shaders.kernels.activations import ops as activations
from istanbul.shaders.kernels.embedding import ops as embedding
from istanbul.shaders.kernels.rmsnorm import ops as rmsnorm
from istanbul.shaders.kernels.rope import ops as rope
from istanbul.shaders.kernels.attention import ops as attention
from istanbul.shaders.kernels.attention import decode
from istanbul.shaders.kernels.elementwise import ops as basic
from istanbul.shaders.kernels.matmul import ops as linear

from .config import ModelConfig
from .layout import ParameterLayout


def fused_qkv(cfg: ModelConfig) -> bool:
    """Whether q, k and v come from ONE matmul into one [rows, d + 2kv] buffer.

    The k and v parts are then bound as views starting at columns d and d + kv, which must
    sit on 256-byte boundaries: d and kv multiples of 64 (true for the small and 124m presets).
    """
    return cfg.d_model % 64 == 0 and cfg.kv_dim % 64 == 0


class Weights:
    """How the kernels read one parameter set in the one-buffer layout.

    `p(name)`: the f32 master values (norm gains, embedding rows); `w(name)`: the matmul
    operand (the f16 mirror in mixed precision, else the f32 values); `wqkv(i)` / `w13(i)`:
    the adjacent [Wq; Wk; Wv] and [W_gate; W_up] of layer i as one matrix. A gradient buffer
    is viewed with the same class (master = matmul = the gradients).
    """

    def __init__(self, cfg: ModelConfig, layout: ParameterLayout, master, matmul=None):
        self.cfg, self.layout = cfg, layout
        self.master, self.matmul = master, matmul if matmul is not None else master

    def _view(self, src, name):
        t = self.layout[name]
        return src.elements(t.offset, t.size, t.shape)

    def p(self, name: str):
        return self._view(self.master, name)

    def w(self, name: str):
        return self._view(self.matmul, name)

    def wqkv(self, layer: int):
        pre = f"layers.{layer}."
        off, size = self.layout.fused_range(pre + "wq", pre + "wk", pre + "wv")
        return self.matmul.elements(off, size, (self.cfg.d_model + 2 * self.cfg.kv_dim,
                                                self.cfg.d_model))

    def w13(self, layer: int):
        off, size = self.layout.fused_range(f"layers.{layer}.w_gate", f"layers.{layer}.w_up")
        return self.matmul.elements(off, size, (2 * self.cfg.ffn_hidden, self.cfg.d_model))

    @property
    def head_name(self) -> str:
        return "embed" if self.cfg.tied_head else "head"


def _rows(buf, rows: int, cols: int):
    return buf.elements(0, rows * cols, (rows, cols))


@dataclass
class QKV:
    """q, k, v of `rows` tokens: views of one fused [rows, d + 2kv] buffer (stride = its
    width) or three separate buffers (stride None)."""
    q: object
    k: object
    v: object
    fused: object | None
    stride: int | None


class QKVBuffers:
    def __init__(self, dev, capacity: int, cfg: ModelConfig, label: str):
        d, kv = cfg.d_model, cfg.kv_dim
        self.d, self.kv = d, kv
        if fused_qkv(cfg):
            self.fused = dev.empty((capacity, d + 2 * kv), np.float32, label=f"{label} qkv")
            self.q = self.k = self.v = None
        else:
            self.fused = None
            self.q = dev.empty((capacity, d), np.float32, label=f"{label} q")
            self.k = dev.empty((capacity, kv), np.float32, label=f"{label} k")
            self.v = dev.empty((capacity, kv), np.float32, label=f"{label} v")

    def buffers(self) -> list:
        return [b for b in (self.fused, self.q, self.k, self.v) if b is not None]

    def rows(self, n: int) -> QKV:
        d, kv = self.d, self.kv
        if self.fused is not None:
            width = d + 2 * kv
            total = n * width
            return QKV(self.fused.elements(0, total), self.fused.elements(d, total - d),
                       self.fused.elements(d + kv, total - d - kv),
                       self.fused.elements(0, total, (n, width)), width)
        return QKV(_rows(self.q, n, d), _rows(self.k, n, kv), _rows(self.v, n, kv), None, None)


@dataclass
class Heads:
    """q, k, v (or their gradients) head-major: [B, H, T, D] and [B, Hkv, T, D], each head's
    rows contiguous (separate buffers: dk and dv are written by one dispatch)."""
    q: object
    k: object
    v: object


class HeadBuffers:
    def __init__(self, dev, capacity: int, cfg: ModelConfig, label: str, dtype=np.float32):
        """dtype float16: the tensor-core attention's f16 operands (attention.takes_f16_operands)."""
        self.d, self.kv = cfg.d_model, cfg.kv_dim
        self.q = dev.empty(capacity * self.d, dtype, label=f"{label} q heads")
        self.k = dev.empty(capacity * self.kv, dtype, label=f"{label} k heads")
        self.v = dev.empty(capacity * self.kv, dtype, label=f"{label} v heads")

    def buffers(self) -> list:
        return [self.q, self.k, self.v]

    def rows(self, n: int) -> Heads:
        return Heads(self.q.elements(0, n * self.d), self.k.elements(0, n * self.kv),
                     self.v.elements(0, n * self.kv))


def head_strides(cfg: ModelConfig, T: int):
    """(q, kv) attention.Strides of head-major Heads for sequences of T tokens."""
    hd = cfg.head_dim
    return (attention.head_major(T, cfg.n_heads, hd), attention.head_major(T, cfg.n_kv_heads, hd))


def token_strides(qkv: QKV, heads: int, cfg: ModelConfig, T: int) -> tuple:
    """(token, head, batch) strides of a q/k/v part of `qkv` with `heads` heads."""
    stride = qkv.stride if qkv.stride is not None else heads * cfg.head_dim
    return (stride, cfg.head_dim, T * stride)


@dataclass
class BlockActs:
    """The activations of one transformer block for `rows` tokens (views)."""
    x: object       # block input (residual stream)
    h: object       # rmsnorm(x)
    rstd: object
    qkv: QKV        # the projection's output (q, k rotated in place unless `heads`)
    heads: Heads | None   # head-major rotated q, k and v (training), else None
    a: object       # attention output
    lse: object
    xa: object      # after the attention residual
    h2: object
    rstd2: object
    gu: object      # row r: gate (F values), then up (F values)
    s: object       # silu(gate) * up


class BlockBuffers:
    """Storage for one block's activations, up to `capacity` rows (`rows()` views them)."""

    def __init__(self, dev, capacity: int, cfg: ModelConfig, label: str, *,
                 share_norm: bool = False, qkv: QKVBuffers | None = None,
                 head_major: bool = False, heads_dtype=np.float32, act_dtype=np.float32):
        """`qkv`: the projection output's buffers, when shared with other blocks (head_major:
        the block keeps its q, k, v head-major, in `heads_dtype`, so its projection output
        is scratch). `act_dtype`: of h, h2 and s, the activations that only feed matmuls
        (float16 where those run on the tensor cores: the values they round to anyway)."""
        d, f = cfg.d_model, cfg.ffn_hidden
        self.cfg, self.capacity = cfg, capacity
        e = lambda shape, name, dtype=np.float32: dev.empty(  # noqa: E731
            shape, dtype, label=f"{label}.{name}")
        self.x, self.h, self.rstd = e((capacity, d), "x"), e((capacity, d), "h", act_dtype), \
            e(capacity, "rstd")
        self.own_qkv = qkv is None
        self.qkv = QKVBuffers(dev, capacity, cfg, label) if qkv is None else qkv
        self.heads = HeadBuffers(dev, capacity, cfg, label, heads_dtype) if head_major else None
        self.a, self.lse = e((capacity, d), "attn"), e(cfg.n_heads * capacity, "lse")
        self.xa = e((capacity, d), "xa")
        # generation needs no saved h2/rstd2: it reuses h and rstd
        self.h2, self.rstd2 = (self.h, self.rstd) if share_norm else \
            (e((capacity, d), "h2", act_dtype), e(capacity, "rstd2"))
        self.gu, self.s = e((capacity, 2 * f), "gate|up"), e((capacity, f), "act", act_dtype)

    def buffers(self) -> list:
        own = [self.x, self.h, self.rstd, self.a, self.lse, self.xa, self.h2, self.rstd2,
               self.gu, self.s]
        return (own + (self.qkv.buffers() if self.own_qkv else [])
                + (self.heads.buffers() if self.heads is not None else []))

    def rows(self, n: int) -> BlockActs:
        if n > self.capacity:
            raise ValueError(f"{n} rows exceed the activation buffers' {self.capacity}")
        d, f, H = self.cfg.d_model, self.cfg.ffn_hidden, self.cfg.n_heads
        return BlockActs(_rows(self.x, n, d), _rows(self.h, n, d), self.rstd.elements(0, n),
                         self.qkv.rows(n), self.heads.rows(n) if self.heads else None,
                         _rows(self.a, n, d), self.lse.elements(0, H * n),
                         _rows(self.xa, n, d), _rows(self.h2, n, d),
                         self.rstd2.elements(0, n), _rows(self.gu, n, 2 * f),
                         _rows(self.s, n, f))


@dataclass
class KVCache:
    """One layer's key and value cache, [t_max, kv] each (K after RoPE)."""
    k: object
    v: object
    t_max: int


def record_blocks(rec, cfg: ModelConfig, weights: Weights, acts: list, x_final, ids,
                  B: int, T: int, rope_table, *, pos0: int = 0,
                  caches: list | None = None, f16_math: bool = False,
                  tensor_cores: bool = False) -> None:
    """Embedding and every block (see the module docstring) for B*T tokens at positions
    pos0..; the last block writes `x_final`. `caches` (generation, B == 1): a KVCache per
    layer, written at pos0..pos0+T-1; T > 1 is a prefill (pos0 == 0), T == 1 a decode step."""
    n, d, kv, f = B * T, cfg.d_model, cfg.kv_dim, cfg.ffn_hidden
    H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    if caches is not None and (B != 1 or (T > 1 and pos0 != 0)):
        raise ValueError("KV-cache forward: one sequence, and a prefill starts at position 0")
    fm = {"f16_math": f16_math, "tensor_cores": tensor_cores}
    embedding.forward(rec, ids, weights.p("embed"), acts[0].x if acts else x_final, n, d,
                      cfg.vocab_size)
    for i, L in enumerate(acts):
        pre = f"layers.{i}."
        x_out = acts[i + 1].x if i + 1 < len(acts) else x_final
        rmsnorm.forward(rec, L.x, weights.p(pre + "attn_norm"), L.h, L.rstd, n, d,
                        cfg.norm_eps)
        qkv = L.qkv
        if qkv.fused is not None:
            linear.matmul_nt(rec, L.h, weights.wqkv(i), qkv.fused, n, d + 2 * kv, d, **fm)
        else:
            linear.matmul_nt(rec, L.h, weights.w(pre + "wq"), qkv.q, n, d, d, **fm)
            linear.matmul_nt(rec, L.h, weights.w(pre + "wk"), qkv.k, n, kv, d, **fm)
            linear.matmul_nt(rec, L.h, weights.w(pre + "wv"), qkv.v, n, kv, d, **fm)
        if L.heads is not None:   # training: q, k, v head-major for the attention kernels
            if caches is not None:
                raise ValueError("KV-cache forward: head-major blocks are for training")
            record_heads(rec, cfg, qkv, L.heads, B, T, rope_table, pos0)
            hq, hkv = head_strides(cfg, T)
            attention.forward(rec, L.heads.q, L.heads.k, L.heads.v, L.a, L.lse, B, T, H, KV,
                              hd, q_stride=hq, kv_stride=hkv, tensor_cores=tensor_cores)
        else:
            rope.forward(rec, qkv.q, rope_table, B, T, H, hd, pos_offset=pos0,
                         token_stride=qkv.stride)
            rope.forward(rec, qkv.k, rope_table, B, T, KV, hd, pos_offset=pos0,
                         token_stride=qkv.stride)
            if caches is not None:
                c = caches[i]
                decode.cache_write(rec, qkv.k, qkv.v, c.k, c.v, 1, T, KV, hd, pos=pos0,
                                   t_max=c.t_max, src_stride=qkv.stride)
            if caches is not None and T == 1:   # the new token's query against every position
                decode.attention(rec, qkv.q, caches[i].k, caches[i].v, L.a, 1, H, KV, hd,
                                 n_ctx=pos0 + 1, t_max=caches[i].t_max, q_stride=qkv.stride)
            else:
                attention.forward(rec, qkv.q, qkv.k, qkv.v, L.a, L.lse, B, T, H, KV, hd,
                                  q_stride=qkv.stride, kv_stride=qkv.stride,
                                  tensor_cores=tensor_cores)
        linear.matmul_nt(rec, L.a, weights.w(pre + "wo"), L.xa, n, d, d, residual=L.x, **fm)
        rmsnorm.forward(rec, L.xa, weights.p(pre + "ffn_norm"), L.h2, L.rstd2, n, d,
                        cfg.norm_eps)
        linear.matmul_nt(rec, L.h2, weights.w13(i), L.gu, n, 2 * f, d, **fm)
        activations.swiglu_forward(rec, L.gu, L.s, n, f)
        linear.matmul_nt(rec, L.s, weights.w(pre + "w_down"), x_out, n, d, f, residual=L.xa,
                         **fm)


def record_heads(rec, cfg: ModelConfig, qkv: QKV, heads: Heads, B: int, T: int, rope_table,
                 pos0: int = 0) -> None:
    """RoPE from the projection's q and k into head-major `heads`, v copied there."""
    H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    hq, hkv = head_strides(cfg, T)
    rope.forward(rec, qkv.q, rope_table, B, T, H, hd, pos_offset=pos0,
                 token_stride=qkv.stride, out=heads.q, out_strides=hq)
    rope.forward(rec, qkv.k, rope_table, B, T, KV, hd, pos_offset=pos0,
                 token_stride=qkv.stride, out=heads.k, out_strides=hkv)
    basic.copy_heads(rec, qkv.v, heads.v, B, T, KV, hd, token_strides(qkv, KV, cfg, T), hkv)
