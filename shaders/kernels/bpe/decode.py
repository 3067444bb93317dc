"""GPU decoding: token ids -> bytes with a gather kernel (shaders/kernels/bpe/bpe_decode.wgsl).

    dec = GpuDecoder(device, tables, encoder_pool)
    data = dec.decode(np.array(ids, np.uint32))        # bytes; raises InvalidIdError

One submission on the fast path: lengths + prefix sum + total + the gather into an output
sized by a guess (1.25 x the previous call's bytes per id), with the status words and the
bytes copied into a persistent mapped staging buffer, then one map. A guess that was short
(or an invalid id) is found in the status words: then the gather runs again at the exact size
(a second submit and read). A batch of documents (`decode_docs`) packs whole documents into
calls of at most max_call_ids ids (4 bytes per id in each binding) whose bytes fit one
binding (max_out_bytes; a call found larger after its scan is split in two and run again).
"""

from __future__ import annotations

import time

import numpy as np

from wgpu import BufferUsage

from ...engine import Buffer, Device
from .scan import (COPY_THREADS, BufferPool, GpuScan, ParallelCopy, UniformSlots,
                       map_staging, write_through_mapping)
from .tables import NONE, VocabTables

DECODE_FILE = "bpe_decode.wgsl"
# Calls of at least this many ids upload them through persistent mappable buffers (mapped
# for writing, filled, unmapped, copied on the GPU) instead of queue.write_buffer (which
# copies into a fresh staging allocation each call). Smaller calls keep write_buffer: the map
# for writing costs a round trip, more than their copy. A buffer holds at most
# UPLOAD_PIECE_BYTES (32 MB): larger calls go up in pieces, one submit each, the last one's
# copy in the decode's own submit; buffers as large as the call would slow every later small
# call of the process. Two buffers take turns, and a piece is written on COPY_THREADS threads
# at once. Sizes chosen by measurement: dev/tokenizer_throughput/README.md, "Decoder and
# packed text defaults".
MAPPED_UPLOAD_IDS = 1 << 18
UPLOAD_PIECE_BYTES = 32 << 20
PARALLEL_UPLOAD_IDS = 1 << 18   # pieces of fewer ids are written by the calling thread
# A vocabulary of at most 65,535 ids (gpt2's 50,257) gets its ids uploaded two per word:
# half the bytes through the mapping and over the bus (less CPU time, same wall time:
# dev/tokenizer_throughput/README.md). Each piece's largest id is
# taken while it is narrowed, so an id that does not fit 16 bits (never a valid one: 0xFFFF is not
# either) sends the call back to 32-bit words, where the GPU names the first invalid one.
NARROW_IDS_MAX_TABLE = 0xFFFF


class InvalidIdError(ValueError):
    """An id outside the vocabulary at `position` (the Encoding turns it into
    InvalidTokenError with the vocabulary's name)."""

    def __init__(self, token: int, position: int):
        super().__init__(f"token id {token} at position {position} is not in the vocabulary")
        self.token = token
        self.position = position


def _document_bytes(body, bounds: list[int] | None):
    """`body` (a mapped memoryview or bytes) as one bytes object, or with `bounds` (n + 1
    byte offsets) each document's bytes: the only copy out of the mapped buffer."""
    if bounds is None:
        return bytes(body)
    return [bytes(body[bounds[i]:bounds[i + 1]]) for i in range(len(bounds) - 1)]


class _OutputTooLarge(Exception):
    """A call's bytes exceed one binding (the caller splits the call)."""


class _WideId(Exception):
    """An id of a narrowed (16-bit) upload does not fit 16 bits: upload 32-bit words."""


def _narrowed(ids: np.ndarray) -> np.ndarray:
    """uint32 ids as uint16 words, padded to whole 32-bit words (raises _WideId)."""
    if ids.size and int(ids.max()) > 0xFFFF:
        raise _WideId()
    out = np.zeros(-(-ids.size // 2) * 2, np.uint16)
    out[:ids.size] = ids
    return out


class GpuDecoder:
    def __init__(self, device: Device, tables: VocabTables, vocab_buf, pool: BufferPool | None = None):
        self.device = device
        self.tables = tables
        self.vocab_buf = vocab_buf
        self.pool = pool or BufferPool(device)
        self.scan = GpuScan(device, self.pool)
        self.uniforms = UniformSlots(device)   # per-call parameters: bind groups made once
        self.k_lengths = device.kernel(DECODE_FILE, "dec_lengths")
        self.k_total = device.kernel(DECODE_FILE, "dec_total")
        self.k_bounds = device.kernel(DECODE_FILE, "dec_bounds")
        self.k_gather = device.kernel(DECODE_FILE, "dec_gather")
        binding = int(device.limits.get("max-storage-buffer-binding-size", 1 << 27))
        # ids, lengths and offsets take 4 bytes per id; the bytes a call gives back must fit
        # one binding too: a call whose total is larger (known after its scan) is split
        self.max_call_ids = max(1, binding // 4 - 1024)
        self.max_out_bytes = binding // 16 * 16
        self.max_staging_bytes = int(device.limits.get("max-buffer-size", 1 << 30)) // 16 * 16
        self.bytes_per_id = 4.0   # the output guess; updated from every call
        self._staging: Buffer | None = None
        self._uploads: list[Buffer | None] = [None, None]   # MAP_WRITE | COPY_SRC, in turn
        self.narrow_ids = tables.layout["n_table"] <= NARROW_IDS_MAX_TABLE
        self.mapped_upload_ids = MAPPED_UPLOAD_IDS
        self.upload_piece_bytes = UPLOAD_PIECE_BYTES
        self.upload_threads = COPY_THREADS
        self.parallel_upload_ids = PARALLEL_UPLOAD_IDS
        self._copier = ParallelCopy("istanbul-ids-upload")
        self.profile = False
        self.gpu_times: list = []
        self.upload_s = 0.0
        self.readback_s = 0.0

    def decode(self, ids) -> bytes:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        if ids.size == 0:
            return b""
        bad = np.flatnonzero((ids < 0) | (ids > 0xFFFFFFFE))
        if bad.size:
            raise InvalidIdError(int(ids[bad[0]]), int(bad[0]))
        ids = ids.astype(np.uint32)
        parts = []
        for lo in range(0, ids.size, self.max_call_ids):
            parts.append(self._decode_split(ids[lo:lo + self.max_call_ids], lo))
        return b"".join(parts)

    def _decode_split(self, ids: np.ndarray, base: int) -> bytes:
        """One call for `ids` (positions from `base` in errors), halved while their bytes do
        not fit one binding."""
        try:
            return self._call(ids)
        except InvalidIdError as exc:
            raise InvalidIdError(exc.token, exc.position + base) from None
        except _OutputTooLarge:
            half = ids.size // 2
            return self._decode_split(ids[:half], base) + \
                self._decode_split(ids[half:], base + half)

    def decode_docs(self, ids: np.ndarray, doc_starts: np.ndarray) -> list[bytes]:
        """The bytes of each document: ids (uint32) of all documents, doc_starts their n + 1
        token offsets. Whole documents go into calls of at most max_call_ids ids and
        max_out_bytes bytes (usually one call): each call's document byte offsets come from
        the GPU with the bytes, and each document is copied once out of the mapped buffer. A
        document larger than one call is decoded on its own in several."""
        ids = np.ascontiguousarray(ids, dtype=np.uint32)
        starts = np.asarray(doc_starts, np.int64)
        n_docs = int(starts.size - 1)
        out: list[bytes] = []
        first, span = 0, n_docs   # span: documents per call, halved when the bytes overflow
        while first < n_docs:
            lo = int(starts[first])
            # documents [first, last) end within one call's ids from lo
            last = int(np.searchsorted(starts, lo + self.max_call_ids, side="right")) - 1
            last = min(last, first + span)
            try:
                if last <= first:   # document `first` alone is larger than one call
                    out.append(self.decode(ids[lo:int(starts[first + 1])]))
                    first, span = first + 1, n_docs
                    continue
                hi = int(starts[last])
                if hi == lo:
                    out += [b""] * (last - first)
                else:
                    out += self._call(ids[lo:hi], (starts[first:last + 1] - lo).astype(np.uint32))
            except InvalidIdError as exc:
                raise InvalidIdError(exc.token, exc.position + lo) from None
            except _OutputTooLarge:
                span = (last - first) // 2   # 0: the one document alone, in several calls
                continue
            first, span = last, n_docs
        return out

    def _staging_for(self, nbytes: int) -> Buffer:
        if self._staging is None or self._staging.nbytes < nbytes:
            if self._staging is not None:
                self._staging.destroy()
            size = max(min(1 << max(int(nbytes) - 1, 15).bit_length(),
                           self.max_staging_bytes), int(nbytes))
            self._staging = self.device.buffer(size, np.uint8, label="bpe decode staging",
                                               usage=BufferUsage.MAP_READ | BufferUsage.COPY_DST)
        return self._staging

    def _mapped_upload(self, ids: np.ndarray, ids_buf: Buffer,
                       narrow: bool) -> tuple[Buffer, int, int]:
        """Write `ids` (narrow: as 16-bit halves, raising _WideId for an id that does not
        fit) into `ids_buf` through the two persistent upload buffers, in turn (see
        MAPPED_UPLOAD_IDS): a piece is written into a mapped buffer on upload_threads
        threads and, but for the last, copied by a submit of its own; mapping a buffer
        again waits only for its own last copy, so writing one piece overlaps the GPU's copy
        of the one before. Returns (buffer, ids_buf byte offset, bytes) of the last piece,
        which the caller's submit copies."""
        n = int(ids.size)
        width = 2 if narrow else 4
        # an even number of ids per piece: every piece but the last fills whole words
        piece = max(2, min(-(-n // 2) * 2, self.upload_piece_bytes // width // 2 * 2))
        for turn in (0, 1) if n > piece else (0,):
            buf = self._uploads[turn]
            if buf is None or buf.nbytes < width * piece:
                if buf is not None:
                    buf.destroy()
                self._uploads[turn] = self.device.buffer(
                    width * piece, np.uint8, label=f"bpe decode upload {turn}",
                    usage=BufferUsage.MAP_WRITE | BufferUsage.COPY_SRC)
        highest = 0   # the largest id written so far (narrow)

        def narrow_part(dst: np.ndarray, src: np.ndarray, lo: int, hi: int) -> int:
            dst[lo:hi] = src[lo:hi]   # truncates; the slice's largest id says whether it may
            return int(src[lo:hi].max()) if hi > lo else 0

        def copy(dst: np.ndarray, src: np.ndarray) -> None:
            nonlocal highest
            if narrow:
                highest = max(highest, *self._copier.map(
                    lambda lo, hi: narrow_part(dst, src, lo, hi), int(src.size),
                    self.upload_threads, self.parallel_upload_ids))
            else:
                self._copier(dst, src, self.upload_threads, self.parallel_upload_ids)
        lo, turn = 0, 0
        while True:
            buf = self._uploads[turn]
            hi = min(n, lo + piece)
            size = -(-width * (hi - lo) // 4) * 4
            write_through_mapping(buf, ids[lo:hi], size, copy,
                                  dtype=np.uint16 if narrow else np.uint32)
            if highest > 0xFFFF:
                raise _WideId()
            if hi == n:
                return buf, width * lo, size
            with self.device.record("bpe decode upload") as rec:
                rec.copy(buf, ids_buf, size, dst_offset=width * lo)
            lo, turn = hi, 1 - turn

    def _upload(self, ids: np.ndarray, narrow: bool):
        """The ids buffer with `ids` written (narrow: 16 bits each, or _WideId), and the
        mapped upload's last piece for the caller's submit to copy (None: written here)."""
        n = int(ids.size)
        ids_buf = self.pool.get("dec_ids", -(-(2 if narrow else 4) * n // 4) * 4)
        if n >= self.mapped_upload_ids:
            return ids_buf, self._mapped_upload(ids, ids_buf, narrow)
        ids_buf.write(_narrowed(ids) if narrow else ids)
        return ids_buf, None

    def _call(self, ids: np.ndarray, doc_starts: np.ndarray | None = None):
        """The bytes of `ids`; with doc_starts (n_docs + 1 token offsets), a list of each
        document's bytes."""
        dev, pool = self.device, self.pool
        n = int(ids.size)
        lay = self.tables.layout
        t0 = time.perf_counter()
        narrow = self.narrow_ids
        try:
            ids_buf, upload = self._upload(ids, narrow)
        except _WideId:   # an invalid id: 32-bit words, the GPU names the first bad one
            narrow = False
            ids_buf, upload = self._upload(ids, narrow)
        lens = pool.get("dec_lens", 4 * n)
        offs = pool.get("dec_offs", 4 * (n + 1))
        status = pool.get("dec_status", 16)
        status.write(np.array([NONE, 0, 0, 0], np.uint32))
        dummy_r = pool.get("dec_dummy_r", 16)
        dummy_w = pool.get("dec_dummy_w", 16)
        self.upload_s += time.perf_counter() - t0
        guess = min(n * max(4, lay["max_tok_len"]), int(self.bytes_per_id * 1.25 * n) + 64)
        guess = min(-(-guess // 4) * 4, self.max_out_bytes)
        out = pool.get("dec_out", guess)
        n_bounds = 0 if doc_starts is None else int(doc_starts.size)
        at = 16 + 4 * n_bounds   # staging: status | document byte offsets | bytes
        guess = max(4, min(guess, (self.max_staging_bytes - at) // 4 * 4))
        staging = self._staging_for(at + guess)
        if n_bounds:
            starts_buf = pool.get("dec_doc_starts", 4 * n_bounds)
            starts_buf.write(doc_starts)
            doc_bytes = pool.get("dec_doc_bytes", 4 * n_bounds)
        params = self.uniforms.get("decode", "IIIIIIII", n, lay["n_table"], lay["info_off"],
                                   lay["bytes_off"], guess, int(narrow), 0, 0)
        with dev.record("bpe decode", timing=self.profile) as rec:
            if upload is not None:   # the last piece of the ids
                piece_buf, at_byte, piece_bytes = upload
                rec.copy(piece_buf, ids_buf, piece_bytes, dst_offset=at_byte)
            rec.dispatch(self.k_lengths, [ids_buf, self.vocab_buf, dummy_r, lens, dummy_w, status,
                                          params], -(-n // 256), "dec_lengths")
            self.scan.record(rec, lens, n, offs, mode=0)
            rec.dispatch(self.k_total, [ids_buf, self.vocab_buf, offs, dummy_w, dummy_r, status,
                                        params], 1, "dec_total")
            rec.dispatch(self.k_gather, [ids_buf, self.vocab_buf, offs, dummy_w, out, status,
                                         params], -(-n // 256), "dec_gather")
            if n_bounds:
                bparams = self.uniforms.get("decode bounds", "IIIIIIII", n_bounds,
                                            lay["n_table"], 0, 0, 0, 0, 0, 0)
                rec.dispatch(self.k_bounds, [starts_buf, self.vocab_buf, offs, doc_bytes,
                                             dummy_w, status, bparams], -(-n_bounds // 256),
                             "dec_bounds")
                rec.copy(doc_bytes, staging, 4 * n_bounds, dst_offset=16)
            rec.copy(status, staging, 16)
            rec.copy(out, staging, guess, dst_offset=at)
        self.gpu_times += rec.gpu_times
        t0 = time.perf_counter()
        map_staging(staging, at + guess)
        try:
            view = staging.raw.read_mapped(0, at + guess, copy=False)
            first_bad, total = (int(v) for v in np.frombuffer(view, np.uint32, count=2))
            bounds = np.frombuffer(view, np.uint32, count=n_bounds, offset=16).tolist()
            data = None
            if first_bad == NONE and total <= guess:
                data = _document_bytes(view[at:at + total], bounds if n_bounds else None)
        finally:
            staging.raw.unmap()
        self.readback_s += time.perf_counter() - t0
        if first_bad != NONE:
            raise InvalidIdError(int(ids[first_bad]), first_bad)
        self.bytes_per_id = max(total / n, 1.0)
        if data is None and total > self.max_out_bytes:
            raise _OutputTooLarge(total)
        if data is not None:
            return data
        # the guess was short: gather again at the exact size
        out = pool.get("dec_out", -(-total // 4) * 4)
        params = self.uniforms.get("decode", "IIIIIIII", n, lay["n_table"], lay["info_off"],
                                   lay["bytes_off"], total, int(narrow), 0, 0)
        with dev.record("bpe decode gather", timing=self.profile) as rec:
            rec.dispatch(self.k_gather, [ids_buf, self.vocab_buf, offs, dummy_w, out, status,
                                         params], -(-n // 256), "dec_gather")
        self.gpu_times += rec.gpu_times
        t0 = time.perf_counter()
        data = dev.download(out.view(0, -(-total // 4) * 4), np.uint8)[:total].tobytes()
        self.readback_s += time.perf_counter() - t0
        return _document_bytes(data, bounds) if n_bounds else data
