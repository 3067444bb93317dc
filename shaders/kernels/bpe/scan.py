"""Device-wide exclusive prefix sums (shaders/kernels/bpe/bpe_scan.wgsl), a small buffer pool,
per-call uniform slots and a parallel host copy.

    scan = GpuScan(device, pool)
    with device.record() as rec:
        scan.record(rec, src, n, dst, mode=1)    # dst[0..n] = exclusive sums, dst[n] = total

mode 0 sums the values, mode 1 counts the entries that are not NONE (token starts).
"""

from __future__ import annotations

import concurrent.futures
import os
import struct
import threading
import weakref

import numpy as np

from wgpu import BufferUsage

from ...engine import Buffer, Device
from .packed_text import PackedRange

SCAN_FILE = "bpe_scan.wgsl"
BLOCK = 1024


class BufferPool:
    """Named device buffers that grow (by powers of two) and are otherwise reused, so repeated
    calls bind the same buffers and hit the kernels' bind-group caches."""

    def __init__(self, device: Device):
        self.device = device
        self._buffers: dict[str, Buffer] = {}

    def get(self, name: str, nbytes: int) -> Buffer:
        nbytes = max(int(nbytes), 16)
        buf = self._buffers.get(name)
        if buf is None or buf.nbytes < nbytes:
            if buf is not None:
                buf.destroy()
            size = 1 << (nbytes - 1).bit_length()
            if size > self.device.limits.get("max-storage-buffer-binding-size", 1 << 27):
                size = -(-nbytes // 16) * 16  # near the binding limit: exactly what is asked
            buf = self.device.buffer(size, np.uint32, label=name)
            self._buffers[name] = buf
        return buf

    def release(self) -> None:
        for buf in self._buffers.values():
            buf.destroy()
        self._buffers.clear()


_DEVICE_LOCKS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_LOCKS_LOCK = threading.Lock()


def device_lock(device) -> threading.RLock:
    """The one lock every GPU tokenizer call on `device` holds (its encoders take it after
    their own lock: encode.GpuEncoder)."""
    with _LOCKS_LOCK:
        lock = _DEVICE_LOCKS.get(device)
        if lock is None:
            lock = _DEVICE_LOCKS[device] = threading.RLock()
        return lock


# How long a staging map is polled for before the blocking wait (Device.wait_for): a short
# call's result comes back within it, and a long call costs at most this much CPU more.
MAP_POLL_S = 1e-3


def map_staging(buffer: Buffer, size: int) -> None:
    """Map the first `size` bytes of a MAP_READ staging buffer and wait for it (polled for
    up to MAP_POLL_S first).

    wgpu-py (wgpu-native) submits an empty command buffer before every such map: its
    workaround for data written through a mapping not being visible yet (wgpu-native#305).
    Staging buffers here are written only by copies in earlier submits, which the map waits
    for, so "READ_NOSYNC" (the mode wgpu-py's own queue.read_buffer uses) skips that submit:
    one submit less per call (~10% of a lone 1 KB encode on lavapipe). Other backends map
    plainly."""
    raw = buffer.raw
    mode = "READ_NOSYNC" if type(raw).__module__.startswith("wgpu.backends.wgpu_native") \
        else "READ"
    buffer.device.wait_for(raw.map_async(mode, 0, size), MAP_POLL_S)


# Threads of a parallel host copy (ParallelCopy) by default: up to 8, half the CPUs.
COPY_THREADS = max(1, min(8, (os.cpu_count() or 1) // 2))


class ParallelCopy:
    """dst[:] = src, in up to `threads` slices at once for arrays of at least `min_items`
    (numpy copies without the GIL): what moves ids into and out of mapped buffers. The pool
    of threads is made at the first parallel copy."""

    def __init__(self, name: str):
        self.name = name
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def __call__(self, dst: np.ndarray, src: np.ndarray, threads: int, min_items: int) -> None:
        for future in self.start(dst, src, threads, min_items):
            future.result()

    def start(self, dst: np.ndarray, src: np.ndarray, threads: int, min_items: int) -> list:
        """Begin dst[:] = src; returns the futures to wait for (none: already copied here)."""
        n = int(src.size)
        if threads <= 1 or n < min_items:
            dst[:] = src
            return []

        def part(lo: int, hi: int) -> None:
            dst[lo:hi] = src[lo:hi]
        return self._submit(part, n, threads)

    def map(self, part, n: int, threads: int, min_items: int) -> list:
        """[part(lo, hi) for the slices of range(n)], in up to `threads` threads for n of at
        least `min_items` (part must let go of the GIL to gain: numpy copies and reductions
        do), else one call here."""
        if threads <= 1 or n < min_items:
            return [part(0, n)]
        return [future.result() for future in self._submit(part, n, threads)]

    def _submit(self, part, n: int, threads: int) -> list:
        if self._pool is None or self._pool._max_workers < threads:
            self._pool = concurrent.futures.ThreadPoolExecutor(threads,
                                                               thread_name_prefix=self.name)
        step = -(-n // threads)
        return [self._pool.submit(part, lo, min(n, lo + step)) for lo in range(0, n, step)]


def write_through_mapping(buffer: Buffer, data, nbytes: int, copy, dtype=None) -> None:
    """Map the first nbytes of a MAP_WRITE buffer, put `data` there as `dtype` (default its
    own; a narrower integer type truncates, the caller has checked the values), zeros after
    it, and unmap. `copy(dst, src)` moves the values when the backend gives a writable
    view of the mapping (wgpu-py's `_experimental_get_mapped_range`, in wgpu-native's and
    Dawn's backends alike; e.g. a ParallelCopy); else `write_mapped` does, on this thread.
    `data` may also be a packed_text.PackedRange (uint8): written into the mapping by its
    own write_into, on this thread."""
    raw = buffer.raw
    raw.map_async("WRITE", 0, nbytes).sync_wait()
    try:
        get = getattr(raw, "_experimental_get_mapped_range", None)
        dtype = np.dtype(np.uint8 if isinstance(data, PackedRange) else dtype or data.dtype)
        dst = np.frombuffer(get(0, nbytes), dtype, count=nbytes // dtype.itemsize) \
            if get is not None else None
        size = data.size * dtype.itemsize
        if dst is None or not dst.flags.writeable:
            if isinstance(data, PackedRange):
                data = data.array()
            data = data.astype(dtype, copy=False)
            tail = np.zeros(nbytes - size, np.uint8)
            raw.write_mapped(np.concatenate([data.view(np.uint8), tail]) if tail.size
                             else data, 0)
        else:
            if isinstance(data, PackedRange):
                data.write_into(dst)
            else:
                copy(dst[:data.size], data)
            dst.view(np.uint8)[size:] = 0
        del dst   # a view of the mapping: gone before the unmap
    finally:
        raw.unmap()


class UniformSlots:
    """One uniform buffer per role, rewritten when its values change.

    `Device.params` keeps one buffer per distinct value, so every new input size would cost
    a buffer and a bind group per kernel (and grow both caches for ever); a slot keeps its
    buffer, so the kernels' bind groups are made once. queue.write_buffer is ordered with the
    submits, so a write for the next call never reaches one already submitted; within one
    recording a role must have one set of values (callers name roles by what differs).
    """

    def __init__(self, device: Device):
        self.device = device
        self._slots: dict[str, tuple[Buffer, bytes]] = {}

    def get(self, role: str, fmt: str, *values) -> Buffer:
        data = struct.pack("<" + fmt, *values)
        data += b"\0" * (-len(data) % 16)
        buf, held = self._slots.get(role, (None, b""))
        if buf is None or buf.nbytes < len(data):
            buf = self.device.buffer(len(data), label=f"uniform {role}",
                                     usage=BufferUsage.UNIFORM | BufferUsage.COPY_DST)
            held = b""
        if held != data:
            self.device.queue.write_buffer(buf.raw, 0, data)
            self._slots[role] = (buf, data)
        return buf


class GpuScan:
    def __init__(self, device: Device, pool: BufferPool):
        self.device = device
        self.pool = pool
        self.uniforms = UniformSlots(device)
        self.blocks = {m: device.kernel(SCAN_FILE, "scan_blocks", {"MODE": m}) for m in (0, 1)}
        self.add = device.kernel(SCAN_FILE, "scan_add")

    def record(self, rec, src: Buffer, n_src: int, dst: Buffer, mode: int = 0,
               level: int = 0) -> None:
        """Record an exclusive scan of n_src values of `src` into dst[0..n_src] (n_src + 1)."""
        n_out = n_src + 1
        blocks = -(-n_out // BLOCK)
        sums = self.pool.get(f"scan_sums{level}", 4 * blocks)
        params = self.uniforms.get(f"scan{level}", "IIII", n_src, n_out, 0, 0)
        rec.dispatch(self.blocks[mode], [src, dst, sums, params], blocks, "scan")
        if blocks > 1:
            scanned = self.pool.get(f"scan_offs{level}", 4 * (blocks + 1))
            self.record(rec, sums, blocks, scanned, 0, level + 1)
            dummy = self.pool.get("scan_dummy", 16)
            rec.dispatch(self.add, [dummy, dst, scanned, params], blocks, "scan")
