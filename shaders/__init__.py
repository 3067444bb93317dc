"""WGSL kernels (shaders/kernels/<family>/) and the engine that compiles and dispatches them."""

from .adapters import NoAdapterError
from .engine import Buffer, BufferView, Device, Kernel, ShaderCompileError, default_device, fold_grid

__all__ = ["Buffer", "BufferView", "Device", "Kernel", "NoAdapterError", "ShaderCompileError",
           "default_device", "fold_grid"]
