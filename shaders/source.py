"""WGSL source handling: kernel splitting and the preamble with feature-dependent enable lines.

A `.wgsl` file in `shaders/wgsl/` holds one or more kernels separated by marker lines

    // --- KERNEL: name ---

Text before the first marker is the file's header (its doc comment and helpers shared by the
file's kernels); it is included in every kernel of the file. Each kernel's entry point is the
function named like the kernel. The module compiled for a kernel is:

    enable lines (from the device's features) + 00_shared.wgsl + file header + kernel section

Kernel files live in `shaders/wgsl/` or in a family folder `shaders/kernels/<family>/` (found
by their unique file name, or as `family/file.wgsl`). A template file (its kernels made with
template parameters, `Device.kernel(..., params=...)`) has its header and section expanded by
`shaders/wgsl_expand.py` first; the preamble is never expanded.

Enable lines are the engine's business, never a kernel file's: naga rejects `enable subgroups;`
(subgroup builtins work once the `subgroup` feature is on) and rejects `enable f16;` unless
`shader-f16` was enabled on the device, so the engine writes them from the device's features.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import wgsl_expand

WGSL_DIR = Path(__file__).resolve().parent / "wgsl"
KERNELS_DIR = Path(__file__).resolve().parent / "kernels"   # one folder per kernel family
PREAMBLE_FILE = "00_shared.wgsl"
KERNEL_MARKER = re.compile(r"^\s*//\s*---\s*KERNEL:\s*([A-Za-z_][A-Za-z0-9_]*)\s*---\s*$", re.M)
ENABLE_LINE = re.compile(r"^\s*enable\s+[^;]+;", re.M)


class ShaderSourceError(ValueError):
    """A WGSL file that breaks the engine's source conventions."""


@dataclass(frozen=True)
class WgslFile:
    path: Path
    header: str
    kernels: dict  # name -> source of that kernel's section


def enable_lines(features) -> str:
    """The `enable` directives a module needs on a device with these features."""
    lines = []
    if "shader-f16" in features:
        lines.append("enable f16;")
    # Never `enable subgroups;`: naga rejects it; the `subgroup` device feature is enough.
    return "\n".join(lines) + ("\n" if lines else "")


def split_kernels(text: str, origin: str = "<wgsl>") -> tuple[str, dict]:
    """Split a file's text into (header, {kernel name: section}) at KERNEL marker lines."""
    if ENABLE_LINE.search(text):
        raise ShaderSourceError(
            f"{origin}: has an `enable` directive; remove it, the engine injects enable lines "
            "from the device's features")
    marks = list(KERNEL_MARKER.finditer(text))
    if not marks:
        raise ShaderSourceError(f"{origin}: no `// --- KERNEL: name ---` marker line")
    header = text[: marks[0].start()]
    kernels = {}
    for i, mark in enumerate(marks):
        name = mark.group(1)
        if name in kernels:
            raise ShaderSourceError(f"{origin}: kernel {name!r} is defined twice")
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        kernels[name] = text[mark.end(): end]
    return header, kernels


def find_file(name: str, directory: str = str(WGSL_DIR)) -> Path:
    """A kernel file by name: `directory/name`, else `shaders/kernels/<family>/name` (a unique
    file name, or `family/file.wgsl`)."""
    path = Path(directory) / name
    if path.is_file():
        return path
    found = ([KERNELS_DIR / name] if "/" in name else sorted(KERNELS_DIR.glob(f"*/{name}")))
    found = [p for p in found if p.is_file()]
    if len(found) > 1:
        raise ShaderSourceError(f"WGSL file name {name!r} is in several families "
                                f"({', '.join(p.parent.name for p in found)}): name it as "
                                "family/file.wgsl")
    if not found:
        raise ShaderSourceError(f"no WGSL file {name!r} in {directory} or {KERNELS_DIR}/*/")
    return found[0]


@lru_cache(maxsize=None)
def load_file(name: str, directory: str = str(WGSL_DIR)) -> WgslFile:
    path = find_file(name, directory)
    header, kernels = split_kernels(path.read_text(encoding="utf-8"), origin=str(path))
    return WgslFile(path=path, header=header, kernels=kernels)


@lru_cache(maxsize=None)
def preamble_text(directory: str = str(WGSL_DIR)) -> str:
    text = (Path(directory) / PREAMBLE_FILE).read_text(encoding="utf-8")
    if ENABLE_LINE.search(text):
        raise ShaderSourceError(f"{PREAMBLE_FILE}: must not contain enable directives")
    return text


def compose(features, file: WgslFile, kernel: str, directory: str = str(WGSL_DIR),
            params: dict | None = None) -> str:
    """The full module source for one kernel on a device with `features`; `params`: the
    template parameters of a template file (header and section expanded by wgsl_expand)."""
    if kernel not in file.kernels:
        raise ShaderSourceError(
            f"{file.path.name} has no kernel {kernel!r}; it has {sorted(file.kernels)}")
    own = (f"// ---- {file.path.name} ----\n" + file.header
           + f"// ---- kernel {kernel} ----\n" + file.kernels[kernel])
    if params is not None:
        own = _expanded(own, tuple(sorted(params.items())), f"{file.path.name}:{kernel}")
    return enable_lines(features) + preamble_text(directory) + "\n" + own


@lru_cache(maxsize=None)
def _expanded(text: str, params: tuple, origin: str) -> str:
    """A template's expansion, once per text and parameters (a pass takes ~0.1-0.3 s; the
    pipelines of one expansion may differ in their override constants)."""
    return wgsl_expand.expand(text, dict(params), origin)
