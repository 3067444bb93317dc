"""The error base class of the whole project, in a module that imports nothing.

Every library (shaders, tokenizer_svc, trainer_svc) raises `UserFacingError` for bad input,
and the `istanbul` command prints it without a traceback. It lives outside the `istanbul`
package on purpose: `istanbul` is the public API, which imports the libraries (lazily), so a
library importing `istanbul.errors` would close an import cycle through the package.
"""


class UserFacingError(Exception):
    """Bad input, a missing file, an unreachable server: say what, with which input, what to do."""
