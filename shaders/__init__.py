"""WGSL kernels (shaders/kernels/<family>/) and the engine that compiles and dispatches them.

Imported as `istanbul.shaders` (the install maps the folder to that name); the folder keeps its
design-card place and name at the repo root. The engine's names below are imported on first
use, so a module of a family that needs no GPU (a reference, the BPE patterns or class table)
imports without wgpu.
"""

import importlib

if __name__ != "istanbul.shaders":
    # e.g. the top-level name with the repo on sys.path: a second copy of every module (its own
    # devices, caches and error classes) beside the real one
    raise ImportError(f"the kernel house is imported as `istanbul.shaders`, not `{__name__}`: "
                      f"write e.g. `from istanbul.shaders.engine import Device`")

# public name -> the submodule that defines it
LAZY_EXPORTS = {"NoAdapterError": "adapters", "Buffer": "engine", "BufferView": "engine",
                "Device": "engine", "Kernel": "engine", "ShaderCompileError": "engine",
                "default_device": "engine", "fold_grid": "engine"}

__all__ = sorted(LAZY_EXPORTS)


def __getattr__(name: str):
    if name not in LAZY_EXPORTS:
        raise AttributeError(f"module 'istanbul.shaders' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{LAZY_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
