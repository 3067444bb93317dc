"""Which asyncio event loop a server process runs (`istanbul serve --event-loop`).

Why: a worker's request handling is grpc.aio's callbacks on the event loop, and that is what
caps small requests per core (dev/service_throughput/README.md). uvloop (libuv under
asyncio's API) runs the same
callbacks with less CPU per request (dev/service_throughput/README.md).
grpc.aio supports any asyncio loop. `auto` takes uvloop when it is installed (a dependency
on Linux and macOS), else asyncio's own.
"""

from __future__ import annotations

import asyncio

from istanbul_errors import UserFacingError

CHOICES = ("auto", "uvloop", "asyncio")


def _uvloop():
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop


def resolve(choice: str) -> str:
    """The loop `choice` means on this machine: "uvloop" or "asyncio"."""
    if choice not in CHOICES:
        raise UserFacingError(f"unknown event loop {choice!r} (choose from {', '.join(CHOICES)})")
    if choice == "auto":
        return "uvloop" if _uvloop() is not None else "asyncio"
    if choice == "uvloop" and _uvloop() is None:
        raise UserFacingError("--event-loop uvloop: uvloop is not installed "
                              "(pip install uvloop; it does not exist on Windows)")
    return choice


def new_loop(choice: str) -> asyncio.AbstractEventLoop:
    """A new event loop of the kind `choice` resolves to."""
    if resolve(choice) == "uvloop":
        return _uvloop().new_event_loop()
    return asyncio.new_event_loop()


def run(coro, choice: str):
    """asyncio.run(coro) on a loop of the kind `choice` resolves to."""
    with asyncio.Runner(loop_factory=lambda: new_loop(choice)) as runner:
        return runner.run(coro)


def name_of(loop: asyncio.AbstractEventLoop) -> str:
    """"uvloop" or "asyncio": what a running server reports (logs, GetInfo)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
