"""Text generation: prefill the prompt, then decode one token at a time with a KV cache.

    gen = Generator(cfg, flat_params, device)
    for token in gen.generate(prompt_ids, max_tokens=64, temperature=0.8, top_k=40,
                              top_p=0.95, seed=1, stop=(eot,)):
        print(decode([token]), end="", flush=True)

All model arithmetic runs on the GPU in f32 (the checkpoint's master weights). Each layer
keeps K and V of every position so far in a cache of max_seq rows (rows = positions,
columns = kv heads x head_dim, K after RoPE). Prefill runs the batched causal attention over
the prompt and writes its K/V rows into the cache; each decode step computes q/k/v of one
token at its position, appends k/v to the cache, and runs single-query attention over the
cache (split into chunks of positions and combined: flash-decoding). Only the last
position's logits come back to the host, where sampling happens: greedy when temperature ==
0, else softmax(logits / T) limited to the top-k ids and to the smallest set whose
probability reaches top-p, drawn from a PCG64 generator seeded with `seed` (same seed, same
text). Ids at or past the tokenizer's size (vocabulary padding) are never produced.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from .model import ops
from .model.config import ModelConfig
from .model.layout import ParameterLayout


class GenerationError(ValueError):
    """A prompt or option the generator cannot honour; the message says which."""


def sample(logits: np.ndarray, rng: np.random.Generator, *, temperature: float = 0.0,
           top_k: int = 0, top_p: float = 1.0) -> int:
    """One id from logits (1-D) with the module docstring's rules."""
    logits = np.asarray(logits, np.float64)
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits / temperature
    order = np.argsort(-z, kind="stable")
    if top_k and top_k > 0:
        order = order[:top_k]
    z = z[order]
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
        order, probs = order[:keep], probs[:keep]
        probs = probs / probs.sum()
    return int(order[rng.choice(len(order), p=probs)])


class Generator:
    def __init__(self, cfg: ModelConfig, params: np.ndarray, device, *,
                 valid_vocab: int | None = None, max_seq: int | None = None):
        self.cfg, self.dev = cfg, device
        self.layout = ParameterLayout.for_config(cfg)
        self.valid_vocab = min(valid_vocab or cfg.vocab_size, cfg.vocab_size)
        self.max_seq = min(max_seq or cfg.max_seq, cfg.max_seq)
        d, kv, f, S = cfg.d_model, cfg.kv_dim, cfg.ffn_hidden, self.max_seq
        e = lambda shape, name: device.empty(shape, np.float32, label=name)  # noqa: E731
        self.params = device.upload(np.ascontiguousarray(params, np.float32), "gen params")
        self.k_cache = [e((S, kv), f"k cache {i}") for i in range(cfg.n_layers)]
        self.v_cache = [e((S, kv), f"v cache {i}") for i in range(cfg.n_layers)]
        # activations for up to S rows (prefill) and their 1-row use (decode)
        self.x, self.x2 = e((S, d), "x"), e((S, d), "x2")
        self.h, self.rstd = e((S, d), "h"), e(S, "rstd")
        self.q, self.a = e((S, d), "q"), e((S, d), "attn")
        self.k, self.v = e((S, kv), "k"), e((S, kv), "v")
        self.lse = e((cfg.n_heads, S), "lse")
        self.gu, self.s = e((S, 2 * f), "gate|up"), e((S, f), "act")
        self.x_last = e((1, d), "x last")
        self.logits = e(cfg.vocab_size, "logits")
        self.ids = device.empty(S, np.uint32, label="ids")
        self.rope_table = ops.rope_table(device, S, cfg.head_dim, cfg.rope_theta)
        self.length = 0  # positions in the cache

    def w(self, name: str):
        t = self.layout[name]
        return self.params.elements(t.offset, t.size, t.shape)

    def _rows(self, buf, rows: int, cols: int):
        return buf.elements(0, rows * cols, (rows, cols))

    def _record(self, rec, T: int, pos0: int) -> None:
        """Forward of T new tokens at positions pos0.. (ids already uploaded); last logits."""
        cfg = self.cfg
        d, kv, f, H, KV, hd = cfg.d_model, cfg.kv_dim, cfg.ffn_hidden, cfg.n_heads, \
            cfg.n_kv_heads, cfg.head_dim
        x, x2 = self._rows(self.x, T, d), self._rows(self.x2, T, d)
        h, q, a = self._rows(self.h, T, d), self._rows(self.q, T, d), self._rows(self.a, T, d)
        k, v = self._rows(self.k, T, kv), self._rows(self.v, T, kv)
        gu, s = self._rows(self.gu, T, 2 * f), self._rows(self.s, T, f)
        rstd = self.rstd.elements(0, T)
        ops.embedding(rec, self.ids.elements(0, T), self.w("embed"), x, T, d, cfg.vocab_size)
        for i in range(cfg.n_layers):
            pre = f"layers.{i}."
            ops.rmsnorm(rec, x, self.w(pre + "attn_norm"), h, rstd, T, d, cfg.norm_eps)
            ops.linear(rec, h, self.w(pre + "wq"), q, T, d, d)
            ops.linear(rec, h, self.w(pre + "wk"), k, T, kv, d)
            ops.linear(rec, h, self.w(pre + "wv"), v, T, kv, d)
            ops.rope(rec, q, self.rope_table, 1, T, H, hd, pos0=pos0)
            ops.rope(rec, k, self.rope_table, 1, T, KV, hd, pos0=pos0)
            ops.kv_cache_write(rec, k, v, self.k_cache[i], self.v_cache[i], T, KV, hd,
                               pos=pos0, t_max=self.max_seq)
            if T > 1:  # prefill: batched causal attention over the prompt (pos0 == 0)
                ops.attention(rec, q, k, v, a, self.lse.elements(0, H * T), 1, T, H, KV, hd)
            else:      # decode: the new token's query against every cached position
                ops.attention_decode(rec, q, self.k_cache[i], self.v_cache[i], a, H, KV, hd,
                                     n_ctx=pos0 + 1, t_max=self.max_seq)
            ops.linear(rec, a, self.w(pre + "wo"), x2, T, d, d, residual=x)
            ops.rmsnorm(rec, x2, self.w(pre + "ffn_norm"), h, rstd, T, d, cfg.norm_eps)
            off, size = self.layout.fused_range(pre + "w_gate", pre + "w_up")
            ops.linear(rec, h, self.params.elements(off, size), gu, T, 2 * f, d)
            ops.swiglu(rec, gu, s, T, f)
            ops.linear(rec, s, self.w(pre + "w_down"), x, T, d, f, residual=x2)
        # only the last row goes through the final norm and the head
        rec.copy(x, self.x_last, d * 4, src_offset=(T - 1) * d * 4)
        ops.rmsnorm(rec, self.x_last, self.w("final_norm"), self._rows(self.h, 1, d),
                    self.rstd.elements(0, 1), 1, d, cfg.norm_eps)
        head = "embed" if cfg.tied_head else "head"
        ops.linear(rec, self._rows(self.h, 1, d), self.w(head), self.logits, 1,
                   cfg.vocab_size, d)

    def _run(self, ids: np.ndarray, pos0: int) -> np.ndarray:
        T = len(ids)
        if pos0 + T > self.max_seq:
            raise GenerationError(f"context of {pos0 + T} tokens exceeds max_seq "
                                  f"{self.max_seq}")
        self.ids.write(np.asarray(ids, np.uint32))
        with self.dev.record("generate") as rec:
            self._record(rec, T, pos0)
        self.length = pos0 + T
        logits = self.dev.download(self.logits)
        return logits[: self.valid_vocab]

    def prefill(self, prompt) -> np.ndarray:
        prompt = np.asarray(prompt, np.int64).reshape(-1)
        if prompt.size == 0:
            raise GenerationError("empty prompt: give at least one token")
        if prompt.min() < 0 or prompt.max() >= self.valid_vocab:
            raise GenerationError(f"prompt ids outside [0, {self.valid_vocab})")
        return self._run(prompt, 0)

    def decode(self, token: int) -> np.ndarray:
        return self._run(np.array([token]), self.length)

    def generate(self, prompt, *, max_tokens: int = 64, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, seed: int = 0,
                 stop=()) -> Iterator[int]:
        if not (0 < top_p <= 1.0) or temperature < 0 or top_k < 0 or max_tokens < 0:
            raise GenerationError("need temperature >= 0, top_k >= 0, 0 < top_p <= 1, "
                                  "max_tokens >= 0")
        rng = np.random.Generator(np.random.PCG64(seed))
        stop = set(int(s) for s in stop)
        logits = self.prefill(prompt)
        for n in range(max_tokens):
            token = sample(logits, rng, temperature=temperature, top_k=top_k, top_p=top_p)
            yield token
            if token in stop or n == max_tokens - 1 or self.length >= self.max_seq:
                return
            logits = self.decode(token)
