"""The corpus's unique pieces on the device, from chunk to chunk (piece_store.wgsl).

    store = PieceStore(device)
    store.add(text, found, n_found, n_bytes)   # after each chunk's piece_count.wgsl pass
    store.pieces()                             # {piece bytes: count}, one download at the end

Each chunk's unique pieces (gpu_corpus.GpuPieceCounter) go into one device table instead of
coming back to the host chunk by chunk: the host loop that added every chunk's list to a
Python Counter was half of the counting phase (100 MB on the H200: 0.43 s of 0.84 s).

Memory: per unique piece one record (8 bytes), its 64-bit count (8 bytes), its bytes rounded
up to words and 2-4 table slots (4 bytes each, the table at most half full): 24-32 bytes plus
the piece, up to twice that right after a buffer doubled. The buffers grow before a call could overflow them (doubling, contents copied;
the table rehashed on the device), and a store that would outgrow one binding of the device
is refused with an error naming the numbers before anything is allocated.
"""

from __future__ import annotations

import numpy as np

from .corpus import CorpusError

FILE = "piece_store.wgsl"
WG = 64
INFO_WORDS = 4  # records used, arena words used, records before this call, unused


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


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
            raise CorpusError(
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

    def pieces(self) -> dict:
        """{piece bytes: count} of everything added (one download)."""
        if not self.used:
            return {}
        records = self.dev.download(self.records.view(0, 8 * self.used), np.uint32).reshape(-1, 2)
        counts = self.dev.download(self.counts.view(0, 8 * self.used), np.uint32).reshape(-1, 2)
        total = counts[:, 0].astype(np.uint64) | (counts[:, 1].astype(np.uint64) << np.uint64(32))
        data = self.dev.download(self.arena.view(0, 4 * max(1, self.arena_used)),
                                 np.uint32).tobytes()
        out = {}
        for (w, n), c in zip(records.tolist(), total.tolist()):
            if n:  # 0: a hole
                out[data[4 * w:4 * w + n]] = c
        return out

    def release(self) -> None:
        for buf in (self.records, self.counts, self.arena, self.slots, self.info, self.dummy):
            if buf is not None:
                buf.destroy()
        self.records = self.counts = self.arena = self.slots = None
