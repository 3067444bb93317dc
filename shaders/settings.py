"""The kernel layer's environment variables: this module alone reads and writes them.

    from istanbul.shaders import settings
    settings.read("ISTANBUL_ADAPTER")            # str, or None when unset
    settings.read("ISTANBUL_AUTOTUNE")           # bool
    settings.write("XDG_RUNTIME_DIR", path)      # for the drivers and child processes

VARIABLES declares every variable once: its name, kind, default, a one-line meaning and
whether users set it (docs/environment.md lists those; `python -m istanbul.settings
--markdown` writes it). A read looks the environment up at the call, so a test's
monkeypatch of os.environ is seen; a value that does not parse raises SettingError naming
the variable and the value. Reading or writing an undeclared name is a KeyError.

Kinds (what `read` returns; unset and empty both mean the default):
    text     the stripped text
    path     a Path, `~` expanded
    choice   the lower-cased text, one of the variable's choices
    switch   a bool: 1/on/true/yes or 0/off/false/no
    list     a tuple of the comma-separated items, stripped, empty ones dropped

tokenizer_svc/settings.py and trainer_svc/settings.py declare theirs with the same
`Variable` and `Settings`; istanbul/settings.py gathers the three tables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from istanbul_errors import UserFacingError

KINDS = ("text", "path", "choice", "switch", "list")
TRUE = ("1", "on", "true", "yes")
FALSE = ("0", "off", "false", "no")


class SettingError(UserFacingError, ValueError):
    """An environment variable whose value does not parse as its declared kind."""


@dataclass(frozen=True)
class Variable:
    """One environment variable: `default` is what `read` returns when it is unset (typed
    as the kind returns it); `shown_default` how the table shows it when that is not
    `default` itself (a computed place, a caller's choice)."""
    name: str
    kind: str
    default: object
    meaning: str
    user_facing: bool = True
    choices: tuple[str, ...] = ()
    shown_default: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind {self.kind!r}; use one of {', '.join(KINDS)}")
        if (self.kind == "choice") != bool(self.choices):
            raise ValueError(f"{self.name}: a choice variable lists its choices, no other does")

    def parse(self, text: str | None):
        """The typed value of `text` (the variable's raw value, None when unset)."""
        text = (text or "").strip()
        if not text:
            return self.default
        if self.kind == "text":
            return text
        if self.kind == "path":
            return Path(text).expanduser()
        if self.kind == "list":
            return tuple(item.strip() for item in text.split(",") if item.strip())
        value = text.lower()
        if self.kind == "choice":
            if value not in self.choices:
                raise SettingError(f"${self.name} is {text!r}; use one of "
                                   f"{', '.join(self.choices)} (or unset it)")
            return value
        if value in TRUE:
            return True
        if value in FALSE:
            return False
        raise SettingError(f"${self.name} is {text!r}; use 1 or 0 (on/off, true/false, "
                           "yes/no), or unset it")

    def default_text(self) -> str:
        """The default as the table shows it."""
        if self.shown_default is not None:
            return self.shown_default
        if self.default is None or self.default == ():
            return "unset"
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        return str(self.default)


class Settings:
    """A library's declared variables, read and written by name."""

    def __init__(self, library: str, variables: tuple[Variable, ...]):
        self.library = library
        self.variables = variables
        self._by_name = {v.name: v for v in variables}
        if len(self._by_name) != len(variables):
            raise ValueError(f"{library}: a variable is declared twice")
        self._parsed: dict = {}    # (name, raw text) -> value: reads sit on hot paths

    def variable(self, name: str) -> Variable:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{name} is not one of {self.library}'s declared environment "
                           "variables (its settings module's VARIABLES)") from None

    def raw(self, name: str) -> str | None:
        """The declared variable's text as the environment holds it (None when unset)."""
        if name not in self._by_name:
            self.variable(name)
        return os.environ.get(name)

    def read(self, name: str):
        """The declared variable's value now, typed by its kind (module docstring)."""
        key = (name, os.environ.get(name))
        try:   # (only a declared name's value is ever remembered)
            return self._parsed[key]
        except KeyError:
            value = self._parsed[key] = self.variable(name).parse(key[1])
            return value

    def write(self, name: str, value: str | None) -> None:
        """Set the declared variable for this process and the ones it starts (None: unset)."""
        self.variable(name)
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)


VARIABLES = (
    Variable("ISTANBUL_BACKEND", "choice", "auto",
             "WebGPU implementation: wgpu (wgpu-native, naga), dawn (Dawn, Tint; pip install "
             "'istanbul[dawn]') or auto: Dawn where the adapter offers f16 subgroup matrices, "
             "else wgpu (same as --backend, which sets it for the processes a command starts)",
             choices=("auto", "wgpu", "dawn")),
    Variable("ISTANBUL_ADAPTER", "text", None,
             "GPU adapter: index from `istanbul devices` or a name substring (same as "
             "--adapter)", shown_default="the first discrete GPU, else software Vulkan"),
    Variable("ISTANBUL_DAWN_TOGGLES", "list", (),
             "extra Dawn toggles, comma-separated (e.g. disable_robustness: no bounds checks "
             "anywhere; faster memory-bound kernels and 20-40% faster tensor-core matmuls on "
             "the H200)"),
    Variable("ISTANBUL_DAWN_ROBUSTNESS", "switch", None,
             "Dawn's robustness (bounds checks) for every device, overriding the defaults",
             shown_default="on, except the trainer's and the tokenizer's devices: off"),
    Variable("ISTANBUL_DAWN_ICD", "path", None,
             "Vulkan driver manifest added for Dawn only (ignored when VK_DRIVER_FILES or "
             "VK_ICD_FILENAMES is set)",
             shown_default=".venv/mesa-backports/lvp_icd.json where scripts/setup.sh made it"),
    Variable("ISTANBUL_EMULATE_SUBGROUP_MATRIX", "switch", False,
             "1: a device without subgroup matrices but with shader-f16 emulates them in "
             "plain WGSL (slow, exact; for checking the tensor-core kernels on a CPU, as "
             "`istanbul kernels check --emulate-subgroup-matrix` does)"),
    Variable("ISTANBUL_AUTOTUNE_DIR", "path", None,
             "the autotuner's cache per adapter and WebGPU implementation (then shaders/tuned/, "
             "then the other implementation's files, borrowed)",
             shown_default="~/.cache/istanbul/autotune"),
    Variable("ISTANBUL_AUTOTUNE", "switch", True,
             "0: ignore every tuned cache (the kernels' built-in defaults)"),
    Variable("ISTANBUL_VOCAB_DIR", "path", None,
             "first folder searched for known vocabulary names (gpt2, cl100k_base, "
             "o200k_base): by the tokenizer, `istanbul vocab fetch` (which writes there) and "
             "the BPE kernels' ladder",
             shown_default="unset: ~/.cache/istanbul/vocab, then tiktoken's cache are searched"),
    Variable("VK_DRIVER_FILES", "text", None,
             "the Vulkan loader's driver list; when it (or VK_ICD_FILENAMES) is set, Dawn gets "
             "no private lavapipe added"),
    Variable("VK_ICD_FILENAMES", "text", None,
             "the Vulkan loader's older name for VK_DRIVER_FILES"),
    Variable("VK_ADD_DRIVER_FILES", "text", None,
             "Vulkan drivers added to the loader's list: set around Dawn's adapter discovery "
             "to ISTANBUL_DAWN_ICD's manifest, then restored", user_facing=False),
    Variable("XDG_RUNTIME_DIR", "text", None,
             "the drivers' runtime directory; when unset or missing a private 0700 one is set "
             "before the first adapter request (Mesa complains without it)", user_facing=False),
    Variable("HOME", "text", None,
             "the user's home: the default ISTANBUL_AUTOTUNE_DIR is under it", user_facing=False),
)

SETTINGS = Settings("istanbul.shaders", VARIABLES)
read = SETTINGS.read
raw = SETTINGS.raw
write = SETTINGS.write
