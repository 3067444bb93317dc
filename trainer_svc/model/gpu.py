"""The model on the GPU: buffers for B x T, and the recorded forward, backward and update.

    model = GpuModel(cfg, layout, device, batch=8, seq=128, precision="mixed")   # or "f16"
    model.set_parameters(flat)                       # f32 master weights (+ f16 mirror)
    out = model.train_step(micro_batches, lr=..., step=1, tc=train_config)   # ONE submit

Everything of one optimizer step goes into one command buffer: per micro-batch the forward
pass saving what the backward needs (forward.py, the same recording generation uses), the
chunked LM head with its fused cross-entropy (lm_head.py: loss, dlogits, dW_head and dh chunk
by chunk), the backward pass accumulating into the f32 gradient buffer; then the gradient
statistics and AdamW. The host uploads the token ids before and reads the per-token losses
and the gradient statistics after: nothing in between. Every kernel is a shader op function
(shaders/kernels/<family>/ops.py) called directly.

The buffers come from one plan (plan.py), made and checked against the device before
anything is allocated: which are f16, the LM head's rows per chunk, and whether parameters,
gradients, moments, the f16 mirror, activations and the logits chunk fit (a tensor over the
binding limit, or a total over the device's memory, is a ConfigDoesNotFitError saying what to
change). The constructor allocates exactly that plan, top to bottom.

Precision "f16": the f16 weight mirror as in "mixed", every matmul on the tensor cores
where the device has f16 subgroup matrices (`linear.has_tensor_cores`: both operands rounded
to f16, f32 accumulation; elsewhere the "mixed" kernels), and dynamic loss scaling
(trainer_svc/model/loss_scale.py): the cross-entropy's gradient carries the scale, the gradient
statistics divide it out, an overflow skips the step and halves the scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from istanbul.shaders.kernels.activations import ops as activations
from istanbul.shaders.kernels.elementwise import ops as basic
from istanbul.shaders.kernels.embedding import ops as embedding
from istanbul.shaders.kernels.optim import ops as optim
from istanbul.shaders.kernels.rmsnorm import ops as rmsnorm
from istanbul.shaders.kernels.rope import ops as rope
from istanbul.shaders.kernels.attention import ops as attention
from istanbul.shaders.kernels.matmul import ops as linear

from .loss_scale import LossScaler
from .config import ModelConfig
from .forward import (BlockBuffers, HeadBuffers, QKVBuffers, Weights, head_strides,
                      record_blocks, token_strides)
from .layout import ParameterLayout
from .lm_head import ChunkedHead
from .plan import plan_step

STATS_FLOATS = 8  # grad_stats: (|g|^2, |g|, clip scale, non-finite flag, 0, 0, 0, 0)


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    skipped: bool
    loss_scale: float = 1.0     # the scale this step's gradients carried (f16 precision)
    scale_backoff: bool = False  # skipped for an f16 overflow the halved scale should avoid


class GpuModel:
    # Called as hook(model) between the backward pass and the update of every train_step,
    # once the gradients are submitted (they are complete when a download returns): data
    # parallel training averages them over the ranks here (trainer_svc/distributed/).
    gradient_hook = None

    def __init__(self, cfg: ModelConfig, layout: ParameterLayout, device, *, batch: int,
                 seq: int, precision: str = "mixed", grad_accum: int = 1,
                 f16_math: bool = False, head_chunk_rows: int | None = None,
                 f16_activations: bool = True, device_memory: int | None = None):
        """`f16_activations`: with precision f16 on tensor cores (and no f16_math) keep h, h2
        and s in f16 (False: f32; the values the matmuls see are the same, bit for bit, in
        less memory and a shorter step: 048b428:bench/results/train/train_f16_round13.md).
        `device_memory`: bytes
        the fit check and the LM head's chunk assume the device has (default:
        plan.device_memory(device), None when unknown). The plan is `step_plan`."""
        self.cfg, self.layout, self.dev = cfg, layout, device
        self.step_plan = plan = plan_step(
            cfg, layout.total, device, batch=batch, seq=seq, precision=precision,
            grad_accum=grad_accum, f16_math=f16_math, head_chunk_rows=head_chunk_rows,
            f16_activations=f16_activations, memory=device_memory)
        self.batch, self.seq, self.precision, self.accum = batch, seq, precision, grad_accum
        self.n = n = plan.rows
        self.mixed, self.f16_math, self.tensor_cores = plan.mixed, f16_math, plan.tensor_cores
        self.scaler = LossScaler() if precision == "f16" else None
        dev, total, d = device, layout.total, cfg.d_model
        self.params = dev.empty(total, np.float32, label="params f32")
        self.grads = dev.empty(total, np.float32, label="grads")
        self.m = dev.empty(total, np.float32, label="adam m")
        self.v = dev.empty(total, np.float32, label="adam v")
        self.w16 = dev.empty(total, np.float16, label="params f16") if self.mixed else None
        self.weights = Weights(cfg, layout, self.params, self.w16 if self.mixed else None)
        self.grad_views = Weights(cfg, layout, self.grads)
        self.rope_table = dev.upload(rope.rope_table(seq, cfg.head_dim, cfg.rope_theta),
                                     label="rope table")
        # token ids, targets and per-token losses of every micro-batch of a step
        # (rows padded to 64 elements: each micro-batch's slot is a 256-byte aligned binding)
        self.stride = plan.ids_stride
        self.all_ids = dev.empty((grad_accum, self.stride), np.uint32, label="ids")
        self.all_targets = dev.empty((grad_accum, self.stride), np.uint32, label="targets")
        # per-token losses of every micro-batch, then the gradient statistics: the one
        # buffer the host reads after a step
        self.results = dev.empty(grad_accum * self.stride + 64, np.float32, label="results")
        self.all_losses = self.results.elements(0, grad_accum * self.stride)
        self.stats = self.results.elements(grad_accum * self.stride, STATS_FLOATS)
        self.hyper = dev.empty(8, np.float32, label="adamw hyper")  # written each step
        # the embedding backward's plan of every micro-batch (computed on the host)
        self.embed_plan_len = embedding.plan_size(n)
        self.all_embed_plans = dev.empty((grad_accum, plan.embed_plan_stride), np.uint32,
                                         label="embed plans")
        self.select_micro_batch(0)
        self._next_step = None   # (key, command buffer) recorded during the previous step
        # q, k, v saved head-major per layer; the projection's output is scratch they share
        self.qkv_storage = QKVBuffers(dev, n, cfg, "proj")
        self.storage = [BlockBuffers(dev, n, cfg, f"L{i}", qkv=self.qkv_storage,
                                     head_major=True,
                                     heads_dtype=plan.heads_dtype, act_dtype=plan.act_dtype)
                        for i in range(cfg.n_layers)]
        self.layers = [s.rows(n) for s in self.storage]
        self.x_final = dev.empty((n, d), np.float32, label="x final")
        self.h_final = dev.empty((n, d), np.float32, label="h final")
        self.rstd_final = dev.empty(n, np.float32, label="rstd final")
        self.head = ChunkedHead(dev, n, d, cfg.vocab_size, chunk_rows=plan.head_rows,
                                f16_dlogits=plan.f16_dlogits)
        # backward scratch, reused by every layer
        f = cfg.ffn_hidden
        self.dx = dev.empty((n, d), np.float32, label="dx")
        self.dh = dev.empty((n, d), np.float32, label="dh")
        self.dqkv_storage = QKVBuffers(dev, n, cfg, "d")
        self.dqkv = self.dqkv_storage.rows(n)
        self.dheads_storage = HeadBuffers(dev, n, cfg, "d")
        self.dheads = self.dheads_storage.rows(n)
        self.da = dev.empty((n, d), np.float32, label="dattn")
        self.dgu = dev.empty((n, 2 * f), np.float32, label="dgate|dup")
        self.ds = dev.empty((n, f), np.float32, label="dact")

    def release(self) -> None:
        """Free every device buffer now (cached bind groups would keep them alive a while)."""
        self._next_step = None
        seen = set()
        owned = list(vars(self).values()) + self.head.buffers() + \
            self.dqkv_storage.buffers() + self.qkv_storage.buffers() + \
            self.dheads_storage.buffers() + [b for s in self.storage for b in s.buffers()]
        for buf in owned:
            if hasattr(buf, "destroy") and id(buf) not in seen:
                seen.add(id(buf))
                buf.destroy()
        self.released = True

    # ---- one optimizer step, top down: train_step, the gradients of each micro-batch
    # (forward, head, backward), the update ---------------------------------------------

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
        scale = self.loss_scale
        hook = self.gradient_hook
        # the scale is recorded into two kernels' parameters; a hook splits the step in two
        key = (accum, repr(tc), scale, hook is not None)
        pending, self._next_step = self._next_step, None
        fresh = pending is None or pending[0] != key
        parts = self._record_step_commands(accum, tc, hook) if fresh else pending[1]
        self.dev.submit(parts[0])
        self._next_step = (key, self._record_step_commands(accum, tc, hook))
        if hook is not None:     # gradients ready -> the hook (all-reduce) -> the update
            hook(self)
            self.dev.submit(parts[1])
        results = self.dev.download(self.results)
        losses = results[:accum * self.stride].reshape(accum, self.stride)[:, :self.n]
        stats = results[accum * self.stride:]
        loss = float(losses.astype(np.float64).mean())
        skipped = bool(stats[3] != 0)
        backoff = self.scaler.update(skipped) if self.scaler is not None else False
        return StepResult(loss=loss, grad_norm=float(stats[1]), skipped=skipped,
                          loss_scale=scale, scale_backoff=backoff)

    def _record_step_commands(self, accum: int, tc, hook=None) -> list:
        """[the whole step], or with a gradient hook [gradients, update]: two submits."""
        if hook is None:
            rec = self.dev.record("train step")
            self._record_step(rec, accum, tc)
            return [rec.finish()]
        grads, update = self.dev.record("gradients"), self.dev.record("update")
        self._record_gradients(grads, accum, tc)
        self.record_update(update, tc=tc)
        return [grads.finish(), update.finish()]

    def _record_step(self, rec, accum: int, tc) -> None:
        self._record_gradients(rec, accum, tc)
        self.record_update(rec, tc=tc)

    def _record_gradients(self, rec, accum: int, tc) -> None:
        """Zero the gradients, then forward + backward of every micro-batch (they add up);
        the tokens are already uploaded."""
        basic.fill(rec, self.grads, self.layout.total, 0.0)
        for a in range(accum):
            self.select_micro_batch(a)
            self.record_forward(rec, loss_scale=self.loss_scale / (self.n * accum), tc=tc)
            self.record_backward(rec)
        self.select_micro_batch(0)

    def record_forward(self, rec, *, loss_scale: float, tc, with_grad: bool = True) -> None:
        """Forward pass, then the chunked head + cross-entropy: per-token losses, and with
        `with_grad` dh (in self.dh) and the head's weight gradient (accumulated)."""
        cfg, n, d = self.cfg, self.n, self.cfg.d_model
        record_blocks(rec, cfg, self.weights, self.layers, self.x_final, self.ids, self.batch,
                      self.seq, self.rope_table, f16_math=self.f16_math,
                      tensor_cores=self.tensor_cores)
        rmsnorm.forward(rec, self.x_final, self.p("final_norm"), self.h_final,
                        self.rstd_final, n, d, cfg.norm_eps)
        head = self.weights.head_name
        grads = {"dh": self.dh, "dw": self.g(head)} if with_grad else {}
        self.head.record(rec, self.h_final, self.w(head), self.targets, self.losses,
                         grad_scale=loss_scale, label_smoothing=tc.label_smoothing,
                         z_loss=tc.z_loss, f16_math=self.f16_math,
                         tensor_cores=self.tensor_cores, **grads)

    def record_backward(self, rec) -> None:
        """Backward pass from dh (the head's, left by record_forward); gradients accumulate
        into `grads`. Linear layer y = x · Wᵀ: dW += dyᵀ · x (matmul TN), dx = dy · W (NN)."""
        cfg, n, d, kv, f = self.cfg, self.n, self.cfg.d_model, self.cfg.kv_dim, \
            self.cfg.ffn_hidden
        B, T, H, KV, hd = self.batch, self.seq, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        W, G = self.weights, self.grad_views
        tcs = {"tensor_cores": self.tensor_cores}
        mm_dw = lambda dy, x, dw, N, K, M: linear.matmul_tn(rec, dy, x, dw, N, K, M,  # noqa
                                                           accumulate=True, **tcs)
        rmsnorm.backward(rec, self.x_final, self.p("final_norm"), self.dh, self.rstd_final,
                         self.dx, self.g("final_norm"), n, d, accumulate_dx=False)
        for i in reversed(range(cfg.n_layers)):
            L, pre = self.layers[i], f"layers.{i}."
            # FFN: x_out = xa + s · Wdownᵀ ; dx holds d x_out
            mm_dw(self.dx, L.s, G.w(pre + "w_down"), d, f, n)
            linear.matmul_nn(rec, self.dx, W.w(pre + "w_down"), self.ds, n, f, d, **tcs)
            activations.swiglu_backward(rec, L.gu, self.ds, self.dgu, n, f)
            mm_dw(self.dgu, L.h2, G.w13(i), 2 * f, d, n)
            linear.matmul_nn(rec, self.dgu, W.w13(i), self.dh, n, d, 2 * f, **tcs)
            # dx (= d xa now) += rmsnorm_backward(dh)
            rmsnorm.backward(rec, L.xa, self.p(pre + "ffn_norm"), self.dh, L.rstd2, self.dx,
                             self.g(pre + "ffn_norm"), n, d, accumulate_dx=True)
            # attention: xa = x + a · Woᵀ
            mm_dw(self.dx, L.a, G.w(pre + "wo"), d, d, n)
            linear.matmul_nn(rec, self.dx, W.w(pre + "wo"), self.da, n, d, d, **tcs)
            # attention on the head-major q, k, v; RoPE's backward and a copy put the
            # gradients into the projection's layout
            heads, dheads, dqkv = L.heads, self.dheads, self.dqkv
            hq, hkv = head_strides(cfg, T)
            attention.backward(rec, heads.q, heads.k, heads.v, L.a, self.da, L.lse, dheads.q,
                               dheads.k, dheads.v, B, T, H, KV, hd, q_stride=hq,
                               kv_stride=hkv, **tcs)
            rope.backward(rec, dheads.q, self.rope_table, B, T, H, hd, strides=hq,
                          out=dqkv.q, out_strides=token_strides(dqkv, H, cfg, T))
            rope.backward(rec, dheads.k, self.rope_table, B, T, KV, hd, strides=hkv,
                          out=dqkv.k, out_strides=token_strides(dqkv, KV, cfg, T))
            basic.copy_heads(rec, dheads.v, dqkv.v, B, T, KV, hd, hkv,
                             token_strides(dqkv, KV, cfg, T))
            if dqkv.fused is not None:
                mm_dw(dqkv.fused, L.h, G.wqkv(i), d + 2 * kv, d, n)
                linear.matmul_nn(rec, dqkv.fused, W.wqkv(i), self.dh, n, d, d + 2 * kv, **tcs)
            else:
                mm_dw(dqkv.q, L.h, G.w(pre + "wq"), d, d, n)
                mm_dw(dqkv.k, L.h, G.w(pre + "wk"), kv, d, n)
                mm_dw(dqkv.v, L.h, G.w(pre + "wv"), kv, d, n)
                linear.matmul_nn(rec, dqkv.q, W.w(pre + "wq"), self.dh, n, d, d, **tcs)
                linear.matmul_nn(rec, dqkv.k, W.w(pre + "wk"), self.dh, n, d, kv,
                                 accumulate=True, **tcs)
                linear.matmul_nn(rec, dqkv.v, W.w(pre + "wv"), self.dh, n, d, kv,
                                 accumulate=True, **tcs)
            rmsnorm.backward(rec, L.x, self.p(pre + "attn_norm"), self.dh, L.rstd, self.dx,
                             self.g(pre + "attn_norm"), n, d, accumulate_dx=True)
        embedding.backward(rec, self.embed_plan, self.ids, self.dx, self.g("embed"), n, d,
                           cfg.vocab_size)

    def write_hyper(self, *, lr: float, step: int, tc) -> None:
        """The step's AdamW hyper-parameters (lr, bias corrections): a queue write before the
        step's submit, so the recorded dispatches are the same every step."""
        self.hyper.write(optim.adamw_hyper(lr, step=step, beta1=tc.beta1, beta2=tc.beta2,
                                           eps=tc.eps, weight_decay=tc.weight_decay))

    def record_update(self, rec, *, tc) -> None:
        """Global gradient norm, clip scale and NaN/Inf flag, then AdamW (+ f16 mirror),
        reading the hyper-parameters `write_hyper` put into `self.hyper`."""
        optim.grad_stats(rec, self.grads, self.stats, max_norm=tc.grad_clip,
                         unscale=1.0 / self.loss_scale)
        (d0, d1), (n0, n1) = self.layout.decay_range(), self.layout.no_decay_range()
        optim.adamw_ranges(rec, self.params, self.grads, self.m, self.v, self.hyper,
                           self.stats, [(d0, d1 - d0, True), (n0, n1 - n0, False)],
                           mirror=self.w16)

    @property
    def loss_scale(self) -> float:
        """The factor the next step's loss (so its gradients) is multiplied by: the dynamic
        loss scale in f16 precision, else 1."""
        return self.scaler.scale if self.scaler is not None else 1.0

    # ---- other uses of the recorded passes ------------------------------------------

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
        return (float(losses.astype(np.float64).mean()),
                self.dev.download(self.grads) / np.float32(self.loss_scale))

    def eval_loss(self, rows: np.ndarray, tc) -> float:
        """Mean loss of one (B, T+1) batch; weights, gradients and moments untouched."""
        self._upload_tokens(np.asarray(rows)[None])  # micro-batch slot 0
        self.select_micro_batch(0)
        with self.dev.record("eval") as rec:
            self.record_forward(rec, loss_scale=1.0 / self.n, tc=tc, with_grad=False)
        return float(self.dev.download(self.losses).astype(np.float64).mean())


    # ---- parameter views --------------------------------------------------------------

    def p(self, name: str):
        """f32 master weights of `name` (a bindable sub-range)."""
        return self.weights.p(name)

    def w(self, name: str):
        """Weights as the forward/backward matmuls read them: the f16 mirror when mixed."""
        return self.weights.w(name)

    def g(self, name: str):
        return self.grad_views.w(name)

    # ---- host transfers ---------------------------------------------------------------

    def set_parameters(self, flat: np.ndarray) -> None:
        flat = np.ascontiguousarray(flat, np.float32)
        if flat.shape != (self.layout.total,):
            raise ValueError(f"parameters: {flat.shape}, expected ({self.layout.total},)")
        self.params.write(flat)
        if self.mixed:
            with self.dev.record("f16 mirror") as rec:
                basic.cast_f32_f16(rec, self.params, self.w16, self.layout.total)

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
        self.embed_plan = self.all_embed_plans.elements(
            a * self.step_plan.embed_plan_stride, self.embed_plan_len)

    def _upload_tokens(self, micro: np.ndarray) -> None:
        """micro (A, B, T+1): inputs are rows[:, :-1], targets rows[:, 1:]."""
        A, n = micro.shape[0], self.n
        ids = np.zeros((A, self.stride), np.uint32)
        targets = np.zeros((A, self.stride), np.uint32)
        ids[:, :n] = micro[:, :, :-1].reshape(A, n)
        targets[:, :n] = micro[:, :, 1:].reshape(A, n)
        self.all_ids.write(ids)
        self.all_targets.write(targets)
        plans = np.zeros((micro.shape[0], self.step_plan.embed_plan_stride), np.uint32)
        for a in range(micro.shape[0]):
            plans[a, :self.embed_plan_len] = embedding.backward_plan(ids[a, :n])
        self.all_embed_plans.write(plans.reshape(-1))
