"""The GPU side of an `Encoding`: ordinary segments -> ids, single pieces -> ids, ids -> bytes.

Segments are valid UTF-8 byte strings with no special-token handling left to do
(tokenizer_svc/encoding.py splits special tokens on the CPU, as the issue allows). For the
gpt2/r50k, cl100k and o200k patterns everything runs on the GPU; for any other pattern (a
custom regex, a tokenizer.json Split sequence) the pieces are cut on the CPU with the reference
pre-tokenizer and merged on the GPU.
"""

from __future__ import annotations

import numpy as np

from shaders.engine import Device
from .gpu_decode import GpuDecoder
from .gpu_encode import PATTERN_IDS, GpuEncoder, find_cut
from .gpu_tables import VocabTables
from .reference import PreTokenizer
from .vocab import Vocabulary


class GpuBackend:
    kind = "gpu"

    def __init__(self, vocab: Vocabulary, device: Device, tables: VocabTables | None = None):
        self.vocab = vocab
        self.device = device
        self.tables = tables or VocabTables.build(vocab)
        gpu_pattern = vocab.pattern_name if vocab.hf_splits is None else None
        self.on_gpu_pretok = gpu_pattern in PATTERN_IDS
        self.encoder = GpuEncoder(device, self.tables, gpu_pattern)
        self.decoder = GpuDecoder(device, self.tables, self.encoder.vocab_buf)
        self.pre = PreTokenizer(vocab)

    def describe(self) -> str:
        where = "GPU" if self.on_gpu_pretok else "CPU (regex), merges on the GPU"
        return f"GPU {self.device.name}; pre-tokenization on the {where}"

    def encode_segments(self, segments: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Flat ids and len(segments) + 1 offsets."""
        if self.on_gpu_pretok:
            lengths = np.fromiter((len(s) for s in segments), dtype=np.int64, count=len(segments))
            starts = np.zeros(len(segments) + 1, dtype=np.int64)
            np.cumsum(lengths, out=starts[1:])
            return self.encoder.encode_docs(b"".join(segments), starts)
        pieces, per_segment = [], []
        for seg in segments:
            cut = [p.encode("utf-8") for p in self.pre.split(seg.decode("utf-8"))]
            pieces.extend(cut)
            per_segment.append(len(cut))
        ids, piece_offsets = self.encode_pieces(pieces)
        first_piece = np.zeros(len(segments) + 1, dtype=np.int64)
        np.cumsum(per_segment, out=first_piece[1:])
        return ids, piece_offsets[first_piece]

    def encode_pieces(self, pieces: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        starts = np.zeros(len(pieces) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        return self.encoder.merge_pieces(b"".join(pieces), starts)

    def last_piece_length(self, prefix: bytes) -> int:
        """Byte length of the last pre-tokenized piece of `prefix` (for encode_bytes)."""
        if not prefix:
            return 0
        start = 0
        if self.on_gpu_pretok and len(prefix) > 1:
            data = np.frombuffer(prefix, dtype=np.uint8)
            start = find_cut(data, 0, len(prefix) - 1, self.vocab.pattern_name) or 0
        pieces = self.pre.split(prefix[start:].decode("utf-8"))
        return len(pieces[-1].encode("utf-8")) if pieces else 0

    def decode(self, ids: np.ndarray) -> bytes:
        return self.decoder.decode(ids)
