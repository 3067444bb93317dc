"""The kernel house layout: every family folder is complete, kernel files are found by name
or as family/file, names are unique, the wheel ships every kernel file, and the folder shaders/
imports as `istanbul.shaders` installed and from a checkout (no generic top-level name)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from istanbul.shaders import source

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "shaders" / "kernels"
# families whose launch code is named after what it launches, not an ops.py (bpe: encode.py,
# scan.py, decode.py; bpe_train: trainer.py, piece_count.py, piece_store.py)
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


def build_wheel(tmp_path: Path) -> Path:
    """The wheel of a copy of the files the Dockerfile copies (pip wheel, no deps)."""
    tree = tmp_path / "src"
    tree.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "istanbul_errors.py"):
        shutil.copy(ROOT / name, tree / name)
    for package in ("istanbul", "shaders", "tokenizer_svc", "trainer_svc", "proto"):
        shutil.copytree(ROOT / package, tree / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"), str(tree)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    return wheel


def python(code: str, cwd: Path, *path: Path) -> subprocess.CompletedProcess:
    """`python -c CODE` with only `path` before the interpreter's own site-packages."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "XDG_RUNTIME_DIR": "/tmp",
           "PYTHONPATH": os.pathsep.join(map(str, path))}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


# in a subprocess: where the house was imported from, and a kernel file found through it
WHERE = ("import istanbul.shaders as h, istanbul.shaders.source as s; "
         "print(h.__file__); print(s.find_file('rmsnorm/02_rmsnorm.wgsl'))")


def test_the_wheel_installs_no_generic_top_level_name_and_every_kernel_file(tmp_path):
    wheel = build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    # the kernel house (folder shaders/) installs as istanbul.shaders; proto/ is source
    assert top == {"istanbul", "istanbul_errors.py", "tokenizer_svc", "trainer_svc"}, top
    shipped = {n for n in names if n.endswith(".wgsl")}
    wanted = {f"istanbul/{p.relative_to(ROOT).as_posix()}"
              for p in (ROOT / "shaders").rglob("*.wgsl")}
    assert wanted and shipped == wanted, sorted(wanted ^ shipped)
    assert {"istanbul/shaders/tuned/nvidia-h200-vulkan-wgpu.json",
            "istanbul/shaders/tuned/nvidia-h200-vulkan-dawn.json",
            "istanbul/shaders/kernels/bpe/data/unicode_classes.json",       # the class tables
            "istanbul/shaders/kernels/bpe/data/unicode_classes_tokenizers.json"} <= set(names)
    # installed on its own (pip install --target, no checkout on the path), it imports
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                           str(site), str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    done = python(WHERE, tmp_path, site)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(site / "istanbul" / "shaders" / "__init__.py"),
                                   str(site / "istanbul" / "shaders" / "kernels" / "rmsnorm" /
                                       "02_rmsnorm.wgsl")]


def test_a_checkout_imports_the_house_as_istanbul_shaders_and_refuses_the_folder_name(tmp_path):
    done = python(WHERE, tmp_path, ROOT)   # PYTHONPATH=<repo>, the editable install's mapping
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(ROOT / "shaders" / "__init__.py"),
                                   str(KERNELS / "rmsnorm" / "02_rmsnorm.wgsl")]
    # the folder name imports in a checkout (the repo root is on the path) but would load a
    # second copy of every module: refused, saying what to write instead
    wrong = python("import shaders", tmp_path, ROOT)   # rename: keep (the old name on purpose)
    assert wrong.returncode == 1
    assert "imported as `istanbul.shaders`, not `shaders`" in wrong.stderr, wrong.stderr
