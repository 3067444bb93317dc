"""Will a training configuration fit the device? Checked before anything is allocated.

    check_fits(device, [Need("parameters", n_bytes, binding=True), ...], hint="...",
               memory=device_memory(device))

Two limits: a tensor the kernels bind whole must fit one storage binding (and one buffer),
and the sum of everything must fit the device's memory when it is known: `device_memory`
gives the host's RAM for software Vulkan (lavapipe allocates there) and `nvidia-smi`'s for
NVIDIA adapters; otherwise (None) only the binding and buffer limits are checked. A configuration that does not fit raises ConfigDoesNotFitError
with what to change: a deterministic error (a daemon fails such a job at once, no retries).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from istanbul_errors import UserFacingError

HEADROOM = 1.10   # split-K scratch, uniforms, the driver's own: 10% over what we count


class ConfigDoesNotFitError(UserFacingError):
    """A model/batch/sequence/vocabulary that cannot fit the device: retrying cannot help."""


@dataclass(frozen=True)
class Need:
    what: str
    nbytes: int             # of one buffer
    binding: bool = True    # bound whole by a kernel (must fit one storage binding)
    count: int = 1          # this many buffers of nbytes each (e.g. one per layer)


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n < 10 * 2**30 else f"{n / 2**30:,.1f} GiB"


def device_memory(device) -> int | None:
    """Bytes of memory the device can allocate, when known (see the module docstring)."""
    info = getattr(device, "info", None)
    if info is not None and info.is_software:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            return None
    if "nvidia" in device.name.lower() and shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        sizes = [int(line.rsplit(",", 1)[1]) * 2**20 for line in out.splitlines()
                 if "," in line and line.rsplit(",", 1)[1].strip().isdigit()]
        return min(sizes) if sizes else None
    return None


def check_fits(device, needs: list[Need], *, hint: str, memory: int | None) -> int:
    """Raise ConfigDoesNotFitError unless every need fits; returns the total bytes counted.

    `hint` says what to change (e.g. "use a smaller batch or sequence length"); `memory`:
    bytes the device can allocate (`device_memory(device)`), None when unknown.
    """
    binding = int(device.limits.get("max-storage-buffer-binding-size", 1 << 27))
    buffer = int(device.limits.get("max-buffer-size", 1 << 28))
    for need in needs:
        limit = min(binding, buffer) if need.binding else buffer
        if need.nbytes > limit:
            raise ConfigDoesNotFitError(
                f"{need.what} needs {_mib(need.nbytes)} in one binding, more than "
                f"{device.name}'s limit of {_mib(limit)}: {hint}")
    total = sum(n.nbytes * n.count for n in needs)
    if memory is not None and total * HEADROOM > memory:
        largest = sorted(needs, key=lambda n: -n.nbytes * n.count)[:3]
        parts = ", ".join(f"{n.what} {_mib(n.nbytes * n.count)}" for n in largest)
        raise ConfigDoesNotFitError(
            f"this configuration needs about {_mib(total * HEADROOM)} on {device.name}, which "
            f"has {_mib(memory)} (largest: {parts}): {hint}")
    return total
