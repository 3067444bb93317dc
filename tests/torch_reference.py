"""The same model in PyTorch: the reference the WGSL model is checked against.

Built from a ModelConfig and the named parameters of a ParameterLayout (numpy), so both sides
start from identical weights:

    ref = TorchReference(cfg, layout.unpack(flat))
    loss, grads = ref.loss_and_grads(batch)          # batch: (B, T+1) token ids
    ref.greedy(prompt_ids, n)                        # generation by full recomputation

`weights_f16=True` emulates mixed precision: every matmul reads its weight matrix rounded to
f16 (the GPU's f16 mirror), through a straight-through rounding so the gradients land on the
f32 master weights unrounded, exactly as the GPU's f32 backward computes them. The embedding
lookup reads the f32 table (the head matmul of a tied model reads its f16 rounding). Runs on
CPU in the tests and on CUDA in bench/train.py.

RoPE pairs dimension i with i + head_dim/2 ("rotate half"), as Hugging Face's Llama does.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
import torch.nn.functional as F



@functools.lru_cache(maxsize=16)
def rope_tables(cfg, seq: int, device="cpu", offset: int = 0):
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd))
    pos = torch.arange(offset, offset + seq, dtype=torch.float64)
    ang = torch.outer(pos, inv)                                    # (T, hd/2)
    return ang.cos().float().to(device), ang.sin().float().to(device)


def apply_rope(x, cos, sin):
    """x: (B, T, H, hd); pairs (i, i + hd/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], dim=-1)


def rms_norm(x, gain, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain


class TorchReference:
    def __init__(self, cfg, params: dict, *, device="cpu", dtype=torch.float32,
                 weights_f16: bool = False):
        self.cfg = cfg
        self.device = device
        self.weights_f16 = weights_f16
        self.params = {}
        for name, value in params.items():
            t = torch.as_tensor(np.asarray(value, np.float32))
            self.params[name] = t.to(device=device, dtype=dtype).requires_grad_(True)

    def mat(self, name: str):
        """A weight matrix as the matmuls read it (straight-through f16 rounding if mixed)."""
        w = self.params[name]
        if not self.weights_f16:
            return w
        return w + (w.detach().half().to(w.dtype) - w.detach())

    def head_weight(self):
        return self.mat("embed" if self.cfg.tied_head else "head")

    def forward(self, idx, autocast_dtype=None):
        """Logits (B, T, V) for token ids idx (B, T)."""
        cfg, p = self.cfg, self.params
        B, T = idx.shape
        H, KV, hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        cos, sin = rope_tables(cfg, T, str(self.device))
        x = p["embed"][idx]
        for i in range(cfg.n_layers):
            w = lambda n: self.mat(f"layers.{i}.{n}") if n.startswith("w") \
                else p[f"layers.{i}.{n}"]  # noqa: E731
            h = rms_norm(x, w("attn_norm"), cfg.norm_eps)
            with torch.autocast(device_type=str(self.device).split(":")[0],
                                dtype=autocast_dtype or torch.bfloat16,
                                enabled=autocast_dtype is not None):
                q = (h @ w("wq").T).view(B, T, H, hd)
                k = (h @ w("wk").T).view(B, T, KV, hd)
                v = (h @ w("wv").T).view(B, T, KV, hd)
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
                q, k, v = (t.transpose(1, 2) for t in (q, k, v))       # (B, H, T, hd)
                if KV != H:
                    k = k.repeat_interleave(H // KV, dim=1)
                    v = v.repeat_interleave(H // KV, dim=1)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                a = a.transpose(1, 2).reshape(B, T, H * hd)
                x = x + a @ w("wo").T
            h = rms_norm(x, w("ffn_norm"), cfg.norm_eps)
            with torch.autocast(device_type=str(self.device).split(":")[0],
                                dtype=autocast_dtype or torch.bfloat16,
                                enabled=autocast_dtype is not None):
                g = h @ w("w_gate").T
                u = h @ w("w_up").T
                x = x + (F.silu(g) * u) @ w("w_down").T
        h = rms_norm(x, p["final_norm"], cfg.norm_eps)
        with torch.autocast(device_type=str(self.device).split(":")[0],
                            dtype=autocast_dtype or torch.bfloat16,
                            enabled=autocast_dtype is not None):
            return h @ self.head_weight().T

    def loss(self, batch, *, label_smoothing=0.0, z_loss=0.0, autocast_dtype=None):
        if not isinstance(batch, torch.Tensor):
            batch = torch.as_tensor(np.asarray(batch, np.int64))
        batch = batch.to(device=self.device, dtype=torch.int64)
        idx, targets = batch[:, :-1], batch[:, 1:]
        logits = self.forward(idx, autocast_dtype).float()
        return token_loss(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                          label_smoothing, z_loss)

    def loss_and_grads(self, batch, **kw):
        for t in self.params.values():
            t.grad = None
        loss = self.loss(batch, **kw)
        loss.backward()
        grads = {n: t.grad.detach().cpu().numpy().astype(np.float32)
                 for n, t in self.params.items()}
        return float(loss.detach()), grads

    @torch.no_grad()
    def greedy(self, prompt, n_new: int, stop=()):
        ids = list(int(i) for i in prompt)
        for _ in range(n_new):
            idx = torch.tensor([ids], device=self.device)
            nxt = int(self.forward(idx)[0, -1].argmax())
            ids.append(nxt)
            if nxt in stop:
                break
        return ids[len(prompt):]

    @torch.no_grad()
    def logits(self, idx):
        return self.forward(torch.as_tensor(np.asarray(idx, np.int64),
                                            device=self.device)).float().cpu().numpy()


def token_loss(logits, targets, label_smoothing=0.0, z_loss=0.0, ignore_index=-1):
    """Mean over kept tokens of CE with label smoothing (uniform over all V) plus z-loss."""
    keep = targets != ignore_index
    logits, targets = logits[keep], targets[keep]
    lse = torch.logsumexp(logits, dim=-1)
    nll = lse - logits.gather(1, targets[:, None])[:, 0]
    smooth = lse - logits.mean(dim=-1)
    loss = (1 - label_smoothing) * nll + label_smoothing * smooth + z_loss * lse.pow(2)
    return loss.mean()


class TorchAdamW:
    """AdamW exactly as the trainer defines it (bias-corrected, decoupled decay on matrices,
    global-norm clipping, skip on non-finite gradients)."""

    def __init__(self, ref: TorchReference, layout, tc):
        self.ref, self.layout, self.tc = ref, layout, tc
        self.m = {n: torch.zeros_like(t) for n, t in ref.params.items()}
        self.v = {n: torch.zeros_like(t) for n, t in ref.params.items()}
        self.t = 0

    @torch.no_grad()
    def step(self, grads: dict, lr: float) -> float:
        tc = self.tc
        norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
        if not math.isfinite(norm):
            return norm
        clip = min(1.0, tc.grad_clip / (norm + 1e-6)) if tc.grad_clip > 0 else 1.0
        self.t += 1
        bc1, bc2 = 1 - tc.beta1 ** self.t, 1 - tc.beta2 ** self.t
        for name, p in self.ref.params.items():
            g = grads[name] * clip
            m, v = self.m[name], self.v[name]
            m.mul_(tc.beta1).add_(g, alpha=1 - tc.beta1)
            v.mul_(tc.beta2).addcmul_(g, g, value=1 - tc.beta2)
            if self.layout[name].decay:
                p.mul_(1 - lr * tc.weight_decay)
            p.sub_(lr * (m / bc1) / ((v / bc2).sqrt() + tc.eps))
        return norm
