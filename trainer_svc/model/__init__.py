"""The Llama-style decoder: configuration, parameter layout, GPU forward/backward, generation.

`config.py` (ModelConfig, presets), `layout.py` (every parameter in one buffer), `init.py`
(seeded initialisation), `forward.py` (the blocks' forward, shared by training and generation),
`lm_head.py` (the chunked head + cross-entropy), `plan.py` (the training step's buffers,
planned once and checked against the device), `gpu.py` (GpuModel: allocates the plan; the
recorded forward, backward and AdamW), `loss_scale.py` (dynamic loss scaling for f16),
`generate.py` (Generator: prefill and KV-cached decoding), `tuning_shapes.py` (the shapes the
autotuner times).
"""

from .config import PRESETS, ModelConfig, pad_vocab
from .layout import ParameterLayout, Tensor

__all__ = ["ModelConfig", "PRESETS", "ParameterLayout", "Tensor", "pad_vocab"]
