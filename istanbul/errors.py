"""Errors whose message is the whole story for the user: the CLI prints them without a traceback."""


class UserFacingError(Exception):
    """Bad input, a missing file, an unreachable server: say what, with which input, what to do."""
