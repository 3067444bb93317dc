"""What a process exposes on the network, decided the same way for `istanbul serve` and
`istanbul trainer`: loopback unless the user says `--listen-public`, and a Prometheus
/metrics endpoint that can require the service's bearer token (`--metrics-auth`).

    host = bind_address(args.host, "--host", public=args.listen_public)   # 127.0.0.1 default
    server = serve_metrics(registry, host, port, tokens=("s3cret",))     # 401 without it
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
import socketserver
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from istanbul_errors import UserFacingError

LOOPBACK = "127.0.0.1"
ALL_INTERFACES = "0.0.0.0"


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:          # a host name: it may resolve to anything
        return False


def bind_address(host: str | None, flag: str, *, public: bool) -> str:
    """The address to bind: `host` if given, else loopback (all interfaces with `public`).
    An address other than loopback needs `public`, so nothing is exposed by accident."""
    if host is None:
        return ALL_INTERFACES if public else LOOPBACK
    if not public and not is_loopback(host):
        raise UserFacingError(f"{flag} {host} is not a loopback address; add --listen-public "
                              "to listen there on purpose (and --auth-token-file to require a "
                              "token)")
    return host


class _ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):   # scrapes are not worth a log line each
        pass


def _bearer_guard(app, tokens: tuple[str, ...]):
    expected = [t.encode() for t in tokens]

    def guarded(environ, start_response):
        header = environ.get("HTTP_AUTHORIZATION", "")
        scheme, _, token = header.partition(" ")
        given = token.strip().encode()
        # compare with every token (no early exit), in constant time each
        ok = scheme.lower() == "bearer" and sum(hmac.compare_digest(given, t)
                                                for t in expected) > 0
        if not ok:
            start_response("401 Unauthorized", [("Content-Type", "text/plain"),
                                                ("WWW-Authenticate", 'Bearer realm="metrics"')])
            return [b"401: /metrics needs 'Authorization: Bearer <token>'\n"]
        return app(environ, start_response)
    return guarded


def serve_metrics(registry, host: str, port: int, tokens: tuple[str, ...] = ()):
    """Serve `registry` at http://host:port/metrics on a daemon thread; with `tokens`, only
    to requests that carry one of them. Returns the server (`.server_port`, `.shutdown()`,
    `.server_close()`)."""
    from prometheus_client import make_wsgi_app
    app = make_wsgi_app(registry)
    if tokens:
        app = _bearer_guard(app, tuple(tokens))

    class Server(_ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    httpd = make_server(host.strip("[]"), port, app, server_class=Server,
                        handler_class=_QuietHandler)
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()
    return httpd
