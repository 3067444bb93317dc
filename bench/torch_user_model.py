"""The istanbul model written as a PyTorch user writes it: the speed anchor of bench/train.py.

nanoGPT's habits on the same architecture and parameter count as trainer_svc's presets:
`nn.RMSNorm`, one fused QKV projection and one fused gate-up projection, RoPE (rotate-half,
as Hugging Face's Llama), `F.scaled_dot_product_attention(is_causal=True)` (flash attention on
a GPU), SwiGLU, a tied or untied head, `torch.optim.AdamW(fused=True)` with decay on the
matrices only, bf16 autocast, global-norm clipping, one loss read-back per step, and
optionally `torch.compile`. It starts from istanbul's own initial weights (`load_layout`), so
both sides train the same model from the same point.

    model = UserModel(cfg).cuda(); model.load_layout(layout.unpack(flat))
    step = make_step(model, lr=3e-4, compile=True)
    loss = step(batch)              # batch: (B, T+1) int64 on the GPU; returns a float

This is not the parity reference (tests/torch_reference.py is: separate q/k/v matmuls, fp32
norms, exact AdamW as the trainer defines it); it is what a user would pick instead.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def rope_tables(head_dim: int, seq: int, theta: float, device):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim // 2, dtype=torch.float64) * 2 / head_dim))
    ang = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
    return ang.cos().float().to(device), ang.sin().float().to(device)


def apply_rope(x, cos, sin):
    """x: (B, H, T, hd); pairs (i, i + hd/2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.H, self.KV, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        d = cfg.d_model
        self.attn_norm = nn.RMSNorm(d, eps=cfg.norm_eps)
        self.qkv = nn.Linear(d, (self.H + 2 * self.KV) * self.hd, bias=False)
        self.wo = nn.Linear(self.H * self.hd, d, bias=False)
        self.ffn_norm = nn.RMSNorm(d, eps=cfg.norm_eps)
        self.gate_up = nn.Linear(d, 2 * cfg.ffn_hidden, bias=False)
        self.w_down = nn.Linear(cfg.ffn_hidden, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(
            [self.H * self.hd, self.KV * self.hd, self.KV * self.hd], dim=-1)
        q = apply_rope(q.view(B, T, self.H, self.hd).transpose(1, 2), cos, sin)
        k = apply_rope(k.view(B, T, self.KV, self.hd).transpose(1, 2), cos, sin)
        v = v.view(B, T, self.KV, self.hd).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.KV != self.H)
        x = x + self.wo(a.transpose(1, 2).reshape(B, T, self.H * self.hd))
        g, u = self.gate_up(self.ffn_norm(x)).chunk(2, dim=-1)
        return x + self.w_down(F.silu(g) * u)


class UserModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tied_head:
            self.head.weight = self.embed.weight

    def forward(self, idx, targets):
        T = idx.shape[1]
        cos, sin = rope_tables(self.cfg.head_dim, T, self.cfg.rope_theta, idx.device)
        x = self.embed(idx)
        for block in self.layers:
            x = block(x, cos, sin)
        logits = self.head(self.final_norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))

    @torch.no_grad()
    def load_layout(self, params: dict) -> None:
        """istanbul's named parameters (numpy, ParameterLayout.unpack) into this model."""
        t = lambda name: torch.as_tensor(np.asarray(params[name], np.float32))  # noqa: E731
        self.embed.weight.copy_(t("embed"))
        if not self.cfg.tied_head:
            self.head.weight.copy_(t("head"))
        self.final_norm.weight.copy_(t("final_norm"))
        for i, block in enumerate(self.layers):
            p = lambda n: t(f"layers.{i}.{n}")  # noqa: E731
            block.attn_norm.weight.copy_(p("attn_norm"))
            block.ffn_norm.weight.copy_(p("ffn_norm"))
            block.qkv.weight.copy_(torch.cat([p("wq"), p("wk"), p("wv")]))
            block.wo.weight.copy_(p("wo"))
            block.gate_up.weight.copy_(torch.cat([p("w_gate"), p("w_up")]))
            block.w_down.weight.copy_(p("w_down"))


def make_step(model: UserModel, *, lr: float = 3e-4, weight_decay: float = 0.1,
              compile: bool = False, autocast=torch.bfloat16):
    """One optimizer step on a (B, T+1) batch, as a training loop writes it; returns the
    loss (the one read-back). `autocast=None`: fp32."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    fused = next(model.parameters()).is_cuda
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=lr,
                            betas=(0.9, 0.95), fused=fused)
    forward = torch.compile(model) if compile else model
    device = next(model.parameters()).device.type

    def step(batch) -> float:
        with torch.autocast(device_type=device, dtype=autocast or torch.float32,
                            enabled=autocast is not None):
            loss = forward(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step
