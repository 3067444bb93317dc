"""Text generation: prefill the prompt, then decode one token at a time with a KV cache.

    gen = Generator(cfg, flat_params, device)
    for token in gen.generate(prompt_ids, max_tokens=64, temperature=0.8, top_k=40,
                              top_p=0.95, seed=1, stop=(eot,)):
        print(decode([token]), end="", flush=True)

All model arithmetic runs on the GPU in f32 (the checkpoint's master weights), recorded by
the same forward pass as training (trainer_svc/model/forward.py). Each layer
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

from istanbul.shaders.kernels.rmsnorm import ops as rmsnorm
from istanbul.shaders.kernels.rope import ops as rope
from istanbul.shaders.kernels.matmul import ops as linear

from .config import ModelConfig
from .forward import BlockBuffers, KVCache, Weights, record_blocks
from .layout import ParameterLayout


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
        d, kv, S = cfg.d_model, cfg.kv_dim, self.max_seq
        e = lambda shape, name: device.empty(shape, np.float32, label=name)  # noqa: E731
        self.params = device.upload(np.ascontiguousarray(params, np.float32), "gen params")
        self.weights = Weights(cfg, self.layout, self.params)   # f32 throughout
        self.caches = [KVCache(e((S, kv), f"k cache {i}"), e((S, kv), f"v cache {i}"), S)
                       for i in range(cfg.n_layers)]
        # one set of activations for up to S rows (prefill) or 1 row (decode), shared by
        # every layer: the training forward's recording with the same buffers per layer
        self.acts = BlockBuffers(device, S, cfg, "gen", share_norm=True)
        self.x_last, self.h_last = e((1, d), "x last"), e((1, d), "h last")
        self.rstd_last = e(1, "rstd last")
        self.logits = e(cfg.vocab_size, "logits")
        self.ids = device.empty(S, np.uint32, label="ids")
        self.rope_table = device.upload(rope.rope_table(S, cfg.head_dim, cfg.rope_theta),
                                        label="rope table")
        self.length = 0  # positions in the cache

    def _record(self, rec, T: int, pos0: int) -> None:
        """Forward of T new tokens at positions pos0.. (ids already uploaded); last logits."""
        cfg, d = self.cfg, self.cfg.d_model
        acts = self.acts.rows(T)
        record_blocks(rec, cfg, self.weights, [acts] * cfg.n_layers, acts.x,
                      self.ids.elements(0, T), 1, T, self.rope_table, pos0=pos0,
                      caches=self.caches)
        # only the last row goes through the final norm and the head
        rec.copy(self.acts.x, self.x_last, d * 4, src_offset=(T - 1) * d * 4)
        rmsnorm.forward(rec, self.x_last, self.weights.p("final_norm"), self.h_last,
                        self.rstd_last, 1, d, cfg.norm_eps)
        linear.matmul_nt(rec, self.h_last, self.weights.w(self.weights.head_name),
                         self.logits, 1, cfg.vocab_size, d, f16_math=False)

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
