"""The model on the GPU: buffers for B x T, and the recorded forward, backward and update.

    model = GpuModel(cfg, layout, device, batch=8, seq=128, precision="mixed")
    model.set_parameters(flat)                       # f32 master weights (+ f16 mirror)
    out = model.train_step(micro_batches, lr=..., step=1, tc=train_config)   # ONE submit

Everything of one optimizer step goes into one command buffer (trainer_svc/model/ops.py
records each kernel): per micro-batch the forward pass saving what the backward needs, the
fused cross-entropy (loss and dlogits), the backward pass accumulating into the f32 gradient
buffer; then the gradient statistics and AdamW. The host uploads the token ids before and
reads the per-token losses and the gradient statistics after: nothing in between.

Activations are (rows = B*T, features) row-major. Per layer i (x_i the residual stream):
    h    = rmsnorm(x_i) · attn_norm         (rstd saved)
    [q|k|v] = h · [Wq; Wk; Wv]ᵀ ;  q, k = RoPE(q), RoPE(k)   (rotated q, k saved)
                 (one matmul into one buffer when d and kv are multiples of 64, else three)
    a    = causal_attention(q, k, v)        (log-sum-exp saved)
    xa   = x_i + a · Woᵀ                    (residual-fused matmul)
    h2   = rmsnorm(xa) · ffn_norm
    [g|u] = h2 · [Wgate; Wup]ᵀ  (one matmul) ;  s = silu(g) * u
    x_i+1 = xa + s · Wdownᵀ
then hf = rmsnorm(x_L) · final_norm and logits = hf · Headᵀ (Head = embedding when tied).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import ops
from .config import ModelConfig
from .layout import ParameterLayout



@dataclass
class StepResult:
    loss: float
    grad_norm: float
    skipped: bool


def check_binding_sizes(device, sizes: dict) -> None:
    """A clear error before allocating when a tensor cannot be bound on this device."""
    limit = int(device.limits.get("max-storage-buffer-binding-size", 1 << 27))
    for what, nbytes in sizes.items():
        if nbytes > limit:
            raise ValueError(f"{what} needs {nbytes / 2**20:.0f} MiB in one binding, more than "
                             f"{device.name}'s limit of {limit / 2**20:.0f} MiB: use a smaller "
                             "batch or sequence length (or a smaller vocabulary or model)")


def _align64(n: int) -> int:
    return -(-n // 64) * 64


def fused_qkv(cfg: ModelConfig) -> bool:
    """Whether q, k and v come from ONE matmul into one [rows, d + 2kv] buffer.

    The k and v parts are then bound as views starting at columns d and d + kv, which must
    sit on 256-byte boundaries: d and kv multiples of 64 (true for the small and 124m presets).
    """
    return cfg.d_model % 64 == 0 and cfg.kv_dim % 64 == 0


class _QKV:
    """q, k, v as separate [rows, d] / [rows, kv] buffers, or as parts of one fused buffer."""

    def __init__(self, dev, n, cfg, label):
        d, kv = cfg.d_model, cfg.kv_dim
        if fused_qkv(cfg):
            width = d + 2 * kv
            self.fused = dev.empty((n, width), np.float32, label=f"{label} qkv")
            total = n * width
            self.q = self.fused.elements(0, total)
            self.k = self.fused.elements(d, total - d)
            self.v = self.fused.elements(d + kv, total - d - kv)
            self.stride = width
        else:
            self.fused = None
            self.q = dev.empty((n, d), np.float32, label=f"{label} q")
            self.k = dev.empty((n, kv), np.float32, label=f"{label} k")
            self.v = dev.empty((n, kv), np.float32, label=f"{label} v")
            self.stride = None


class _LayerActs:
    """Saved activations of one transformer block."""

    def __init__(self, dev, n, cfg, batch, seq, i):
        d, f = cfg.d_model, cfg.ffn_hidden
        e = lambda shape, name: dev.empty(shape, np.float32, label=f"L{i}.{name}")  # noqa
        self.x = e((n, d), "x")            # block input (residual stream)
        self.h = e((n, d), "h")            # rmsnorm(x)
        self.rstd = e(n, "rstd")
        self.qkv = _QKV(dev, n, cfg, f"L{i}")  # after RoPE (q, k rotated in place)
        self.a = e((n, d), "attn")
        self.lse = e((batch, cfg.n_heads, seq), "lse")
        self.xa = e((n, d), "xa")          # after the attention residual
        self.h2 = e((n, d), "h2")
        self.rstd2 = e(n, "rstd2")
        self.gu = e((n, 2 * f), "gate|up")  # row r: gate (F values), then up (F values)
        self.s = e((n, f), "act")


class GpuModel:
    def __init__(self, cfg: ModelConfig, layout: ParameterLayout, device, *, batch: int,
                 seq: int, precision: str = "mixed", grad_accum: int = 1,
                 f16_math: bool = False):
        self.cfg, self.layout, self.dev = cfg, layout, device
        self.batch, self.seq, self.precision = batch, seq, precision
        self.accum = grad_accum
        self.mixed = precision == "mixed"
        if f16_math and not self.mixed:
            raise ValueError("f16_math needs precision='mixed' (it multiplies the f16 weights)")
        self.f16_math = f16_math  # forward matmuls in packed f16 (speed; looser accuracy)
        if self.mixed and not device.has("shader-f16"):
            raise RuntimeError(f"mixed precision needs the shader-f16 feature, which "
                               f"{device.name} lacks; use precision='fp32'")
        dev, n, total = device, batch * seq, layout.total
        d, f, V = cfg.d_model, cfg.ffn_hidden, cfg.vocab_size
        check_binding_sizes(device, {"logits (B*T x vocab)": n * V * 4,
                                     "parameters": total * 4,
                                     "FFN activations (B*T x 2F)": n * 2 * f * 4})
        self.n = n
        self.params = dev.empty(total, np.float32, label="params f32")
        self.grads = dev.empty(total, np.float32, label="grads")
        self.m = dev.empty(total, np.float32, label="adam m")
        self.v = dev.empty(total, np.float32, label="adam v")
        self.w16 = dev.empty(total, np.float16, label="params f16") if self.mixed else None
        self.rope_table = ops.rope_table(dev, seq, cfg.head_dim, cfg.rope_theta)
        # token ids, targets and per-token losses of every micro-batch of a step
        # (rows padded to 64 elements: each micro-batch's slot is a 256-byte aligned binding)
        self.stride = _align64(n)
        self.all_ids = dev.empty((grad_accum, self.stride), np.uint32, label="ids")
        self.all_targets = dev.empty((grad_accum, self.stride), np.uint32, label="targets")
        # per-token losses of every micro-batch, then the gradient statistics: the one
        # buffer the host reads after a step
        self.results = dev.empty(grad_accum * self.stride + 64, np.float32, label="results")
        self.all_losses = self.results.elements(0, grad_accum * self.stride)
        self.stats = self.results.elements(grad_accum * self.stride, ops.STATS_FLOATS)
        self.hyper = dev.empty(8, np.float32, label="adamw hyper")  # written each step
        self.plan_len = ops.embedding_plan_size(n)
        self.plan_stride = _align64(self.plan_len)
        self.all_plans = dev.empty((grad_accum, self.plan_stride), np.uint32,
                                   label="embed plans")
        self.select_micro_batch(0)
        self._next_step = None   # (key, command buffer) recorded during the previous step
        self.layers = [_LayerActs(dev, n, cfg, batch, seq, i) for i in range(cfg.n_layers)]
        self.x_final = dev.empty((n, d), np.float32, label="x final")
        self.h_final = dev.empty((n, d), np.float32, label="h final")
        self.rstd_final = dev.empty(n, np.float32, label="rstd final")
        self.logits = dev.empty((n, V), np.float32, label="logits")  # dlogits in place
        self.ce_stats = dev.empty(4, np.float32, label="cross-entropy stats")
        # backward scratch, reused by every layer
        self.dx = dev.empty((n, d), np.float32, label="dx")
        self.dh = dev.empty((n, d), np.float32, label="dh")
        self.dqkv = _QKV(dev, n, cfg, "d")
        self.da = dev.empty((n, d), np.float32, label="dattn")
        self.dgu = dev.empty((n, 2 * f), np.float32, label="dgate|dup")
        self.ds = dev.empty((n, f), np.float32, label="dact")

    def release(self) -> None:
        """Free every device buffer now (cached bind groups would keep them alive a while)."""
        self._next_step = None
        seen = set()
        for value in list(vars(self).values()) + [vars(L) for L in self.layers] + \
                [vars(L.qkv) for L in self.layers] + [vars(self.dqkv)]:
            items = value.values() if isinstance(value, dict) else [value]
            for buf in items:
                if hasattr(buf, "destroy") and id(buf) not in seen:
                    seen.add(id(buf))
                    buf.destroy()
        self.released = True

    # ---- parameter views --------------------------------------------------------------

    def p(self, name: str):
        """f32 master weights of `name` (a bindable sub-range)."""
        t = self.layout[name]
        return self.params.elements(t.offset, t.size, t.shape)

    def w(self, name: str):
        """Weights as the forward/backward matmuls read them: the f16 mirror when mixed."""
        t = self.layout[name]
        src = self.w16 if self.mixed else self.params
        return src.elements(t.offset, t.size, t.shape)

    def g(self, name: str):
        t = self.layout[name]
        return self.grads.elements(t.offset, t.size, t.shape)

    def w13(self, layer: int, grads: bool = False):
        """W_gate stacked on W_up: one [2F, d] matrix (weights as read, or its gradient)."""
        off, size = self.layout.fused_range(f"layers.{layer}.w_gate", f"layers.{layer}.w_up")
        src = self.grads if grads else (self.w16 if self.mixed else self.params)
        return src.elements(off, size, (2 * self.cfg.ffn_hidden, self.cfg.d_model))

    def wqkv(self, layer: int, grads: bool = False):
        """Wq, Wk, Wv stacked as one [d + 2kv, d] matrix (adjacent in the layout)."""
        pre = f"layers.{layer}."
        off, size = self.layout.fused_range(pre + "wq", pre + "wk", pre + "wv")
        src = self.grads if grads else (self.w16 if self.mixed else self.params)
        return src.elements(off, size, (self.cfg.d_model + 2 * self.cfg.kv_dim,
                                        self.cfg.d_model))

    def head(self) -> str:
        return "embed" if self.cfg.tied_head else "head"

    # ---- host transfers ---------------------------------------------------------------

    def set_parameters(self, flat: np.ndarray) -> None:
        flat = np.ascontiguousarray(flat, np.float32)
        if flat.shape != (self.layout.total,):
            raise ValueError(f"parameters: {flat.shape}, expected ({self.layout.total},)")
        self.params.write(flat)
        if self.mixed:
            with self.dev.record("f16 mirror") as rec:
                ops.cast_f16(rec, self.params, self.w16, self.layout.total)

    def get_parameters(self) -> np.ndarray:
        return self.dev.download(self.params)

    def get_moments(self) -> tuple[np.ndarray, np.ndarray]:
        return self.dev.download(self.m), self.dev.download(self.v)

    def set_moments(self, m: np.ndarray, v: np.ndarray) -> None:
        self.m.write(np.ascontiguousarray(m, np.float32))
        self.v.write(np.ascontiguousarray(v, np.float32))

    def select_micro_batch(self, a: int) -> None:
        """Point ids/targets/losses at micro-batch `a`'s slots (bindable sub-ranges)."""
        n, s = self.n, self.stride
        self.ids = self.all_ids.elements(a * s, n)
        self.targets = self.all_targets.elements(a * s, n)
        self.losses = self.results.elements(a * s, n)
        self.plan = self.all_plans.elements(a * self.plan_stride, self.plan_len)

    def _upload_tokens(self, micro: np.ndarray) -> None:
        """micro (A, B, T+1): inputs are rows[:, :-1], targets rows[:, 1:]."""
        A, n = micro.shape[0], self.n
        ids = np.zeros((A, self.stride), np.uint32)
        targets = np.zeros((A, self.stride), np.uint32)
        ids[:, :n] = micro[:, :, :-1].reshape(A, n)
        targets[:, :n] = micro[:, :, 1:].reshape(A, n)
        self.all_ids.write(ids)
        self.all_targets.write(targets)
        plans = np.zeros((micro.shape[0], self.plan_stride), np.uint32)
        for a in range(micro.shape[0]):
            plans[a, :self.plan_len] = ops.embedding_plan(ids[a, :n])
        self.all_plans.write(plans.reshape(-1))

    # ---- recording --------------------------------------------------------------------

    def record_forward(self, rec, *, loss_scale: float, tc, with_grad: bool = True) -> None:
        """Forward pass and fused cross-entropy: token losses and dlogits (in `logits`)."""
        cfg, n, d, kv, f = self.cfg, self.n, self.cfg.d_model, self.cfg.kv_dim, \
            self.cfg.ffn_hidden
        B, T, H, KV, hd = self.batch, self.seq, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        fm = {"f16_math": self.f16_math}
        ops.embedding(rec, self.ids, self.p("embed"), self.layers[0].x if self.layers
                      else self.x_final, n, d, cfg.vocab_size)
        for i, L in enumerate(self.layers):
            pre = f"layers.{i}."
            x_out = self.layers[i + 1].x if i + 1 < len(self.layers) else self.x_final
            ops.rmsnorm(rec, L.x, self.p(pre + "attn_norm"), L.h, L.rstd, n, d, cfg.norm_eps)
            qkv = L.qkv
            if qkv.fused is not None:
                ops.linear(rec, L.h, self.wqkv(i), qkv.fused, n, d + 2 * kv, d, **fm)
            else:
                ops.linear(rec, L.h, self.w(pre + "wq"), qkv.q, n, d, d, **fm)
                ops.linear(rec, L.h, self.w(pre + "wk"), qkv.k, n, kv, d, **fm)
                ops.linear(rec, L.h, self.w(pre + "wv"), qkv.v, n, kv, d, **fm)
            ops.rope(rec, qkv.q, self.rope_table, B, T, H, hd, stride=qkv.stride)
            ops.rope(rec, qkv.k, self.rope_table, B, T, KV, hd, stride=qkv.stride)
            ops.attention(rec, qkv.q, qkv.k, qkv.v, L.a, L.lse, B, T, H, KV, hd,
                          stride=qkv.stride)
            ops.linear(rec, L.a, self.w(pre + "wo"), L.xa, n, d, d, residual=L.x, **fm)
            ops.rmsnorm(rec, L.xa, self.p(pre + "ffn_norm"), L.h2, L.rstd2, n, d,
                        cfg.norm_eps)
            ops.linear(rec, L.h2, self.w13(i), L.gu, n, 2 * f, d, **fm)
            ops.swiglu(rec, L.gu, L.s, n, f)
            ops.linear(rec, L.s, self.w(pre + "w_down"), x_out, n, d, f, residual=L.xa,
                       **fm)
        ops.rmsnorm(rec, self.x_final, self.p("final_norm"), self.h_final, self.rstd_final,
                    n, d, cfg.norm_eps)
        ops.linear(rec, self.h_final, self.w(self.head()), self.logits, n, cfg.vocab_size, d,
                   **fm)
        ops.cross_entropy(rec, self.logits, self.targets, self.losses, self.ce_stats, n,
                          cfg.vocab_size, grad_scale=loss_scale,
                          label_smoothing=tc.label_smoothing, z_loss=tc.z_loss,
                          with_grad=with_grad)

    def record_backward(self, rec) -> None:
        """Backward pass from dlogits (in `logits`); gradients accumulate into `grads`."""
        cfg, n, d, kv, f, V = self.cfg, self.n, self.cfg.d_model, self.cfg.kv_dim, \
            self.cfg.ffn_hidden, self.cfg.vocab_size
        B, T, H, KV, hd = self.batch, self.seq, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        head = self.head()
        # head: logits = hf · Headᵀ
        ops.linear_dw(rec, self.logits, self.h_final, self.g(head), V, d, n)
        ops.linear_dx(rec, self.logits, self.w(head), self.dh, n, d, V)
        ops.rmsnorm_backward(rec, self.x_final, self.p("final_norm"), self.rstd_final, self.dh,
                             self.dx, self.g("final_norm"), n, d, accumulate_dx=False)
        for i in reversed(range(cfg.n_layers)):
            L, pre = self.layers[i], f"layers.{i}."
            # FFN: x_out = xa + s · Wdownᵀ ; dx holds d x_out
            ops.linear_dw(rec, self.dx, L.s, self.g(pre + "w_down"), d, f, n)
            ops.linear_dx(rec, self.dx, self.w(pre + "w_down"), self.ds, n, f, d)
            ops.swiglu_backward(rec, L.gu, self.ds, self.dgu, n, f)
            ops.linear_dw(rec, self.dgu, L.h2, self.w13(i, grads=True), 2 * f, d, n)
            ops.linear_dx(rec, self.dgu, self.w13(i), self.dh, n, d, 2 * f)
            # dx (= d xa now) += rmsnorm_backward(dh)
            ops.rmsnorm_backward(rec, L.xa, self.p(pre + "ffn_norm"), L.rstd2, self.dh,
                                 self.dx, self.g(pre + "ffn_norm"), n, d, accumulate_dx=True)
            # attention: xa = x + a · Woᵀ
            ops.linear_dw(rec, self.dx, L.a, self.g(pre + "wo"), d, d, n)
            ops.linear_dx(rec, self.dx, self.w(pre + "wo"), self.da, n, d, d)
            qkv, dqkv = L.qkv, self.dqkv
            ops.attention_backward(rec, qkv.q, qkv.k, qkv.v, L.a, L.lse, self.da, dqkv.q,
                                   dqkv.k, dqkv.v, B, T, H, KV, hd, stride=qkv.stride)
            ops.rope_backward(rec, dqkv.q, self.rope_table, B, T, H, hd, stride=dqkv.stride)
            ops.rope_backward(rec, dqkv.k, self.rope_table, B, T, KV, hd, stride=dqkv.stride)
            if dqkv.fused is not None:
                ops.linear_dw(rec, dqkv.fused, L.h, self.wqkv(i, grads=True), d + 2 * kv, d, n)
                ops.linear_dx(rec, dqkv.fused, self.wqkv(i), self.dh, n, d, d + 2 * kv)
            else:
                ops.linear_dw(rec, dqkv.q, L.h, self.g(pre + "wq"), d, d, n)
                ops.linear_dw(rec, dqkv.k, L.h, self.g(pre + "wk"), kv, d, n)
                ops.linear_dw(rec, dqkv.v, L.h, self.g(pre + "wv"), kv, d, n)
                ops.linear_dx(rec, dqkv.q, self.w(pre + "wq"), self.dh, n, d, d)
                ops.linear_dx(rec, dqkv.k, self.w(pre + "wk"), self.dh, n, d, kv,
                              accumulate=True)
                ops.linear_dx(rec, dqkv.v, self.w(pre + "wv"), self.dh, n, d, kv,
                              accumulate=True)
            ops.rmsnorm_backward(rec, L.x, self.p(pre + "attn_norm"), L.rstd, self.dh, self.dx,
                                 self.g(pre + "attn_norm"), n, d, accumulate_dx=True)
        ops.embedding_backward(rec, self.plan, self.ids, self.dx, self.g("embed"), n, d,
                               cfg.vocab_size)

    def write_hyper(self, *, lr: float, step: int, tc) -> None:
        """The step's AdamW hyper-parameters (lr, bias corrections): a queue write before the
        step's submit, so the recorded dispatches are the same every step."""
        self.hyper.write(ops.adamw_hyper(lr, step=step, beta1=tc.beta1, beta2=tc.beta2,
                                         eps=tc.eps, weight_decay=tc.weight_decay))

    def record_update(self, rec, *, tc) -> None:
        """Global gradient norm, clip scale and NaN/Inf flag, then AdamW (+ f16 mirror),
        reading the hyper-parameters `write_hyper` put into `self.hyper`."""
        ops.grad_stats(rec, self.grads, self.stats, max_norm=tc.grad_clip)
        (d0, d1), (n0, n1) = self.layout.decay_range(), self.layout.no_decay_range()
        ops.adamw(rec, self.params, self.grads, self.m, self.v, self.hyper, self.stats,
                  [(d0, d1 - d0, True), (n0, n1 - n0, False)], mirror=self.w16)

    # ---- one optimizer step, one evaluation -------------------------------------------

    def train_step(self, micro: np.ndarray, *, lr: float, step: int, tc) -> StepResult:
        """micro: (A, B, T+1) uint32. Forward+backward per micro-batch, then the update.

        One upload, one submit, one read-back of losses and gradient statistics. A step's
        commands never change (its inputs, tokens and hyper-parameters, are buffer writes),
        so the next step's command buffer is recorded while the GPU runs this one: the
        host's ~450 dispatch calls leave the step's critical path.
        """
        accum = micro.shape[0]
        self._upload_tokens(micro)
        self.write_hyper(lr=lr, step=step, tc=tc)
        key = (accum, repr(tc))
        pending, self._next_step = self._next_step, None
        fresh = pending is None or pending[0] != key
        self.dev.submit(self._record_step_commands(accum, tc) if fresh else pending[1])
        self._next_step = (key, self._record_step_commands(accum, tc))
        results = self.dev.download(self.results)
        losses = results[:accum * self.stride].reshape(accum, self.stride)[:, :self.n]
        stats = results[accum * self.stride:]
        loss = float(losses.astype(np.float64).mean())
        return StepResult(loss=loss, grad_norm=float(stats[1]), skipped=bool(stats[3] != 0))

    def _record_step_commands(self, accum: int, tc):
        rec = self.dev.record("train step")
        self._record_step(rec, accum, tc)
        return rec.finish()

    def _record_step(self, rec, accum: int, tc) -> None:
        self._record_gradients(rec, accum, tc)
        self.record_update(rec, tc=tc)

    def _record_gradients(self, rec, accum: int, tc) -> None:
        """Zero the gradients, then forward + backward of every micro-batch (they add up);
        the tokens are already uploaded."""
        ops.fill(rec, self.grads, 0.0, self.layout.total)
        for a in range(accum):
            self.select_micro_batch(a)
            self.record_forward(rec, loss_scale=1.0 / (self.n * accum), tc=tc)
            self.record_backward(rec)
        self.select_micro_batch(0)

    def profile_step(self, micro: np.ndarray, *, lr: float, step: int, tc) -> list:
        """One training step with a GPU timestamp pair around every dispatch.

        Returns [(kernel label, seconds)]. The step really happens (weights change).
        """
        self._upload_tokens(micro)
        self.write_hyper(lr=lr, step=step, tc=tc)
        with self.dev.record("profiled step", timing=True) as rec:
            self._record_step(rec, micro.shape[0], tc)
        return rec.gpu_times

    def gradients(self, micro: np.ndarray, tc) -> tuple[float, np.ndarray]:
        """Mean loss and the flat f32 gradient of micro-batches (A, B, T+1); no update."""
        accum = micro.shape[0]
        self._upload_tokens(micro)
        with self.dev.record("gradients") as rec:
            self._record_gradients(rec, accum, tc)
        losses = self.dev.download(self.all_losses).reshape(accum, self.stride)[:, :self.n]
        return float(losses.astype(np.float64).mean()), self.dev.download(self.grads)

    def eval_loss(self, rows: np.ndarray, tc) -> float:
        """Mean loss of one (B, T+1) batch; weights, gradients and moments untouched."""
        self._upload_tokens(np.asarray(rows)[None])  # micro-batch slot 0
        self.select_micro_batch(0)
        with self.dev.record("eval") as rec:
            self.record_forward(rec, loss_scale=1.0 / self.n, tc=tc, with_grad=False)
        return float(self.dev.download(self.losses).astype(np.float64).mean())
