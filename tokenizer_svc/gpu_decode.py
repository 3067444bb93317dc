"""GPU decoding: token ids -> bytes with a gather kernel (shaders/kernels/bpe/bpe_decode.wgsl).

    dec = GpuDecoder(device, tables, encoder_pool)
    data = dec.decode(np.array(ids, np.uint32))        # bytes; raises InvalidIdError

Two submissions: lengths + prefix sum + total (one small read: first invalid position and the
byte count), then the gather and the read of the bytes.
"""

from __future__ import annotations

import time

import numpy as np

from shaders.engine import Device
from .gpu_scan import BufferPool, GpuScan
from .gpu_tables import NONE, VocabTables

DECODE_FILE = "bpe_decode.wgsl"


class InvalidIdError(ValueError):
    """An id outside the vocabulary at `position` (the Encoding turns it into
    InvalidTokenError with the vocabulary's name)."""

    def __init__(self, token: int, position: int):
        super().__init__(f"token id {token} at position {position} is not in the vocabulary")
        self.token = token
        self.position = position


class GpuDecoder:
    def __init__(self, device: Device, tables: VocabTables, vocab_buf, pool: BufferPool | None = None):
        self.device = device
        self.tables = tables
        self.vocab_buf = vocab_buf
        self.pool = pool or BufferPool(device)
        self.scan = GpuScan(device, self.pool)
        self.k_lengths = device.kernel(DECODE_FILE, "dec_lengths")
        self.k_total = device.kernel(DECODE_FILE, "dec_total")
        self.k_gather = device.kernel(DECODE_FILE, "dec_gather")
        binding = int(device.limits.get("max-storage-buffer-binding-size", 1 << 27))
        # out may hold up to max_tok_len bytes per id; stay under the binding limit
        self.max_call_ids = max(1, binding // max(4, tables.layout["max_tok_len"]) - 1024)
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
            try:
                parts.append(self._call(ids[lo:lo + self.max_call_ids]))
            except InvalidIdError as exc:
                raise InvalidIdError(exc.token, exc.position + lo) from None
        return b"".join(parts)

    def _call(self, ids: np.ndarray) -> bytes:
        dev, pool = self.device, self.pool
        n = int(ids.size)
        lay = self.tables.layout
        t0 = time.perf_counter()
        ids_buf = pool.get("dec_ids", 4 * n)
        ids_buf.write(ids)
        lens = pool.get("dec_lens", 4 * n)
        offs = pool.get("dec_offs", 4 * (n + 1))
        status = pool.get("dec_status", 16)
        status.write(np.array([NONE, 0, 0, 0], np.uint32))
        dummy_r = pool.get("dec_dummy_r", 16)
        dummy_w = pool.get("dec_dummy_w", 16)
        self.upload_s += time.perf_counter() - t0
        params = dev.params("IIIIIIII", n, lay["n_table"], lay["info_off"], lay["bytes_off"],
                            0, 0, 0, 0)
        with dev.record("bpe decode lengths", timing=self.profile) as rec:
            rec.dispatch(self.k_lengths, [ids_buf, self.vocab_buf, dummy_r, lens, dummy_w, status,
                                          params], -(-n // 256), "dec_lengths")
            self.scan.record(rec, lens, n, offs, mode=0)
            rec.dispatch(self.k_total, [ids_buf, self.vocab_buf, offs, dummy_w, dummy_r, status,
                                        params], 1, "dec_total")
        self.gpu_times += rec.gpu_times
        t0 = time.perf_counter()
        first_bad, total = (int(v) for v in dev.download(status.view(0, 16), np.uint32)[:2])
        self.readback_s += time.perf_counter() - t0
        if first_bad != NONE:
            raise InvalidIdError(int(ids[first_bad]), first_bad)
        if total == 0:
            return b""
        out = pool.get("dec_out", -(-total // 4) * 4)
        params = dev.params("IIIIIIII", n, lay["n_table"], lay["info_off"], lay["bytes_off"],
                            total, 0, 0, 0)
        with dev.record("bpe decode gather", timing=self.profile) as rec:
            rec.dispatch(self.k_gather, [ids_buf, self.vocab_buf, offs, dummy_w, out, status,
                                         params], -(-n // 256), "dec_gather")
        self.gpu_times += rec.gpu_times
        t0 = time.perf_counter()
        data = dev.download(out.view(0, -(-total // 4) * 4), np.uint8)[:total].tobytes()
        self.readback_s += time.perf_counter() - t0
        return data
