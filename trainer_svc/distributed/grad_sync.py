"""Averaging the gradients over the ranks: the model's `gradient_hook` (bucketed all-reduce).

    model.gradient_hook = GradientAllReduce(group)   # GpuModel calls it between backward
                                                     # and AdamW, gradients complete

Gloo reduces host memory, so the f32 gradient buffer goes device -> host -> all-reduce ->
device, in buckets of `bucket_bytes` (256-byte aligned sub-ranges of the one gradient buffer,
in layout order). The steps are pipelined: bucket k+1 is copied off the GPU while bucket k's
all-reduce runs on Gloo's threads, and bucket k is written back (a queued write) while later
ones are still reducing. What this does NOT overlap is the backward pass itself: the whole
backward is one recorded command buffer, so the first bucket waits for it to finish. (Cutting
the backward into per-layer command buffers would let the last layers' buckets travel while
the first layers' backward runs; on one host the device<->host copies cost about as much as the
reduction, so the win is bounded by them: `bench/train_ddp.py` reports the sync's share.)

The average is the sum times 1/world: exact for a power-of-two world, and the same bits on
every rank (every rank scales the same reduced sum), so every rank's AdamW sees identical
gradients and the weights stay identical.
"""

from __future__ import annotations

import time

import numpy as np

DEFAULT_BUCKET_BYTES = 32 << 20
ALIGN_ELEMENTS = 64          # 256 bytes: a bindable (and copyable) sub-range offset


class GradientAllReduce:
    def __init__(self, group, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        if bucket_bytes < ALIGN_ELEMENTS * 4:
            raise ValueError(f"bucket_bytes must be at least {ALIGN_ELEMENTS * 4}")
        self.group = group
        self.bucket_elements = bucket_bytes // 4 // ALIGN_ELEMENTS * ALIGN_ELEMENTS
        self._host: np.ndarray | None = None
        # the last sync's wall time from the backward's end (the first bucket's copy
        # returning) to the last write-back: what the all-reduce adds to a step
        self.last_seconds = 0.0

    def buckets(self, total: int) -> list[tuple[int, int]]:
        """(start, count) in elements, covering [0, total) in order."""
        step = self.bucket_elements
        return [(s, min(step, total - s)) for s in range(0, total, step)]

    def __call__(self, model) -> None:
        start_time = None
        total, grads, dev = model.layout.total, model.grads, model.dev
        if self._host is None or self._host.shape != (total,):
            self._host = np.empty(total, np.float32)
        host, world = self._host, self.group.world
        pending = []
        for start, count in self.buckets(total):
            chunk = host[start:start + count]
            # one copy out of the mapped staging memory (dev.download would add a second);
            # the first bucket's read waits for the backward to finish
            chunk[:] = np.frombuffer(dev.queue.read_buffer(grads.raw, start * 4, count * 4),
                                     np.float32)
            start_time = start_time or time.perf_counter()
            pending.append((start, chunk, self.group.all_reduce_sum(chunk, async_op=True)))
        scale = np.float32(1.0 / world)
        for start, chunk, work in pending:
            work.wait()
            chunk *= scale
            grads.write(chunk, start * 4)
        self.last_seconds = time.perf_counter() - start_time
