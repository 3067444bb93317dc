"""Datasets in Redis: token shards and their metadata, read by daemons and never consumed.

A dataset is the token stream of a list of documents, each document preceded by the
end-of-text id (so documents are separated and the model sees where one starts), cut into
shards of `shard_tokens` ids (the last one shorter). Each shard is one Redis string in the
format of `trainer_svc.data.shards` (header with dtype, count and vocabulary hash). Because shards
are plain keys that are only ever read, any number of jobs can train on a dataset, resume
anywhere in it and run several epochs.

    writer = DatasetWriter(handle, "web", vocab_hash=h, n_vocab=50257, eot_id=50256)
    writer.add_document(ids)          # as many as there are
    info = writer.close()             # metadata written last: the dataset is now "ready"

    info = get_dataset(handle, "web")
    ids = load_shard(handle, info, 0, n_vocab=50257, vocab_hash=h)   # validated uint32 ids
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..jobs import keys
from ..jobs.redis_conn import RedisHandle
from .shards import ShardError, decode_shard, encode_shard

DEFAULT_SHARD_TOKENS = 1 << 20


class DatasetError(ValueError):
    """A dataset that is missing, unfinished or unusable; the message says what to do."""


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    vocab_hash: str
    n_vocab: int
    eot_id: int
    shards: int
    tokens: int
    documents: int
    shard_tokens: int
    vocab_name: str = ""
    tokenizer: str = ""
    created_at: float = 0.0
    state: str = "ready"
    vocab_files: tuple = ()

    @classmethod
    def from_hash(cls, raw: dict) -> "DatasetInfo":
        try:
            return cls(name=raw["name"], vocab_hash=raw["vocab_hash"], n_vocab=int(raw["n_vocab"]),
                       eot_id=int(raw["eot_id"]), shards=int(raw.get("shards", 0)),
                       tokens=int(raw.get("tokens", 0)), documents=int(raw.get("documents", 0)),
                       shard_tokens=int(raw.get("shard_tokens", 0)),
                       vocab_name=raw.get("vocab_name", ""), tokenizer=raw.get("tokenizer", ""),
                       created_at=float(raw.get("created_at", 0)), state=raw.get("state", ""),
                       vocab_files=tuple(json.loads(raw.get("vocab_files", "[]"))))
        except (KeyError, ValueError) as exc:
            raise DatasetError(f"dataset metadata {raw.get('name', '?')!r} is damaged ({exc}); "
                               "prepare the dataset again with --replace") from None

    def to_dict(self) -> dict:
        return asdict(self)


def check_name(name: str) -> str:
    if not keys.DATASET_RE.match(name or ""):
        raise DatasetError(f"dataset name {name!r} is not allowed: it must match "
                           f"{keys.DATASET_RE.pattern}")
    return name


class DatasetWriter:
    """Packs documents into shards and stores them; `close()` publishes the dataset."""

    def __init__(self, handle: RedisHandle, name: str, *, vocab_hash: str, n_vocab: int,
                 eot_id: int, vocab_name: str = "", tokenizer: str = "",
                 shard_tokens: int = DEFAULT_SHARD_TOKENS, replace: bool = False):
        self.handle, self.name = handle, check_name(name)
        if shard_tokens <= 0:
            raise DatasetError(f"shard size must be positive, got {shard_tokens}")
        if not 0 <= eot_id < n_vocab:
            raise DatasetError(f"end-of-text id {eot_id} is outside the vocabulary of {n_vocab}")
        self.vocab_hash, self.n_vocab, self.eot_id = vocab_hash, n_vocab, eot_id
        self.vocab_name, self.tokenizer, self.shard_tokens = vocab_name, tokenizer, shard_tokens
        self.shards = self.tokens = self.documents = 0
        self.vocab_files: list[str] = []
        self._pending: list[np.ndarray] = []
        self._pending_count = 0
        self._claim(replace)

    def _claim(self, replace: bool) -> None:
        r, meta = self.handle.text, keys.dataset(self.name)
        if replace:
            delete_dataset(self.handle, self.name)
        if not r.hsetnx(meta, "state", "preparing"):
            state = r.hget(meta, "state")
            if state == "ready":
                raise DatasetError(f"dataset {self.name!r} already exists; pass --replace to "
                                   "overwrite it or choose another --dataset name")
            raise DatasetError(f"dataset {self.name!r} is being prepared by another process (or "
                               "an earlier prepare was interrupted); pass --replace to overwrite")
        r.hset(meta, mapping={"name": self.name, "vocab_hash": self.vocab_hash,
                              "n_vocab": self.n_vocab, "eot_id": self.eot_id,
                              "created_at": repr(time.time())})

    def add_document(self, ids) -> None:
        ids = np.asarray(ids, dtype=np.int64).ravel()
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_vocab):
            raise DatasetError(f"document {self.documents}: ids outside the vocabulary "
                               f"[0, {self.n_vocab}): min {ids.min()}, max {ids.max()}")
        self._pending.append(np.array([self.eot_id], np.int64))
        self._pending.append(ids)
        self._pending_count += 1 + ids.size
        self.documents += 1
        while self._pending_count >= self.shard_tokens:
            self._flush(self.shard_tokens)

    def attach_vocabulary(self, files: dict[str, bytes]) -> None:
        """Store the vocabulary file(s), so checkpoints carry them for generation."""
        if files:
            self.handle.binary.hset(keys.dataset_vocab(self.name), mapping=files)
            self.vocab_files = sorted(files)

    def _flush(self, count: int) -> None:
        stream = np.concatenate(self._pending)
        shard, rest = stream[:count], stream[count:]
        self._pending = [rest] if rest.size else []
        self._pending_count = int(rest.size)
        blob = encode_shard(shard, self.vocab_hash, self.n_vocab)
        self.handle.binary.set(keys.shard(self.name, self.shards), blob)
        self.shards += 1
        self.tokens += int(shard.size)

    def close(self) -> DatasetInfo:
        if self._pending_count:
            self._flush(self._pending_count)
        if self.tokens == 0:
            self.abort()
            raise DatasetError(f"dataset {self.name!r}: no tokens (were the inputs empty?)")
        meta = {"name": self.name, "vocab_hash": self.vocab_hash, "n_vocab": self.n_vocab,
                "eot_id": self.eot_id, "shards": self.shards, "tokens": self.tokens,
                "documents": self.documents, "shard_tokens": self.shard_tokens,
                "vocab_name": self.vocab_name, "tokenizer": self.tokenizer,
                "vocab_files": json.dumps(self.vocab_files), "state": "ready"}
        pipe = self.handle.text.pipeline(transaction=True)
        pipe.hset(keys.dataset(self.name), mapping=meta)
        pipe.sadd(keys.DATASETS, self.name)
        pipe.execute()
        return get_dataset(self.handle, self.name)

    def abort(self) -> None:
        delete_dataset(self.handle, self.name)


def delete_dataset(handle: RedisHandle, name: str) -> int:
    """Remove a dataset's metadata, shards and vocabulary; returns the number of keys removed."""
    r = handle.text
    doomed = [keys.dataset(name), keys.dataset_vocab(name)]
    doomed += list(r.scan_iter(match=keys.shard(name, 0)[:-1] + "*", count=1000))
    removed = r.delete(*doomed)
    r.srem(keys.DATASETS, name)
    return removed


def get_dataset(handle: RedisHandle, name: str, *, require_ready: bool = True) -> DatasetInfo:
    raw = handle.text.hgetall(keys.dataset(name))
    if not raw:
        known = sorted(handle.text.smembers(keys.DATASETS))
        raise DatasetError(f"no dataset {name!r} in Redis; create it with `istanbul prepare "
                           f"FILES --tokenizer HOST:PORT --dataset {name}`"
                           + (f" (known: {', '.join(known)})" if known else ""))
    if require_ready and raw.get("state") != "ready":
        raise DatasetError(f"dataset {name!r} is not ready (state {raw.get('state')!r}): its "
                           "prepare is still running or was interrupted")
    return DatasetInfo.from_hash(raw)


def list_datasets(handle: RedisHandle) -> list[DatasetInfo]:
    out = []
    for name in sorted(handle.text.smembers(keys.DATASETS)):
        try:
            out.append(get_dataset(handle, name, require_ready=False))
        except DatasetError:
            continue
    return out


def load_shard(handle: RedisHandle, info: DatasetInfo, index: int, *, n_vocab: int,
               vocab_hash: str | None) -> np.ndarray:
    """One shard's ids, validated: present, complete, same vocabulary, ids in range."""
    where = f"dataset {info.name!r} shard {index}"
    blob = handle.binary.get(keys.shard(info.name, index))
    if blob is None:
        raise ShardError(f"{where} is missing from Redis (deleted, or Redis lost data); "
                         "prepare the dataset again")
    return decode_shard(blob, n_vocab=n_vocab, vocab_hash=vocab_hash, name=where)


def vocabulary_files(handle: RedisHandle, name: str) -> dict[str, bytes]:
    raw = handle.binary.hgetall(keys.dataset_vocab(name))
    return {k.decode(): v for k, v in raw.items()}
