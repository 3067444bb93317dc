"""Optional extras (pyproject's [project.optional-dependencies]): import one or say which to
install. The core install stays small; pictures and the autograd reference are extras."""

from __future__ import annotations

import importlib

from istanbul_errors import UserFacingError


def require_extra(module: str, extra: str, purpose: str):
    """`module`, imported; if it is missing, a UserFacingError naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module.partition(".")[0]:
            raise
        raise UserFacingError(f"{purpose} needs {module}, an optional extra that is not "
                              f"installed: pip install 'istanbul[{extra}]'") from None
