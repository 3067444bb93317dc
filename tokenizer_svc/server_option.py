"""`--server HOST:PORT` for the istanbul commands (encode, decode): the options, and the
tokenizer-service client they give, which has the Encoding's API and output.

Kept apart from tokenizer_svc.client so that registering the options imports no gRPC.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from istanbul_errors import UserFacingError

if TYPE_CHECKING:   # annotations only: importing the client pulls in gRPC
    from tokenizer_svc.client import TokenizerClient


def add_server_arguments(parser) -> None:
    """The options that point a command at a running tokenizer service instead of --vocab."""
    parser.add_argument("--server", metavar="HOST:PORT",
                        help="use the tokenizer service at HOST:PORT instead of a local "
                             "vocabulary (same output as --vocab with the server's vocabulary)")
    parser.add_argument("--server-token-file", metavar="PATH",
                        help="bearer token for a server started with --auth-token-file")
    parser.add_argument("--server-tls", action="store_true", help="connect with TLS")
    parser.add_argument("--server-ca", metavar="PEM",
                        help="CA certificate(s) to trust for --server-tls (default: system roots)")


def client_from_args(args, startup_timeout: float = 120.0) -> TokenizerClient:
    """A connected client for `--server`, checked with GetInfo.

    A server that is still loading is waited for (up to `startup_timeout` seconds); one that
    cannot be reached fails at once with a UserFacingError.
    """
    from .client import ServiceError, TokenizerClient
    client = TokenizerClient(args.server, token_file=args.server_token_file,
                             tls=args.server_tls, root_certificates=args.server_ca, timeout=60,
                             retries=2)
    deadline = time.monotonic() + startup_timeout
    while True:
        try:
            client.info()
            client.retries = 8  # reachable: ride out restarts from now on
            return client
        except ServiceError as exc:
            if exc.reason == "not-ready" and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            client.close()
            raise UserFacingError(f"--server {args.server}: {exc.details or exc.code.name} "
                                  f"({exc.code.name}); is `istanbul serve` running there?") \
                from None
