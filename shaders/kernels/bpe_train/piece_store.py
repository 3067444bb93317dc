"""The corpus's unique pieces on the device, from chunk to chunk (piece_store.wgsl).

    store = PieceStore(device)
    store.add(text, found, n_found, n_bytes)   # after each chunk's piece_count.wgsl pass
    pieces = CorpusPieces(store.download(), host_counted)   # one download, at the end

Each chunk's unique pieces (piece_count.GpuPieceCounter) go into one device table instead of
coming back to the host chunk by chunk: the host loop that added every chunk's list to a
Python Counter was half of the counting phase (dev/vocab_train_speed/README.md). At the
end the store comes back as three arrays (records, counts, bytes: a few MB, no per-piece
host work), and the GPU trainer builds its input from them with numpy gathers
(CorpusPieces.trainer_arrays): no Python dict of the pieces is made unless one is read.

Memory: per unique piece one record (8 bytes), its 64-bit count (8 bytes), its bytes rounded
up to words and 2-4 table slots (4 bytes each, the table at most half full): 24-32 bytes plus
the piece, up to twice that right after a buffer doubled. The buffers grow before a call
could overflow them (doubling, contents copied; the table rehashed on the device), and a
store that would outgrow one binding of the device is refused with an error naming the
numbers before anything is allocated.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

LONG_MIN = 512  # longer pieces are counted on the host; must equal LONG_MIN in piece_count.wgsl

FILE = "piece_store.wgsl"
WG = 64
INFO_WORDS = 4  # records used, arena words used, records before this call, unused


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


class CapacityError(ValueError):
    """The corpus's unique pieces need a larger buffer than the device allows."""


class PieceStore:
    def __init__(self, device, first_records: int = 1 << 16, buffer_limit: int | None = None):
        self.dev = device
        self.k_begin = device.kernel(FILE, "store_begin")
        self.k_store = device.kernel(FILE, "store_pieces")
        self.k_rehash = device.kernel(FILE, "store_rehash")
        self.limit = int(min(device.limits.get("max-storage-buffer-binding-size", 128 << 20),
                             device.limits.get("max-buffer-size", 256 << 20),
                             buffer_limit or 1 << 62))  # tests scale it down
        self.used = 0  # records (an upper bound between calls: holes count)
        self.arena_used = 0  # words
        self.n_records = 0
        self.n_words = 0
        self.n_slots = 0
        self.records = self.counts = self.arena = self.slots = None
        self.info = device.zeros(INFO_WORDS, np.uint32, "piece store info")
        self.dummy = device.zeros(4, np.uint32, "piece store unused")
        self.growths = 0
        self._reserve(first_records, first_records * 4)

    # ---- capacity ---------------------------------------------------------------------------

    def _check(self, what: str, nbytes: int, records: int) -> None:
        if nbytes > self.limit:
            raise CapacityError(
                f"the corpus has more unique pieces than this device can count ({records:,} "
                f"needed: its {what} would take {nbytes / 2**20:,.1f} MiB in one buffer, the "
                f"device allows {self.limit / 2**20:,.1f} MiB); use --pretokenizer cpu, a "
                "GPU with larger buffers, or less varied text")

    def _grown(self, old, new_bytes: int, used_bytes: int, label: str):
        buf = self.dev.zeros(new_bytes // 4, np.uint32, label)
        if old is not None:
            if used_bytes:
                with self.dev.record("piece store grow") as rec:
                    rec.copy(old, buf, used_bytes)
            old.destroy()
        return buf

    def _reserve(self, records: int, words: int) -> None:
        """Room for `records` records and `words` arena words in all."""
        if records > self.n_records:
            n = max(records, 2 * self.n_records)
            self._check("record table", 8 * n, records)
            self._check("table of slots", 4 * _next_pow2(2 * n), records)
            self.records = self._grown(self.records, 8 * n, 8 * self.used, "piece store records")
            self.counts = self._grown(self.counts, 8 * n, 8 * self.used, "piece store counts")
            self.n_records = n
            self.growths += 1
        if words > self.n_words:
            n = max(words, 2 * self.n_words)
            self._check("bytes", 4 * n, records)
            self.arena = self._grown(self.arena, 4 * n, 4 * self.arena_used, "piece store bytes")
            self.n_words = n
        slots = _next_pow2(2 * records)  # at most half full
        if slots > self.n_slots:
            self.n_slots = max(slots, 2 * self.n_slots)
            if self.slots is not None:
                self.slots.destroy()
            self.slots = self.dev.zeros(self.n_slots, np.uint32, "piece store slots")
            if self.used:
                self.dev.run(self.k_rehash, self._binds(self.dummy, self.dummy, self.used),
                             -(-self.used // WG))

    def _binds(self, text, found, n: int) -> list:
        return [text, found, self.slots, self.records, self.counts, self.arena, self.info,
                self.dev.params("IIII", n, self.n_slots - 1, 0, 0)]

    # ---- use --------------------------------------------------------------------------------

    def add(self, text, found, n_found: int, n_bytes: int) -> None:
        """Add `n_found` distinct pieces of a chunk (found: start, length, count per piece,
        into `text`, `n_bytes` bytes long) to the store."""
        if not n_found:
            return
        # the pieces of one chunk hold at most n_bytes bytes: n_bytes / 4 + n_found words
        self._reserve(self.used + n_found, self.arena_used + n_bytes // 4 + n_found)
        with self.dev.record("piece store") as rec:
            rec.dispatch(self.k_begin, [self.info], 1)
            rec.dispatch(self.k_store, self._binds(text, found, n_found), -(-n_found // WG))
        info = self.dev.download(self.info, np.uint32)
        self.used, self.arena_used = int(info[0]), int(info[1])

    def download(self) -> "StoredPieces":
        """Everything added, as three arrays (one download each, no per-piece host work)."""
        if not self.used:
            return StoredPieces(np.zeros(0, np.int64), np.zeros(0, np.int64),
                                np.zeros(0, np.uint64), np.zeros(0, np.uint8))
        records = self.dev.download(self.records.view(0, 8 * self.used), np.uint32).reshape(-1, 2)
        counts = self.dev.download(self.counts.view(0, 8 * self.used), np.uint32).reshape(-1, 2)
        total = counts[:, 0].astype(np.uint64) | (counts[:, 1].astype(np.uint64) << np.uint64(32))
        data = self.dev.download(self.arena.view(0, 4 * max(1, self.arena_used)), np.uint32)
        real = records[:, 1] > 0  # 0: a hole
        return StoredPieces(4 * records[real, 0].astype(np.int64),
                            records[real, 1].astype(np.int64), total[real],
                            data.view(np.uint8))

    def pieces(self) -> dict:
        """{piece bytes: count} of everything added."""
        return self.download().as_dict()

    def release(self) -> None:
        for buf in (self.records, self.counts, self.arena, self.slots, self.info, self.dummy):
            if buf is not None:
                buf.destroy()
        self.records = self.counts = self.arena = self.slots = None


class StoredPieces:
    """The store's pieces on the host as arrays: piece i is data[starts[i]:starts[i] + lens[i]]
    (distinct pieces), occurring counts[i] times."""

    def __init__(self, starts, lens, counts, data):
        self.starts, self.lens, self.counts, self.data = starts, lens, counts, data

    def __len__(self) -> int:
        return int(self.lens.size)

    def as_dict(self) -> dict:
        raw = self.data.tobytes()
        return {raw[s:s + n]: c for s, n, c in
                zip(self.starts.tolist(), self.lens.tolist(), self.counts.tolist())}

    def flat(self, min_len: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bytes of the pieces of at least min_len bytes back to back, their lengths, their
        counts), by numpy gathers: the GPU trainer's input without a dict."""
        keep = self.lens >= min_len
        starts, lens = self.starts[keep], self.lens[keep]
        total = int(lens.sum())
        if not total:
            return np.zeros(0, np.uint8), lens, self.counts[keep]
        # index of every byte: its piece's start, plus its place within the piece
        first = np.concatenate([[0], np.cumsum(lens)[:-1]])
        index = np.repeat(starts - first, lens) + np.arange(total)
        return self.data[index], lens, self.counts[keep]


class CorpusPieces(Mapping):
    """{piece bytes: count} of a GPU-counted corpus: the store's pieces plus those counted on
    the host (long pieces, CPU-path files). A read-only mapping equal to corpus.py's dict;
    built into a dict only when read as one. The GPU trainer takes its arrays directly
    (`trainer_arrays`), so training never builds the dict."""

    def __init__(self, stored: StoredPieces, extras: dict):
        self.stored = stored
        self.extras = extras
        # long pieces (the only ones counted on the host unless a file took the CPU path)
        # never are in the store, which holds pieces of at most LONG_MIN bytes
        self._disjoint = all(len(k) > LONG_MIN for k in extras)
        self._dict: dict | None = None

    def _all(self) -> dict:
        if self._dict is None:
            d = self.stored.as_dict()
            for k, v in self.extras.items():
                d[k] = d.get(k, 0) + v
            self._dict = d
        return self._dict

    def __getitem__(self, key):
        return self._all()[key]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        if self._dict is None and self._disjoint:
            return len(self.stored) + len(self.extras)
        return len(self._all())

    def occurrences(self) -> int:
        return int(self.stored.counts.sum(dtype=np.uint64)) + sum(self.extras.values())

    def has_pair(self) -> bool:
        """Whether some piece has two or more bytes (something to merge)."""
        return bool((self.stored.lens >= 2).any()) or any(len(k) >= 2 for k in self.extras)

    def trainer_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bytes back to back, lengths, counts) of the pieces of two or more bytes. A piece
        both stored and counted on the host comes twice, with its two counts: BPE training
        treats two copies of a piece exactly as one with the summed count."""
        flat, lens, counts = self.stored.flat(2)
        more = [k for k in self.extras if len(k) >= 2]
        if not more:
            return flat, lens, counts
        return (np.concatenate([flat, np.frombuffer(b"".join(more), np.uint8)]),
                np.concatenate([lens, np.fromiter(map(len, more), np.int64, len(more))]),
                np.concatenate([counts, np.fromiter(map(self.extras.__getitem__, more),
                                                    np.uint64, len(more))]))
