"""Every environment variable the product reads or writes, gathered from the libraries'
settings modules (the command line declares none of its own), and the page that lists the
ones users set:

    python -m istanbul.settings --markdown > docs/environment.md

tests/test_settings.py fails when the committed page differs from what this prints.
"""

from __future__ import annotations

import argparse
import sys

from istanbul.shaders import settings as device_settings
from tokenizer_svc import settings as tokenizer_settings
from trainer_svc import settings as trainer_settings

# (heading, the library's settings), in the order data flows through the libraries
LIBRARIES = (
    ("The GPU device and its kernels (`istanbul.shaders`, shaders/settings.py)",
     device_settings.SETTINGS),
    ("The tokenizer (`tokenizer_svc`, tokenizer_svc/settings.py)", tokenizer_settings.SETTINGS),
    ("Training, Redis and the daemon (`trainer_svc`, trainer_svc/settings.py)",
     trainer_settings.SETTINGS),
)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """docs/environment.md: one table per library of its user-facing variables."""
    out = ["# Environment variables", "",
           "Generated from the settings modules by `python -m istanbul.settings --markdown > "
           "docs/environment.md`;",
           "edit the `Variable` declarations there, not this page. Command-line flags win "
           "over these where both exist.",
           "Unset and empty mean the same: the default."]
    for heading, library in LIBRARIES:
        out += ["", f"## {heading}", "", "| variable | value | default | meaning |",
                "|---|---|---|---|"]
        for v in library.variables:
            if not v.user_facing:
                continue
            value = {"choice": " / ".join(f"`{c}`" for c in v.choices),
                     "switch": "`1` / `0` (on / off)", "list": "comma-separated"}.get(v.kind, v.kind)
            out.append(f"| `{v.name}` | {value} | {_cell(v.default_text())} | "
                       f"{_cell(v.meaning)} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m istanbul.settings",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true",
                        help="print docs/environment.md (the user-facing variables)")
    args = parser.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    for _, library in LIBRARIES:
        for v in library.variables:
            print(f"{v.name:34} {library.library:17} {'user' if v.user_facing else '-':5} "
                  f"{v.kind:7} {v.default_text()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
