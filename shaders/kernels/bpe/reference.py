"""Exact references of the BPE tokenizer kernels.

    encode(vocab, docs)    ids and per-document offsets of tiktoken-identical BPE
                           (the plain-Python tokenizer, tokenizer_svc/reference.py)
    exclusive_scan(x)      n + 1 outputs: 0, x0, x0 + x1, ..., the total (u32, wrapping)
    decode(vocab, ids)     the concatenated bytes of the tokens
"""

from __future__ import annotations

import numpy as np


def encode(vocab, docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    from tokenizer_svc.reference import ReferenceTokenizer
    ref = ReferenceTokenizer(vocab)
    parts = [np.array(ref.encode_ordinary(d), dtype=np.uint32) for d in docs]
    offsets = np.concatenate([[0], np.cumsum([p.size for p in parts])]).astype(np.int64)
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32), offsets


def exclusive_scan(x: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(x, dtype=np.uint64)]).astype(np.uint32)


def decode(vocab, ids: np.ndarray) -> np.ndarray:
    return np.frombuffer(b"".join(vocab.decoder[int(i)] for i in ids), np.uint8)
