"""The error base class of the whole project, in a module that imports nothing of it.

Every library (shaders, tokenizer_svc, trainer_svc) raises `UserFacingError` for bad input,
and the `istanbul` command prints it without a traceback. It lives outside the `istanbul`
package on purpose: `istanbul` is the public API, which imports the libraries (lazily), so a
library importing `istanbul.errors` would close an import cycle through the package.
"""


class UserFacingError(Exception):
    """Bad input, a missing file, an unreachable server: say what, with which input, what to do."""


def require_extra(module: str, extra: str, purpose: str):
    """`module`, imported; if it is missing, a UserFacingError naming the optional extra
    (pyproject's [project.optional-dependencies]) to install for `purpose`."""
    import importlib
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module.partition(".")[0]:
            raise
        raise UserFacingError(f"{purpose} needs {module}, an optional extra that is not "
                              f"installed: pip install 'istanbul[{extra}]'") from None
