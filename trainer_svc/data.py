"""Training batches from token shards, in a deterministic order that resumes exactly.

    stream = TokenStream([ids0, ids1, ...], batch=8, seq=1024)
    batch = stream.next_batch()          # (8, 1025) uint32: row b holds T+1 consecutive tokens
    pos = stream.position                # {"epoch": 0, "shard": 0, "offset": 8192}: JSON
    TokenStream(shards, 8, 1024, position=pos)   # continues with the very next batch

Rows are windows of T+1 tokens read front to back through shard 0, then shard 1, ...; the
window advances by T, so each token is predicted exactly once per epoch (the last token of a
row is the first of the next). A window never spans two shards: a shard's tail shorter than
T+1 tokens is skipped. After the last shard the epoch count goes up and reading restarts at
shard 0. The position is the place where the next row starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class DataError(ValueError):
    """Shards that cannot produce batches of the requested shape."""


@dataclass(frozen=True)
class Position:
    epoch: int = 0
    shard: int = 0
    offset: int = 0

    def to_json(self) -> dict:
        return {"epoch": self.epoch, "shard": self.shard, "offset": self.offset}

    @classmethod
    def from_json(cls, data: dict) -> "Position":
        try:
            return cls(int(data["epoch"]), int(data["shard"]), int(data["offset"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"bad data position {data!r}: needs integer epoch, shard, "
                            "offset") from exc


class TokenStream:
    def __init__(self, shards, batch: int, seq: int, position: dict | Position | None = None,
                 vocab_size: int | None = None):
        if batch < 1 or seq < 1:
            raise DataError(f"batch and seq must be >= 1, got batch={batch} seq={seq}")
        self.shards = [np.asarray(s).reshape(-1) for s in shards]
        self.batch, self.seq = int(batch), int(seq)
        if not self.shards:
            raise DataError("no shards to read")
        if not any(s.size >= seq + 1 for s in self.shards):
            longest = max(s.size for s in self.shards)
            raise DataError(f"no shard holds seq+1 = {seq + 1} tokens (the longest has "
                            f"{longest}); use a shorter --seq or more data")
        if vocab_size is not None:
            for i, s in enumerate(self.shards):
                if s.size and (int(s.max()) >= vocab_size or int(s.min()) < 0):
                    raise DataError(f"shard {i} holds ids outside the vocabulary of "
                                    f"{vocab_size}")
        if isinstance(position, dict):
            position = Position.from_json(position)
        self._pos = position or Position()
        if not (0 <= self._pos.shard < len(self.shards)) or self._pos.offset < 0:
            raise DataError(f"data position {self._pos.to_json()} lies outside the "
                            f"{len(self.shards)} shard(s)")

    @property
    def position(self) -> dict:
        return self._pos.to_json()

    @property
    def epoch(self) -> int:
        return self._pos.epoch

    def tokens_per_epoch(self) -> int:
        """Predicted tokens in one pass (full windows only)."""
        return sum(max(s.size - 1, 0) // self.seq * self.seq for s in self.shards)

    def _next_row(self) -> np.ndarray:
        epoch, shard, offset = self._pos.epoch, self._pos.shard, self._pos.offset
        T = self.seq
        while offset + T + 1 > self.shards[shard].size:
            shard, offset = shard + 1, 0
            if shard == len(self.shards):
                shard, epoch = 0, epoch + 1
        row = self.shards[shard][offset: offset + T + 1]
        self._pos = Position(epoch, shard, offset + T)
        return row

    def next_batch(self) -> np.ndarray:
        out = np.empty((self.batch, self.seq + 1), np.uint32)
        for b in range(self.batch):
            out[b] = self._next_row()
        return out

    def next_accumulated(self, grad_accum: int) -> np.ndarray:
        """(grad_accum, B, T+1): the micro-batches of one optimizer step."""
        return np.stack([self.next_batch() for _ in range(grad_accum)])
