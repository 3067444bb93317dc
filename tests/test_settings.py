"""Configuration has one place per library: its settings module declares every environment
variable (shaders/settings.py, tokenizer_svc/settings.py, trainer_svc/settings.py) and alone
reads or writes it; docs/environment.md is generated from those tables.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from istanbul import settings as all_settings
from istanbul.shaders import settings
from istanbul.shaders.settings import SettingError, Settings, Variable
from tests.package_names import ROOT, product_modules

SETTINGS_MODULES = {"istanbul.shaders.settings", "tokenizer_svc.settings", "trainer_svc.settings"}
# Modules that copy the whole environment for the processes they start (`dict(os.environ,
# ...)` as the first argument: no setting is read, every variable passes through).
COPIES = {
    "istanbul.demo": "the demo's service, daemons and commands",
    "trainer_svc.distributed.launch": "the ranks of a data-parallel group",
}
ENV_NAMES = ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")


def environment_uses(tree: ast.AST) -> list[tuple[int, str, bool]]:
    """(line, what, copied) of every use of the process environment in a module: os.environ
    and its kin through any name `os` is imported as, and `from os import environ`; `copied`
    when the use is the first argument of a dict(...) call."""
    os_names = {"os"} | {a.asname for n in ast.walk(tree) if isinstance(n, ast.Import)
                         for a in n.names if a.name == "os" and a.asname}
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [(node.lineno, f"from os import {a.name}", False) for a in node.names
                      if a.name in ENV_NAMES]
        elif (isinstance(node, ast.Attribute) and node.attr in ENV_NAMES
              and isinstance(node.value, ast.Name) and node.value.id in os_names):
            call = parents.get(node)
            copied = (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                      and call.func.id == "dict" and call.args[:1] == [node])
            found.append((node.lineno, f"{node.value.id}.{node.attr}", copied))
    return found


def test_only_the_settings_modules_touch_the_environment():
    """Every product module (shaders/, tokenizer_svc/, trainer_svc/, istanbul/,
    istanbul_errors.py), read as source: os.environ, os.getenv and their kin appear only in
    the settings modules, and in COPIES as dict(os.environ, ...) for child processes."""
    modules = product_modules()
    assert SETTINGS_MODULES <= set(modules) and set(COPIES) <= set(modules)
    wrong, copies = [], set()
    for name, path in sorted(modules.items()):
        if name in SETTINGS_MODULES:
            continue
        for line, what, copied in environment_uses(ast.parse(path.read_text(encoding="utf-8"))):
            if copied and name in COPIES:
                copies.add(name)
            else:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {what}")
    assert not wrong, ("environment reads outside the settings modules; declare the variable "
                       "in the library's settings.py and read it there: " + "; ".join(wrong))
    assert copies == set(COPIES), f"COPIES lists modules that no longer copy: {set(COPIES) - copies}"


def test_the_checker_sees_aliases_imports_and_copies():
    code = ("import os\nimport os as o\nfrom os import getenv\n"
            "a = os.environ.get('X')\nb = o.environ['Y']\nc = dict(os.environ, Z='1')\n"
            "d = dict(x=os.environ)\nos.putenv('A', 'B')\n")
    assert sorted(environment_uses(ast.parse(code))) == [
        (3, "from os import getenv", False), (4, "os.environ", False), (5, "o.environ", False),
        (6, "os.environ", True), (7, "os.environ", False), (8, "os.putenv", False)]


def test_environment_page_is_generated_from_the_tables():
    """docs/environment.md is what `python -m istanbul.settings --markdown` prints: regenerate
    it after changing a Variable."""
    page = ROOT / "docs" / "environment.md"
    assert page.read_text(encoding="utf-8") == all_settings.markdown(), (
        "docs/environment.md is out of date: python -m istanbul.settings --markdown > "
        "docs/environment.md")


def test_the_page_lists_every_user_facing_variable_and_nothing_else():
    page = all_settings.markdown()
    for _, library in all_settings.LIBRARIES:
        for v in library.variables:
            assert (f"| `{v.name}` |" in page) == v.user_facing, v.name


def test_no_variable_is_declared_by_two_libraries():
    names = [v.name for _, library in all_settings.LIBRARIES for v in library.variables]
    assert len(names) == len(set(names))


def test_reads_happen_at_call_time_and_are_typed(monkeypatch):
    monkeypatch.delenv("ISTANBUL_AUTOTUNE", raising=False)
    assert settings.read("ISTANBUL_AUTOTUNE") is True
    for text, want in (("0", False), ("off", False), (" No ", False), ("1", True), ("on", True),
                       ("", True)):
        monkeypatch.setenv("ISTANBUL_AUTOTUNE", text)
        assert settings.read("ISTANBUL_AUTOTUNE") is want, text
    monkeypatch.setenv("ISTANBUL_BACKEND", " Dawn ")
    assert settings.read("ISTANBUL_BACKEND") == "dawn"
    monkeypatch.setenv("ISTANBUL_DAWN_TOGGLES", "a, b,,c ")
    assert settings.read("ISTANBUL_DAWN_TOGGLES") == ("a", "b", "c")
    monkeypatch.setenv("ISTANBUL_AUTOTUNE_DIR", "~/tuned")
    assert settings.read("ISTANBUL_AUTOTUNE_DIR") == Path.home() / "tuned"
    monkeypatch.setenv("ISTANBUL_ADAPTER", "  ")
    assert settings.read("ISTANBUL_ADAPTER") is None


@pytest.mark.parametrize("name, text", [("ISTANBUL_AUTOTUNE", "maybe"),
                                        ("ISTANBUL_BACKEND", "metal"),
                                        ("ISTANBUL_EMULATE_SUBGROUP_MATRIX", "2")])
def test_a_value_that_does_not_parse_names_the_variable_and_the_value(monkeypatch, name, text):
    monkeypatch.setenv(name, text)
    with pytest.raises(SettingError, match=rf"^\${name} is '{text}'; use "):
        settings.read(name)


def test_undeclared_names_are_refused():
    with pytest.raises(KeyError, match="ISTANBUL_NO_SUCH_THING is not one of"):
        settings.read("ISTANBUL_NO_SUCH_THING")
    with pytest.raises(KeyError):
        settings.write("PATH", "/bin")


def test_writes_set_and_unset_for_child_processes(monkeypatch):
    monkeypatch.delenv("VK_ADD_DRIVER_FILES", raising=False)
    settings.write("VK_ADD_DRIVER_FILES", "/x/icd.json")
    assert os.environ["VK_ADD_DRIVER_FILES"] == "/x/icd.json"
    settings.write("VK_ADD_DRIVER_FILES", None)
    assert "VK_ADD_DRIVER_FILES" not in os.environ


def test_declarations_are_checked():
    with pytest.raises(ValueError, match="kind"):
        Variable("X", "number", None, "-")
    with pytest.raises(ValueError, match="choices"):
        Variable("X", "choice", None, "-")
    with pytest.raises(ValueError, match="twice"):
        Settings("lib", (Variable("X", "text", None, "-"), Variable("X", "text", None, "-")))
