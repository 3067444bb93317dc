"""Training batches from token shards, in a deterministic order that resumes exactly.

    stream = TokenStream([ids0, ids1, ...], batch=8, seq=1024, shuffle=True, seed=7)
    batch = stream.next_batch()          # (8, 1025) uint32: row b holds T+1 consecutive tokens
    pos = stream.position                # {"epoch": 0, "window": 8, "seed": 7}: JSON
    TokenStream(shards, 8, 1024, position=pos, shuffle=True)   # the very next batch

Rows are windows of T+1 tokens: in each shard the windows start at 0, T, 2T, ... (the last
token of a window is the first of the next), so each token is predicted exactly once per
epoch. A window never spans two shards: a shard's tail shorter than T+1 tokens is skipped.

Order. Without `shuffle` the windows are read front to back through shard 0, then shard 1, ...
and the position is (epoch, shard, offset), the place where the next row starts. With
`shuffle` every epoch reads all windows once in its own order: a permutation drawn from
PCG64(SeedSequence([seed, epoch])), so the order is a pure function of the seed, the epoch and
the shards; the position is (epoch, window index in that order, seed), and a stream built
from it continues with exactly the rows it would have given (its seed wins over the
argument: a resumed run keeps its order). Neighbouring windows of one file no longer fill
one batch, so the loss curve shows learning instead of which file is being read.

Held-out data: `split_documents` cuts the shards at end-of-text ids into documents and holds
out a seeded fraction of them, so no held-out document is ever trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class DataError(ValueError):
    """Shards that cannot produce batches of the requested shape."""


@dataclass(frozen=True)
class Position:
    epoch: int = 0
    shard: int = 0      # in order: the shard and offset where the next row starts
    offset: int = 0
    window: int = 0     # shuffled: index of the next row in this epoch's order
    seed: int | None = None   # shuffled positions only

    @property
    def shuffled(self) -> bool:
        return self.seed is not None

    def to_json(self) -> dict:
        if self.shuffled:
            return {"epoch": self.epoch, "window": self.window, "seed": self.seed}
        return {"epoch": self.epoch, "shard": self.shard, "offset": self.offset}

    @classmethod
    def from_json(cls, data: dict) -> "Position":
        try:
            if "window" in data:
                return cls(epoch=int(data["epoch"]), window=int(data["window"]),
                           seed=int(data["seed"]))
            return cls(int(data["epoch"]), int(data["shard"]), int(data["offset"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"bad data position {data!r}: needs integer epoch, shard, offset "
                            "(in order) or epoch, window, seed (shuffled)") from exc


def epoch_order(seed: int, epoch: int, windows: int) -> np.ndarray:
    """The shuffled order of an epoch's windows (see the module docstring)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(epoch)])))
    return rng.permutation(windows)


class TokenStream:
    def __init__(self, shards, batch: int, seq: int, position: dict | Position | None = None,
                 vocab_size: int | None = None, *, shuffle: bool = False, seed: int = 0):
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
        # windows per shard, and the first global window index of each shard
        self._counts = np.array([max(s.size - 1, 0) // seq for s in self.shards], np.int64)
        self._first = np.concatenate([[0], np.cumsum(self._counts)])
        self.windows = int(self._first[-1])
        if isinstance(position, dict):
            position = Position.from_json(position)
        if position is None:
            position = Position(seed=int(seed)) if shuffle else Position()
        if position.shuffled != bool(shuffle):
            raise DataError(f"data position {position.to_json()} is for a "
                            f"{'shuffled' if position.shuffled else 'in-order'} stream, this "
                            f"one reads {'shuffled' if shuffle else 'in order'}; resume with "
                            "the same shuffle setting")
        if position.shuffled:
            if not (0 <= position.window <= self.windows):
                raise DataError(f"data position {position.to_json()} lies outside the "
                                f"{self.windows} windows of the shards")
        elif not (0 <= position.shard < len(self.shards)) or position.offset < 0:
            raise DataError(f"data position {position.to_json()} lies outside the "
                            f"{len(self.shards)} shard(s)")
        self._pos = position
        self._order = None      # (epoch, permutation) cached for the current epoch

    @property
    def position(self) -> dict:
        return self._pos.to_json()

    @property
    def epoch(self) -> int:
        return self._pos.epoch

    def tokens_per_epoch(self) -> int:
        """Predicted tokens in one pass (full windows only)."""
        return self.windows * self.seq

    def _window(self, g: int) -> np.ndarray:
        shard = int(np.searchsorted(self._first, g, side="right") - 1)
        offset = (g - int(self._first[shard])) * self.seq
        return self.shards[shard][offset: offset + self.seq + 1]

    def _next_shuffled(self) -> np.ndarray:
        epoch, window = self._pos.epoch, self._pos.window
        if window >= self.windows:
            epoch, window = epoch + 1, 0
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(self._pos.seed, epoch, self.windows))
        row = self._window(int(self._order[1][window]))
        self._pos = Position(epoch=epoch, window=window + 1, seed=self._pos.seed)
        return row

    def _next_in_order(self) -> np.ndarray:
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
        take = self._next_shuffled if self._pos.shuffled else self._next_in_order
        for b in range(self.batch):
            out[b] = take()
        return out

    def next_accumulated(self, grad_accum: int) -> np.ndarray:
        """(grad_accum, B, T+1): the micro-batches of one optimizer step."""
        return np.stack([self.next_batch() for _ in range(grad_accum)])


def split_documents(shards, eot: int | None, fraction: float, seed: int, seq: int
                    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(train shards, held-out shards): about `fraction` of the documents, chosen with
    PCG64(seed), held out whole. Documents end where an `eot` id follows (each document is
    stored after its end-of-text id); with no eot id every shard is one document. At least
    one document is held out, and enough for one window of seq+1 tokens; the rest must hold
    one window too (else a DataError saying what to change)."""
    if not 0 < fraction < 1:
        raise DataError(f"eval fraction must lie in (0, 1), got {fraction}")
    docs = []
    for s in shards:
        s = np.asarray(s).reshape(-1)
        cuts = np.flatnonzero(s == eot) if eot is not None else np.array([], np.int64)
        bounds = [0] + [int(c) for c in cuts if c > 0] + [s.size]
        docs += [s[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    if len(docs) < 2:
        raise DataError(f"the dataset holds {len(docs)} document(s): too few to hold out a "
                        "fraction of them; add documents or give a separate eval dataset")
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), 0x5EED])))
    held = rng.random(len(docs)) < fraction
    held_tokens = sum(d.size for d, h in zip(docs, held) if h)
    for i in rng.permutation(len(docs)):    # topped up in a seeded order when too few
        if held.any() and held_tokens >= seq + 1:
            break
        if not held[i]:
            held[i] = True
            held_tokens += docs[i].size
    train = [d for d, h in zip(docs, held) if not h]
    evals = [d for d, h in zip(docs, held) if h]
    if not train or sum(d.size for d in train) < seq + 1 or held.all():
        raise DataError(f"holding out {fraction:g} of {len(docs)} documents leaves too "
                        f"little to train on at seq {seq}; lower the eval fraction or add data")
    # one shard each: windows may then cross document boundaries, as in any packed shard
    return [np.concatenate(train)], [np.concatenate(evals)]
