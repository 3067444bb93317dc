"""WGSL source handling: kernel splitting and the preamble with feature-dependent enable lines.

A `.wgsl` file in `shaders/wgsl/` holds one or more kernels separated by marker lines

    // --- KERNEL: name ---

Text before the first marker is the file's header (its doc comment and helpers shared by the
file's kernels); it is included in every kernel of the file. Each kernel's entry point is the
function named like the kernel. The module compiled for a kernel is:

    enable lines (from the device's features) + 00_shared.wgsl + file header + kernel section

Enable lines are the engine's business, never a kernel file's, and depend on the compiler
(the backend's: naga for wgpu-native, Tint for Dawn). Both reject `enable f16;` unless
`shader-f16` was enabled on the device. naga rejects `enable subgroups;` (subgroup builtins
work once the `subgroup` feature is on); Tint requires it, and
`enable chromium_experimental_subgroup_matrix;` for subgroup matrices.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

WGSL_DIR = Path(__file__).resolve().parent / "wgsl"
COMPILERS = ("naga", "tint")
PREAMBLE_FILE = "00_shared.wgsl"
KERNEL_MARKER = re.compile(r"^\s*//\s*---\s*KERNEL:\s*([A-Za-z_][A-Za-z0-9_]*)\s*---\s*$", re.M)
ENABLE_LINE = re.compile(r"^\s*enable\s+[^;]+;", re.M)
# `@group(0) @binding(N) var<storage, read_write> name` (attributes in either order)
BINDING_DECL = re.compile(
    r"((?:@\s*(?:group|binding)\s*\(\s*\d+\s*\)\s*)+)var\s*<\s*(storage|uniform)\s*"
    r"(?:,\s*(read_write|read)\s*)?>\s*([A-Za-z_][A-Za-z0-9_]*)")
ATTRIBUTE = re.compile(r"@\s*(group|binding)\s*\(\s*(\d+)\s*\)")


class ShaderSourceError(ValueError):
    """A WGSL file that breaks the engine's source conventions."""


@dataclass(frozen=True)
class WgslFile:
    path: Path
    header: str
    kernels: dict  # name -> source of that kernel's section


@dataclass(frozen=True)
class Binding:
    name: str
    space: str      # "storage" or "uniform"
    writable: bool  # storage read_write


def enable_lines(features, compiler: str = "naga") -> str:
    """The `enable` directives a module needs on a device with these (engine-named)
    features, for this shader compiler."""
    if compiler not in COMPILERS:
        raise ValueError(f"unknown shader compiler {compiler!r}; one of {COMPILERS}")
    lines = []
    if "shader-f16" in features:
        lines.append("enable f16;")
    # naga rejects `enable subgroups;` (the device feature is enough); Tint requires it.
    if compiler == "tint" and "subgroup" in features:
        lines.append("enable subgroups;")
    if compiler == "tint" and "subgroup-matrix" in features:
        lines.append("enable chromium_experimental_subgroup_matrix;")
    return "\n".join(lines) + ("\n" if lines else "")


def bindings(code: str) -> dict:
    """{binding index: Binding} of a module's group-0 buffer declarations."""
    found = {}
    for m in BINDING_DECL.finditer(code):
        attrs = {k: int(v) for k, v in ATTRIBUTE.findall(m.group(1))}
        if attrs.get("group", 0) == 0 and "binding" in attrs:
            found[attrs["binding"]] = Binding(m.group(4), m.group(2),
                                              m.group(2) == "storage" and m.group(3) == "read_write")
    return found


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


@lru_cache(maxsize=None)
def load_file(name: str, directory: str = str(WGSL_DIR)) -> WgslFile:
    path = Path(directory) / name
    if not path.is_file():
        raise ShaderSourceError(f"no WGSL file {name!r} in {directory}")
    header, kernels = split_kernels(path.read_text(encoding="utf-8"), origin=str(path))
    return WgslFile(path=path, header=header, kernels=kernels)


@lru_cache(maxsize=None)
def preamble_text(directory: str = str(WGSL_DIR)) -> str:
    text = (Path(directory) / PREAMBLE_FILE).read_text(encoding="utf-8")
    if ENABLE_LINE.search(text):
        raise ShaderSourceError(f"{PREAMBLE_FILE}: must not contain enable directives")
    return text


def compose(features, file: WgslFile, kernel: str, directory: str = str(WGSL_DIR), *,
            compiler: str = "naga") -> str:
    """The full module source for one kernel on a device with `features`."""
    if kernel not in file.kernels:
        raise ShaderSourceError(
            f"{file.path.name} has no kernel {kernel!r}; it has {sorted(file.kernels)}")
    return (enable_lines(features, compiler) + preamble_text(directory) + "\n"
            + f"// ---- {file.path.name} ----\n" + file.header
            + f"// ---- kernel {kernel} ----\n" + file.kernels[kernel])
