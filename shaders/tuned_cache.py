"""Per-adapter tuning cache: which kernel configuration won for a (kernel, shape).

Ops with tunable kernels (matmuls, attention, cross-entropy) ask
`lookup(device, op, key, shape)` for a configuration string before falling back to their own
per-device-class default. This module only reads and writes the cache and imports no op: the
tuner that fills it (shaders/autotune.py, driven by `istanbul kernels tune` or
bench/autotune.py) sits on top of the ops.

Where the cache lives, per adapter and WebGPU implementation (`adapter_key`: the adapter's
name, its graphics API and the implementation, e.g. `nvidia-h200-vulkan-wgpu.json` and
`nvidia-h200-vulkan-dawn.json`: naga and Tint compile the same WGSL differently, so a
configuration that wins on one may lose on the other):

    $ISTANBUL_AUTOTUNE_DIR/<key>.json      when the variable is set (read and written), else
    ~/.cache/istanbul/autotune/<key>.json  (read and written),
    shaders/tuned/<key>.json               the committed results (read only),

then, for an (op, key) this implementation has no entry for, the same adapter's files of the
other implementation ("borrowed": the kernels are the same WGSL, so the configuration is
valid; only its rank may differ), and a cache written before the key named the implementation
(`<name>-<api>.json`, read as wgpu's: only wgpu-native existed then). `istanbul kernels tune`
under one implementation writes that implementation's file, which then wins over borrowed
entries.

An entry is {"config": "...", "us": best time, "candidates": {config: us, ...}}. A shape
that was not tuned takes the entry of the nearest tuned shape of the same op and key (by
log-distance of the dimensions, within a factor of 4 per dimension), else the op's default.
`ISTANBUL_AUTOTUNE=0` ignores every cache (defaults only).
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

from . import settings

SHIPPED_DIR = Path(__file__).resolve().parent / "tuned"
NEAREST_FACTOR = 4.0
_memory: dict = {}
_answers: dict = {}   # (adapter, implementation, cache dirs, op, key, shape) -> config
_UNKNOWN = object()
WEBGPU_IMPLEMENTATIONS = ("wgpu", "dawn")


def adapter_key(device, webgpu: str | None = None) -> str:
    """A file-name-safe key of the adapter and WebGPU implementation (the driver is recorded
    inside): `webgpu` names another implementation's file of the same adapter."""
    impl = webgpu or _webgpu(device)
    return _safe(f"{device.info.name}-{device.info.backend}-{impl}")


def _webgpu(device) -> str:
    return str(getattr(device.info, "webgpu", None) or "wgpu").lower()


def _safe(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown-adapter"


def user_dir() -> Path:
    chosen = settings.read("ISTANBUL_AUTOTUNE_DIR")
    if chosen is not None:
        return chosen
    return Path.home() / ".cache" / "istanbul" / "autotune"


def cache_paths(device) -> list[Path]:
    """This implementation's files for the adapter, first match wins: the user's, shipped."""
    name = adapter_key(device) + ".json"
    paths = [user_dir() / name, SHIPPED_DIR / name]
    if _webgpu(device) == "wgpu":
        paths.append(_legacy_path(device))
    return paths


def borrowed_paths(device) -> list[Path]:
    """The same adapter's files of the other implementation(s), consulted after this one's."""
    paths = []
    for impl in WEBGPU_IMPLEMENTATIONS:
        if impl != _webgpu(device):
            name = adapter_key(device, impl) + ".json"
            paths += [user_dir() / name, SHIPPED_DIR / name]
            if impl == "wgpu":
                paths.append(_legacy_path(device))
    return paths


def _legacy_path(device) -> Path:
    """A user cache written before the key named the implementation: wgpu-native's (the only
    implementation then)."""
    return user_dir() / (_safe(f"{device.info.name}-{device.info.backend}") + ".json")


def shape_key(shape) -> str:
    return "x".join(str(int(s)) for s in shape)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return entries if isinstance(entries, dict) else {}


def _tables(device) -> list[list[dict]]:
    """[this implementation's tables, borrowed tables]: a lookup tries the first group fully
    (exact shape, then nearest) before the second."""
    paths = (tuple(cache_paths(device)), tuple(borrowed_paths(device)))
    if paths not in _memory:
        _memory[paths] = [[_read(p) for p in group] for group in paths]
    return _memory[paths]


def sources(device) -> list[tuple[Path, int, bool]]:
    """(file, entries, borrowed) of each cache file that exists for the adapter, in lookup
    order (`device` needs only `.info`)."""
    found = []
    for group, borrowed in ((cache_paths(device), False), (borrowed_paths(device), True)):
        for path in group:
            if path.is_file():
                found.append((path, len(_read(path)), borrowed))
    return found


def forget(device=None) -> None:
    """Drop the in-memory copy of the cache files (after writing them, or in tests)."""
    _memory.clear()
    _answers.clear()


def lookup(device, op: str, key: str, shape) -> str | None:
    """The tuned configuration string for (op, key, shape), or None (use the default)."""
    if not settings.read("ISTANBUL_AUTOTUNE"):
        return None
    # keyed by what decides the files (not the paths themselves: building them costs
    # pathlib calls, and the ops ask ~1,000 times a training step)
    memo = (device.info.name, device.info.backend, _webgpu(device),
            settings.raw("ISTANBUL_AUTOTUNE_DIR"), settings.raw("HOME"), op, key,
            tuple(int(s) for s in shape))
    found = _answers.get(memo, _UNKNOWN)
    if found is _UNKNOWN:   # (None is an answer: no entry, use the default)
        found = _answers[memo] = _lookup(device, op, key, shape)
    return found


def _lookup(device, op: str, key: str, shape) -> str | None:
    for tables in _tables(device):
        found = _lookup_in(tables, op, key, shape)
        if found is not None:
            return found
    return None


def _lookup_in(tables: list[dict], op: str, key: str, shape) -> str | None:
    prefix = f"{op}/{key}/"
    exact = prefix + shape_key(shape)
    for table in tables:
        entry = table.get(exact)
        if isinstance(entry, dict) and isinstance(entry.get("config"), str):
            return entry["config"]
    best, best_dist = None, math.inf
    want = [max(int(s), 1) for s in shape]
    for table in tables:
        for name, entry in table.items():
            if not name.startswith(prefix) or not isinstance(entry, dict):
                continue
            try:
                dims = [max(int(s), 1) for s in name[len(prefix):].split("x")]
            except ValueError:
                continue
            if len(dims) != len(want):
                continue
            gaps = [abs(math.log(a / b)) for a, b in zip(dims, want)]
            if max(gaps) > math.log(NEAREST_FACTOR):
                continue
            if sum(gaps) < best_dist and isinstance(entry.get("config"), str):
                best, best_dist = entry["config"], sum(gaps)
        if best is not None:
            return best
    return None


def save(device, results: dict, path: Path | None = None) -> Path:
    """Merge {"op/key/shape": entry} into the user's cache file for this adapter."""
    path = Path(path) if path is not None else cache_paths(device)[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = _read(path) if path.exists() else {}
    entries.update(results)
    payload = {"adapter": device.info.name, "backend": device.info.backend,
               "webgpu": _webgpu(device), "driver": device.info.driver, "adapter_key": adapter_key(device),
               "written": time.strftime("%Y-%m-%dT%H:%M:%S"), "entries": dict(sorted(entries.items()))}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    forget(device)
    return path


