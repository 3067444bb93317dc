"""Which errors of a job are worth retrying: the one classification the daemon goes by.

    raise JobInputError("seq 4096 exceeds the model's max_seq 1024; lower --seq")   # fails now
    raise TransientJobError("the GPU device was lost")                              # retried

Deterministic: the job asks for something that cannot work (a spec that does not validate,
ids outside the vocabulary, a truncated shard, a model that does not fit the device, a
diverging loss). Retrying fails the same way, so the job fails at once with the message as
its error. These are `JobInputError` (and its subclasses), any `UserFacingError` (the
project's "bad input, here is what to do" errors, wherever they are raised: the trainer, the
data loader, the CLI helpers) and pydantic's `ValidationError`.

Transient: everything else (`TransientJobError` says so explicitly, and wins over the rest):
a GPU error, a full disk, a bug. The job goes back to the queue; it is dead-lettered after
`max_failures` attempts in a row that ended without progress (see `daemon.py`).
"""

from __future__ import annotations

from istanbul_errors import UserFacingError


class JobError(Exception):
    """An error about one job (as opposed to the daemon or Redis)."""


class JobInputError(JobError, UserFacingError):
    """Something wrong with what a job asks for (spec, data, paths, vocabulary, a config that
    cannot fit, a diverging loss): retrying cannot help, so the job fails at once with this
    message as its error."""


class TransientJobError(JobError):
    """A failure that another attempt (maybe on another worker) may not hit: retried."""


def is_deterministic(exc: BaseException) -> bool:
    """True when retrying `exc`'s job would fail the same way (follows `raise ... from`)."""
    from pydantic import ValidationError
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, TransientJobError):
            return False
        if isinstance(exc, (UserFacingError, ValidationError)):
            return True
        exc = exc.__cause__
    return False
