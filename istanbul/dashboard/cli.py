"""`istanbul dashboard`: serve the live dashboard of jobs and services.

    istanbul dashboard [--redis URL | --data-dir DIR] [--port 8080] [--host ADDR]
                       [--listen-public] [--auth-token-file F] [--tokenizer-metrics URL]

Only argparse is imported to build the parser; the web stack (starlette, uvicorn: the
`dashboard` extra), Redis and the reader load when the command runs.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
from pathlib import Path

from istanbul_errors import UserFacingError

log = logging.getLogger(__name__)

EXTRA = "dashboard"


def register(sub) -> None:
    from trainer_svc.cli_jobs import add_redis_args
    p = sub.add_parser(
        "dashboard", help="a live web page of the training queue: jobs, loss curves, "
                          "checkpoints, datasets, daemons (pip install 'istanbul[dashboard]')",
        description="Serve a web page that shows, live, what the training daemons write to "
                    "Redis: the queue (queued, leased, running, done, failed, dead-lettered "
                    "jobs), each job's loss curves, learning rate, grad norm, tokens/s, ETA, "
                    "checkpoints and spec, the datasets and the daemons; optionally a "
                    "tokenizer service's /metrics. Anyone who can open the page can read; "
                    "cancelling or re-queueing a job needs a bearer token from "
                    "--auth-token-file.")
    add_redis_args(p)
    p.add_argument("--port", type=int, default=8080, help="HTTP port (0: any free port)")
    p.add_argument("--host", default=None, metavar="ADDR",
                   help="address to listen on (default: 127.0.0.1; 0.0.0.0 with "
                        "--listen-public)")
    p.add_argument("--listen-public", action="store_true",
                   help="listen on all interfaces; needed for any address that is not "
                        "loopback")
    p.add_argument("--auth-token-file", type=Path, metavar="PATH",
                   help="bearer tokens, one per line (the service's format), that the cancel "
                        "and re-queue buttons need (default: none, the page is read-only)")
    p.add_argument("--tokenizer-metrics", metavar="URL",
                   help="also show this tokenizer service's metrics, e.g. "
                        "http://127.0.0.1:9400/metrics (`istanbul serve --metrics-port`)")
    p.add_argument("--refresh", type=float, default=1.0, metavar="S",
                   help="seconds between reads of Redis for the live page")
    p.add_argument("--port-file", type=Path, metavar="PATH",
                   help="write the port once listening (useful with --port 0)")
    p.set_defaults(func=cmd_dashboard)


def cmd_dashboard(args) -> int:
    from istanbul_errors import require_extra
    for module in ("starlette", "uvicorn"):
        require_extra(module, EXTRA, "istanbul dashboard")
    import uvicorn
    from tokenizer_svc.exposure import bind_address, is_loopback
    from trainer_svc.jobs.redis_conn import connect
    from .app import create_app
    from .checkpoints import CheckpointInspector
    from .reader import Reader
    from .tokenizer_metrics import TokenizerMetrics

    if args.refresh <= 0:
        raise UserFacingError(f"--refresh must be positive, got {args.refresh}")
    if not 0 <= args.port <= 65535:
        raise UserFacingError(f"--port {args.port} is not a port number (0 to 65535)")
    if args.tokenizer_metrics and not args.tokenizer_metrics.startswith(("http://",
                                                                         "https://")):
        raise UserFacingError(f"--tokenizer-metrics {args.tokenizer_metrics!r}: give the "
                              "metrics URL, e.g. http://127.0.0.1:9400/metrics")
    host = bind_address(args.host, "--host", public=args.listen_public)
    tokens = ()
    if args.auth_token_file:
        from tokenizer_svc.service.auth import load_tokens
        tokens = load_tokens(args.auth_token_file)
    sock = _listen(host, args.port)
    port = sock.getsockname()[1]
    handle = connect(args.redis, data_dir=args.data_dir)
    inspector = CheckpointInspector()
    tokenizer = TokenizerMetrics(args.tokenizer_metrics) if args.tokenizer_metrics else None
    app = create_app(Reader(handle, inspector), tokens=tokens, tokenizer=tokenizer,
                     refresh_s=args.refresh)
    shown = f"[{host}]" if ":" in host else host
    print(f"dashboard on http://{shown}:{port}/ (Redis {handle.location}; "
          + ("cancel and re-queue need a token from " + str(args.auth_token_file) if tokens
             else "read-only: no --auth-token-file") + ")", flush=True)
    if not is_loopback(host):
        log.warning("the dashboard listens on %s: anyone who reaches the port can read the "
                    "jobs%s", host, "" if tokens else " (none can change them: no token file)")
    if args.port_file:
        tmp = args.port_file.with_name(args.port_file.name + f".tmp-{os.getpid()}")
        tmp.write_text(f"{port}\n")
        tmp.replace(args.port_file)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then raises the signal again under the
    # handlers it found: these let the command return 0 after releasing Redis (the embedded
    # server stops with its last client) instead of dying of the signal, and stop a server
    # that is signalled before uvicorn has taken the signals over.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: setattr(server, "should_exit", True))
    try:
        server.run(sockets=[sock])
    finally:
        inspector.close()
        handle.close()
    return 0


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host.strip("[]"), port), family=family, backlog=128)
    except OSError as exc:
        raise UserFacingError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick "
                              "another --port (0: any free one)") from None
