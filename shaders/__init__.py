"""WGSL kernels (shaders/kernels/<family>/) and the engine that compiles and dispatches them.

Imported as `istanbul.shaders` (installed or from a checkout); the folder keeps its design-card
place and name at the repo root.
"""

if __name__ != "istanbul.shaders":
    # e.g. the top-level name with the repo on sys.path: a second copy of every module (its own
    # devices, caches and error classes) beside the real one
    raise ImportError(f"the kernel house is imported as `istanbul.shaders`, not `{__name__}`: "
                      f"write e.g. `from istanbul.shaders.engine import Device`")

from .adapters import NoAdapterError
from .engine import Buffer, BufferView, Device, Kernel, ShaderCompileError, default_device, fold_grid

__all__ = ["Buffer", "BufferView", "Device", "Kernel", "NoAdapterError", "ShaderCompileError",
           "default_device", "fold_grid"]
