"""Token shards: the binary unit of tokenized training data (in Redis or in a file).

Layout (little-endian), a 32-byte header followed by the token ids:

    offset size  field
    0      8     magic b"ISTSHRD\\0"
    8      2     version (1)
    10     1     dtype code: 2 = uint16, 4 = uint32
    11     1     reserved (0)
    12     4     reserved (0)
    16     8     token count
    24     8     first 8 bytes of the vocabulary's sha256 content hash (Vocabulary.content_hash)
    32     ...   count ids of the dtype; documents are separated by the end-of-text id

uint16 is used whenever the vocabulary has at most 65,536 ids. A shard is validated fully
before use: magic, version, dtype, size against the count, the vocabulary hash against the
job's vocabulary, and every id against the vocabulary size.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"ISTSHRD\0"
VERSION = 1
HEADER = struct.Struct("<8sHBBIQ8s")
HEADER_SIZE = HEADER.size  # 32
DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}


class ShardError(ValueError):
    """A shard that cannot be used; the message says which check failed."""


@dataclass(frozen=True)
class ShardHeader:
    version: int
    itemsize: int
    count: int
    vocab_hash: bytes  # 8 bytes

    @property
    def dtype(self) -> np.dtype:
        return DTYPES[self.itemsize]


def vocab_hash_prefix(content_hash: str) -> bytes:
    """The 8 header bytes that identify a vocabulary (from its hex sha256 content hash)."""
    return bytes.fromhex(content_hash)[:8]


def encode_shard(ids, vocab_hash: str, n_vocab: int) -> bytes:
    """Pack token ids into a shard (uint16 when the vocabulary fits)."""
    ids = np.asarray(ids)
    if ids.ndim != 1:
        raise ShardError(f"shard ids must be 1-D, got shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
        raise ShardError(f"ids outside the vocabulary [0, {n_vocab}): min {ids.min()}, "
                         f"max {ids.max()}")
    itemsize = 2 if n_vocab <= 65536 else 4
    payload = ids.astype(DTYPES[itemsize]).tobytes()
    header = HEADER.pack(MAGIC, VERSION, itemsize, 0, 0, ids.size, vocab_hash_prefix(vocab_hash))
    return header + payload


def read_header(blob: bytes, name: str = "shard") -> ShardHeader:
    if len(blob) < HEADER_SIZE:
        raise ShardError(f"{name}: {len(blob)} bytes is shorter than the {HEADER_SIZE}-byte header")
    magic, version, itemsize, _r0, _r1, count, vhash = HEADER.unpack_from(blob)
    if magic != MAGIC:
        raise ShardError(f"{name}: bad magic {magic!r} (not an istanbul shard)")
    if version != VERSION:
        raise ShardError(f"{name}: shard version {version}, this build reads version {VERSION}")
    if itemsize not in DTYPES:
        raise ShardError(f"{name}: unknown dtype code {itemsize}")
    return ShardHeader(version, itemsize, count, vhash)


def decode_shard(blob: bytes, *, n_vocab: int, vocab_hash: str | None = None,
                 name: str = "shard") -> np.ndarray:
    """Validate a shard completely and return its ids (as uint32)."""
    header = read_header(blob, name)
    expected = HEADER_SIZE + header.count * header.itemsize
    if len(blob) != expected:
        raise ShardError(f"{name}: truncated or padded: {len(blob)} bytes, header says "
                         f"{header.count} tokens = {expected} bytes")
    if vocab_hash is not None and header.vocab_hash != vocab_hash_prefix(vocab_hash):
        raise ShardError(f"{name}: tokenized with another vocabulary (hash "
                         f"{header.vocab_hash.hex()} != {vocab_hash[:16]})")
    ids = np.frombuffer(blob, dtype=header.dtype, offset=HEADER_SIZE, count=header.count)
    if ids.size and int(ids.max()) >= n_vocab:
        bad = int(np.flatnonzero(ids >= n_vocab)[0])
        raise ShardError(f"{name}: token id {int(ids[bad])} at position {bad} is outside the "
                         f"vocabulary of {n_vocab} ids")
    return ids.astype(np.uint32)
