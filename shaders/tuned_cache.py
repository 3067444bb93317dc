"""Per-adapter tuning cache: which kernel configuration won for a (kernel, shape).

Ops with tunable kernels (matmuls, attention, cross-entropy) ask
`lookup(device, op, key, shape)` for a configuration string before falling back to their own
per-device-class default. This module only reads and writes the cache and imports no op: the
tuner that fills it (shaders/autotune.py, driven by `istanbul kernels tune` or
bench/autotune.py) sits on top of the ops.

Where the cache lives, per adapter (`adapter_key`: the adapter's name and backend, e.g.
`nvidia-h200-vulkan.json`):

    $ISTANBUL_AUTOTUNE_DIR/<key>.json      when the variable is set (read and written), else
    ~/.cache/istanbul/autotune/<key>.json  (read and written),
    shaders/tuned/<key>.json               the committed results (read only, consulted last)

An entry is {"config": "...", "us": best time, "candidates": {config: us, ...}}. A shape
that was not tuned takes the entry of the nearest tuned shape of the same op and key (by
log-distance of the dimensions, within a factor of 4 per dimension), else the op's default.
`ISTANBUL_AUTOTUNE=0` ignores every cache (defaults only).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent / "tuned"
NEAREST_FACTOR = 4.0
_memory: dict = {}
_answers: dict = {}   # (cache files, op, key, shape) -> config: ops call lookup every step


def adapter_key(device) -> str:
    """A file-name-safe key of the adapter (name and backend; the driver is recorded inside)."""
    text = f"{device.info.name}-{device.info.backend}".lower()
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "unknown-adapter"


def user_dir() -> Path:
    env = os.environ.get("ISTANBUL_AUTOTUNE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "istanbul" / "autotune"


def cache_paths(device) -> list[Path]:
    """Files consulted for this adapter, first match wins: the user's cache, then shipped."""
    name = adapter_key(device) + ".json"
    return [user_dir() / name, SHIPPED_DIR / name]


def shape_key(shape) -> str:
    return "x".join(str(int(s)) for s in shape)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return entries if isinstance(entries, dict) else {}


def _tables(device) -> list[dict]:
    paths = tuple(cache_paths(device))
    if paths not in _memory:
        _memory[paths] = [_read(p) for p in paths]
    return _memory[paths]


def forget(device=None) -> None:
    """Drop the in-memory copy of the cache files (after writing them, or in tests)."""
    _memory.clear()
    _answers.clear()


def lookup(device, op: str, key: str, shape) -> str | None:
    """The tuned configuration string for (op, key, shape), or None (use the default)."""
    if os.environ.get("ISTANBUL_AUTOTUNE", "1") == "0":
        return None
    memo = (tuple(cache_paths(device)), op, key, tuple(int(s) for s in shape))
    if memo not in _answers:
        _answers[memo] = _lookup(device, op, key, shape)
    return _answers[memo]


def _lookup(device, op: str, key: str, shape) -> str | None:
    prefix = f"{op}/{key}/"
    exact = prefix + shape_key(shape)
    for table in _tables(device):
        entry = table.get(exact)
        if isinstance(entry, dict) and isinstance(entry.get("config"), str):
            return entry["config"]
    best, best_dist = None, math.inf
    want = [max(int(s), 1) for s in shape]
    for table in _tables(device):
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
               "driver": device.info.driver, "adapter_key": adapter_key(device),
               "written": time.strftime("%Y-%m-%dT%H:%M:%S"), "entries": dict(sorted(entries.items()))}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    forget(device)
    return path


