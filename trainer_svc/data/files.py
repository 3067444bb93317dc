"""Shard files on disk: what `istanbul prepare --out DIR` writes and `istanbul train --data`
reads, for one machine with no Redis and no tokenizer service.

    DIR/shard_00000.shard, shard_00001.shard, ...   the shard format of trainer_svc/data/shards.py
    DIR/dataset.json                                 vocabulary name/hash/size, eot id, counts
    DIR/<vocabulary file> (+ its .json sidecar)      when prepare was given --vocab

Documents are packed exactly as in Redis datasets (each preceded by the end-of-text id,
`shard_tokens` ids per shard), so a dataset written here trains like the same dataset
in Redis.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .shards import encode_shard

PATTERN = "shard_*.shard"


class DataFilesError(ValueError):
    """A shard folder that cannot be written or read; the message says what to do."""


def shard_paths(name: str) -> list[Path]:
    """A shard file itself, or the shard files of a folder written by `prepare --out`."""
    path = Path(name)
    if path.is_dir():
        found = sorted(path.glob(PATTERN))
        if not found:
            raise DataFilesError(f"{name}: no {PATTERN} files in this folder (write them with "
                                 "`istanbul prepare FILES --vocab V --out DIR`)")
        return found
    return [path]


class ShardFileWriter:
    """Packs documents into shard files in `out` (the DatasetWriter interface)."""

    def __init__(self, out: Path, *, vocab_hash: str, n_vocab: int, eot_id: int,
                 vocab_name: str = "", tokenizer: str = "", shard_tokens: int = 1 << 20,
                 replace: bool = False):
        self.out = Path(out)
        if shard_tokens <= 0:
            raise DataFilesError(f"shard size must be positive, got {shard_tokens}")
        if not 0 <= eot_id < n_vocab:
            raise DataFilesError(f"end-of-text id {eot_id} is outside the vocabulary of "
                                 f"{n_vocab}")
        old = sorted(self.out.glob(PATTERN)) if self.out.is_dir() else []
        if old and not replace:
            raise DataFilesError(f"{self.out} already holds shard files; pass --replace to "
                                 "overwrite them or choose another --out folder")
        self.out.mkdir(parents=True, exist_ok=True)
        for path in old + [self.out / "dataset.json"]:
            path.unlink(missing_ok=True)
        self.meta = {"vocab_hash": vocab_hash, "n_vocab": n_vocab, "eot_id": eot_id,
                     "vocab_name": vocab_name, "tokenizer": tokenizer,
                     "shard_tokens": shard_tokens}
        self.vocab_hash, self.n_vocab, self.eot_id = vocab_hash, n_vocab, eot_id
        self.shard_tokens = shard_tokens
        self.shards = self.tokens = self.documents = 0
        self._eot = np.array([eot_id], np.uint32)
        self.vocab_files: list[str] = []
        self._pending: list[np.ndarray] = []
        self._pending_count = 0

    def add_document(self, ids) -> None:
        ids = np.asarray(ids).ravel()
        # the encoder's uint32 ids are checked with one pass and never copied here
        if ids.size and ((ids.dtype.kind != "u" and ids.min() < 0)
                         or ids.max() >= self.n_vocab):
            raise DataFilesError(f"document {self.documents}: ids outside the vocabulary "
                                 f"[0, {self.n_vocab})")
        if ids.dtype != np.uint32:
            ids = ids.astype(np.uint32)
        self._pending += [self._eot, ids]
        self._pending_count += 1 + ids.size
        self.documents += 1
        while self._pending_count >= self.shard_tokens:
            self._flush(self.shard_tokens)

    def attach_vocabulary(self, files: dict[str, bytes]) -> None:
        for name, data in files.items():
            (self.out / name).write_bytes(data)
        self.vocab_files = sorted(files)

    def _flush(self, count: int) -> None:
        stream = np.concatenate(self._pending)
        shard, rest = stream[:count], stream[count:]
        self._pending = [rest] if rest.size else []
        self._pending_count = int(rest.size)
        path = self.out / f"shard_{self.shards:05d}.shard"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(encode_shard(shard, self.vocab_hash, self.n_vocab))
        tmp.replace(path)
        self.shards += 1
        self.tokens += int(shard.size)

    def close(self) -> dict:
        if self._pending_count:
            self._flush(self._pending_count)
        if self.tokens == 0:
            self.abort()
            raise DataFilesError(f"{self.out}: no tokens (were the inputs empty?)")
        self.meta.update(shards=self.shards, tokens=self.tokens, documents=self.documents,
                         vocab_files=self.vocab_files)
        (self.out / "dataset.json").write_text(json.dumps(self.meta, indent=2) + "\n")
        return dict(self.meta, name=str(self.out))

    def abort(self) -> None:
        for path in self.out.glob(PATTERN):
            path.unlink(missing_ok=True)
