"""The product's modules by import name, read from the source folders: a folder at the repo
root imports under its own name, except one that pyproject.toml's
[tool.setuptools.package-dir] maps to another (shaders/ -> `istanbul.shaders`)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the product's folders and top-level modules (proto/ is source, not an import)
PRODUCT = ("istanbul", "istanbul_errors.py", "shaders", "tokenizer_svc", "trainer_svc")


def mapped_folders() -> dict[str, str]:
    """{folder: import name} for the folders installed under another name."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"].get("package-dir", {})
    return {folder: name for name, folder in package_dir.items()}


def import_name(top: str) -> str:
    """The import name of a product folder or top-level module file."""
    return mapped_folders().get(top, top.removesuffix(".py"))


def product_modules() -> dict[str, Path]:
    """{module import name: source file} for every product module."""
    modules = {}
    for top in PRODUCT:
        path = ROOT / top
        files = [path] if path.suffix == ".py" else sorted(path.rglob("*.py"))
        for f in files:
            rel = f.relative_to(ROOT).with_suffix("").parts
            rel = rel[:-1] if rel[-1] == "__init__" else rel
            modules[".".join((import_name(top), *rel[1:]))] = f
    return modules
