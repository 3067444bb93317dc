"""WGSL source handling: finding a kernel file, kernel splitting, and the preamble with
feature-dependent enable lines.

Kernel files live in their family's folder, `shaders/kernels/<family>/*.wgsl`; a file is named
either by its file name alone (names are unique across the families) or as
`<family>/<file>.wgsl`. Until the matmul and attention families move into the same layout,
their files in `shaders/wgsl/` are found the same way (by file name).

A `.wgsl` file holds one or more kernels separated by marker lines

    // --- KERNEL: name ---

Text before the first marker is the file's header (its doc comment and helpers shared by the
file's kernels); it is included in every kernel of the file. Each kernel's entry point is the
function named like the kernel. The module compiled for a kernel is:

    enable lines (from the device's features) + 00_shared.wgsl + file header + kernel section

Enable lines are the engine's business, never a kernel file's: naga rejects `enable subgroups;`
(subgroup builtins work once the `subgroup` feature is on) and rejects `enable f16;` unless
`shader-f16` was enabled on the device, so the engine writes them from the device's features.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent / "kernels"
# matmul and attention files not yet moved into their family folders (searched after KERNELS_DIR)
WGSL_DIR = Path(__file__).resolve().parent / "wgsl"
PREAMBLE_FILE = "00_shared.wgsl"   # in KERNELS_DIR: every kernel of every family includes it
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


@lru_cache(maxsize=None)
def kernel_files() -> dict[str, Path]:
    """{file name: path} of every kernel file: shaders/kernels/*/ and the not-yet-moved
    shaders/wgsl/. Two files of one name would make a name ambiguous: that is an error."""
    found: dict[str, Path] = {}
    paths = sorted(KERNELS_DIR.glob("*/*.wgsl")) + sorted(WGSL_DIR.glob("*.wgsl"))
    for path in paths:
        if path.name in found:
            raise ShaderSourceError(
                f"kernel file name {path.name!r} is used twice ({found[path.name]} and {path}); "
                "file names must be unique across shaders/kernels/*/ and shaders/wgsl/ so "
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
        raise ShaderSourceError(f"no WGSL file {name!r} in {KERNELS_DIR}/*/ or {WGSL_DIR}; "
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


def compose(features, file: WgslFile, kernel: str, directory: str = str(KERNELS_DIR)) -> str:
    """The full module source for one kernel on a device with `features`."""
    if kernel not in file.kernels:
        raise ShaderSourceError(
            f"{file.path.name} has no kernel {kernel!r}; it has {sorted(file.kernels)}")
    return (enable_lines(features) + preamble_text(directory) + "\n"
            + f"// ---- {file.path.name} ----\n" + file.header
            + f"// ---- kernel {kernel} ----\n" + file.kernels[kernel])
