"""The Llama-style decoder: configuration, parameter layout, GPU forward/backward."""

from .config import PRESETS, ModelConfig, pad_vocab
from .layout import ParameterLayout, Tensor

__all__ = ["ModelConfig", "PRESETS", "ParameterLayout", "Tensor", "pad_vocab"]
