"""Finding a GPU adapter: listing, choosing by index or name, and the no-adapter error.

The choice order is the one users expect from a GPU tool: an explicit `--adapter` /
`ISTANBUL_ADAPTER` (an index into `istanbul devices`, or a case-insensitive substring of the
adapter's name), else the first discrete GPU, else an integrated one, else software Vulkan
(Mesa's lavapipe, "llvmpipe"), so tests and CI run on any machine with mesa-vulkan-drivers.
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass, field

import wgpu

# OpenGL adapters lack subgroups and timestamps inside passes; the engine does not use them.
USABLE_BACKENDS = ("Vulkan", "Metal", "D3D12")
TYPE_PREFERENCE = ("DiscreteGPU", "IntegratedGPU", "VirtualGPU", "CPU", "Unknown")

NO_ADAPTER_HELP = (
    "no Vulkan adapter found. istanbul runs its kernels through WebGPU on Vulkan. "
    "Without a GPU install Mesa's software Vulkan driver (lavapipe): "
    "`sudo apt-get install mesa-vulkan-drivers` (Debian/Ubuntu); "
    "with a GPU install its vendor driver with Vulkan support (for NVIDIA, the driver's "
    "Vulkan ICD; in containers set NVIDIA_DRIVER_CAPABILITIES=compute,graphics,utility). "
    "`vulkaninfo --summary` shows what the Vulkan loader sees."
)


class NoAdapterError(RuntimeError):
    """No usable GPU adapter (or none matching the requested one)."""


@dataclass(frozen=True)
class AdapterInfo:
    index: int
    name: str
    adapter_type: str
    backend: str
    vendor: str
    driver: str
    features: tuple[str, ...] = field(repr=False)
    limits: dict = field(repr=False)

    @property
    def is_software(self) -> bool:
        return self.adapter_type == "CPU"

    def summary(self) -> str:
        return f"[{self.index}] {self.name} ({self.adapter_type}, {self.backend}, {self.driver})"


def _describe(index: int, adapter) -> AdapterInfo:
    info = adapter.info
    return AdapterInfo(
        index=index,
        name=info.get("device", "") or info.get("description", "") or "unknown",
        adapter_type=info.get("adapter_type", "Unknown"),
        backend=info.get("backend_type", "Unknown"),
        vendor=info.get("vendor", ""),
        driver=info.get("description", ""),
        features=tuple(sorted(adapter.features)),
        limits=dict(adapter.limits),
    )


def prepare_driver_environment() -> None:
    """Give the Vulkan drivers the runtime directory they look for before the first adapter
    request: without $XDG_RUNTIME_DIR (ssh, cron, containers) Mesa's window-system code prints
    "error: XDG_RUNTIME_DIR is invalid or not set" once per driver it loads. A directory the
    user set is kept; else a private 0700 one of ours (nothing is written into it)."""
    current = os.environ.get("XDG_RUNTIME_DIR")
    if current and os.path.isdir(current):
        return
    path = os.path.join(tempfile.gettempdir(), f"istanbul-runtime-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():  # not ours: a fresh one
        path = tempfile.mkdtemp(prefix="istanbul-runtime-")
    os.environ["XDG_RUNTIME_DIR"] = path


def enumerate_adapters() -> list[tuple[AdapterInfo, object]]:
    """All adapters the engine can use, in a stable order, with their descriptions."""
    prepare_driver_environment()
    found = []
    for adapter in wgpu.gpu.enumerate_adapters_sync():
        if adapter.info.get("backend_type") in USABLE_BACKENDS:
            found.append(adapter)
    return [(_describe(i, a), a) for i, a in enumerate(found)]


def choose_adapter(spec: str | int | None = None):
    """Pick an adapter. `spec` (or $ISTANBUL_ADAPTER) is an index or a name substring."""
    if spec is None or spec == "":
        spec = os.environ.get("ISTANBUL_ADAPTER") or None
    adapters = enumerate_adapters()
    if not adapters:
        raise NoAdapterError(NO_ADAPTER_HELP)
    if spec is not None:
        text = str(spec).strip()
        if text.isdigit():
            index = int(text)
            if index >= len(adapters):
                names = "; ".join(info.summary() for info, _ in adapters)
                raise NoAdapterError(f"adapter index {index} is out of range; adapters: {names}")
            return adapters[index]
        matches = [(i, a) for i, a in adapters if text.lower() in i.name.lower()]
        if not matches:
            names = "; ".join(info.summary() for info, _ in adapters)
            raise NoAdapterError(f"no adapter name contains {text!r}; adapters: {names}")
        return matches[0]
    return min(adapters, key=lambda ia: (TYPE_PREFERENCE.index(ia[0].adapter_type)
                                         if ia[0].adapter_type in TYPE_PREFERENCE else 99, ia[0].index))
