"""Compatibility name: the error base class lives in the bottom module `istanbul_errors`."""

from istanbul_errors import UserFacingError

__all__ = ["UserFacingError"]
