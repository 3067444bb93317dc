"""GPU decoding: token ids -> bytes with a gather kernel (shaders/kernels/bpe/bpe_decode.wgsl).

    dec = GpuDecoder(device, tables, encoder_pool)
    data = dec.decode(np.array(ids, np.uint32))        # bytes; raises InvalidIdError

One submission on the fast path: lengths + prefix sum + total + the gather into an output
sized by a guess (1.25 x the previous call's bytes per id), with the status words and the
bytes copied into a persistent mapped staging buffer, then one map. A guess that was short
(or an invalid id) is found in the status words: then the gather runs again at the exact size
(a second submit and read). A batch of documents (`decode_docs`) packs whole documents into
calls of at most pipeline_ids ids (and max_call_ids: 4 bytes per id in each binding) whose
bytes fit one binding (max_out_bytes; a call found larger after its scan is split in two and
run again). The calls are a pipeline of two slots (each its own device buffers and staging
buffer): while this thread copies call k's documents out of its mapping, the copy threads
write call k+1's ids into their upload buffer, and call k+1 is submitted right after.
"""

from __future__ import annotations

import time

import numpy as np

from istanbul.shaders.engine import Buffer, Device
from wgpu import BufferUsage
from .gpu_scan import (COPY_THREADS, BufferPool, GpuScan, ParallelCopy, UniformSlots,
                       map_staging, write_through_mapping)
from .gpu_tables import NONE, VocabTables

DECODE_FILE = "bpe_decode.wgsl"
# Calls of at least this many ids upload them through persistent mappable buffers (mapped
# for writing, filled, unmapped, copied on the GPU) instead of queue.write_buffer: on the H200
# a 67 MB write_buffer took 34 ms (2 GB/s, the copy into a fresh staging allocation each
# call). Smaller calls keep write_buffer: the map for writing costs a round trip, more than
# their copy. A buffer holds at most UPLOAD_PIECE_IDS ids (8 MB): larger calls go up in
# pieces, one submit each, the last one's copy in the decode's own submit. A buffer as large
# as the call (128 MB per Encoding, kept) made every later small call of the process slower
# on the H200 once two vocabularies had decoded a corpus: a lone 914 B encode took 4.7-5.3
# ms instead of 0.9 (its four tiny write_buffer calls 2 ms; bench/results/tokenize/). With
# one buffer each piece waited for the previous piece's GPU copy and was written by one
# thread (20 ms of a 34M-id gpt2 decode); two buffers take turns, and a piece is written on
# COPY_THREADS threads at once.
MAPPED_UPLOAD_IDS = 1 << 18
UPLOAD_PIECE_IDS = 1 << 21
PARALLEL_UPLOAD_IDS = 1 << 18   # pieces of fewer ids are written by the calling thread
# Ids per call of decode_docs' pipeline: two calls in flight, so a call's upload (copy
# threads, no GIL) overlaps the previous call's bytes leaving their mapping (this thread):
# on the H200 a 67 MB gpt2 decode had spent 17.7 ms uploading 34M ids, then 14.9 ms copying
# the documents out, one after the other (bench/results/tokenize/). One upload piece each.
PIPELINE_IDS = UPLOAD_PIECE_IDS


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
        self._staging: list[Buffer | None] = [None, None]   # MAP_READ, one per slot
        self._uploads: list[Buffer | None] = [None, None]   # MAP_WRITE | COPY_SRC, in turn
        self.pipeline_ids = PIPELINE_IDS
        self.mapped_upload_ids = MAPPED_UPLOAD_IDS
        self.upload_piece_ids = UPLOAD_PIECE_IDS
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
        token offsets. Whole documents go into calls of at most pipeline_ids (and
        max_call_ids) ids and max_out_bytes bytes: each call's document byte offsets come
        from the GPU with the bytes, and each document is copied once out of the mapped
        buffer. Two calls are in flight (slots 0 and 1): call k+1's ids are being written
        by the copy threads while this thread takes call k's documents out. A document
        larger than one call is decoded on its own in several."""
        ids = np.ascontiguousarray(ids, dtype=np.uint32)
        starts = np.asarray(doc_starts, np.int64)
        n_docs = int(starts.size - 1)
        limit = max(1, min(self.max_call_ids, self.pipeline_ids))
        out: list[bytes] = []
        first, span = 0, n_docs   # span: documents per call, halved when the bytes overflow
        slot, running = 0, None   # running: the submitted call whose bytes are not read yet
        upcoming = None           # started (ids being written), not submitted
        try:
            while first < n_docs or running is not None:
                upcoming = None
                if first < n_docs:
                    lo = int(starts[first])
                    # documents [first, last) end within one call's ids from lo
                    last = int(np.searchsorted(starts, lo + limit, side="right")) - 1
                    last = min(last, first + span)
                    if last > first and int(starts[last]) > lo:
                        try:
                            upcoming = self._start(
                                ids[lo:int(starts[last])],
                                (starts[first:last + 1] - lo).astype(np.uint32), slot)
                        except InvalidIdError as exc:
                            raise InvalidIdError(exc.token, exc.position + lo) from None
                        upcoming.first, upcoming.last = first, last
                if running is not None:   # its bytes leave while the upload's threads copy
                    try:
                        out += self._finish(running)
                    except _OutputTooLarge:
                        span = (running.last - running.first) // 2   # 0: alone, in pieces
                        first = running.first
                        running = None
                        if upcoming is not None:
                            self._abandon(upcoming)
                        continue
                    except InvalidIdError as exc:
                        raise InvalidIdError(exc.token, exc.position +
                                             int(starts[running.first])) from None
                    running = None
                if upcoming is not None:
                    self._submit(upcoming)
                    running, upcoming = upcoming, None
                    first, span, slot = running.last, n_docs, 1 - slot
                    continue
                if first >= n_docs:
                    break
                # no call was started: empty documents, or one larger than a call (done here,
                # with nothing in flight)
                lo = int(starts[first])
                try:
                    if last <= first:   # document `first` alone is larger than one call
                        out.append(self.decode(ids[lo:int(starts[first + 1])]))
                        first, span = first + 1, n_docs
                    else:
                        out += [b""] * (last - first)
                        first, span = last, n_docs
                except InvalidIdError as exc:
                    raise InvalidIdError(exc.token, exc.position + lo) from None
        except BaseException:
            for call in (running, upcoming):
                if call is not None:
                    self._abandon(call)
            raise
        return out

    def _staging_for(self, slot: int, nbytes: int) -> Buffer:
        buf = self._staging[slot]
        if buf is None or buf.nbytes < nbytes:
            if buf is not None:
                buf.destroy()
            size = max(min(1 << max(int(nbytes) - 1, 15).bit_length(),
                           self.max_staging_bytes), int(nbytes))
            buf = self._staging[slot] = self.device.buffer(
                size, np.uint8, label=f"bpe decode staging {slot}",
                usage=BufferUsage.MAP_READ | BufferUsage.COPY_DST)
        return buf

    def _upload_buffer(self, turn: int, nbytes: int) -> Buffer:
        buf = self._uploads[turn]
        if buf is None or buf.nbytes < nbytes:
            if buf is not None:
                buf.destroy()
            buf = self._uploads[turn] = self.device.buffer(
                nbytes, np.uint32, label=f"bpe decode upload {turn}",
                usage=BufferUsage.MAP_WRITE | BufferUsage.COPY_SRC)
        return buf

    def _mapped_upload(self, ids: np.ndarray, ids_buf: Buffer, turn: int) -> "_Upload":
        """Write `ids` into `ids_buf` through the two persistent upload buffers, in turn from
        `turn` (see MAPPED_UPLOAD_IDS): a piece is written into a mapped buffer on
        upload_threads threads and, but for the last, copied by a submit of its own; mapping
        a buffer again waits only for its own last copy, so writing one piece overlaps the
        GPU's copy of the one before. The last piece is left mapped with its copy threads
        running: the caller's submit waits for them, unmaps it and copies it."""
        n = int(ids.size)
        piece = max(1, min(n, self.upload_piece_ids))
        size = 4 * piece
        lo = 0
        while True:
            buf = self._upload_buffer(turn, size)
            hi = min(n, lo + piece)
            if hi == n:
                return _Upload.start(buf, ids[lo:hi], 4 * lo, self._copier, self.upload_threads,
                                     self.parallel_upload_ids)
            write_through_mapping(buf, ids[lo:hi], 4 * (hi - lo), lambda dst, src: self._copier(
                dst, src, self.upload_threads, self.parallel_upload_ids))
            with self.device.record("bpe decode upload") as rec:
                rec.copy(buf, ids_buf, 4 * (hi - lo), dst_offset=4 * lo)
            lo, turn = hi, 1 - turn

    def _start(self, ids: np.ndarray, doc_starts: np.ndarray | None = None,
               slot: int = 0) -> "_Pending":
        """Begin one call in `slot` (its own device buffers and staging buffer): the ids are
        written (a large call's last piece still being copied by threads); `_submit` records
        and submits it, `_finish` reads it back."""
        pool = self.pool
        n = int(ids.size)
        t0 = time.perf_counter()
        call = _Pending(slot=slot, ids=ids, doc_starts=doc_starts)
        call.ids_buf = pool.get(f"dec_ids{slot}", 4 * n)
        if n >= self.mapped_upload_ids:
            call.upload = self._mapped_upload(ids, call.ids_buf, slot)
        else:
            call.ids_buf.write(ids)
        self.upload_s += time.perf_counter() - t0
        return call

    def _submit(self, call: "_Pending") -> None:
        dev, pool, slot = self.device, self.pool, call.slot
        n = int(call.ids.size)
        lay = self.tables.layout
        t0 = time.perf_counter()
        if call.upload is not None:
            call.upload.finish()   # the copy threads' writes, then the unmap
        ids_buf = call.ids_buf
        lens = pool.get(f"dec_lens{slot}", 4 * n)
        offs = pool.get(f"dec_offs{slot}", 4 * (n + 1))
        status = pool.get(f"dec_status{slot}", 16)
        status.write(np.array([NONE, 0, 0, 0], np.uint32))
        dummy_r = pool.get("dec_dummy_r", 16)
        dummy_w = pool.get("dec_dummy_w", 16)
        self.upload_s += time.perf_counter() - t0
        guess = min(n * max(4, lay["max_tok_len"]), int(self.bytes_per_id * 1.25 * n) + 64)
        guess = min(-(-guess // 4) * 4, self.max_out_bytes)
        out = pool.get(f"dec_out{slot}", guess)
        doc_starts = call.doc_starts
        n_bounds = 0 if doc_starts is None else int(doc_starts.size)
        at = 16 + 4 * n_bounds   # staging: status | document byte offsets | bytes
        guess = max(4, min(guess, (self.max_staging_bytes - at) // 4 * 4))
        staging = self._staging_for(slot, at + guess)
        if n_bounds:
            starts_buf = pool.get(f"dec_doc_starts{slot}", 4 * n_bounds)
            starts_buf.write(doc_starts)
            doc_bytes = pool.get(f"dec_doc_bytes{slot}", 4 * n_bounds)
        # a role per slot: slot 1's values must not reach slot 0's submitted call
        params = self.uniforms.get(f"decode {slot}", "IIIIIIII", n, lay["n_table"],
                                   lay["info_off"], lay["bytes_off"], guess, 0, 0, 0)
        with dev.record("bpe decode", timing=self.profile) as rec:
            if call.upload is not None:   # the last piece of the ids
                rec.copy(call.upload.buffer, ids_buf, call.upload.nbytes,
                         dst_offset=call.upload.at_byte)
            rec.dispatch(self.k_lengths, [ids_buf, self.vocab_buf, dummy_r, lens, dummy_w, status,
                                          params], -(-n // 256), "dec_lengths")
            self.scan.record(rec, lens, n, offs, mode=0)
            rec.dispatch(self.k_total, [ids_buf, self.vocab_buf, offs, dummy_w, dummy_r, status,
                                        params], 1, "dec_total")
            rec.dispatch(self.k_gather, [ids_buf, self.vocab_buf, offs, dummy_w, out, status,
                                         params], -(-n // 256), "dec_gather")
            if n_bounds:
                bparams = self.uniforms.get(f"decode bounds {slot}", "IIIIIIII", n_bounds,
                                            lay["n_table"], 0, 0, 0, 0, 0, 0)
                rec.dispatch(self.k_bounds, [starts_buf, self.vocab_buf, offs, doc_bytes,
                                             dummy_w, status, bparams], -(-n_bounds // 256),
                             "dec_bounds")
                rec.copy(doc_bytes, staging, 4 * n_bounds, dst_offset=16)
            rec.copy(status, staging, 16)
            rec.copy(out, staging, guess, dst_offset=at)
        self.gpu_times += rec.gpu_times
        call.offs, call.out, call.status, call.staging = offs, out, status, staging
        call.at, call.guess, call.n_bounds = at, guess, n_bounds
        call.submitted = True

    def _finish(self, call: "_Pending"):
        """The submitted call's bytes (a list per document with doc_starts)."""
        dev, pool, lay = self.device, self.pool, self.tables.layout
        ids, n, staging, at, guess = call.ids, int(call.ids.size), call.staging, call.at, \
            call.guess
        n_bounds = call.n_bounds
        call.submitted = False
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
        # the guess was short: gather again at the exact size (the slot's own buffers)
        out = pool.get(f"dec_out{call.slot}", -(-total // 4) * 4)
        params = self.uniforms.get(f"decode {call.slot}", "IIIIIIII", n, lay["n_table"],
                                   lay["info_off"], lay["bytes_off"], total, 0, 0, 0)
        dummy_w = pool.get("dec_dummy_w", 16)
        with dev.record("bpe decode gather", timing=self.profile) as rec:
            rec.dispatch(self.k_gather, [call.ids_buf, self.vocab_buf, call.offs, dummy_w, out,
                                         call.status, params], -(-n // 256), "dec_gather")
        self.gpu_times += rec.gpu_times
        t0 = time.perf_counter()
        data = dev.download(out.view(0, -(-total // 4) * 4), np.uint8)[:total].tobytes()
        self.readback_s += time.perf_counter() - t0
        return _document_bytes(data, bounds) if n_bounds else data

    def _abandon(self, call: "_Pending") -> None:
        """Drop a started or submitted call (an error, or a split before it): its copy
        threads end and its upload buffer is unmapped; a submitted one is waited for."""
        if call.upload is not None:
            call.upload.finish()
        if call.submitted:
            call.submitted = False
            map_staging(call.staging, 4)
            call.staging.raw.unmap()

    def _call(self, ids: np.ndarray, doc_starts: np.ndarray | None = None):
        """The bytes of `ids`; with doc_starts (n_docs + 1 token offsets), a list of each
        document's bytes. One call, nothing else in flight (slot 0)."""
        call = self._start(ids, doc_starts, 0)
        try:
            self._submit(call)
        except BaseException:
            self._abandon(call)
            raise
        return self._finish(call)


class _Upload:
    """The last piece of a call's ids, being written into a mapped upload buffer by copy
    threads; `finish()` waits for them and unmaps it (once)."""

    def __init__(self, buffer: Buffer, at_byte: int, nbytes: int):
        self.buffer, self.at_byte, self.nbytes = buffer, at_byte, nbytes
        self._futures: list = []
        self._dst = None
        self._mapped = False

    @classmethod
    def start(cls, buffer: Buffer, ids: np.ndarray, at_byte: int, copier: ParallelCopy,
              threads: int, min_items: int) -> "_Upload":
        nbytes = 4 * int(ids.size)
        up = cls(buffer, at_byte, nbytes)
        raw = buffer.raw
        get = getattr(raw, "_experimental_get_mapped_range", None)
        if get is None:   # no writable view of a mapping: written here, at once
            write_through_mapping(buffer, ids, nbytes, lambda dst, src: copier(
                dst, src, threads, min_items))
            return up
        raw.map_async("WRITE", 0, nbytes).sync_wait()
        up._mapped = True
        try:
            up._dst = np.frombuffer(get(0, nbytes), np.uint32)
            if not up._dst.flags.writeable:
                raw.write_mapped(ids, 0)
            else:
                up._futures = copier.start(up._dst, ids, threads, min_items)
        except BaseException:
            up.finish()
            raise
        return up

    def finish(self) -> None:
        try:
            for future in self._futures:
                future.result()
        finally:
            self._futures = []
            self._dst = None   # a view of the mapping: gone before the unmap
            if self._mapped:
                self._mapped = False
                self.buffer.raw.unmap()


class _Pending:
    """One call of the decoder between _start and _finish."""

    def __init__(self, slot: int, ids: np.ndarray, doc_starts):
        self.slot, self.ids, self.doc_starts = slot, ids, doc_starts
        self.ids_buf = self.upload = None
        self.submitted = False
        self.first = self.last = 0
