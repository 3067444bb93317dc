"""Finding a GPU adapter: listing, choosing by index or name, and the no-adapter error.

The choice order is the one users expect from a GPU tool: an explicit `--adapter` /
`ISTANBUL_ADAPTER` (an index into `istanbul devices`, or a case-insensitive substring of the
adapter's name), else the first discrete GPU, else an integrated one, else software Vulkan
(Mesa's lavapipe, "llvmpipe"), so tests and CI run on any machine with mesa-vulkan-drivers.

Adapters come from one WebGPU backend (`backends.py`: wgpu-native or Dawn; indexes are per
backend). With `--backend auto` the adapter is first looked up among Dawn's, and Dawn is
taken when that adapter offers f16 subgroup matrices; otherwise wgpu-native's list decides.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
from dataclasses import dataclass, field

from . import backends, settings
from .backends import Backend, NoAdapterError

log = logging.getLogger("istanbul.adapters")

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


@dataclass(frozen=True)
class AdapterInfo:
    index: int
    name: str
    adapter_type: str
    backend: str
    vendor: str
    driver: str
    features: tuple[str, ...] = field(repr=False)  # the engine's names (backends.py)
    limits: dict = field(repr=False)
    webgpu: str = "wgpu"  # the WebGPU backend that lists it: "wgpu" or "dawn"
    subgroup_matrix_configs: tuple = field(default=(), repr=False)

    @property
    def is_software(self) -> bool:
        return self.adapter_type == "CPU"

    def summary(self) -> str:
        return (f"[{self.index}] {self.name} ({self.adapter_type}, {self.backend}, "
                f"{self.driver}; {self.webgpu})")


def _describe(index: int, adapter, backend: Backend) -> AdapterInfo:
    info = adapter.info
    return AdapterInfo(
        index=index,
        name=info.get("device", "") or info.get("description", "") or "unknown",
        adapter_type=info.get("adapter_type", "Unknown"),
        backend=info.get("backend_type", "Unknown"),
        vendor=info.get("vendor", ""),
        driver=info.get("description", ""),
        features=tuple(sorted(backend.canonical(adapter.features))),
        limits=dict(adapter.limits),
        webgpu=backend.name,
        subgroup_matrix_configs=backend.subgroup_matrix_configs(adapter),
    )


def prepare_driver_environment() -> None:
    """Give the Vulkan drivers the runtime directory they look for before the first adapter
    request: without $XDG_RUNTIME_DIR (ssh, cron, containers) Mesa's window-system code prints
    "error: XDG_RUNTIME_DIR is invalid or not set" once per driver it loads. A directory the
    user set is kept; else a private 0700 one of ours (nothing is written into it)."""
    current = settings.read("XDG_RUNTIME_DIR")
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
    settings.write("XDG_RUNTIME_DIR", path)


def enumerate_adapters(backend: str | Backend = "wgpu") -> list[tuple[AdapterInfo, object]]:
    """All adapters of one backend the engine can use, in a stable order, described."""
    prepare_driver_environment()
    if isinstance(backend, str):
        backend = backends.load(backend)
    found = [a for a in backend.adapters() if a.info.get("backend_type") in USABLE_BACKENDS]
    return [(_describe(i, a, backend), a) for i, a in enumerate(found)]


def choose_adapter(spec: str | int | None = None, backend: str | None = None):
    """Pick (AdapterInfo, adapter). `spec` (or $ISTANBUL_ADAPTER) is an index or a name
    substring; `backend` (or $ISTANBUL_BACKEND) is wgpu, dawn or auto; `info.webgpu` names
    the backend chosen."""
    if spec is None or spec == "":
        spec = settings.read("ISTANBUL_ADAPTER")
    choice = backends.requested(backend)
    if choice == "auto":
        tensor_cores = _dawn_with_subgroup_matrices(spec)
        if tensor_cores is not None:
            return tensor_cores
        choice = "wgpu"
    chosen = backends.load(choice)
    return _pick(enumerate_adapters(chosen), spec, chosen)


def _dawn_with_subgroup_matrices(spec):
    """`auto`: Dawn's pick for `spec` if Dawn is installed and it has f16 subgroup matrices."""
    if not backends.dawn_installed():
        return None
    try:
        dawn = backends.load("dawn")
        info, adapter = _pick(enumerate_adapters(dawn), spec, dawn)
    except NoAdapterError as exc:  # BackendError too
        log.debug("auto backend: not Dawn (%s)", exc)
        return None
    if not backends.has_f16_subgroup_matrices(info.subgroup_matrix_configs):
        log.debug("auto backend: %s has no f16 subgroup matrices under Dawn", info.name)
        return None
    return info, adapter


def _pick(adapters, spec, backend: Backend):
    if not adapters:
        if backend.name == "dawn":
            raise NoAdapterError(
                "Dawn found no Vulkan adapter it accepts. Dawn refuses Mesa 22.3's lavapipe "
                "(Debian 12's); `bash scripts/setup.sh` unpacks Mesa 25's into "
                ".venv/mesa-backports/ for Dawn, or point $ISTANBUL_DAWN_ICD at a newer "
                "driver's manifest. " + NO_ADAPTER_HELP)
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
