"""One-line errors for a port the server cannot listen on, naming which port it was.

grpc reports a failed bind as a bare RuntimeError ("Failed to bind to address ...") and
http.server as an OSError without the address; `PortUnavailable` says which port (gRPC or
metrics), why (busy, privileged, not an address of this machine) and which flag changes it.
"""

from __future__ import annotations

import errno
import socket


class PortUnavailable(OSError):
    """The gRPC or metrics port cannot be bound; the message is the whole story."""


_WHY = {
    errno.EADDRINUSE: "is already in use by another process (another `istanbul serve`?)",
    errno.EACCES: "needs privileges (ports below 1024 are reserved for root)",
    errno.EADDRNOTAVAIL: "is not an address of this machine",
}


def _probe(host: str, port: int) -> OSError | None:
    """Bind (without SO_REUSEPORT) and release host:port: the OS's reason it is unusable."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        try:
            probe.bind(address)
        except OSError as exc:
            return exc
    return None


HOST_FLAGS = {"--port": "--host", "--metrics-port": "--metrics-host"}


def port_error(what: str, flag: str, host: str, port: int,
               cause: BaseException | None = None) -> PortUnavailable:
    """`what` ("gRPC port", "metrics port") at host:port cannot be bound: why, and the flag
    (`flag` for the port; its host flag when the address is at fault)."""
    exc = _probe(host, port)
    exc = exc or (cause if isinstance(cause, OSError) else None)
    where = f"{host}:{port}" if ":" not in host else f"[{host.strip('[]')}]:{port}"
    if isinstance(exc, socket.gaierror) or getattr(exc, "errno", None) == errno.EADDRNOTAVAIL:
        why = (f"has a host name that does not resolve ({exc.strerror})"
               if isinstance(exc, socket.gaierror) else _WHY[errno.EADDRNOTAVAIL])
        return PortUnavailable(f"{what} {where} {why}; choose another address with "
                               f"{HOST_FLAGS.get(flag, '--host')}")
    elif exc is not None and exc.errno in _WHY:
        why = _WHY[exc.errno]
    elif exc is not None:
        why = f"cannot be bound ({exc.strerror or exc})"
    else:
        why = f"cannot be bound ({cause})" if cause else "cannot be bound"
    return PortUnavailable(f"{what} {where} {why}; choose another with {flag} "
                           "(0: any free port)")


def check_free(what: str, flag: str, host: str, port: int) -> None:
    """Raise PortUnavailable now if host:port cannot be bound (before grpc tries: its failed
    bind also logs a multi-line error of its own)."""
    if _probe(host, port) is not None:
        raise port_error(what, flag, host, port)
