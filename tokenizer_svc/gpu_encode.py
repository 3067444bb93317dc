"""GPU encoding: documents (valid UTF-8 bytes) -> flat token ids + per-document offsets.

    enc = GpuEncoder(device, VocabTables.build(vocab), pattern="cl100k")
    ids, offsets = enc.encode_docs(data, starts)     # data: uint8, starts: n_docs + 1 offsets
    ids, offsets = enc.merge_pieces(data, piece_starts)   # pieces cut on the CPU

One call records, per batch of documents that fits the device's binding limit:

    upload text + document starts
    bpe_fill_none -> bpe_cuts -> bpe_pretok           (shaders/kernels/bpe/bpe_encode.wgsl)
    read the counters (long pieces queued, boundary overruns)
    bpe_merge_long                                     (only if long pieces were queued)
    scan of "a token starts here" -> bpe_compact       (bpe_scan.wgsl, bpe_compact.wgsl)
    read the document offsets, then the ids

On software Vulkan (a per-dispatch loop budget) bpe_pretok and bpe_merge_long resume in
rounds until done; each round must show progress (counters[4]) or the call raises
EncoderStalled naming the input size, so no input can loop forever. Documents larger than
one call are split at the tokenizer's split points (tokenizer_svc/cuts.py).

Threads: one call at a time per encoder (a lock; a call owns the buffer pool and counters).
`interruptible(check)` runs `check()` between the submits of the calling thread's calls.

`profile=True` keeps per-phase times in `last_profile` (GPU timestamps per dispatch plus
host-side upload and readback wall times) for bench/tokenize_bench.py.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from shaders.engine import Device
from .gpu_scan import BufferPool, GpuScan
from .gpu_tables import NONE, VocabTables
from .cuts import cut_rule, find_cut, split_cuts  # the one cut rule (cut_rule, find_cut
# re-exported for older imports)

ENCODE_FILE = "bpe_encode.wgsl"
COMPACT_FILE = "bpe_compact.wgsl"
PATTERN_IDS = {"gpt2": 0, "cl100k": 1, "o200k": 2}
WG = 64
SHORT_MAX = 64  # must equal SHORT_MAX in bpe_encode.wgsl
SCRATCH_WORDS_PER_BYTE = 5  # per byte of a long-piece window (bpe_encode.wgsl SCRATCH_PER_BYTE)
STATE_WORDS = 4  # per long-piece window, before its arrays (bpe_encode.wgsl)
JOB_WORDS = 8    # two vec4 per queued window in `longs` (bpe_encode.wgsl)
# Long pieces are merged in windows of LONG_WINDOW bytes (+ LONG_OVERLAP of the next) and
# stitched where two windows agree on a token (exact: bpe_encode.wgsl, "Long pieces"). A
# piece whose seams do not all stitch is merged again with windows LONG_RETRY_FACTOR times
# longer, then as one window. 5760 = 2^7 3^2 5: runs of one character in the real
# vocabularies repeat their tokens every 1 to 128 bytes, which divides it.
LONG_WINDOW = 5760
LONG_OVERLAP = 512
LONG_RETRY_FACTOR = 7
# Counted loop iterations per invocation and dispatch under llvmpipe's limit of 65,535 per
# SIMD vector. The kernels' count underestimates llvmpipe's by up to ~2.6x (measured: the
# heap merge fails at a budget of 25,000 on one lane, works at 20,000), and 8 lanes that
# diverge may add up; a lone lane (the _sg kernel) may not.
PRETOK_BUDGET_SOFTWARE = 4000
LONG_BUDGET_SOFTWARE = 6000
LONG_SEAM_FAILED = 4  # longs[2 i].w after bpe_long_stitch found no shared token
MAX_RESUME_DISPATCHES = 64  # budgeted dispatches per submit when resuming (software devices)


class BoundaryError(RuntimeError):
    """The GPU pre-tokenizer's segment proof failed (an internal error, never expected)."""


class EncoderStalled(RuntimeError):
    """A resumed GPU kernel made no progress (an internal error, never expected)."""


@dataclass
class Profile:
    upload_s: float = 0.0
    readback_s: float = 0.0
    host_s: float = 0.0
    gpu: dict = field(default_factory=dict)  # dispatch label -> seconds
    calls: int = 0
    long_windows: int = 0   # windows of long pieces merged (retries included)
    long_retried: int = 0   # long pieces merged again because a seam did not stitch

    def add_gpu(self, times) -> None:
        for label, seconds in times:
            self.gpu[label] = self.gpu.get(label, 0.0) + seconds


class GpuEncoder:
    def __init__(self, device: Device, tables: VocabTables, pattern: str | None,
                 chunk: int = 128, max_call_bytes: int | None = None,
                 long_window: int = LONG_WINDOW, long_overlap: int = LONG_OVERLAP):
        self.device = device
        self.tables = tables
        self.pattern = pattern
        self.chunk = chunk
        self.pool = BufferPool(device)
        self.scan = GpuScan(device, self.pool)
        if long_overlap < 1 or long_window <= long_overlap + tables.layout["max_tok_len"]:
            raise ValueError(f"long_window ({long_window}) must exceed long_overlap "
                             f"({long_overlap}) plus the longest token "
                             f"({tables.layout['max_tok_len']} bytes), and long_overlap be >= 1")
        self.long_window, self.long_overlap = long_window, long_overlap
        windows = {"LONG_WINDOW": long_window, "LONG_OVERLAP": long_overlap}
        constants = {"PATTERN": PATTERN_IDS[pattern]} if pattern in PATTERN_IDS else {}
        k = lambda name, c=None: device.kernel(ENCODE_FILE, name, c or {})  # noqa: E731
        self.k_fill = k("bpe_fill_none")
        self.k_cuts = k("bpe_cuts", constants) if constants else None
        self.k_pretok = k("bpe_pretok", dict(constants, **windows)) if constants else None
        self.k_pieces = k("bpe_merge_pieces", windows)
        self.k_long = k("bpe_merge_long")
        self.k_stitch = k("bpe_long_stitch")
        self.k_copy = k("bpe_long_copy")
        # llvmpipe ends every loop of an invocation after 65,535 iterations in total
        # (shaders/NOTES.md): there the kernels work in budgeted rounds; GPUs run unbounded.
        software = device.info.is_software
        self.budget = PRETOK_BUDGET_SOFTWARE if software else NONE
        self.k_long_sg = k("bpe_merge_long_sg") if software and device.has("subgroup") else None
        self.long_budget = LONG_BUDGET_SOFTWARE
        self.max_round_dispatches = MAX_RESUME_DISPATCHES
        self.k_compact = device.kernel(COMPACT_FILE, "bpe_compact")
        self.vocab_buf = device.upload(tables.vocab_words, label="bpe vocab")
        self.pairs_buf = device.upload(tables.pairs, label="bpe pairs")
        self.classes_buf = device.upload(tables.classes, label="unicode classes")
        binding = int(device.limits.get("max-storage-buffer-binding-size", 1 << 27))
        # tok_buf and the scan take 4 bytes per input byte; keep every binding under the limit
        self.max_call_bytes = max_call_bytes or (binding // 4 - 1024)
        self.scratch_limit_words = binding // 4 - 16
        self.profile = False
        self.last_profile = Profile()
        # One call at a time per encoder: a call owns the buffer pool and the counters. Run
        # several encoders (they may share `tables`) for work that must not wait on each other.
        self._lock = threading.Lock()
        self._interrupt = threading.local()  # per thread: a check run between resume rounds

    @contextlib.contextmanager
    def interruptible(self, check: Callable[[], None]):
        """Run `check()` between the submits of this thread's calls (between resume rounds of
        long pieces and between device calls); an exception it raises ends the call."""
        previous = getattr(self._interrupt, "check", None)
        self._interrupt.check = check
        try:
            yield self
        finally:
            self._interrupt.check = previous

    def _check_interrupt(self) -> None:
        check = getattr(self._interrupt, "check", None)
        if check is not None:
            check()

    # ---- public ---------------------------------------------------------------------------

    def encode_docs(self, data, starts) -> tuple[np.ndarray, np.ndarray]:
        """Pre-tokenize on the GPU with this encoder's pattern and BPE every piece."""
        if self.k_pretok is None:
            raise ValueError(f"pattern {self.pattern!r} has no GPU pre-tokenizer; cut pieces on "
                             "the CPU and call merge_pieces")
        return self._batched(data, starts, pieces=False)

    def merge_pieces(self, data, starts) -> tuple[np.ndarray, np.ndarray]:
        """BPE each piece [starts[i], starts[i+1]) on the GPU; offsets are per piece."""
        return self._batched(data, starts, pieces=True)

    # ---- batching -------------------------------------------------------------------------

    def _batched(self, data, starts, pieces: bool):
        with self._lock:
            return self._batched_locked(data, starts, pieces)

    def _batched_locked(self, data, starts, pieces: bool):
        data = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
        starts = np.asarray(starts, dtype=np.int64)
        n_docs = starts.size - 1
        if self.profile:
            self.last_profile = Profile()
        if n_docs <= 0:
            return np.zeros(0, np.uint32), np.zeros(max(n_docs + 1, 1), np.int64)
        sub_starts, owner_first = self._split_oversize(data, starts, pieces)
        id_parts, sub_offsets, base = [], [np.zeros(1, np.int64)], 0
        first = 0
        n_sub = sub_starts.size - 1
        while first < n_sub:
            # as many whole sub-documents as fit one call
            limit = sub_starts[first] + self.max_call_bytes
            last = int(np.searchsorted(sub_starts, limit, side="right")) - 1
            last = max(min(last, n_sub), first + 1)
            lo, hi = int(sub_starts[first]), int(sub_starts[last])
            self._check_interrupt()
            ids, offs = self._call(data[lo:hi], (sub_starts[first:last + 1] - lo), pieces)
            id_parts.append(ids)
            sub_offsets.append(offs[1:].astype(np.int64) + base)
            base += ids.size
            first = last
        ids = np.concatenate(id_parts) if len(id_parts) > 1 else id_parts[0]
        sub_offsets = np.concatenate(sub_offsets)
        return ids, sub_offsets[owner_first]

    def _split_oversize(self, data, starts, pieces: bool):
        """Sub-documents no larger than max_call_bytes; returns (sub starts, index of each
        document's first sub-document, plus the end)."""
        sizes = np.diff(starts)
        if sizes.max(initial=0) <= self.max_call_bytes:
            return starts, np.arange(starts.size)
        if pieces:
            raise ValueError(f"a piece of {int(sizes.max())} bytes exceeds the device's limit of "
                             f"{self.max_call_bytes} bytes per call")
        subs, owner_first = [], []
        for d in range(starts.size - 1):
            owner_first.append(len(subs))
            lo, hi = int(starts[d]), int(starts[d + 1])
            subs.append(lo)
            cuts = split_cuts(data[lo:hi].tobytes(), self.pattern) + lo if \
                hi - lo > self.max_call_bytes else None
            while hi - lo > self.max_call_bytes:
                k = int(np.searchsorted(cuts, lo + self.max_call_bytes, side="right")) - 1
                cut = int(cuts[k]) if k >= 0 and cuts[k] > lo else None
                if cut is None:
                    raise ValueError(
                        f"document {d} has no provable piece boundary in {self.max_call_bytes} "
                        f"bytes from byte {lo - int(starts[d])} (e.g. one run of whitespace or "
                        "digits that long); split it before encoding")
                subs.append(cut)
                lo = cut
        owner_first.append(len(subs))
        subs.append(int(starts[-1]))
        return np.array(subs, dtype=np.int64), np.array(owner_first, dtype=np.int64)

    # ---- one device call ------------------------------------------------------------------

    def _call(self, data: np.ndarray, starts: np.ndarray, pieces: bool):
        dev, pool, prof = self.device, self.pool, self.last_profile
        n = int(data.size)
        n_docs = int(starts.size - 1)
        if n == 0:
            return np.zeros(0, np.uint32), np.zeros(n_docs + 1, np.int64)
        t0 = time.perf_counter()
        words = np.zeros(-(-n // 4) * 4, dtype=np.uint8)
        words[:n] = data
        text = pool.get("text", words.nbytes)
        text.write(words)
        starts_buf = pool.get("starts", 4 * (n_docs + 1))
        starts_buf.write(starts.astype(np.uint32))
        n_chunks = -(-n // self.chunk)
        cuts = pool.get("cuts", 16 * n_chunks)
        tok_buf = pool.get("tok_buf", 4 * n)
        longs = pool.get("longs", 4 * JOB_WORDS * (n // (SHORT_MAX + 1) + 1))
        counters = pool.get("counters", 32)
        counters.write(np.zeros(8, np.uint32))
        scratch = pool.get("scratch_dummy", 16)
        lay = self.tables.layout
        prof.upload_s += time.perf_counter() - t0

        def binds(scratch_buf, budget):
            params = dev.params("IIIIIIIIIIII", n, n_docs, n_chunks, self.chunk,
                                lay["info_off"], lay["bytes_off"], lay["piece_off"],
                                lay["piece_mask"], lay["pair_mask"], lay["max_tok_len"],
                                int(self.tables.whole_piece), budget)
            return [text, starts_buf, self.classes_buf, self.vocab_buf, self.pairs_buf, cuts,
                    tok_buf, longs, scratch_buf, counters, params]

        with dev.record("bpe encode", timing=self.profile) as rec:
            rec.dispatch(self.k_fill, binds(scratch, self.budget), -(-n // WG), "fill")
            if pieces:
                rec.dispatch(self.k_pieces, binds(scratch, self.budget), -(-n_docs // WG),
                             "merge_pieces")
            else:
                rec.dispatch(self.k_cuts, binds(scratch, self.budget), -(-n_chunks // WG), "cuts")
                rec.dispatch(self.k_pretok, binds(scratch, self.budget), -(-n_chunks // WG),
                             "pretok_merge")
        prof.add_gpu(rec.gpu_times)
        n_long, long_words, overruns, unfinished = self._counters(counters)[:4]
        if unfinished:  # only with a finite budget (llvmpipe): resume the segments
            self._resume(lambda rec: rec.dispatch(self.k_pretok, binds(scratch, self.budget),
                                                  -(-n_chunks // WG), "pretok_merge"),
                         counters, "bpe pretok resume", n)
            n_long, long_words, overruns = self._counters(counters)[:3]
        if overruns:
            raise BoundaryError(f"{overruns} GPU pre-tokenizer segment(s) overran their end: "
                                "a piece boundary proof failed (internal error; please report "
                                "the input)")
        if n_long:
            prof.long_windows += n_long
            self._merge_long(binds, longs, counters, n_long, long_words, n)

        excl = pool.get("excl", 4 * (n + 1))
        ids_buf = pool.get("ids", 4 * n)
        doc_off = pool.get("doc_off", 4 * (n_docs + 1))
        cparams = dev.params("IIII", n, n_docs, 0, 0)
        with dev.record("bpe compact", timing=self.profile) as rec:
            self.scan.record(rec, tok_buf, n, excl, mode=1)
            rec.dispatch(self.k_compact, [tok_buf, excl, starts_buf, ids_buf, doc_off, cparams],
                         -(-max(n, n_docs + 1) // 256), "compact")
        prof.add_gpu(rec.gpu_times)
        t0 = time.perf_counter()
        offsets = dev.download(doc_off.view(0, 4 * (n_docs + 1)), np.uint32).astype(np.int64)
        total = int(offsets[-1])
        ids = dev.download(ids_buf.view(0, 4 * total), np.uint32) if total else \
            np.zeros(0, np.uint32)
        prof.readback_s += time.perf_counter() - t0
        prof.calls += 1
        return ids, offsets

    def _counters(self, counters) -> tuple[int, ...]:
        """(long-piece windows, scratch words, boundary overruns, unfinished, progress,
        failed seams)."""
        t0 = time.perf_counter()
        values = self.device.download(counters.view(0, 24), np.uint32)
        self.last_profile.readback_s += time.perf_counter() - t0
        return tuple(int(v) for v in values)

    def _resume(self, record_one, counters, label: str, n_bytes: int) -> None:
        """Dispatch a resumable kernel until nothing is unfinished.

        Every dispatch that leaves work unfinished has made progress (counters[4] > 0; each
        kernel does one piece or one merge step before its budget may stop it), so this ends;
        a round without progress is an internal error instead of a silent endless loop.
        Rounds grow to max_round_dispatches dispatches per submit (llvmpipe's budget applies
        per dispatch; the round trips are what costs); the interrupt check runs between rounds.
        """
        dev, per_round = self.device, 1
        while True:
            self._check_interrupt()
            counters.write(np.zeros(2, np.uint32), offset_bytes=12)
            with dev.record(label, timing=self.profile) as rec:
                for _ in range(per_round):
                    record_one(rec)
            self.last_profile.add_gpu(rec.gpu_times)
            unfinished, progress = self._counters(counters)[3:5]
            if not unfinished:
                return
            if not progress:
                raise EncoderStalled(
                    f"the GPU encoder made no progress on a call of {n_bytes:,} input bytes "
                    f"({unfinished} unfinished after {label}); internal error, please report "
                    "the input")
            per_round = min(2 * per_round, self.max_round_dispatches)

    def _merge_long(self, binds, longs, counters, n_jobs: int, words: int,
                    n_bytes: int) -> None:
        """Merge the queued windows of long pieces, stitch them into tok_buf, and merge the
        pieces whose seams did not stitch again with longer windows, at last as one window."""
        if words <= self.scratch_limit_words:   # the common case: the queue as bpe_pretok left it
            scratch = self.pool.get("scratch", 4 * words)
            if not self._run_windows(binds, scratch, counters, n_jobs, n_bytes):
                return
            failed = self._failed_pieces(longs, n_jobs)
        else:
            queue = self.device.download(longs.view(0, 4 * JOB_WORDS * n_jobs), np.uint32)
            failed = self._run_queue(binds, longs, counters, queue.reshape(-1, JOB_WORDS), n_bytes)
        window = self.long_window
        while failed:
            window = window * LONG_RETRY_FACTOR if window else None
            if window and window > max(pl for _, pl in failed):
                window = None   # one window per piece: the plain heap merge, it cannot fail
            jobs = self._windows(failed, window)
            self.last_profile.long_retried += len(failed)
            self.last_profile.long_windows += jobs.shape[0]
            failed = self._run_queue(binds, longs, counters, jobs, n_bytes)

    def _windows(self, pieces, window: int | None) -> np.ndarray:
        """Queue entries (bases unset) for `pieces` [(start, length)] in windows of `window`
        bytes (None: one window each), as bpe_encode.wgsl's encode_piece lays them out."""
        rows, ov = [], self.long_overlap
        for ps, pl in pieces:
            m = 1 if window is None or pl <= window + ov else -(-(pl - ov) // window)
            for k in range(m):
                length = window + ov if k + 1 < m else pl - k * (window or 0)
                rows.append((ps + k * (window or 0), length, 0, 0, ps, pl, k, m))
        return np.array(rows, dtype=np.uint32).reshape(-1, JOB_WORDS)

    def _failed_pieces(self, longs, n_jobs: int) -> list[tuple[int, int]]:
        queue = self.device.download(longs.view(0, 4 * JOB_WORDS * n_jobs), np.uint32)
        queue = queue.reshape(-1, JOB_WORDS)
        bad = queue[queue[:, 3] == LONG_SEAM_FAILED]
        return sorted({(int(ps), int(pl)) for ps, pl in bad[:, 4:6]})

    def _run_queue(self, binds, longs, counters, jobs: np.ndarray, n_bytes: int):
        """Run `jobs` in groups that fit the scratch binding (a piece's windows stay in one
        group); returns the pieces with a failed seam."""
        need = STATE_WORDS + SCRATCH_WORDS_PER_BYTE * jobs[:, 1].astype(np.int64)
        if int(need.max()) > self.scratch_limit_words:
            raise ValueError(f"a single pre-tokenized piece of {int(jobs[:, 5].max())} bytes "
                             "exceeds the device's long-piece work space "
                             f"({self.scratch_limit_words // SCRATCH_WORDS_PER_BYTE} bytes)")
        scratch = self.pool.get("scratch", 4 * min(int(need.sum()), self.scratch_limit_words))
        firsts = np.flatnonzero(jobs[:, 6] == 0)
        piece_need = np.add.reduceat(need, firsts)
        failed, i = [], 0
        while i < firsts.size:
            # as many whole pieces as fit (at least one)
            fit = np.searchsorted(np.cumsum(piece_need[i:]), self.scratch_limit_words,
                                  side="right")
            j = i + max(int(fit), 1)
            lo = int(firsts[i])
            hi = int(firsts[j]) if j < firsts.size else jobs.shape[0]
            if int(need[lo:hi].sum()) > self.scratch_limit_words:
                raise ValueError(f"a single pre-tokenized piece of {int(jobs[lo, 5])} bytes "
                                 "exceeds the device's long-piece work space "
                                 f"({self.scratch_limit_words // SCRATCH_WORDS_PER_BYTE} bytes)")
            batch = jobs[lo:hi].copy()
            batch[:, 2] = np.concatenate([[0], np.cumsum(need[lo:hi - 1])])
            batch[:, 3] = 0  # LONG_NEW
            longs.write(batch)
            counters.write(np.array([hi - lo], np.uint32))
            if self._run_windows(binds, scratch, counters, hi - lo, n_bytes):
                failed += self._failed_pieces(longs, hi - lo)
            i = j
        return failed

    def _run_windows(self, binds, scratch, counters, n_jobs: int, n_bytes: int) -> int:
        """Heap-merge the queued windows (resumed until done when the budget is finite),
        then stitch and copy them into tok_buf; returns the number of failed seams."""
        kernel, budget = self.k_long, self.budget
        if self.k_long_sg is not None:
            kernel, budget = self.k_long_sg, self.long_budget
        self._resume(lambda rec: rec.dispatch(kernel, binds(scratch, budget), -(-n_jobs // WG),
                                              "merge_long"),
                     counters, "bpe long", n_bytes)
        counters.write(np.zeros(1, np.uint32), offset_bytes=20)
        with self.device.record("bpe long stitch", timing=self.profile) as rec:
            rec.dispatch(self.k_stitch, binds(scratch, self.budget), -(-n_jobs // WG), "stitch")
            rec.dispatch(self.k_copy, binds(scratch, self.budget), n_jobs, "long_copy")
        self.last_profile.add_gpu(rec.gpu_times)
        return self._counters(counters)[5]


__all__ = ["BoundaryError", "EncoderStalled", "GpuEncoder", "NONE", "Profile", "cut_rule",
           "find_cut"]
