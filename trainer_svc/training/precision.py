"""Training precisions, and what "auto" (the default of `istanbul train` and of a job spec)
runs on a given device. Light on imports: the CLI builds its parser from these names."""

from __future__ import annotations

PRECISIONS = ("mixed", "fp32", "f16")
PRECISION_CHOICES = ("auto",) + PRECISIONS     # what a user or a job spec may ask for


def resolve_precision(requested: str, device) -> str:
    """The precision a run asking for `requested` gets on `device`: "auto" is "f16" (every
    matmul on the tensor cores) where the device has f16 subgroup matrices, else "fp32"
    (without tensor cores the f16 mirror does not pay: 7f1f229:bench/results/train/README.md);
    "mixed" and "f16" on a device without shader-f16 fall back to "fp32"; "fp32" stays."""
    from istanbul.shaders.kernels.op_support import has_tensor_cores   # (the engine: lazily)
    if requested not in PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {PRECISION_CHOICES}, got {requested!r}")
    if requested == "auto":
        return "f16" if has_tensor_cores(device) else "fp32"
    if requested in ("mixed", "f16") and not device.has("shader-f16"):
        return "fp32"
    return requested
