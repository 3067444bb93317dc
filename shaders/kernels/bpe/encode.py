"""GPU encoding: documents (valid UTF-8 bytes) -> flat token ids + per-document offsets.

    enc = GpuEncoder(device, VocabTables.build(vocab), pattern="cl100k")
    ids, offsets = enc.encode_docs(data, starts)     # data: uint8, starts: n_docs + 1 offsets
    ids, offsets = enc.encode_docs(data, starts, out=buf)  # ids written into buf (a view back)
    ids, offsets = enc.merge_pieces(data, piece_starts)   # pieces cut on the CPU
    enc.encode_docs(data, starts, check_utf8=True)   # InvalidUtf8 unless all valid UTF-8

`data`: bytes, a uint8 array, or a PackedText (documents joined range by range as the
pipeline uploads them, so the joins overlap with GPU work). Every document must be valid
UTF-8; `check_utf8=True` checks that on the GPU (bpe_utf8_check, in each chunk's submit, its
answer in the counters the chunk reads back anyway) and raises InvalidUtf8 when one is not,
after the call has ended (so the caller can take a path for raw bytes).

`out=` (for callers that keep one array, e.g. the service): a 1-D uint32 numpy array of at
least len(data) elements (no byte starts two tokens); the returned ids are its first
elements, so the ids are copied once, from the mapped readback buffer into it. Without it the
encoder allocates such an array per call (np.empty: pages past the ids are never touched).

A call is a pipeline of chunks of whole documents (~PIPELINE_BYTES each; a document larger
than one device call is first split at the tokenizer's split points, cuts.py).
Each chunk is ONE submit on the fast path (shaders/kernels/bpe/):

    write text + document starts                       (host; overlaps the previous chunk)
    bpe_fill_none (-> bpe_utf8_check) -> bpe_cuts (-> bpe_digit_cuts) -> bpe_pretok
                                                       (bpe_encode.wgsl)
    scan of "a token starts here" -> bpe_compact       (bpe_scan.wgsl, bpe_compact.wgsl;
        one bpe_scan_compact dispatch for chunks of at most SMALL_COMPACT_BYTES)
    copy counters, document offsets and a guess of the ids (bpe_compact lays them out in one
    buffer as the host reads them) into a mapped staging buffer: one copy

then one map of that staging buffer; the next chunk is submitted before this chunk's ids are
copied out, so the host's copy runs while the GPU works. The number of Python operations is
constant per chunk (none per document), and a chunk creates no device objects once the
pools have grown: its parameters are written into uniform slots (scan.UniformSlots), so
every kernel's bind group is made once. On GPUs the chunk's submit also merges its long
pieces (bpe_merge_long_wg's short build, then its full build, -> bpe_merge_long ->
bpe_long_stitch -> bpe_long_copy, grids sized by the chunk). The
slow path, taken per chunk when the counters say so: long pieces were queued on a software
device (loop budgets) or a seam failed to stitch (merged again, then compact again), a
budgeted segment is unfinished (software Vulkan), or the ids guess was short.

Long pieces (over SHORT_MAX bytes) are merged in windows of LONG_WINDOW bytes in parallel and
stitched where two neighbouring windows hold the same token; the proof that this is exactly
tiktoken's result is in bpe_encode.wgsl ("Long pieces"). A piece whose seams do not all
stitch is merged again with longer windows, at last as one window (the plain heap merge).

On software Vulkan (a per-dispatch loop budget) bpe_pretok and bpe_merge_long resume in
rounds until done; each round must show progress (counters[4]) or the call raises
EncoderStalled naming the input size, so no input can loop forever.

Threads: one call at a time per encoder (a lock; a call owns the buffer pool and counters),
and inside it the device's lock (scan.device_lock). `begin_docs` splits a call in two
(submit, then finish): the encoder stays held between the halves; `twin()` gives a second
encoder for a call begun while the first is held (two calls in flight, GPU work back to back).
`interruptible(check)` runs `check()` between the submits of the calling thread's calls.

`profile=True` keeps per-phase times in `last_profile` (GPU timestamps per dispatch, host
upload and readback wall times, long-piece windows and retries) for bench/tokenize_bench.py;
timed recordings wait for each submit, so a profiled call does not overlap chunks.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from wgpu import BufferUsage

from ...engine import Buffer, Device
from .scan import (COPY_THREADS, BufferPool, GpuScan, ParallelCopy, UniformSlots,
                       device_lock, map_staging, write_through_mapping)
from .tables import NONE, VocabTables
from .packed_text import LazyPackedText, PackedRange, PackedText, byte_range
from .cuts import split_cuts, valid_utf8_prefix
from .patterns import PATTERN_IDS

ENCODE_FILE = "bpe_encode.wgsl"
COMPACT_FILE = "bpe_compact.wgsl"
COUNTER_WORDS = 8   # the counters (bpe_encode.wgsl), first in bpe_compact's `out` and staging
UTF8_WORD = 6       # counters[6]: ~(first invalid UTF-8 byte) or 0 (bpe_encode.wgsl UTF8_INVALID)
UTF8_BYTES = 16     # bytes per bpe_utf8_check invocation (bpe_encode.wgsl UTF8_BYTES)
SMALL_COMPACT_BYTES = 4095   # bpe_compact.wgsl SMALL_BYTES: one-workgroup scan + compact
DIGIT_GROUP_PATTERNS = ("cl100k", "o200k")   # \p{N}{1,3}: bpe_digit_cuts cuts their runs
WG = 64
SHORT_MAX = 64  # must equal SHORT_MAX in bpe_encode.wgsl
SCRATCH_WORDS_PER_BYTE = 5  # per byte of a long-piece window (bpe_encode.wgsl SCRATCH_PER_BYTE)
STATE_WORDS = 4  # per long-piece window, before its arrays (bpe_encode.wgsl)
JOB_WORDS = 8    # two vec4 per queued window in `longs` (bpe_encode.wgsl)
# Long pieces are merged in windows of LONG_WINDOW bytes (+ LONG_OVERLAP of the next) and
# stitched where two windows agree on a token (exact: bpe_encode.wgsl, "Long pieces"). A
# piece whose seams do not all stitch is merged again with windows LONG_RETRY_FACTOR times
# longer, then as one window. A window is heap-merged by one invocation, so shorter windows
# are faster (chosen by measurement: dev/tokenizer_throughput/README.md, "Encoder defaults").
# 384 = 2^7 3: runs of one character in the real vocabularies repeat their tokens every 1 to
# 128 bytes (spaces: 128; 3-byte characters: multiples of 3), which divides it
# (tests/test_tokenizer_long_windows.py checks every ASCII and sample run). The overlap holds
# the 128-byte space period with room. A window must exceed overlap + the longest token:
# vocabularies with tokens of 192 bytes or more get longer windows (long_windows_for).
LONG_WINDOW = 384
LONG_OVERLAP = 192
LONG_RETRY_FACTOR = 7
# Windows of at most WG_LONG_MAX bytes (the shipped 384 + 192 included) are merged by one
# workgroup each in workgroup memory (bpe_merge_long_wg, LW_MAX), the rest (the retries'
# longer windows) by the one-invocation heap merge. Software Vulkan keeps the heap merge by
# default: the workgroup merge spends more CPU in all, which other requests pay for
# (tests/test_service_isolation.py); tests force it. Evidence for both:
# dev/tokenizer_throughput/README.md, "Encoder defaults".
WG_LONG_MAX = 768
WG_LONG_MAX_PRIORITY = (1 << 22) - 1   # the kernel's keys are priority << 10 | position
WG_LONG_GROUPS = 8192   # at most; workgroup-stride beyond
# Windows of at most WG_SHORT_LONG_MAX bytes (most of them: a 129-256 byte piece of CJK or
# Thai without spaces is one window) go first to the same kernel built with workgroups of
# WG_SHORT_LONG_WG invocations and arrays of WG_SHORT_LONG_MAX words: a merge is a chain of
# barriers and lookups, so a window's time is latency, and a third of the workgroup memory
# lets more windows run at once per SM (sizes chosen by measurement:
# dev/tokenizer_throughput/README.md, "Encoder defaults"). 0: off.
WG_SHORT_LONG_MAX = 256
WG_SHORT_LONG_WG = 32
WG_SHORT_LONG_GROUPS = 16384
# Counted loop iterations per invocation and dispatch under llvmpipe's limit of 65,535 per
# SIMD vector. The kernels' count underestimates llvmpipe's by up to ~2.6x (measured: the
# heap merge fails at a budget of 25,000 on one lane, works at 20,000), and 8 lanes that
# diverge may add up; a lone lane (the _sg kernel) may not.
PRETOK_BUDGET_SOFTWARE = 4000
LONG_BUDGET_SOFTWARE = 6000
LONG_SEAM_FAILED = 4  # longs[2 i].w after bpe_long_stitch found no shared token
MAX_RESUME_DISPATCHES = 64
# Long pieces merged inside a chunk's one submit (GPUs) get a work space of w words per input
# byte, w the least integer >= 5 (1 + overlap / window) + 0.07 (5 words per window byte, so
# 5 (1 + overlap / window) per piece byte, plus 4 per window of a piece > SHORT_MAX bytes,
# < 4 / 65): no queue can outgrow it (8 for the shipped windows), and the windows' kernels
# run grid-stride.
INLINE_LONG_WORKGROUPS = 1024   # at most; fewer for a small chunk (its windows' bound)
# Below this a chunk records no long-piece dispatches and a long piece in it takes the slow
# path (more round trips): a lone small request waits for every dispatch of its submit, and
# the four long-piece dispatches cost it more than the rare slow path (chosen by measurement:
# dev/tokenizer_throughput/README.md, "Encoder defaults"). 0: every chunk merges them in its
# submit.
INLINE_MIN_BYTES = 4096
# Bytes per pre-tokenizer invocation on a GPU, per call (calls up to TINY_CALL_BYTES take
# TINY_CHUNK, below): the smallest power of two from SMALL_CHUNK up to `chunk` (128) that
# needs at most FILL_INVOCATIONS invocations for one pipeline chunk of the call, except that
# a whole pipeline chunk (16 MB) takes 32. Each invocation walks its chunk sequentially with
# divergent control flow, so shorter chunks are faster (chosen by measurement:
# dev/tokenizer_throughput/README.md, "Encoder defaults"). The chunk is a kernel parameter,
# so no second set of pipelines. Software Vulkan keeps `chunk` (shorter chunks ran slower there).
SMALL_CHUNK = 16
FILL_INVOCATIONS = 1 << 19
# A chunk's pre-tokenizer walk (bpe_cuts, bpe_pretok) is divergent, serial work: the lanes of
# one subgroup that walk different text take turns. A call of few chunks leaves the GPU mostly
# idle, so its chunks are spread: chunk c runs on invocation c << s, the largest
# s <= MAX_LANE_SHIFT with n_chunks << s <= SPREAD_INVOCATIONS; calls of at most
# TINY_CALL_BYTES also take TINY_CHUNK-byte chunks (chosen by measurement:
# dev/tokenizer_throughput/README.md, "Encoder defaults"; from 1 MB up the GPU is full and
# no spreading pays). spread_invocations 0 turns spreading off (software Vulkan never
# spreads: its lanes are a CPU's SIMD lanes, and budgets count per dispatch).
TINY_CHUNK = 8
TINY_CALL_BYTES = 256 << 10
MAX_LANE_SHIFT = 3
SPREAD_INVOCATIONS = 1 << 15
# A chunk of at most EXACT_GUESS_BYTES copies room for one id per input byte (the most it can
# have) with its offsets: no guess to miss. Larger chunks guess 1.25 x the previous chunk's
# ids per byte; a lone 1 KB code document missed that guess in 45 of 256 calls (gpt2,
# bench/service.py's texts), each miss one more copy and map round trip (the slow path).
EXACT_GUESS_BYTES = 64 << 10
# A chunk's ids leave its mapped staging buffer in COPY_THREADS slices at once when there are
# at least PARALLEL_COPY_IDS of them (numpy releases the GIL while it copies; the pages of a
# fresh ids array are faulted in by whichever thread writes them first). Evidence:
# dev/tokenizer_throughput/README.md, "Encoder defaults".
PARALLEL_COPY_IDS = 1 << 20
# Bytes per pipelined device call: big enough that a call's fixed costs (3 submits' worth of
# dispatches, one map) are small, small enough that two chunks overlap in a 64 MB batch.
PIPELINE_BYTES = 16 << 20  # budgeted dispatches per submit when resuming (software devices)
# The first chunks of a call ramp up to PIPELINE_BYTES: 1/4, 1/2, then whole, so the GPU
# does not idle while the first whole chunk uploads (dev/tokenizer_throughput/README.md).
PIPELINE_RAMP = 2
# A chunk of at least MAPPED_TEXT_BYTES writes its text into its slot's persistent mappable
# buffer on copy_threads threads, copied to the text binding at the start of its submit;
# smaller chunks use queue.write_buffer (one thread; a map for writing costs a round trip,
# more than a small copy).
MAPPED_TEXT_BYTES = 4 << 20
# A text of at most this many bytes whose length is not a multiple of 4 is padded in a host
# copy and written at once, not as its whole words plus a tail: each queue.write_buffer is
# one more copy in the GPU's queue before the chunk's dispatches, and the copy here costs
# less up to this size (dev/tokenizer_throughput/README.md, "Encoder defaults").
ONE_WRITE_TEXT_BYTES = 256 << 10


class BoundaryError(RuntimeError):
    """The GPU pre-tokenizer's segment proof failed (an internal error, never expected)."""


class EncoderStalled(RuntimeError):
    """A resumed GPU kernel made no progress (an internal error, never expected)."""


class InvalidUtf8(ValueError):
    """A call with check_utf8=True found a document that is not valid UTF-8. `position`: the
    byte of `data` where the first such document (in data's order) stops being valid (as
    Python's `UnicodeDecodeError.start`, counted from the start of data). Raised after the
    call has ended: the encoder is free again and nothing was written to `out` past the
    chunks before it."""

    def __init__(self, position: int):
        super().__init__(f"invalid UTF-8 at byte {position:,} of the call's data: encode_docs "
                         "takes valid UTF-8 only (raw bytes: Encoding.encode_bytes)")
        self.position = position


@dataclass
class Profile:
    upload_s: float = 0.0
    readback_s: float = 0.0
    host_s: float = 0.0
    gpu: dict = field(default_factory=dict)  # dispatch label -> seconds
    calls: int = 0
    long_windows: int = 0   # windows of long pieces merged (retries included)
    long_retried: int = 0   # long pieces merged again because a seam did not stitch
    long_widened: int = 0   # of those, pieces the phase-aligned windows did not stitch either
    slow_paths: int = 0     # chunks finished on the slow path (more submits and round trips)

    def add_gpu(self, times) -> None:
        for label, seconds in times:
            self.gpu[label] = self.gpu.get(label, 0.0) + seconds


def long_windows_for(max_tok_len: int) -> tuple[int, int]:
    """(window, overlap) for a vocabulary whose longest token has max_tok_len bytes: the
    shipped LONG_WINDOW / LONG_OVERLAP when the window exceeds overlap + the longest token
    (every published vocabulary: 128 bytes), else the overlap grown to the longest token
    + 64 (a multiple of 64) and the window doubled until it exceeds both (doubling keeps
    its factors 2 and 3)."""
    window, overlap = LONG_WINDOW, LONG_OVERLAP
    if window > overlap + max_tok_len:
        return window, overlap
    overlap = max(overlap, -(-(max_tok_len + 64) // 64) * 64)
    while window <= overlap + max_tok_len:
        window *= 2
    return window, overlap


class GpuEncoder:
    def __init__(self, device: Device, tables: VocabTables, pattern: str | None,
                 chunk: int = 128, max_call_bytes: int | None = None,
                 long_window: int | None = None, long_overlap: int | None = None):
        self.device = device
        self.tables = tables
        self.pattern = pattern
        self.chunk = chunk
        self.small_chunk = min(chunk, SMALL_CHUNK)   # chunk_for's first above tiny calls
        self.fill_invocations = FILL_INVOCATIONS     # 0: `chunk` for every call
        self.pool = BufferPool(device)
        self.scan = GpuScan(device, self.pool)
        self.uniforms = UniformSlots(device)   # per-call parameters: bind groups made once
        default_window, default_overlap = long_windows_for(tables.layout["max_tok_len"])
        long_window = default_window if long_window is None else long_window
        long_overlap = default_overlap if long_overlap is None else long_overlap
        if long_overlap < 1 or long_window <= long_overlap + tables.layout["max_tok_len"]:
            raise ValueError(f"long_window ({long_window}) must exceed long_overlap "
                             f"({long_overlap}) plus the longest token "
                             f"({tables.layout['max_tok_len']} bytes), and long_overlap be >= 1")
        self.long_window, self.long_overlap = long_window, long_overlap
        words = 100 * SCRATCH_WORDS_PER_BYTE * (long_window + long_overlap) + 7 * long_window
        self.inline_words_per_byte = -(-words // (100 * long_window))   # see INLINE_LONG_*
        windows = {"LONG_WINDOW": long_window, "LONG_OVERLAP": long_overlap}
        constants = {"PATTERN": PATTERN_IDS[pattern]} if pattern in PATTERN_IDS else {}
        k = lambda name, c=None: device.kernel(ENCODE_FILE, name, c or {})  # noqa: E731
        self.k_fill = k("bpe_fill_none")
        self.k_utf8 = k("bpe_utf8_check")
        self.k_cuts = k("bpe_cuts", constants) if constants else None
        # cuts inside runs of digits (cl100k, o200k: \p{N}{1,3} pieces; gpt2 takes a run whole)
        self.k_digit_cuts = k("bpe_digit_cuts", constants) if pattern in DIGIT_GROUP_PATTERNS \
            else None
        self.k_pretok = k("bpe_pretok", dict(constants, **windows)) if constants else None
        self.k_pieces = k("bpe_merge_pieces", windows)
        self.k_long = k("bpe_merge_long")
        self.k_stitch = k("bpe_long_stitch")
        self.k_copy = k("bpe_long_copy")
        # llvmpipe ends every loop of an invocation after 65,535 iterations in total
        # (shaders/NOTES.md): there the kernels work in budgeted rounds; GPUs run unbounded.
        software = device.info.is_software
        self.budget = PRETOK_BUDGET_SOFTWARE if software else NONE
        self.spread_invocations = 0 if software else SPREAD_INVOCATIONS   # 0: never spread
        self.tiny_call_bytes = TINY_CALL_BYTES   # calls up to this take TINY_CHUNK (GPUs)
        self.k_long_sg = k("bpe_merge_long_sg") if software and device.has("subgroup") else None
        self.k_long_wg = None
        if device.has("subgroup") and tables.layout.get("max_priority", NONE) <= \
                WG_LONG_MAX_PRIORITY and long_window + long_overlap <= WG_LONG_MAX:
            self.k_long_wg = k("bpe_merge_long_wg")
        self.k_long_wg_short = None
        if self.k_long_wg is not None and WG_SHORT_LONG_MAX:
            self.k_long_wg_short = k("bpe_merge_long_wg", {"LW_MAX": WG_SHORT_LONG_MAX,
                                                           "LW_WG": WG_SHORT_LONG_WG})
        self.long_wg = not software   # whether windows go to bpe_merge_long_wg first
        self.long_wg_short = True     # whether short windows go to its short build before
        self.long_budget = LONG_BUDGET_SOFTWARE
        self.max_round_dispatches = MAX_RESUME_DISPATCHES
        self.k_compact = device.kernel(COMPACT_FILE, "bpe_compact")
        self.k_scan_compact = device.kernel(COMPACT_FILE, "bpe_scan_compact")
        self.vocab_buf = device.upload(tables.vocab_words, label="bpe vocab")
        self.pairs_buf = device.upload(tables.pairs, label="bpe pairs")
        self.classes_buf = device.upload(tables.classes, label="unicode classes")
        binding = int(device.limits.get("max-storage-buffer-binding-size", 1 << 27))
        # tok_buf and the scan take 4 bytes per input byte; keep every binding under the limit
        self.max_call_bytes = max_call_bytes or (binding // 4 - 1024)
        self.scratch_limit_words = binding // 4 - 16
        self.pipeline_bytes = PIPELINE_BYTES
        self.inline_long = True   # False: long pieces always on the slow path (tests compare)
        self.inline_min_bytes = INLINE_MIN_BYTES
        self.ids_per_byte = 0.3   # the ids staging guess; updated from every chunk
        # and from every call's first chunk: a batch's documents are often ordered alike
        # from call to call, and a first chunk guessed from the previous call's last one
        # missed (the tokenize bench's corpus: 0.73 ids per byte first, 0.41 last: one slow
        # path, a second map, per call)
        self.first_ids_per_byte = 0.0
        self.exact_guess_bytes = EXACT_GUESS_BYTES   # chunks up to this size: no guess
        self.call_chunk = chunk
        self._staging: dict[int, Buffer] = {}
        self._text_up: dict[int, Buffer] = {}   # per slot: MAP_WRITE | COPY_SRC
        self.mapped_text_bytes = MAPPED_TEXT_BYTES
        self.copy_threads = COPY_THREADS   # 1: copy the ids out on the calling thread only
        self.parallel_copy_ids = PARALLEL_COPY_IDS
        self._copier = ParallelCopy("istanbul-ids-copy")
        self.profile = False
        self.last_profile = Profile()
        # One call at a time per encoder: a call owns the buffer pool and the counters. Run
        # several encoders (they may share `tables`) for work that must not wait on each other.
        self._lock = threading.Lock()
        self.holder: int | None = None   # the thread whose call holds the lock
        # then the device's lock (one thread feeds its queue at a time), always after ours: a
        # begun call holds this encoder between its halves and the device only within them
        self.device_lock = device_lock(device)
        self._interrupt = threading.local()  # per thread: a check run between resume rounds

    def staging(self, slot: int, nbytes: int) -> Buffer:
        """The slot's mappable readback buffer, grown by powers of two and otherwise reused."""
        buf = self._staging.get(slot)
        if buf is None or buf.nbytes < nbytes:
            if buf is not None:
                buf.destroy()
            size = 1 << max(int(nbytes) - 1, 15).bit_length()
            buf = self._staging[slot] = self.device.buffer(
                size, np.uint32, label=f"bpe staging {slot}",
                usage=BufferUsage.MAP_READ | BufferUsage.COPY_DST)
        return buf

    def write_text(self, slot: int, text: Buffer, data) -> Buffer | None:
        """Put `data` (a uint8 array, or a PackedRange: written into the mapping 256 KB of
        documents at a time, never joined whole) into `text` (rounded up to whole words, the
        tail zero): through
        the slot's mappable buffer on copy_threads threads for chunks of at least
        mapped_text_bytes (returns that buffer: the caller's submit copies it into `text`,
        and the slot's previous chunk has finished with it), else queue.write_buffer (None)."""
        n = int(data.size)
        aligned, words = n & ~3, -(-n // 4) * 4
        if n < self.mapped_text_bytes:
            if isinstance(data, PackedRange):
                data = data.array()   # a small range: joined, then written (fewer calls)
            if n > aligned and n <= ONE_WRITE_TEXT_BYTES:   # padded on the host: one write
                padded = np.zeros(words, np.uint8)
                padded[:n] = data
                self.device.queue.write_buffer(text.raw, 0, padded)
                return None
            if aligned:
                self.device.queue.write_buffer(text.raw, 0, data[:aligned])
            if n > aligned:
                tail = np.zeros(4, np.uint8)
                tail[:n - aligned] = data[aligned:]
                self.device.queue.write_buffer(text.raw, aligned, tail)
            return None
        up = self._text_up.get(slot)
        if up is None or up.nbytes < words:
            if up is not None:
                up.destroy()
            up = self._text_up[slot] = self.device.buffer(
                1 << (words - 1).bit_length(), np.uint8, label=f"bpe text upload {slot}",
                usage=BufferUsage.MAP_WRITE | BufferUsage.COPY_SRC)
        write_through_mapping(up, data, words, lambda dst, src: self._copier(
            dst, src, self.copy_threads, self.parallel_copy_ids))
        return up

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

    def encode_docs(self, data, starts, out: np.ndarray | None = None,
                    check_utf8: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Pre-tokenize on the GPU with this encoder's pattern and BPE every piece.

        `out`: a 1-D uint32 array of at least len(data) elements (no input byte starts two
        tokens) that receives the ids; the ids returned are then its first elements (a view).
        `check_utf8`: check on the GPU that every document is valid UTF-8 (what Python's
        strict decoder accepts, each document on its own) and raise InvalidUtf8 if one is
        not; without it the caller guarantees it.
        """
        if self.k_pretok is None:
            raise ValueError(f"pattern {self.pattern!r} has no GPU pre-tokenizer; cut pieces on "
                             "the CPU and call merge_pieces")
        return self._batched(data, starts, pieces=False, out=out, check_utf8=check_utf8)

    def merge_pieces(self, data, starts, out: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
        """BPE each piece [starts[i], starts[i+1]) on the GPU; offsets are per piece."""
        return self._batched(data, starts, pieces=True, out=out)

    # ---- batching -------------------------------------------------------------------------

    def _batched(self, data, starts, pieces: bool, out=None, check_utf8: bool = False):
        with self._lock, self.device_lock:
            self.holder = threading.get_ident()
            try:
                return self._batched_locked(data, starts, pieces, out, check_utf8)
            finally:
                self.holder = None

    def busy(self) -> bool:
        """Whether a call holds this encoder now (e.g. a begun one not yet finished); its
        thread is `holder` (a thread's own begun call must not be waited for by it)."""
        return self._lock.locked()

    def _batched_locked(self, data, starts, pieces: bool, out=None, check_utf8: bool = False):
        call = self._prepare(data, starts, pieces, out, check_utf8)
        return call if isinstance(call, tuple) else call.run()

    def _prepare(self, data, starts, pieces: bool, out=None, check_utf8: bool = False):
        """A call's inputs checked and cut into chunks (a _Plan), or its result at once when it
        has no document. A document over max_call_bytes is cut at split points inside its
        valid UTF-8 prefix (cuts.split_cuts), which are character boundaries: each part of a
        valid document is valid, and a part of an invalid one is not (valid parts join into
        valid UTF-8), so the check of check_utf8 holds for the parts. A LazyPackedText is
        cut as the pipeline reaches it (its texts encoded chunk by chunk) when `_cuts_lazily`
        allows, else all its starts are learnt here."""
        lazy = isinstance(data, LazyPackedText) and \
            self._cuts_lazily(data, pieces, out, check_utf8)
        if isinstance(data, LazyPackedText) and not lazy:
            data.complete()
            starts = data.starts
        if not isinstance(data, (np.ndarray, PackedText)):
            data = np.frombuffer(data, dtype=np.uint8)
        starts = np.asarray(starts, dtype=np.int64)
        n_docs = starts.size - 1
        if self.profile:
            self.last_profile = Profile()
        if out is not None and (out.dtype != np.uint32 or out.ndim != 1
                                or out.size < int(data.size)):
            raise ValueError(f"out must be a 1-D uint32 array of at least {int(data.size):,} "
                             f"elements (one per input byte), got {out.dtype} {out.shape}")
        if n_docs <= 0:
            return (out[:0] if out is not None else np.zeros(0, np.uint32)), \
                np.zeros(max(n_docs + 1, 1), np.int64)
        limit = min(self.pipeline_bytes, self.max_call_bytes)
        if lazy:   # documents fit a call (_cuts_lazily): no sub-documents
            sub_starts, owner_first = data.starts, np.arange(n_docs + 1)
            bounds = _Bounds(limit, sub_starts, data.reach)
            bounds.has(0)   # the first chunk's texts: their bytes per character size the rest
            call_bytes = min(data.estimated_size(), self.pipeline_bytes)
        else:
            sub_starts, owner_first = self._split_oversize(data, starts, pieces, check_utf8)
            bounds = _Bounds(limit, sub_starts)
            call_bytes = min(int(sub_starts[-1]), self.pipeline_bytes)
        return _Plan(self, data, sub_starts, owner_first, bounds, pieces,
                     out if out is not None else np.empty(int(data.size), np.uint32),
                     check_utf8, self.chunk_for(call_bytes))

    def _cuts_lazily(self, data: LazyPackedText, pieces: bool, out, check_utf8: bool) -> bool:
        """Whether a call of `data` may learn its starts chunk by chunk: ordinary documents
        into an array of its own, possibly more than one chunk's worth, none possibly over
        max_call_bytes. Its pre-tokenizer chunk (chunk_for) then comes from its size as
        estimated once the first chunk's texts are encoded (any chunk gives the same ids)."""
        first_step = min(self.pipeline_bytes, self.max_call_bytes) >> PIPELINE_RAMP
        return (not pieces and out is None and not check_utf8
                and data.size > first_step
                and data.largest_bound() <= self.max_call_bytes)

    # ---- a call in two halves -------------------------------------------------------------

    def begin_docs(self, data, starts, check_utf8: bool = False) -> "BegunCall":
        """`encode_docs` in two halves: this uploads and submits the call and returns at
        once; its `finish()` waits for the GPU and returns (ids, offsets). Between the two the
        caller can do other work, e.g. begin a call on another encoder (`twin()`), which the
        GPU runs right after this one: the shared GPU process overlaps a round's GPU time with
        answering the round before and receiving the next. The encoder is held (its lock)
        until finish() (or cancel()) ends the call: another thread's call waits for it, and
        the thread that began it must not call this encoder before. A call of more than one
        chunk (over a quarter of pipeline_bytes, or documents over max_call_bytes) runs
        whole here; its finish() only returns the result. `check_utf8` as in encode_docs:
        InvalidUtf8 comes from finish() (or from here, for a call run whole here), the
        encoder given back either way."""
        if self.k_pretok is None:
            raise ValueError(f"pattern {self.pattern!r} has no GPU pre-tokenizer; cut pieces on "
                             "the CPU and call merge_pieces")
        self._lock.acquire()
        self.holder = threading.get_ident()
        try:
            with self.device_lock:
                return self._begin_locked(data, starts, check_utf8)
        except BaseException:
            self.holder = None
            self._lock.release()
            raise

    def _begin_locked(self, data, starts, check_utf8: bool = False) -> "BegunCall":
        plan = self._prepare(data, starts, False, check_utf8=check_utf8)
        if isinstance(plan, tuple):   # no document
            return BegunCall(self, result=plan)
        if plan.bounds.has(1):        # several chunks: the whole call now
            return BegunCall(self, result=plan.run())
        self.call_chunk = plan.call_chunk
        self._check_interrupt()
        chunk = self._upload(plan.data, plan.sub_starts, plan.bounds, 0, False, check_utf8)
        try:
            chunk.dispatch()
        except BaseException:
            chunk.release()
            raise
        return BegunCall(self, chunk=chunk, plan=plan)

    def twin(self) -> "GpuEncoder":
        """An encoder of the same device, tables, kernels and settings with buffers, staging
        and a lock of its own: its calls never wait for this one's (see begin_docs)."""
        twin = copy.copy(self)
        twin.pool = BufferPool(self.device)
        twin.scan = GpuScan(self.device, twin.pool)
        twin.uniforms = UniformSlots(self.device)
        twin._staging, twin._text_up = {}, {}
        twin._copier = ParallelCopy("istanbul-ids-copy")
        twin.last_profile = Profile()
        twin._lock = threading.Lock()
        twin.holder = None
        twin._interrupt = threading.local()
        return twin

    def chunk_for(self, nbytes: int) -> int:
        """Bytes per pre-tokenizer invocation for a call of `nbytes` (see FILL_INVOCATIONS)."""
        if self.budget != NONE:   # software Vulkan
            return self.chunk
        if self.fill_invocations and nbytes <= self.tiny_call_bytes:
            return min(TINY_CHUNK, self.chunk)
        c = self.small_chunk
        while c < self.chunk and nbytes > c * self.fill_invocations:
            c *= 2
        return min(c, self.chunk) if self.fill_invocations else self.chunk

    def lane_shift_for(self, n_chunks: int) -> int:
        """log2 of the invocations per pre-tokenizer chunk (see SPREAD_INVOCATIONS)."""
        shift = 0
        while shift < MAX_LANE_SHIFT and n_chunks << (shift + 1) <= self.spread_invocations:
            shift += 1
        return shift

    def _pipeline(self, plan: "_Plan") -> int:
        """Encode the plan's chunks [bounds[k], bounds[k+1]) of sub-documents, overlapping the
        host's work with the GPU's: chunk k+1 is cut and its text written while chunk k runs,
        and chunk k+1 is submitted before chunk k's ids are copied out of their mapped staging
        buffer (the host-written buffers and the staging buffers alternate between two
        slots; the rest is only written by the GPU, in queue order). Returns the number of
        ids written to plan.ids; fills plan.sub_offsets[1:]. With check_utf8 each chunk
        checks its text (InvalidUtf8 from the first chunk that finds invalid text, before the
        next one is submitted)."""
        data, sub_starts, bounds = plan.data, plan.sub_starts, plan.bounds
        ids, sub_offsets = plan.ids, plan.sub_offsets

        def upload(k):
            return self._upload(data, sub_starts, bounds, k, plan.pieces, plan.check_utf8) \
                if bounds.has(k) else None

        base, k = 0, 0
        self.call_chunk = plan.call_chunk
        self._check_interrupt()
        chunk = upload(0)
        following = after = None
        try:
            chunk.dispatch()
            following = upload(1)   # while chunk 0 runs
            while chunk is not None:
                chunk.wait()
                if following is not None:
                    self._check_interrupt()
                    following.dispatch()
                # chunk k's ids leave on the copy threads (numpy, without the GIL) while this
                # thread uploads chunk k+2 (its slot's staging buffer, still mapped for chunk
                # k, is only taken at its dispatch) and the GPU runs chunk k+1
                copying = self._collect_start(chunk, ids, sub_offsets, base)
                try:
                    after = upload(k + 2) if following is not None else None
                finally:   # the copies end before the mapping does, whatever happened
                    base = self._collect_finish(chunk, copying)
                chunk, following, after = following, after, None
                k += 1
        finally:   # an error or an interrupt leaves no staging buffer mapped
            for c in (chunk, following, after):
                if c is not None:
                    c.release()
        return base

    def _upload(self, data, sub_starts, bounds, k: int, pieces: bool,
                check_utf8: bool = False) -> "_Chunk":
        """Chunk k of a call (sub-documents [bounds[k], bounds[k+1])), its text written into
        slot k % 2."""
        lo, hi = int(sub_starts[bounds[k]]), int(sub_starts[bounds[k + 1]])
        text = PackedRange(data, lo, hi) if isinstance(data, PackedText) else data[lo:hi]
        return _Chunk(self, text, sub_starts[bounds[k]:bounds[k + 1] + 1] - lo, pieces,
                      slot=k % 2, first_sub=bounds[k], check_utf8=check_utf8, data_at=lo)

    def _collect_start(self, chunk, ids, sub_offsets, base: int):
        """Start copying the chunk's ids into ids[base:] (returns what _collect_finish waits
        for) and write its documents' offsets."""
        t0 = time.perf_counter()
        offsets, n = chunk.offsets, chunk.total
        copying = self._copier.start(ids[base:base + n], chunk.ids_view[:n], self.copy_threads,
                                     self.parallel_copy_ids)
        sub_offsets[chunk.first_sub + 1:chunk.first_sub + offsets.size] = offsets[1:] + base
        self.last_profile.readback_s += time.perf_counter() - t0
        return copying, base + n

    def _collect_finish(self, chunk, copying) -> int:
        t0 = time.perf_counter()
        futures, end = copying
        try:
            for future in futures:
                future.result()
        finally:
            chunk.release()
        self.last_profile.readback_s += time.perf_counter() - t0
        self.last_profile.calls += 1
        return end

    def _split_oversize(self, data, starts, pieces: bool, check_utf8: bool = False):
        """Sub-documents no larger than max_call_bytes; returns (sub starts, index of each
        document's first sub-document, plus the end). A document that cannot be cut raises
        ValueError, or with check_utf8 InvalidUtf8 when it or one before it is not valid
        UTF-8 (checked here, on the host: raw bytes past an invalid one are not cut)."""
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
            cuts = split_cuts(byte_range(data, lo, hi).tobytes(), self.pattern) + lo if \
                hi - lo > self.max_call_bytes else None
            while hi - lo > self.max_call_bytes:
                k = int(np.searchsorted(cuts, lo + self.max_call_bytes, side="right")) - 1
                cut = int(cuts[k]) if k >= 0 and cuts[k] > lo else None
                if cut is None:
                    for e in range(d + 1) if check_utf8 else ():
                        e_lo, e_hi = int(starts[e]), int(starts[e + 1])
                        valid = valid_utf8_prefix(byte_range(data, e_lo, e_hi).tobytes())
                        if valid < e_hi - e_lo:
                            raise InvalidUtf8(e_lo + valid)
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

    def _binds(self, chunk, scratch_buf, budget):
        lay = self.tables.layout
        # one role per budget: a recording may bind both (the inline long-piece dispatches)
        params = self.uniforms.get(
            f"encode budget={budget}", "IIIIIIIIIIIII", chunk.n, chunk.n_docs, chunk.n_chunks,
            chunk.chunk_bytes, lay["info_off"], lay["bytes_off"], lay["piece_off"],
            lay["piece_mask"], lay["pair_mask"],
            lay["max_tok_len"], int(self.tables.whole_piece), budget, chunk.lane_shift)
        return [chunk.text, chunk.starts, self.classes_buf, self.vocab_buf, self.pairs_buf,
                chunk.cuts, chunk.tok_buf, chunk.longs, scratch_buf, chunk.counters, params]

    def _record_encode(self, rec, chunk) -> None:
        binds = self._binds(chunk, self.pool.get("scratch_dummy", 16), self.budget)
        rec.dispatch(self.k_fill, binds, -(-chunk.n // WG), "fill")
        if chunk.check_utf8:
            rec.dispatch(self.k_utf8, binds, -(-chunk.n // (WG * UTF8_BYTES)), "utf8_check")
        if chunk.pieces:
            rec.dispatch(self.k_pieces, binds, -(-chunk.n_docs // WG), "merge_pieces")
        else:
            rec.dispatch(self.k_cuts, binds, chunk.walk_groups, "cuts")
            if self.k_digit_cuts is not None:
                rec.dispatch(self.k_digit_cuts, binds, chunk.walk_groups, "digit_cuts")
            rec.dispatch(self.k_pretok, binds, chunk.walk_groups, "pretok_merge")
        if chunk.inline_long:
            # long pieces in the same submit: windows, stitch, copy over however many windows
            # bpe_pretok queued (grid-stride), in a work space no queue can outgrow
            binds = self._binds(chunk, self.pool.get("scratch", 4 * self.inline_words_per_byte
                                                     * chunk.n), NONE)
            # grids sized by the most windows the chunk can queue (pieces of > SHORT_MAX
            # bytes, plus one per long_window of them): merge and stitch one invocation per
            # window, copy one workgroup per window; grid-stride beyond that, so any grid is
            # exact
            windows = chunk.n // (SHORT_MAX + 1) + chunk.n // self.long_window + 1
            groups = min(INLINE_LONG_WORKGROUPS, -(-windows // WG))
            self._record_long_wg(rec, binds, windows)
            rec.dispatch(self.k_long, binds, groups, "merge_long")
            rec.dispatch(self.k_stitch, binds, groups, "stitch")
            rec.dispatch(self.k_copy, binds, min(INLINE_LONG_WORKGROUPS, windows), "long_copy")

    def _use_long_wg(self) -> bool:
        return self.long_wg and self.k_long_wg is not None

    def _record_long_wg(self, rec, binds, windows: int) -> None:
        """The workgroup merges of up to `windows` queued windows: the short build takes the
        short ones, then the full build the rest it can hold (bpe_merge_long, recorded
        after, takes what is left)."""
        if not self._use_long_wg():
            return
        if self.long_wg_short and self.k_long_wg_short is not None:
            rec.dispatch(self.k_long_wg_short, binds, min(WG_SHORT_LONG_GROUPS, windows),
                         "merge_long_wg_short")
        rec.dispatch(self.k_long_wg, binds, min(WG_LONG_GROUPS, windows), "merge_long_wg")

    def inline_long_for(self, n: int) -> bool:
        """Are the long pieces of a chunk of n bytes merged in its one submit? On GPUs (no
        loop budget), for chunks of at least inline_min_bytes (default 0: all), when the
        worst-case work space fits one binding."""
        limit = min(int(self.device.limits.get("max-storage-buffer-binding-size", 1 << 27)),
                    int(self.device.limits.get("max-buffer-size", 1 << 30)))
        return self.budget == NONE and self.inline_long and n >= self.inline_min_bytes and \
            4 * self.inline_words_per_byte * n <= limit

    def _record_compact(self, rec, chunk) -> None:
        n, n_docs = chunk.n, chunk.n_docs
        cparams = self.uniforms.get("compact", "IIII", n, n_docs, 0, 0)
        binds = [chunk.tok_buf, chunk.excl, chunk.starts, chunk.counters, chunk.out, cparams]
        if n <= SMALL_COMPACT_BYTES:
            rec.dispatch(self.k_scan_compact, binds, 1, "scan_compact")
            return
        self.scan.record(rec, chunk.tok_buf, n, chunk.excl, mode=1)
        rec.dispatch(self.k_compact, binds, -(-max(n, n_docs + 1) // 256), "compact")

    def _finish_slow(self, chunk, n_long: int, long_words: int, unfinished: int,
                     failed: int = 0) -> None:
        """Resume the pre-tokenizer (finite budgets), merge long pieces (or, when they were
        merged in the chunk's submit, merge again those whose seams failed), compact again
        and read the chunk back exactly (the one-submit guess of the fast path did not
        hold)."""
        dev, counters, n = self.device, chunk.counters, chunk.n
        self.last_profile.slow_paths += 1
        binds = lambda scratch, budget: self._binds(chunk, scratch, budget)  # noqa: E731
        dummy = self.pool.get("scratch_dummy", 16)
        if unfinished:
            self._resume(lambda rec: rec.dispatch(self.k_pretok, binds(dummy, self.budget),
                                                  chunk.walk_groups, "pretok_merge"),
                         counters, "bpe pretok resume", n)
            n_long, long_words, overruns = self._counters(counters)[:3]
            if overruns:
                raise BoundaryError(f"{overruns} GPU pre-tokenizer segment(s) overran their end: "
                                    "a piece boundary proof failed (internal error; please "
                                    "report the input)")
        changed = bool(unfinished)   # tok_buf changed since the chunk's own compact
        if n_long:
            self.last_profile.long_windows += n_long
        if n_long and not (chunk.inline_long and not failed):   # else stitched in its submit
            changed |= self._merge_long(binds, chunk.longs, counters, n_long, long_words, n,
                                        merged=chunk.inline_long)
        if changed:
            with dev.record("bpe compact", timing=self.profile) as rec:
                self._record_compact(rec, chunk)
            self.last_profile.add_gpu(rec.gpu_times)
            t0 = time.perf_counter()
            # counters and document offsets; the last offset is the total
            chunk.total = int(dev.download(chunk.out.view(0, chunk.ids_at), np.uint32)[-1])
            self.last_profile.readback_s += time.perf_counter() - t0
        # the whole result into the slot's staging buffer (grown if need be) and mapped, as
        # on the fast path: the ids are copied once on the host, by _collect_start
        t0 = time.perf_counter()
        size = chunk.ids_at + 4 * chunk.total
        chunk.staging = self.staging(chunk.slot, size)
        with dev.record("bpe readback") as rec:
            rec.copy(chunk.out, chunk.staging, size)
        map_staging(chunk.staging, size)
        chunk.mapped = True
        view = chunk.staging.raw.read_mapped(0, size, copy=False)
        chunk.offsets = np.frombuffer(view, np.uint32, count=chunk.n_docs + 1,
                                      offset=4 * COUNTER_WORDS).astype(np.int64)
        chunk.ids_view = np.frombuffer(view, np.uint32, count=chunk.total, offset=chunk.ids_at)
        self.last_profile.readback_s += time.perf_counter() - t0

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
                    n_bytes: int, merged: bool = False) -> None:
        """Merge the queued windows of long pieces, stitch them into tok_buf, and merge the
        pieces whose seams did not stitch again with longer windows, at last as one window.
        `merged`: the first round already ran (in the chunk's own submit). Returns whether
        tok_buf was written (not when that first round left nothing to merge again)."""
        if merged:
            failed = self._failed_pieces(longs, n_jobs, align=True)
        elif words <= self.scratch_limit_words:   # the common case: the queue as bpe_pretok left it
            scratch = self.pool.get("scratch", 4 * words)
            if not self._run_windows(binds, scratch, counters, n_jobs, n_bytes):
                return True
            failed = self._failed_pieces(longs, n_jobs, align=True)
        else:
            queue = self.device.download(longs.view(0, 4 * JOB_WORDS * n_jobs), np.uint32)
            failed = self._run_queue(binds, longs, counters, queue.reshape(-1, JOB_WORDS),
                                     n_bytes, align=True)
        changed = not merged or bool(failed)
        # first again with windows of the same size whose starts sit on a token boundary of
        # the piece's first window (a periodic run after a different first character, e.g.
        # " xxxx..." or "<!!!!...", tokenizes in a phase set by that character: windows that
        # start at multiples of LONG_WINDOW from the piece's start never share a token)
        aligned = [f for f in failed if f[2]]
        failed = [f[:2] for f in failed if not f[2]]
        if aligned:
            self.last_profile.long_retried += len(aligned)
            jobs = self._aligned_windows(aligned)
            self.last_profile.long_windows += jobs.shape[0]
            failed += self._run_queue(binds, longs, counters, jobs, n_bytes)
        failed = sorted(set(failed))
        self.last_profile.long_widened += len(failed)
        window = self.long_window
        while failed:
            window = window * LONG_RETRY_FACTOR if window else None
            if window and window > max(pl for _, pl in failed):
                window = None   # one window per piece: the plain heap merge, it cannot fail
            jobs = self._windows(failed, window)
            self.last_profile.long_retried += len(failed)
            self.last_profile.long_windows += jobs.shape[0]
            failed = self._run_queue(binds, longs, counters, jobs, n_bytes)
        return changed

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

    def _aligned_windows(self, pieces) -> np.ndarray:
        """Queue entries for `pieces` [(start, length, b)]: a first window [start, b +
        overlap), then windows of long_window bytes from b (the last to the piece's end)."""
        rows, w, ov = [], self.long_window, self.long_overlap
        for ps, pl, b in pieces:
            end, rest = ps + pl, ps + pl - b
            m = 1 + (1 if rest <= w + ov else -(-(rest - ov) // w))
            starts = [ps] + [b + k * w for k in range(m - 1)]
            for k, ws in enumerate(starts):
                we = starts[k + 1] + ov if k + 1 < m else end
                rows.append((ws, we - ws, 0, 0, ps, pl, k, m))
        return np.array(rows, dtype=np.uint32).reshape(-1, JOB_WORDS)

    def _failed_pieces(self, longs, n_jobs: int, align: bool = False) -> list[tuple]:
        """The pieces of the last run whose seams did not all stitch: (start, length), or with
        `align` (start, length, b): b the last token start of the piece's first window in
        (its second window's start - the longest token, that start], 0 when there is none
        (while the scratch still holds that run's windows)."""
        queue = self.device.download(longs.view(0, 4 * JOB_WORDS * n_jobs), np.uint32)
        queue = queue.reshape(-1, JOB_WORDS)
        bad = queue[queue[:, 3] == LONG_SEAM_FAILED]
        pieces = sorted({(int(ps), int(pl)) for ps, pl in bad[:, 4:6]})
        if not align or not pieces:
            return pieces
        # a first window's tokens just left of where the second one started (the spacing of
        # window starts must stay above overlap + the longest token: bpe_encode.wgsl's proof)
        d = int(self.tables.layout["max_tok_len"])
        w, ov = self.long_window, self.long_overlap
        lo_rel = max(w - d, ov + d + 1)
        firsts = queue[(queue[:, 6] == 0) & (queue[:, 7] > 1)]
        first_of = {(int(r[4]), int(r[5])): r for r in firsts}
        rows = [first_of.get(pc) for pc in pieces]
        usable = [r is not None and lo_rel <= w for r in rows]
        span = w - lo_rel + 1
        tails = np.full((len(pieces), max(span, 1)), NONE, np.uint32)
        if any(usable):
            scratch = self.pool.get("scratch", 16)   # the buffer that run merged in
            gather = self.pool.get("align_gather", 4 * span * len(pieces))
            with self.device.record("bpe long align") as rec:
                for i, r in enumerate(rows):
                    if usable[i]:
                        toks = int(r[2]) + STATE_WORDS + 4 * int(r[1])   # bpe_encode.wgsl layout
                        rec.copy(scratch, gather, 4 * span, src_offset=4 * (toks + lo_rel),
                                 dst_offset=4 * span * i)
            tails = self.device.download(gather.view(0, 4 * span * len(pieces)),
                                         np.uint32).reshape(len(pieces), span)
        out = []
        for i, (ps, pl) in enumerate(pieces):
            hits = np.flatnonzero(tails[i] != NONE) if usable[i] else []
            out.append((ps, pl, ps + lo_rel + int(hits[-1]) if len(hits) else 0))
        return out

    def _run_queue(self, binds, longs, counters, jobs: np.ndarray, n_bytes: int,
                   align: bool = False):
        """Run `jobs` in groups that fit the scratch binding (a piece's windows stay in one
        group); returns the pieces with a failed seam (`_failed_pieces`, `align` as there)."""
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
                                 f"needs {int(need[lo:hi].sum()):,} words of long-piece work "
                                 f"space for its {hi - lo} windows, more than the device's "
                                 f"{self.scratch_limit_words:,}")
            batch = jobs[lo:hi].copy()
            batch[:, 2] = np.concatenate([[0], np.cumsum(need[lo:hi - 1])])
            batch[:, 3] = 0  # LONG_NEW
            longs.write(batch)
            counters.write(np.array([hi - lo], np.uint32))
            if self._run_windows(binds, scratch, counters, hi - lo, n_bytes):
                failed += self._failed_pieces(longs, hi - lo, align)
            i = j
        return failed

    def _run_windows(self, binds, scratch, counters, n_jobs: int, n_bytes: int) -> int:
        """Heap-merge the queued windows (resumed until done when the budget is finite),
        then stitch and copy them into tok_buf; returns the number of failed seams."""
        kernel, budget = self.k_long, self.budget
        if self.k_long_sg is not None:
            kernel, budget = self.k_long_sg, self.long_budget
        def record(rec):   # whole windows first; the heap merge takes the rest and resumes
            self._record_long_wg(rec, binds(scratch, budget), n_jobs)
            rec.dispatch(kernel, binds(scratch, budget), -(-n_jobs // WG), "merge_long")

        self._resume(record, counters, "bpe long", n_bytes)
        counters.write(np.zeros(1, np.uint32), offset_bytes=20)
        with self.device.record("bpe long stitch", timing=self.profile) as rec:
            rec.dispatch(self.k_stitch, binds(scratch, self.budget), -(-n_jobs // WG), "stitch")
            rec.dispatch(self.k_copy, binds(scratch, self.budget), n_jobs, "long_copy")
        self.last_profile.add_gpu(rec.gpu_times)
        return self._counters(counters)[5]


class _Bounds:
    """The first sub-document of each chunk of a call, cut as far as asked (`has(k)`):
    chunks of whole sub-documents of about `limit` bytes each (at least one sub-document),
    the first ones a quarter and a half of that (PIPELINE_RAMP): the GPU waits for the first
    chunk's upload, and the next upload overlaps only the chunk before it. `reach` (a
    LazyPackedText's) learns the starts up to a chunk's end before it is cut."""

    def __init__(self, limit: int, sub_starts: np.ndarray, reach=None):
        self.limit, self.sub_starts, self.reach = limit, sub_starts, reach
        self.n_sub = sub_starts.size - 1
        self.firsts = [0]

    def has(self, k: int) -> bool:
        """Whether the call has a chunk k (then it and the chunks before it are cut)."""
        while len(self.firsts) <= k + 1 and self.firsts[-1] < self.n_sub:
            first = self.firsts[-1]
            step = self.limit >> max(0, PIPELINE_RAMP - len(self.firsts) + 1)
            end = int(self.sub_starts[first]) + step
            if self.reach is not None:
                self.reach(end)
            last = int(np.searchsorted(self.sub_starts, end, side="right")) - 1
            self.firsts.append(max(min(last, self.n_sub), first + 1))
        return len(self.firsts) > k + 1

    def __getitem__(self, k: int) -> int:
        return self.firsts[k]


class _Plan:
    """A call cut into chunks (GpuEncoder._prepare): its data, sub-documents and their
    owners, chunk bounds (_Bounds), the arrays its ids and offsets go to, and its
    pre-tokenizer chunk (GpuEncoder.chunk_for)."""

    def __init__(self, enc, data, sub_starts, owner_first, bounds, pieces, ids,
                 check_utf8: bool, call_chunk: int):
        self.enc, self.data, self.sub_starts, self.owner_first = enc, data, sub_starts, \
            owner_first
        self.bounds, self.pieces, self.ids = bounds, pieces, ids
        self.check_utf8, self.call_chunk = check_utf8, call_chunk
        self.sub_offsets = np.zeros(sub_starts.size, np.int64)

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        """Every chunk through the encoder's pipeline: (ids, offsets)."""
        return self.result(self.enc._pipeline(self))

    def result(self, total: int) -> tuple[np.ndarray, np.ndarray]:
        return self.ids[:total], self.sub_offsets[self.owner_first]


class BegunCall:
    """A call GpuEncoder.begin_docs submitted: `finish()` -> (ids, offsets), once; `cancel()`
    gives the encoder back without a result (its next call's GPU work follows this one's in
    queue order, so nothing is waited for)."""

    def __init__(self, enc: GpuEncoder, chunk: "_Chunk | None" = None,
                 plan: "_Plan | None" = None, result=None):
        self.encoder = enc
        self._chunk, self._plan, self._result = chunk, plan, result
        self._held = True

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        if not self._held:
            raise RuntimeError("this call has already finished")
        enc, chunk = self.encoder, self._chunk
        try:
            if chunk is None:
                return self._result
            plan = self._plan
            with enc.device_lock:   # a slow path submits more
                chunk.wait()
                copying = enc._collect_start(chunk, plan.ids, plan.sub_offsets, 0)
                total = enc._collect_finish(chunk, copying)
            return plan.result(total)
        finally:
            self._end()

    def cancel(self) -> None:
        if self._held:
            self._end()

    def _end(self) -> None:
        self._held = False
        try:
            if self._chunk is not None:
                self._chunk.release()
        finally:
            self._chunk = self._plan = None
            self.encoder.holder = None
            self.encoder._lock.release()


class _Chunk:
    """One device call of the pipeline: its host-written buffers (slot 0 or 1), its mapped
    staging buffer, and after wait() its offsets and ids.

    dispatch() records everything a chunk of ordinary text needs in ONE submit: encode,
    compact, and copies of the counters, the document offsets and a guess of the ids into the
    staging buffer (the guess: 1.25 x the previous chunk's ids per byte, for a call's first
    chunk the larger of that and the previous call's first chunk's; at most one id per
    byte). wait() maps it once; when the counters show long pieces, unfinished budgeted
    segments or a wrong guess, the chunk finishes on the slow path (more submits); when they
    show invalid UTF-8 (check_utf8), it raises InvalidUtf8 (the position counted from
    `data_at`, the chunk's first byte in the call's data)."""

    def __init__(self, enc: GpuEncoder, data: np.ndarray, starts: np.ndarray, pieces: bool,
                 slot: int, first_sub: int, check_utf8: bool = False, data_at: int = 0):
        self.slot = slot
        self.enc, self.pieces, self.first_sub = enc, pieces, first_sub
        self.check_utf8, self.data_at = check_utf8, data_at
        self.n, self.n_docs = int(data.size), int(starts.size - 1)
        self.chunk_bytes = enc.call_chunk
        self.n_chunks = -(-self.n // self.chunk_bytes)
        self.lane_shift = enc.lane_shift_for(self.n_chunks)
        self.walk_groups = -(-(self.n_chunks << self.lane_shift) // WG)   # cuts, pretok
        pool, t0 = enc.pool, time.perf_counter()
        self.text = pool.get(f"text{slot}", -(-self.n // 4) * 4)
        self.text_up = enc.write_text(slot, self.text, data)   # copied at dispatch, if any
        self.starts = pool.get(f"starts{slot}", 4 * (self.n_docs + 1))
        self.starts.write(starts.astype(np.uint32))
        self.counters = pool.get(f"counters{slot}", 4 * COUNTER_WORDS)   # bpe_fill_none zeroes
        enc.last_profile.upload_s += time.perf_counter() - t0
        self.guess = 0
        self.staging = None   # taken at dispatch: the slot's chunk before may still be mapped
        self.inline_long = enc.inline_long_for(self.n)
        self.ids_at = 4 * (COUNTER_WORDS + self.n_docs + 1)   # in `out` and the staging
        self.offsets = self.ids_view = None
        self.total = 0
        self.mapped = False

    def dispatch(self) -> None:
        enc, pool = self.enc, self.enc.pool
        if self.n == 0:
            return
        # Buffers only the GPU writes are shared by both slots (queue order keeps chunks
        # apart); they are taken here, not at upload, because a bigger next chunk may grow
        # (replace) them while this one may still need them on its slow path.
        ratio = enc.ids_per_byte if self.first_sub else max(enc.ids_per_byte,
                                                             enc.first_ids_per_byte)
        self.guess = self.n if self.n <= enc.exact_guess_bytes else \
            min(self.n, int(ratio * 1.25 * self.n) + 16)
        self.staging = enc.staging(self.slot, self.ids_at + 4 * self.guess)
        self.cuts = pool.get("cuts", 16 * self.n_chunks)
        self.tok_buf = pool.get("tok_buf", 4 * self.n)
        self.longs = pool.get("longs", 4 * JOB_WORDS * (self.n // (SHORT_MAX + 1) + 1))
        self.excl = pool.get("excl", 4 * (self.n + 1))
        self.out = pool.get("out", self.ids_at + 4 * self.n)   # counters, offsets, ids
        with enc.device.record("bpe encode", timing=enc.profile) as rec:
            if self.text_up is not None:
                rec.copy(self.text_up, self.text, -(-self.n // 4) * 4)
            enc._record_encode(rec, self)
            enc._record_compact(rec, self)
            rec.copy(self.out, self.staging, self.ids_at + 4 * self.guess)
        enc.last_profile.add_gpu(rec.gpu_times)

    def wait(self) -> None:
        enc, t0 = self.enc, time.perf_counter()
        if self.n == 0:   # only empty documents
            self.offsets = np.zeros(self.n_docs + 1, np.int64)
            self.ids_view = np.zeros(0, np.uint32)
            return
        raw = self.staging.raw
        map_staging(self.staging, self.ids_at + 4 * self.guess)
        self.mapped = True
        view = raw.read_mapped(0, self.ids_at + 4 * self.guess, copy=False)
        counters = np.frombuffer(view, np.uint32, count=COUNTER_WORDS)
        n_long, long_words, overruns, unfinished, _, failed = (int(v) for v in counters[:6])
        if counters[UTF8_WORD]:   # nothing was encoded (bpe_cuts found no boundary)
            self.release()
            raise InvalidUtf8(self.data_at + (~int(counters[UTF8_WORD]) & 0xFFFFFFFF))
        offsets = np.frombuffer(view, np.uint32, count=self.n_docs + 1,
                                offset=4 * COUNTER_WORDS)
        self.offsets = offsets.astype(np.int64)
        self.total = int(self.offsets[-1])
        enc.last_profile.readback_s += time.perf_counter() - t0
        if overruns:
            self.release()
            raise BoundaryError(f"{overruns} GPU pre-tokenizer segment(s) overran their end: "
                                "a piece boundary proof failed (internal error; please report "
                                "the input)")
        if (n_long and not self.inline_long) or failed or unfinished or \
                self.total > self.guess:
            self.release()
            enc._finish_slow(self, n_long, long_words, unfinished, failed)
        else:
            self.ids_view = np.frombuffer(view, np.uint32, count=self.total, offset=self.ids_at)
            enc.last_profile.long_windows += n_long   # merged in the chunk's submit
        if self.n:
            enc.ids_per_byte = max(self.total / self.n, 0.05)
            if self.first_sub == 0:
                enc.first_ids_per_byte = enc.ids_per_byte

    def release(self) -> None:
        if self.mapped:
            self.staging.raw.unmap()
            self.mapped = False


__all__ = ["BegunCall", "BoundaryError", "EncoderStalled", "GpuEncoder", "InvalidUtf8", "NONE",
           "Profile"]
