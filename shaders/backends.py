"""Which WebGPU implementation runs the kernels: wgpu-native (naga) or Dawn (Tint).

Both speak wgpu-py's API: `wgpu` (wgpu-native, the default dependency) and `wgpudawn`
(Google's Dawn, the optional extra `istanbul[dawn]`). They differ in what this module hides
from the rest of the engine:

- feature names: Dawn says `subgroups`, `chromium-experimental-subgroup-matrix`, ...; the
  engine uses wgpu-native's names (`subgroup`) and `subgroup-matrix` (FEATURE_ALIASES);
- the shader compiler and its `enable` lines (`source.enable_lines`): naga rejects
  `enable subgroups;`, Tint requires it;
- Dawn's toggles, given before its instance is created: `allow_unsafe_apis` (experimental
  features such as subgroup matrices), `vulkan_enable_f16_on_nvidia` (`shader-f16` on
  NVIDIA), plus any named in $ISTANBUL_DAWN_TOGGLES (e.g. `disable_robustness`); and on
  every Dawn device (DAWN_DEVICE_TOGGLES): bounds checks by the driver's robustBufferAccess2
  instead of Tint's index clamping where Vulkan offers it, clamping skipped where range analysis proves an index in bounds, and exact
  timestamps (Dawn quantizes them by default, a browser's anti-fingerprinting measure: GPU
  times come out in multiples of tens of microseconds). Out-of-bounds accesses stay harmless
  either way while robustness itself is on. Robustness (Tint's bounds-checking transform)
  is on by default; the trainer's and the tokenizer's devices turn it off
  (`Device(robustness=False)`: they run only the project's kernels, which check their own
  bounds; the tensor-core matmuls and the pre-tokenizer run much faster without it,
  dev/tensor_core_matmul/README.md, dev/tokenizer_throughput/README.md;
  tokenizer_svc.gpu_backend.ROBUSTNESS).
  $ISTANBUL_DAWN_ROBUSTNESS=on|off overrides both, and `disable_robustness` in
  $ISTANBUL_DAWN_TOGGLES turns it off everywhere;
- the Vulkan driver Dawn may need: Dawn refuses Debian 12's lavapipe (Mesa 22.3) but runs on
  Mesa 25's, which `scripts/setup.sh` unpacks privately into `.venv/mesa-backports/`; its
  driver manifest is added to Dawn's Vulkan loader only ($ISTANBUL_DAWN_ICD overrides it).

The choice (`--backend` or $ISTANBUL_BACKEND): `wgpu`, `dawn`, or `auto` (the default):
Dawn when it is installed and the adapter offers f16 subgroup matrices (tensor cores),
else wgpu-native. `adapters.choose_adapter` resolves it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from . import settings

log = logging.getLogger("istanbul.backends")

CHOICES = settings.SETTINGS.variable("ISTANBUL_BACKEND").choices   # auto, wgpu, dawn
# Where scripts/setup.sh puts the newer lavapipe's manifest (inside the virtual environment).
PRIVATE_ICD = Path(sys.prefix) / "mesa-backports" / "lvp_icd.json"
# Always on under Dawn: experimental features need the first, f16 on NVIDIA the second.
DAWN_TOGGLES = ("allow_unsafe_apis", "vulkan_enable_f16_on_nvidia")
# Every Dawn device: robustness by the driver where it can, clamping skipped where provably in
# bounds, exact timestamps (no speed cost measured: dev/tensor_core_matmul/README.md).
# vulkan_use_cooperative_matrix_robust_access is not asked for: drivers without the feature
# make Dawn force it off with a warning.
DAWN_DEVICE_TOGGLES = ("vulkan_use_buffer_robust_access_2",
                       "enable_integer_range_analysis_in_robustness")
DAWN_DEVICE_DISABLED = ("timestamp_quantization",)

# Dawn's feature that makes a device safe to call from several threads (a lock per call)
SYNC_FEATURE = "implicit-device-synchronization"

# Dawn's feature name -> the engine's (wgpu-native's where it has one).
FEATURE_ALIASES = {
    "dawn": {
        "subgroups": "subgroup",
        "chromium-experimental-subgroup-matrix": "subgroup-matrix",
        "chromium-experimental-timestamp-query-inside-passes": "timestamp-query-inside-passes",
    },
    "wgpu": {},
}


class NoAdapterError(RuntimeError):
    """No usable GPU adapter (or none matching the requested one)."""


class BackendError(NoAdapterError):
    """No adapter from the backend asked for: an unknown name, or a backend that is not
    installed or will not start (the CLI prints it like NoAdapterError, without traceback)."""


@dataclass(frozen=True)
class Backend:
    name: str          # "wgpu" or "dawn"
    compiler: str      # "naga" or "tint": decides the enable lines
    api: object = field(repr=False)  # the wgpu-py-style module
    device_toggles: tuple = ()       # Dawn device-stage toggles from $ISTANBUL_DAWN_TOGGLES

    def canonical(self, names) -> frozenset:
        """Feature names as the engine spells them."""
        aliases = FEATURE_ALIASES[self.name]
        return frozenset(aliases.get(n, n) for n in names)

    def native(self, names) -> list:
        """The engine's feature names as this backend spells them."""
        back = {v: k for k, v in FEATURE_ALIASES[self.name].items()}
        return [back.get(n, n) for n in names]

    def adapters(self) -> list:
        with _dawn_drivers() if self.name == "dawn" else contextlib.nullcontext():
            return list(self.api.gpu.enumerate_adapters_sync())

    def subgroup_matrix_configs(self, adapter) -> tuple:
        """Dawn's subgroup-matrix configurations of an adapter (dicts with component_type,
        result_component_type, m, n, k, min/max_subgroup_size); () elsewhere."""
        if self.name != "dawn":
            return ()
        from wgpudawn.backends.dawn import extras
        props = extras.get_adapter_properties(adapter) or {}
        return tuple(dict(c) for c in props.get("subgroup_matrix_configs") or ())

    def request_device(self, adapter, features, limits, robustness: bool = True):
        """A device with these (engine-named) features and limits; `robustness=False` turns
        Dawn's bounds-checking transform off (see dawn_robustness; wgpu-native has none)."""
        features = self.native(features)
        if self.name == "dawn":
            from wgpudawn.backends.dawn import extras
            # Dawn's device is not thread-safe without it; ours is used from several threads
            # (the service's GPU process and its tests, the tokenizer's callers), and wgpu-py
            # releases objects on whichever thread drops them. Without it a submit can crash
            # the process.
            if SYNC_FEATURE in adapter.features:
                features = [*features, SYNC_FEATURE]
            off = () if robustness else ("disable_robustness",)
            toggles = list(dict.fromkeys((*DAWN_DEVICE_TOGGLES, *self.device_toggles, *off)))
            return extras.request_device_sync(adapter, required_features=features,
                                              required_limits=limits, enable_toggles=toggles,
                                              disable_toggles=list(DAWN_DEVICE_DISABLED))
        return adapter.request_device_sync(required_features=features, required_limits=limits)


def dawn_robustness(default: bool = True) -> bool:
    """Whether a Dawn device keeps robustness: $ISTANBUL_DAWN_ROBUSTNESS (on/off, 1/0) if set,
    else `default` (the caller's: True, or False for the trainer's devices)."""
    chosen = settings.read("ISTANBUL_DAWN_ROBUSTNESS")
    return bool(default) if chosen is None else chosen


def has_f16_subgroup_matrices(configs) -> bool:
    """f16 x f16 -> f32 subgroup matrices: what the tensor-core kernels need."""
    return any(c.get("component_type") == "f16" and c.get("result_component_type") == "f32"
               for c in configs)


def requested(choice: str | None = None) -> str:
    """The backend asked for: `choice`, else $ISTANBUL_BACKEND, else "auto"."""
    if not choice:
        return settings.read("ISTANBUL_BACKEND")
    text = choice.strip().lower()
    if text not in CHOICES:
        raise BackendError(f"--backend is {text!r}; use one of {', '.join(CHOICES)}")
    return text


def dawn_installed() -> bool:
    return importlib.util.find_spec("wgpudawn") is not None


def load(name: str) -> Backend:
    """The backend `name` ("wgpu" or "dawn"), started once per process."""
    if name == "wgpu":
        return _wgpu()
    if name == "dawn":
        if not dawn_installed():
            raise BackendError(
                "the Dawn backend needs the wgpudawn package: pip install 'istanbul[dawn]' "
                "(or choose --backend wgpu)")
        return _dawn(settings.read("ISTANBUL_DAWN_TOGGLES"))
    raise BackendError(f"unknown backend {name!r}; use wgpu or dawn")


@lru_cache(maxsize=None)
def _wgpu() -> Backend:
    import wgpu
    return Backend("wgpu", "naga", wgpu)


@lru_cache(maxsize=None)
def _dawn(extra: tuple[str, ...]) -> Backend:
    import wgpudawn
    from wgpudawn.backends.dawn import extras
    known = extras.all_toggles()
    unknown = [t for t in extra if t not in known]
    if unknown:
        raise BackendError(f"$ISTANBUL_DAWN_TOGGLES names unknown Dawn toggle(s) "
                           f"{', '.join(unknown)}; "
                           "wgpudawn.backends.dawn.extras.all_toggles() lists them")
    device = tuple(t for t in extra if known[t]["stage"] == "device")
    early = [t for t in (*DAWN_TOGGLES, *extra) if t not in device]
    # The instance is created by the first adapter request; its toggles must come first.
    extras.set_instance_extras(enable_toggles=early)
    return Backend("dawn", "tint", wgpudawn, device_toggles=device)


def dawn_icd() -> Path | None:
    """The private Vulkan driver manifest Dawn's loader gets, if any: $ISTANBUL_DAWN_ICD,
    else the one scripts/setup.sh unpacked into this environment."""
    path = settings.read("ISTANBUL_DAWN_ICD")
    if path is not None:
        if not path.is_file():
            raise BackendError(f"$ISTANBUL_DAWN_ICD is {str(path)!r}, which is not a file; point "
                               "it at a Vulkan driver manifest (.json) or unset it")
        return path
    return PRIVATE_ICD if PRIVATE_ICD.is_file() else None


@contextlib.contextmanager
def _dawn_drivers():
    """Dawn's adapter discovery: the private lavapipe added to the Vulkan loader's drivers
    (only when the user did not choose the driver list with VK_DRIVER_FILES /
    VK_ICD_FILENAMES), for this call only so wgpu-native's list stays as it was; Dawn's own
    stderr lines about adapters it refuses (Mesa 22.3's lavapipe) go to the debug log."""
    icd = dawn_icd()
    chosen = settings.read("VK_DRIVER_FILES") or settings.read("VK_ICD_FILENAMES")
    key = "VK_ADD_DRIVER_FILES"
    before = settings.raw(key)
    if icd is not None and not chosen:
        settings.write(key, os.pathsep.join(p for p in (str(icd), before) if p))
    try:
        with _stderr_to_log():
            yield
    finally:
        settings.write(key, before)


@contextlib.contextmanager
def _stderr_to_log():
    """Native stderr (fd 2) captured for the block and logged at debug level."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (embedded, captured)
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), fd)
        try:
            yield
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode("utf-8", "replace").strip()
            if text:
                log.debug("Dawn adapter discovery: %s", text)
