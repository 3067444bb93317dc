"""The shapes the autotuner times (istanbul.shaders.autotune): one training step of a model
preset (config.PRESETS) at the step size it is tuned for (STEPS).

    dims = model_dims("124m")            # d, kv, ffn, vocab (padded), tokens, fused_qkv
    attention = model_attention("124m")  # B, T, H, Hkv, D
    rows = autotune.tune_model(device, dims, attention)

`istanbul kernels tune --preset P` (trainer_svc/cli_tune.py) and bench/autotune.py pass
them to the tuner.
"""

from __future__ import annotations

from .config import PRESETS, ModelConfig

# The training step each preset is tuned for: batch, sequence length, tokenizer vocabulary
# (padded by ModelConfig.preset). 124m at 8 x 1024 with GPT-2's vocabulary is the training
# benchmark's step (bench/train.py); tiny stays small enough for software Vulkan (tests).
STEPS = {
    "124m": dict(batch=8, seq=1024, vocab=50257),
    "small": dict(batch=8, seq=512, vocab=50257),
    "tiny": dict(batch=2, seq=64, vocab=384),
}


def _config(preset: str) -> ModelConfig:
    if preset not in STEPS or preset not in PRESETS:
        known = sorted(set(STEPS) & set(PRESETS))
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(known)}")
    return ModelConfig.preset(preset, STEPS[preset]["vocab"])


def model_dims(preset: str, tokens: int | None = None) -> dict:
    """The Linear shapes of one training step of `preset`: d_model, kv_dim, ffn_hidden,
    vocab (padded), tokens per step (B*T, or `tokens`) and whether the trainer computes q, k
    and v in one product (forward.fused_qkv); the arguments of autotune.linear_shapes."""
    cfg = _config(preset)
    step = STEPS[preset]
    from .forward import fused_qkv
    return dict(d=cfg.d_model, kv=cfg.kv_dim, ffn=cfg.ffn_hidden, vocab=cfg.vocab_size,
                tokens=int(tokens) if tokens else step["batch"] * step["seq"],
                fused_qkv=fused_qkv(cfg))


def model_attention(preset: str) -> dict:
    """The attention shape of one training step of `preset`: B, T, H, Hkv, D."""
    cfg = _config(preset)
    step = STEPS[preset]
    return dict(B=step["batch"], T=step["seq"], H=cfg.n_heads, Hkv=cfg.n_kv_heads,
                D=cfg.head_dim)
