"""Seeded parameter initialisation (host side, numpy): the same seed gives the same bytes.

Matrices ~ N(0, 0.02); the two projections that write into the residual stream (wo, w_down)
are scaled down by 1/sqrt(2 * n_layers) (GPT-2's rule, keeps the residual variance flat with
depth); RMSNorm gains start at 1. Tensors are drawn in layout order from one generator, so the
result depends only on (config, seed).
"""

from __future__ import annotations

import math

import numpy as np

from .config import ModelConfig
from .layout import ParameterLayout

STD = 0.02


def init_parameters(cfg: ModelConfig, layout: ParameterLayout, seed: int) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(seed))
    flat = np.zeros(layout.total, np.float32)
    residual_scale = 1.0 / math.sqrt(2 * cfg.n_layers)
    for t in layout:
        if not t.decay:  # RMSNorm gains
            value = np.ones(t.shape, np.float32)
        else:
            std = STD * (residual_scale if t.name.endswith(("wo", "w_down")) else 1.0)
            value = (rng.standard_normal(t.shape, dtype=np.float32) * std).astype(np.float32)
        flat[t.offset:t.end] = value.reshape(-1)
    return flat
