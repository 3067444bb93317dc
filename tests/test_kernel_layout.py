"""The kernel house layout: every family folder is complete, kernel files are found by name
or as family/file, names are unique, and the wheel ships every kernel file."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from shaders import source

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "shaders" / "kernels"
# families whose op functions are the tokenizer's own classes (tokenizer_svc), not an ops.py
OPS_ELSEWHERE = {"bpe", "bpe_train"}
NO_CASES = {"roofline"}   # the ladder's FMA ceilings: timed by the bench rung, no reference


def families() -> list[Path]:
    return sorted(p for p in KERNELS.iterdir() if p.is_dir() and not p.name.startswith("_")
                  and p.name != "__pycache__")


@pytest.mark.parametrize("folder", families(), ids=lambda p: p.name)
def test_a_family_folder_holds_its_kernels_reference_ops_and_cases(folder):
    names = {p.name for p in folder.iterdir()}
    assert "__init__.py" in names and any(n.endswith(".wgsl") for n in names), names
    if folder.name in NO_CASES:
        return
    assert {"reference.py", "cases.py"} <= names, names
    assert ("ops.py" in names) != (folder.name in OPS_ELSEWHERE), names


def test_kernel_files_are_found_by_name_or_family_path():
    assert source.find_file("02_rmsnorm.wgsl") == KERNELS / "rmsnorm" / "02_rmsnorm.wgsl"
    assert source.find_file("rmsnorm/02_rmsnorm.wgsl") == KERNELS / "rmsnorm" / "02_rmsnorm.wgsl"
    assert source.find_file("03_linear.wgsl") == KERNELS / "matmul" / "03_linear.wgsl"
    with pytest.raises(source.ShaderSourceError, match="no WGSL file 'nope.wgsl'"):
        source.find_file("nope.wgsl")
    with pytest.raises(source.ShaderSourceError, match="expected `<family>/<file>.wgsl`"):
        source.find_file("rope/02_rmsnorm.wgsl")


def test_a_file_name_used_twice_is_an_error_naming_both(tmp_path, monkeypatch):
    for family in ("a", "b"):
        (tmp_path / "kernels" / family).mkdir(parents=True)
        (tmp_path / "kernels" / family / "same.wgsl").write_text("// --- KERNEL: k ---\n")
    monkeypatch.setattr(source, "KERNELS_DIR", tmp_path / "kernels")
    source.kernel_files.cache_clear()
    try:
        with pytest.raises(source.ShaderSourceError, match=r"'same.wgsl' is used twice .*a/same"
                           r".*b/same"):
            source.find_file("same.wgsl")
    finally:
        source.kernel_files.cache_clear()


def test_the_engine_compiles_a_kernel_named_either_way(device):
    assert device.kernel("elementwise/infra.wgsl", "scale").pipeline is not None
    assert device.kernel("infra.wgsl", "scale").pipeline is not None


def test_the_wheel_ships_every_kernel_file(tmp_path):
    tree = tmp_path / "src"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "istanbul_errors.py"):
        shutil.copy(ROOT / name, tree / name)
    for package in ("istanbul", "shaders", "tokenizer_svc", "trainer_svc", "proto"):
        shutil.copytree(ROOT / package, tree / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(tree)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    # no generic top-level import name beyond the design card's packages (proto/ is source)
    assert top == {"istanbul", "istanbul_errors.py", "shaders", "tokenizer_svc",
                   "trainer_svc"}, top
    shipped = {n for n in names if n.endswith(".wgsl")}
    wanted = {p.relative_to(ROOT).as_posix() for p in (ROOT / "shaders").rglob("*.wgsl")}
    assert wanted and shipped == wanted, sorted(wanted ^ shipped)
