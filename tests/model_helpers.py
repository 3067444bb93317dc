"""Small shared pieces for the model tests: a test vocabulary, tiny configs, token data."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tokenizer_svc.vocab import Vocabulary, save_vocabulary
from tokenizer_svc.patterns import PATTERNS
from trainer_svc.model import ModelConfig

TINY = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=192, max_seq=64)


def tiny_config(vocab: int = 512, **overrides) -> ModelConfig:
    return ModelConfig(**{**TINY, "vocab_size": vocab, **overrides})


def byte_vocabulary(path: Path, extra: int = 0, name: str = "bytes") -> Path:
    """A .tiktoken of the 256 byte tokens (+ `extra` two-byte merges) with a sidecar."""
    ranks = {bytes([i]): i for i in range(256)}
    letters = b"etaoinshrdlucmfw"
    for a in letters:
        for b in letters:
            if len(ranks) >= 256 + extra:
                break
            ranks[bytes([a, b])] = len(ranks)
    vocab = Vocabulary(name=name, ranks=ranks, pattern=PATTERNS["gpt2"],
                       special_tokens={"<|endoftext|>": len(ranks)})
    save_vocabulary(vocab, path)
    return path


def random_batches(rng, n: int, batch: int, seq: int, vocab: int) -> list[np.ndarray]:
    return [rng.integers(0, vocab, size=(batch, seq + 1), dtype=np.uint32) for _ in range(n)]


def stdlib_text(max_bytes: int = 200_000) -> str:
    """Real text: sources of the Python standard library (fixed files, in a fixed order)."""
    import sysconfig
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for name in ("textwrap.py", "string.py", "heapq.py", "bisect.py", "fnmatch.py",
                 "shlex.py", "difflib.py", "argparse.py"):
        path = root / name
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            parts.append(text)
            size += len(text)
        if size >= max_bytes:
            break
    return "\n".join(parts)[:max_bytes]


def requires_ops(*families: str):
    """Skip (with the reason) while a kernel family the model needs is not in the build.

    The kernels land family by family from the kernels branch; once all are merged nothing
    here skips.
    """
    import importlib.util
    import pytest
    from trainer_svc.model.ops import FAMILY_MODULES
    missing = [f for f in families if importlib.util.find_spec(FAMILY_MODULES[f]) is None]
    return pytest.mark.skipif(bool(missing), reason="kernel families not in this build yet: "
                              + ", ".join(FAMILY_MODULES[m] for m in missing))


FORWARD_OPS = ("linear", "embedding", "rmsnorm", "rope", "activations", "attention",
               "decode", "basic")
TRAINING_OPS = FORWARD_OPS + ("cross_entropy", "optim")
