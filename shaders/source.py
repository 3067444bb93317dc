"""WGSL source handling: finding a kernel file, kernel splitting, and the preamble with
feature-dependent enable lines.

Kernel files live in their family's folder, `shaders/kernels/<family>/*.wgsl`; a file is named
either by its file name alone (names are unique across the families) or as
`<family>/<file>.wgsl`.

A `.wgsl` file holds one or more kernels separated by marker lines

    // --- KERNEL: name ---

Text before the first marker is the file's header (its doc comment and helpers shared by the
file's kernels); it is included in every kernel of the file. Each kernel's entry point is the
function named like the kernel. The module compiled for a kernel is:

    enable lines (from the device's features) + 00_shared.wgsl + file header + kernel section

A template file (its kernels made with template parameters, `Device.kernel(..., params=...)`)
has its header and section expanded by `shaders/wgsl_expand.py` first; the preamble is never
expanded.

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

from . import wgsl_expand

KERNELS_DIR = Path(__file__).resolve().parent / "kernels"   # one folder per kernel family
COMPILERS = ("naga", "tint")
PREAMBLE_FILE = "00_shared.wgsl"   # in KERNELS_DIR: every kernel of every family includes it
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
def kernel_files() -> dict[str, Path]:
    """{file name: path} of every kernel file in shaders/kernels/*/. Two files of one name
    would make a name ambiguous: that is an error."""
    found: dict[str, Path] = {}
    paths = sorted(KERNELS_DIR.glob("*/*.wgsl"))
    for path in paths:
        if path.name in found:
            raise ShaderSourceError(
                f"kernel file name {path.name!r} is used twice ({found[path.name]} and {path}); "
                "file names must be unique across shaders/kernels/*/ so "
                "`device.kernel(file, name)` finds one file; rename one of them")
        found[path.name] = path
    return found


def find_file(name: str) -> Path:
    """The path of kernel file `name`: a file name, or `family/file.wgsl`."""
    if "/" in name:
        path = KERNELS_DIR / name
        if path.is_file() and path.parent.parent == KERNELS_DIR:
            return path
        raise ShaderSourceError(f"no WGSL file {name!r} in {KERNELS_DIR} (expected "
                                "`<family>/<file>.wgsl`, e.g. `rmsnorm/02_rmsnorm.wgsl`)")
    path = kernel_files().get(name)
    if path is None:
        raise ShaderSourceError(f"no WGSL file {name!r} in {KERNELS_DIR}/*/; "
                                f"known files: {', '.join(sorted(kernel_files()))}")
    return path


@lru_cache(maxsize=None)
def load_file(name: str, directory: str | None = None) -> WgslFile:
    """The kernel file `name` (see find_file), or `directory/name` when a directory is given."""
    if directory is None:
        path = find_file(name)
    else:
        path = Path(directory) / name
        if not path.is_file():
            raise ShaderSourceError(f"no WGSL file {name!r} in {directory}")
    header, kernels = split_kernels(path.read_text(encoding="utf-8"), origin=str(path))
    return WgslFile(path=path, header=header, kernels=kernels)


@lru_cache(maxsize=None)
def preamble_text(directory: str = str(KERNELS_DIR)) -> str:
    text = (Path(directory) / PREAMBLE_FILE).read_text(encoding="utf-8")
    if ENABLE_LINE.search(text):
        raise ShaderSourceError(f"{PREAMBLE_FILE}: must not contain enable directives")
    return text


def compose(features, file: WgslFile, kernel: str, directory: str = str(KERNELS_DIR),
            params: dict | None = None, *, compiler: str = "naga") -> str:
    """The full module source for one kernel on a device with `features`; `params`: the
    template parameters of a template file (header and section expanded by wgsl_expand)."""
    if kernel not in file.kernels:
        raise ShaderSourceError(
            f"{file.path.name} has no kernel {kernel!r}; it has {sorted(file.kernels)}")
    own = (f"// ---- {file.path.name} ----\n" + file.header
           + f"// ---- kernel {kernel} ----\n" + file.kernels[kernel])
    if params is not None:
        own = _expanded(own, tuple(sorted(params.items())), f"{file.path.name}:{kernel}")
    return enable_lines(features, compiler) + preamble_text(directory) + "\n" + own


@lru_cache(maxsize=None)
def _expanded(text: str, params: tuple, origin: str) -> str:
    """A template's expansion, once per text and parameters (a pass takes ~0.1-0.3 s; the
    pipelines of one expansion may differ in their override constants)."""
    return wgsl_expand.expand(text, dict(params), origin)
