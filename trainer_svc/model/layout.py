"""Parameter layout: every parameter in ONE buffer, each at a named, aligned sub-range.

    layout = ParameterLayout.for_config(cfg)
    layout["layers.0.wq"]      # -> Tensor(name, shape=(d, d), offset=..., size=..., decay=True)
    layout.total               # elements in the buffer (f32 master, gradients, AdamW moments)
    layout.hash                # FNV-1a 64 of names, shapes, offsets and dtype (hex)

The same layout indexes four buffers of the trainer: f32 master weights, f32 gradients, the
AdamW moments, and the f16 weight mirror. Offsets are multiples of 128 elements, so every
sub-range starts on a 256-byte boundary in the f16 mirror (512 in the f32 buffers): that is
the device's storage-offset alignment (256 on lavapipe and NVIDIA), so any tensor can be bound
on its own. Gaps between tensors stay zero and never reach the optimizer or the gradient norm.

Order: first every weight-decayed matrix (embedding, projections, head), then the RMSNorm
gains, so AdamW runs as two dispatches (decay / no decay) over two contiguous ranges.

Matrices are stored (out_features, in_features), row-major, like torch.nn.Linear and
Hugging Face Llama: a projection is y = x · Wᵀ (the NT matmul). Each layer's W_gate and W_up
are adjacent (the config guarantees F*d is a multiple of the alignment), so the two FFN input
projections run as ONE matmul with the stacked [2F, d] matrix (`fused_range`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import ModelConfig

ALIGN_ELEMENTS = 128  # 256 bytes of f16 = the storage-offset alignment of our devices
MASTER_DTYPE = "f32"


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for byte in data:
        h ^= byte
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple
    offset: int   # in elements
    decay: bool   # AdamW weight decay applies

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))   # not np.prod: asked ~2,000 times a recorded step

    @property
    def end(self) -> int:
        return self.offset + self.size


def layer_matrices(cfg: ModelConfig, i: int) -> list[tuple[str, tuple]]:
    d, kv, f = cfg.d_model, cfg.kv_dim, cfg.ffn_hidden
    p = f"layers.{i}."
    return [(p + "wq", (d, d)), (p + "wk", (kv, d)), (p + "wv", (kv, d)), (p + "wo", (d, d)),
            (p + "w_gate", (f, d)), (p + "w_up", (f, d)), (p + "w_down", (d, f))]


class ParameterLayout:
    def __init__(self, tensors: list[Tensor], total: int, dtype: str = MASTER_DTYPE):
        self.tensors = tensors
        self.by_name = {t.name: t for t in tensors}
        self.total = total
        self.dtype = dtype

    @classmethod
    def for_config(cls, cfg: ModelConfig) -> "ParameterLayout":
        d = cfg.d_model
        decayed = [("embed", (cfg.vocab_size, d))]
        for i in range(cfg.n_layers):
            decayed += layer_matrices(cfg, i)
        if not cfg.tied_head:
            decayed.append(("head", (cfg.vocab_size, d)))
        gains = []
        for i in range(cfg.n_layers):
            gains += [(f"layers.{i}.attn_norm", (d,)), (f"layers.{i}.ffn_norm", (d,))]
        gains.append(("final_norm", (d,)))
        tensors, offset = [], 0
        for group, decay in ((decayed, True), (gains, False)):
            for name, shape in group:
                t = Tensor(name, tuple(shape), offset, decay)
                tensors.append(t)
                offset = _align(t.end)
        return cls(tensors, offset)

    def __getitem__(self, name: str) -> Tensor:
        try:
            return self.by_name[name]
        except KeyError:
            raise KeyError(f"no parameter {name!r} in the layout") from None

    def __contains__(self, name: str) -> bool:
        return name in self.by_name

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def fused_range(self, *names: str) -> tuple[int, int]:
        """(offset, size) of adjacent tensors as one stacked matrix (the rows of all)."""
        parts = [self[n] for n in names]
        for a, b in zip(parts, parts[1:]):
            if a.end != b.offset or a.shape[1:] != b.shape[1:]:
                raise ValueError(f"{a.name} and {b.name} are not adjacent with equal row length")
        return parts[0].offset, sum(t.size for t in parts)

    def decay_range(self) -> tuple[int, int]:
        """[start, end) in elements of the weight-decayed block (aligned at both ends)."""
        decayed = [t for t in self.tensors if t.decay]
        return decayed[0].offset, _align(decayed[-1].end)

    def no_decay_range(self) -> tuple[int, int]:
        plain = [t for t in self.tensors if not t.decay]
        return plain[0].offset, _align(plain[-1].end)

    def canonical(self) -> str:
        """The text the hash covers: one line per tensor, in buffer order."""
        lines = [f"dtype={self.dtype};total={self.total}"]
        lines += [f"{t.name}:{'x'.join(map(str, t.shape))}@{t.offset}" for t in self.tensors]
        return "\n".join(lines)

    @property
    def hash(self) -> str:
        return f"{fnv1a64(self.canonical().encode()):016x}"

    # ---- host-side views ---------------------------------------------------------------

    def unpack(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Named copies of each tensor from a flat buffer of `total` elements."""
        if flat.size < self.total:
            raise ValueError(f"flat parameter array of {flat.size} elements is smaller than "
                             f"the layout's {self.total}")
        return {t.name: flat[t.offset:t.end].reshape(t.shape).copy() for t in self.tensors}

    def pack(self, named: dict, dtype=np.float32) -> np.ndarray:
        """A flat buffer from named tensors (every name required, shapes checked)."""
        missing = [n for n in self.names if n not in named]
        extra = sorted(set(named) - set(self.names))
        if missing or extra:
            raise ValueError(f"tensors do not match the layout: missing {missing[:5]}, "
                             f"unexpected {extra[:5]}")
        flat = np.zeros(self.total, dtype)
        for t in self.tensors:
            value = np.asarray(named[t.name])
            if tuple(value.shape) != t.shape:
                raise ValueError(f"tensor {t.name}: shape {tuple(value.shape)}, layout says "
                                 f"{t.shape}")
            flat[t.offset:t.end] = value.reshape(-1)
        return flat


def _align(n: int) -> int:
    return -(-n // ALIGN_ELEMENTS) * ALIGN_ELEMENTS
