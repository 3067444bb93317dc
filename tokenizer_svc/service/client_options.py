"""`--tokenizer HOST:PORT` and its connection options, for every command that talks to a
tokenizer service (encode, decode, prepare), and the client they give, which has the
Encoding's API and output.

The same names as on the server side: `--auth-token-file` (serve: the tokens it accepts;
here: the first one is sent), `--tls`, `--tls-ca`. Kept apart from tokenizer_svc.service.client so that
registering the options imports no gRPC.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from istanbul_errors import UserFacingError

if TYPE_CHECKING:   # annotations only: importing the client pulls in gRPC
    from tokenizer_svc.service.client import TokenizerClient


def add_tokenizer_arguments(parser, *, required: bool = False, help: str | None = None) -> None:
    """`--tokenizer HOST:PORT` (the gRPC tokenizer service) with its auth and TLS options."""
    parser.add_argument("--tokenizer", metavar="HOST:PORT", required=required,
                        help=help or "the gRPC tokenizer service (`istanbul serve`)")
    add_client_security_arguments(parser)


def add_client_security_arguments(parser) -> None:
    parser.add_argument("--auth-token-file", type=Path, metavar="PATH",
                        help="bearer token (the file's first line) for a service started with "
                             "--auth-token-file")
    parser.add_argument("--tls", action="store_true", help="connect with TLS")
    parser.add_argument("--tls-ca", type=Path, metavar="PEM",
                        help="CA certificate(s) to trust (implies --tls; default: the system's "
                             "roots)")


def client_from_args(args, startup_timeout: float = 120.0) -> TokenizerClient:
    """A connected client for `--tokenizer`, checked with GetInfo.

    A server that is still loading is waited for (up to `startup_timeout` seconds); one that
    cannot be reached fails at once with a UserFacingError.
    """
    from .client import ServiceError, TokenizerClient
    client = TokenizerClient(args.tokenizer, token_file=args.auth_token_file,
                             tls=args.tls or args.tls_ca is not None,
                             root_certificates=args.tls_ca, timeout=60, retries=2)
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
            raise UserFacingError(f"tokenizer service at {args.tokenizer} (--tokenizer): "
                                  f"{exc.details or exc.code.name} ({exc.code.name}); is "
                                  "`istanbul serve` running there?") from None
