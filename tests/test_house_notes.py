"""The house's signposts stay true: every kernel family folder has a short NOTES.md naming each
of its WGSL files, and every result file the notes, bench/results/HISTORY.md and the lab's
index cite at a plain path exists (older files are cited as COMMIT:PATH, read with git show)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "shaders" / "kernels"
FAMILIES = sorted(p for p in KERNELS.iterdir()
                  if p.is_dir() and not p.name.startswith("_") and p.name != "__pycache__")
CITED = re.compile(r"(?<![\w:/])((?:bench/results|dev)/[\w./*{},-]*[\w*}])")


def cited_paths(text: str) -> list[str]:
    """Plain paths, not patterns, and not the ones a row reads from git ("history of `PATH`")."""
    return [p for p in CITED.findall(text)
            if not any(c in p for c in "<*{") and f"history of `{p}`" not in text]


@pytest.mark.parametrize("folder", FAMILIES, ids=lambda p: p.name)
def test_a_family_has_notes_naming_its_kernels(folder):
    notes = folder / "NOTES.md"
    assert notes.is_file(), f"{folder.name}: write {notes.relative_to(ROOT)}"
    text = notes.read_text()
    assert len(text.splitlines()) <= 40, f"{notes.relative_to(ROOT)}: keep it under 40 lines"
    missing = [p.name for p in folder.glob("*.wgsl") if p.name not in text]
    assert not missing, f"{notes.relative_to(ROOT)} does not name {missing}"


@pytest.mark.parametrize("doc", [*(f / "NOTES.md" for f in FAMILIES),
                                 ROOT / "bench" / "results" / "HISTORY.md",
                                 ROOT / "dev" / "README.md"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_result_files_exist(doc):
    if not doc.is_file():
        pytest.skip(f"{doc} not written")
    gone = [p for p in cited_paths(doc.read_text()) if not (ROOT / p).exists()]
    assert not gone, f"{doc.relative_to(ROOT)} cites missing files: {gone}"


def test_the_lab_index_lists_every_question_folder():
    index = (ROOT / "dev" / "README.md").read_text()
    folders = [p.name for p in (ROOT / "dev").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert folders and all(f"`{name}/`" in index for name in folders), folders
    for name in folders:
        assert (ROOT / "dev" / name / "README.md").is_file(), name
