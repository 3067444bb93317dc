"""No import cycle between the product's modules, and every import points down a floor,
function-local imports included.

The floors, from the ground: `istanbul_errors`; the kernel house `istanbul.shaders` (the folder
shaders/: kernels, their launch code and references, the engine); the libraries
`tokenizer_svc`, then `trainer_svc` (which uses the tokenizer); the package `istanbul` (the
public API and the command line) on top. A module imports only from its own floor or below.

The graph is built from the source (AST), not by importing: an edge A -> B for every
`import B` / `from B import x` anywhere in A, also inside functions, where B is one of the
product's modules (`from pkg import name` counts as an edge to `pkg.name` when that is a
module, else to `pkg`). A cycle means two modules that cannot be read, tested or changed
one without the other; a function-local import only hides it from Python, not from us.
"""

from __future__ import annotations

import ast
import subprocess

import pytest

from tests.package_names import ROOT, mapped_folders, product_modules

# Cycles that exist today in files whose owners are changing them, each with the issue that
# removes it. The test fails when one of them is gone (so the list shrinks) or a new one shows.
KNOWN_CYCLES: dict[frozenset, str] = {}


def _targets(node, module: str, is_package: bool, modules) -> list[str]:
    def known(name: str) -> str | None:
        while name and name not in modules:   # `import a.b.c` of a non-module attribute path
            name = name.rpartition(".")[0]
        return name or None

    if isinstance(node, ast.Import):
        return [t for t in (known(a.name) for a in node.names) if t]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module or ""
    found = []
    for alias in node.names:
        sub = f"{origin}.{alias.name}"
        target = sub if sub in modules else known(origin)
        if target:
            found.append(target)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = product_modules()
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_targets(node, name, path.name == "__init__.py", modules))
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.add(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        out.append(frozenset(component))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def test_the_graph_sees_function_local_and_relative_imports():
    graph = import_graph()
    house = "istanbul.shaders"    # the folder shaders/, by its import name
    assert f"{house}.engine" in graph[f"{house}.kernels.op_support"]           # from ..engine
    assert f"{house}.kernels.rmsnorm.ops" in graph[f"{house}.kernels.rmsnorm.cases"]  # . import
    assert f"{house}.tuned_cache" in graph[f"{house}.kernels.matmul.ops"]      # inside a function
    assert f"{house}.kernels.bpe.encode" in graph[f"{house}.kernels.bpe.cases"]
    assert any(f"{house}.engine" in graph[m] for m in graph if m.startswith("tokenizer_svc."))


def test_the_cycle_finder_finds_a_hidden_loop():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    found = cycles(import_graph())
    new = [sorted(c) for c in found if c not in KNOWN_CYCLES]
    gone = [f"{sorted(c)} ({why})" for c, why in KNOWN_CYCLES.items() if c not in found]
    assert not new, f"import cycles: {new}; break them (move the shared part down a layer)"
    if gone:
        pytest.fail(f"known cycles no longer exist, remove them from KNOWN_CYCLES: {gone}")


def test_nothing_imports_a_mapped_folder_by_its_folder_name():
    """shaders/ is imported as `istanbul.shaders` only: importing the folder name (possible in a
    checkout, where the repo root is on sys.path) would load a second copy of every module."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others",
                             "--exclude-standard", "*.py"], capture_output=True, text=True)
    files = ([ROOT / n for n in listed.stdout.split()] if listed.returncode == 0
             else sorted(ROOT.rglob("*.py")))
    wrong = []
    for path in files:
        if not path.is_file() or ".venv" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            for name in names:
                folder = name.split(".")[0]
                if folder in mapped_folders():
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name} "
                                 f"(write {mapped_folders()[folder]}{name[len(folder):]})")
    assert not wrong, wrong


# floor -> the top-level names it must not import (its own floor and the ones below are fine)
ABOVE = {
    "istanbul.shaders": ("tokenizer_svc", "trainer_svc", "istanbul"),
    "tokenizer_svc": ("trainer_svc", "istanbul"),
    "trainer_svc": ("istanbul",),
}


def _floor(module: str) -> str | None:
    return next((f for f in ABOVE if module == f or module.startswith(f + ".")), None)


def imported_names(path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative ones resolved;
    `from pkg import name` counts as pkg.name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level:
                up = base[:len(base) - (node.level - 1)]
                origin = ".".join(up + ([origin] if origin else []))
            out += [(node.lineno, f"{origin}.{a.name}") for a in node.names]
    return out


def upward_imports() -> list[str]:
    wrong = []
    for module, path in product_modules().items():
        floor = _floor(module)
        if floor is None:
            continue
        for line, name in imported_names(path, module):
            if name == "istanbul.shaders" or name.startswith("istanbul.shaders."):
                continue                                   # the house: below every library
            if name.split(".")[0] in ABOVE[floor]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    return wrong


def test_the_floor_check_sees_relative_and_function_local_imports(tmp_path):
    f = tmp_path / "__init__.py"
    f.write_text("def f():\n    from ...tokenizer_svc import vocab\n")
    assert imported_names(f, "istanbul.shaders.kernels") == [(2, "istanbul.tokenizer_svc.vocab")]
    g = tmp_path / "m.py"
    g.write_text("import trainer_svc.model\nfrom istanbul import shaders\n")
    assert imported_names(g, "tokenizer_svc.m") == [(1, "trainer_svc.model"),
                                                      (2, "istanbul.shaders")]


def test_every_import_points_down_a_floor():
    """The house imports no library and no `istanbul`; the libraries import no `istanbul`
    (only `istanbul.shaders`), and the tokenizer not the trainer."""
    wrong = upward_imports()
    assert not wrong, ("upward imports (move what they need down to the importing floor, or "
                       f"pass it in): {wrong}")
