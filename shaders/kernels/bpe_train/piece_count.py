"""One chunk of text -> its unique pieces and their counts, on the device (piece_count.wgsl).

    counter = GpuPieceCounter(device, "o200k")
    counter.count(data, starts, host_counter)          # documents [starts[d], starts[d+1])
    pieces = CorpusPieces(counter.store.download(), dict(host_counter))   # at the end

The encoder's own pre-tokenizer (bpe_encode.wgsl: bpe_cuts, then bpe_pretok with
MARK_PIECES = 1) writes at every piece start the piece's length; count_pieces counts the
pieces in a hash table with atomics, exact (keys compared byte by byte), and list_pieces lists
each unique piece once. The chunk's unique pieces go into the device store (piece_store.py),
which lives for the whole corpus; pieces longer than LONG_MIN bytes come back to the host
counter (rare: long runs of one kind). The documents must be valid UTF-8 and must not cut a
piece in two: finding such cuts in files is the caller's (tokenizer_svc/training/gpu_corpus.py).
"""

from __future__ import annotations

import functools
import time
from collections import Counter

import numpy as np

from ..bpe.encode import ENCODE_FILE
from ..bpe.patterns import PATTERN_IDS
from ..bpe.scan import BufferPool
from .piece_store import LONG_MIN, PieceStore

COUNT_FILE = "piece_count.wgsl"
CUT_CHUNK = 128  # bytes per bpe_cuts chunk (<= 255, see bpe_encode.wgsl)
WG = 64
NONE = 0xFFFFFFFF
PRETOK_BUDGET_SOFTWARE = 4000  # as the encoder's (bpe/encode.py): llvmpipe's loop limit


@functools.lru_cache(maxsize=1)
def _class_table() -> np.ndarray:
    """The Unicode class table as bpe_encode.wgsl reads it (stage 1, then stage 2); ~0.2 s."""
    from ..bpe.unicode_table import load_table
    stage1, stage2 = load_table().two_level()
    return np.concatenate([stage1, stage2]).astype(np.uint32)


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n - 1).bit_length())


class GpuPieceCounter:
    """The device side: one chunk of text (documents) -> Counter of its pieces."""

    def __init__(self, device, pattern: str, max_chunk: int | None = None,
                 first_slots: int | None = None, first_store_records: int | None = None,
                 buffer_limit: int | None = None):
        self.dev = device
        self.pattern = pattern
        pid = {"PATTERN": PATTERN_IDS[pattern]}
        self.k_fill = device.kernel(ENCODE_FILE, "bpe_fill_none")
        self.k_cuts = device.kernel(ENCODE_FILE, "bpe_cuts", pid)
        self.k_pretok = device.kernel(ENCODE_FILE, "bpe_pretok", dict(pid, MARK_PIECES=1))
        # runs of digits cut at their groups (cl100k, o200k), as the encoder does
        self.k_digit_cuts = device.kernel(ENCODE_FILE, "bpe_digit_cuts", pid) \
            if pid.get("PATTERN", 0) else None
        self.k_count = device.kernel(COUNT_FILE, "count_pieces")
        self.k_list = device.kernel(COUNT_FILE, "list_pieces")
        self.classes = device.upload(_class_table(), "unicode classes")
        # the encoder's vocabulary, pair table, long-piece queue and scratch: unused here
        self.unused = [device.zeros(4, np.uint32, f"unused {i}") for i in range(4)]
        self.budget = PRETOK_BUDGET_SOFTWARE if device.info.is_software else NONE
        binding = int(min(device.limits.get("max-storage-buffer-binding-size", 128 << 20),
                          device.limits.get("max-buffer-size", 256 << 20)))
        # the largest binding: 12 bytes per table slot, up to one slot per text byte (the
        # table is the power of two above half the text), 16 once the pool rounds it up
        self.max_chunk = max(1 << 16, binding // 16 - 4096)
        if max_chunk is not None:  # smaller device calls (tests)
            self.max_chunk = min(self.max_chunk, int(max_chunk))
        self.first_slots = first_slots  # the hash table's first size (tests: force regrowth)
        self.table_growths = 0
        self.pool = BufferPool(device)  # reused from chunk to chunk
        self.seconds = {"device_calls": 0.0, "host_counting": 0.0}
        self.calls = 0
        self.store = PieceStore(device, first_store_records or 1 << 16, buffer_limit)

    def count(self, data: bytes, starts: np.ndarray, counter: Counter,
              limit: int | None = None, to_store: bool = True) -> None:
        """Add the pieces of `data` (documents [starts[d], starts[d+1])) that start before
        `limit` (default: all) to the device store (`to_store`, the pieces longer than
        LONG_MIN to `counter`), or all of them to `counter`."""
        dev = self.dev
        n = len(data)
        limit = n if limit is None else int(limit)
        if n == 0 or limit == 0:
            return
        t_start = time.perf_counter()
        pool = self.pool
        # uploaded straight from `data` (a padded copy of 32 MB cost more than the upload):
        # the whole words, then the last partial word padded with zeros
        text = pool.get("corpus text", -(-n // 4) * 4)
        head = n - n % 4
        if head:
            text.write(np.frombuffer(data, np.uint8, count=head))
        if n % 4:
            text.write(np.frombuffer(bytes(data[head:]) + bytes(4 - n % 4), np.uint8),
                       offset_bytes=head)
        n_docs = int(starts.size - 1)
        starts_buf = pool.get("corpus documents", 4 * (n_docs + 1))
        starts_buf.write(starts.astype(np.uint32))
        n_chunks = -(-n // CUT_CHUNK)
        cuts = pool.get("corpus cuts", 16 * n_chunks)
        lens = pool.get("corpus piece lengths", 4 * n)  # bpe_fill_none sets every used word
        counters = pool.get("corpus counters", 32)
        self.dev.zero(counters)
        params = dev.params("IIIIIIIIIIIII", n, n_docs, n_chunks, CUT_CHUNK, 0, 0, 0, 0, 0, 0,
                            0, self.budget, 0)   # lane_shift 0: one chunk per invocation
        u = self.unused
        encode_binds = [text, starts_buf, self.classes, u[0], u[1], cuts, lens, u[2], u[3],
                        counters, params]
        with dev.record("corpus pre-tokenize") as rec:
            rec.dispatch(self.k_fill, encode_binds, -(-n // WG))
            rec.dispatch(self.k_cuts, encode_binds, -(-n_chunks // WG))
            if self.k_digit_cuts is not None:
                rec.dispatch(self.k_digit_cuts, encode_binds, -(-n_chunks // WG))
            rec.dispatch(self.k_pretok, encode_binds, -(-n_chunks // WG))
        while True:
            c = dev.download(counters.view(0, 16), np.uint32)
            if c[2]:
                raise RuntimeError(f"{int(c[2])} GPU pre-tokenizer segment(s) overran their end "
                                   "(internal error; please report the input)")
            if not c[3]:
                break
            counters.write(np.zeros(1, np.uint32), offset_bytes=12)  # resume (software only)
            dev.run(self.k_pretok, encode_binds, -(-n_chunks // WG))

        n_slots = _next_pow2(self.first_slots or n // 2 + 1024)
        longs = pool.get("corpus long pieces", 8 * (n // (LONG_MIN + 1) + 1))
        info = pool.get("corpus count info", 16)
        while True:
            slots = pool.get("corpus piece slots", 4 * n_slots)
            counts = pool.get("corpus piece counts", 4 * n_slots)
            out = pool.get("corpus unique pieces", 12 * n_slots)
            for buf in (slots.view(0, 4 * n_slots), counts.view(0, 4 * n_slots), info):
                dev.zero(buf)
            cparams = dev.params("IIII", limit, n_slots - 1, n_slots, 0)
            binds = [text, lens, slots, counts, out, longs, info, cparams]
            with dev.record("corpus count") as rec:
                rec.dispatch(self.k_count, binds, -(-limit // WG))
                rec.dispatch(self.k_list, binds, -(-n_slots // WG))
            found = dev.download(info, np.uint32)
            if not found[1]:
                break
            n_slots *= 2  # not with one slot per two bytes (<= 1 piece per byte, most longer)
            self.table_growths += 1
        t_host = time.perf_counter()
        self.seconds["device_calls"] += t_host - t_start
        self.calls += 1
        unique, n_long = int(found[0]), int(found[2])
        if to_store:
            self.store.add(text, out, unique, n)
        elif unique:
            table = dev.download(out.view(0, 12 * unique), np.uint32).reshape(-1, 3)
            for s, k, c in table.tolist():
                counter[data[s:s + k]] += c
        if n_long:
            for s, k in dev.download(longs.view(0, 8 * n_long), np.uint32).reshape(-1, 2).tolist():
                counter[data[s:s + k]] += 1
        self.seconds["host_counting"] += time.perf_counter() - t_host
