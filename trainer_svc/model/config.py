"""Model configuration: a Llama-style decoder as plain data, with named presets.

    cfg = ModelConfig.preset("tiny", vocab_size=50257)   # vocab padded up to 50304
    ModelConfig.from_json(cfg.to_json()) == cfg

The architecture (SPEC §8): token embedding, n_layers blocks of
    x += Wo · attention(RoPE(Wq · rmsnorm(x)), RoPE(Wk · rmsnorm(x)), Wv · rmsnorm(x))
    x += Wdown · (silu(Wgate · rmsnorm(x)) * (Wup · rmsnorm(x)))
then a final RMSNorm and the head (its own matrix, or the embedding when `tied_head`).
Attention is causal with n_heads query heads sharing n_kv_heads key/value heads (GQA).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

VOCAB_MULTIPLE = 128  # padded vocabulary: the head matmul's N stays tile-friendly


def pad_vocab(vocab_size: int) -> int:
    return -(-int(vocab_size) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int          # padded to a multiple of 128; ids >= the tokenizer's size never occur
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    max_seq: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied_head: bool = False

    def __post_init__(self):
        problems = []
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                     "ffn_hidden", "max_seq"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if not problems:
            if self.vocab_size % VOCAB_MULTIPLE:
                problems.append(f"vocab_size {self.vocab_size} is not a multiple of "
                                f"{VOCAB_MULTIPLE} (use ModelConfig.preset or pad_vocab)")
            if self.d_model % self.n_heads:
                problems.append(f"d_model {self.d_model} is not divisible by n_heads "
                                f"{self.n_heads}")
            elif self.head_dim % 2:
                problems.append(f"head_dim {self.head_dim} must be even for RoPE")
            if (self.ffn_hidden * self.d_model) % 128:
                problems.append(f"ffn_hidden x d_model = {self.ffn_hidden * self.d_model} must "
                                "be a multiple of 128 (W_gate and W_up sit back to back in "
                                "the parameter buffer as one [2F, d] matrix)")
            if self.n_heads % self.n_kv_heads:
                problems.append(f"n_heads {self.n_heads} is not a multiple of n_kv_heads "
                                f"{self.n_kv_heads}")
        if not (self.rope_theta > 0 and self.norm_eps > 0):
            problems.append("rope_theta and norm_eps must be positive")
        if problems:
            raise ValueError("invalid model config: " + "; ".join(problems))

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def n_params(self) -> int:
        d, f, v = self.d_model, self.ffn_hidden, self.vocab_size
        per_layer = 2 * d + d * d + 2 * d * self.kv_dim + d * d + 3 * d * f
        return v * d + self.n_layers * per_layer + d + (0 if self.tied_head else v * d)

    def flops_per_token(self, seq: int) -> float:
        """Training FLOPs per token (forward + backward = 3x forward), attention included."""
        d, f = self.d_model, self.ffn_hidden
        matmul = 2 * (d * d * 2 + 2 * d * self.kv_dim + 3 * d * f) * self.n_layers \
            + 2 * d * self.vocab_size
        attention = 2 * 2 * seq / 2 * d * self.n_layers  # QK^T and PV over the causal half
        return 3.0 * (matmul + attention)

    # ---- serialisation ------------------------------------------------------------------

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown model config field(s): {', '.join(unknown)}")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.name not in data and f.default is dataclasses.MISSING)
        if missing:
            raise ValueError(f"model config lacks field(s): {', '.join(missing)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> "ModelConfig":
        return cls.from_dict(json.loads(text))

    @classmethod
    def preset(cls, name: str, vocab_size: int, **overrides) -> "ModelConfig":
        """A named preset for a tokenizer of `vocab_size` ids (padded to a multiple of 128)."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of "
                             f"{', '.join(PRESETS)}")
        fields = dict(PRESETS[name], vocab_size=pad_vocab(vocab_size))
        fields.update(overrides)
        return cls(**fields)


# Presets without vocab_size (it comes from the tokenizer).
PRESETS: dict[str, dict] = {
    # seconds on lavapipe; GQA (4 query heads over 2 kv heads) so the tests exercise it
    "tiny": dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=192, max_seq=256),
    # minutes on a GPU: a real little language model
    "small": dict(d_model=384, n_layers=6, n_heads=6, n_kv_heads=6, ffn_hidden=1024,
                  max_seq=512),
    # GPT-2 small's shape: d 768, 12 layers, 12 heads, seq 1024; SwiGLU hidden 2048 keeps the
    # FFN at GPT-2's 4.7M parameters per layer; tied head like GPT-2 (124M with vocab 50304)
    "124m": dict(d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, ffn_hidden=2048,
                 max_seq=1024, tied_head=True),
}
