"""Keeping the GPU's clock up while the service is in use (`istanbul serve --gpu-keep-clock S`).

A GPU's driver lowers its clock when it idles and raises it only under sustained high
utilization, which the service's load may never reach, so its calls can run at several times
the GPU time they take at full clock (dev/lone_request/README.md). With a hold of S
seconds, the GPU process keeps one
short register-only kernel running (roofline.wgsl's fma_f32, one workgroup, ~SPIN_S at full clock)
whenever it has no batch to encode and a request arrived in the last S seconds: the GPU looks
busy, the driver raises the clock, and a batch that arrives waits at most one spin. It costs
the GPU's power while the service is in use, so it is off by default (0).

The GPU process's thread never waits for a spin: it submits one, goes back to its sockets,
and submits the next once a non-blocking check says the last has finished (at most one is
ever queued). So a message that arrives mid-spin is read at once and its call is queued
behind the rest of that spin; when the thread waited for each spin, a lone request's message
waited for the spin and the wake-up after it (dev/lone_request/README.md). While it holds the
clock the thread polls, so it keeps a CPU core busy too.
"""

from __future__ import annotations

import time

import numpy as np

from istanbul.shaders.kernels.bpe.scan import device_lock

SPIN_S = 50e-6          # one spin's length at full clock (it is longer at a low clock)
ITERS_PER_SECOND = 1.2e8  # fma_f32 iterations per second of one workgroup at 1980 MHz (an
                          # estimate: 8 warps x 8 FMAs per iteration, 4 warp-FMAs per cycle)


class ClockKeeper:
    """Spins the GPU between batches for `hold_s` seconds after the last `used()`."""

    def __init__(self, device, hold_s: float, spin_s: float = SPIN_S):
        if hold_s < 0:
            raise ValueError(f"the clock hold must be >= 0 seconds, got {hold_s}")
        self.device, self.hold_s = device, float(hold_s)
        iters = max(1, int(spin_s * ITERS_PER_SECOND))
        self.kernel = device.kernel("roofline.wgsl", "fma_f32")
        self.out = device.buffer(256 * 4, np.float32, label="clock keeper sink")
        self.params = device.params("IfII", iters, 1.0, 0, 0)
        self.last_use = float("-inf")
        self.spins = 0
        self._spin_done = None   # the last spin's Device.work_done check (None: none yet)

    def used(self) -> None:
        """A request came in: hold the clock for hold_s seconds from now."""
        self.last_use = time.monotonic()

    def holding(self) -> bool:
        return self.hold_s > 0 and time.monotonic() - self.last_use < self.hold_s

    def wait_timeout(self) -> float | None:
        """How long the GPU process may wait for work before the next spin (None: block)."""
        return 0.0 if self.holding() else None

    def spin(self) -> None:
        """Submit one spin if the last one has finished; returns at once either way."""
        if not self.holding():
            return
        # the device's lock, as every tokenizer call on it takes: a spin never lands inside
        # another thread's call (before Dawn devices were made thread-safe, a spin's submit
        # and a test thread's call met and crashed the process)
        with device_lock(self.device):
            if self._spin_done is not None and not self._spin_done():
                return
            self.device.run(self.kernel, [self.out, self.params], 1, "clock keeper")
            self._spin_done = self.device.work_done()
        self.spins += 1
