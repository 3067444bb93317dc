"""Optional bearer-token authentication (`--auth-token-file`): `authorization: Bearer <token>`.

The token file holds one or more tokens, one per line (several lines let tokens rotate
without downtime); blank lines and lines starting with `#` are ignored. Health checks
(grpc.health.v1) stay open so that load balancers and container probes need no secret;
everything else, reflection included, needs a valid token or gets UNAUTHENTICATED.

The decision is made from the metadata, before any request body is read: a refused call is
answered by a streaming handler that never reads its request stream, so an unauthenticated
client cannot make the server receive (and hold) a large message. Refusals are logged at
WARNING with the peer.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path

import grpc

from istanbul_errors import UserFacingError

from .errors import UNAUTHENTICATED, RequestRejected, refusing

log = logging.getLogger("tokenizer_svc.service.auth")

OPEN_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})


def load_tokens(path: str | Path) -> tuple[str, ...]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UserFacingError(f"auth token file {path}: cannot read it ({exc.strerror}); give "
                              "a readable file with one token per line") from None
    tokens = tuple(line.strip() for line in text.splitlines()
                   if line.strip() and not line.strip().startswith("#"))
    if not tokens:
        raise UserFacingError(f"auth token file {path} holds no token; write one token per line")
    for token in tokens:
        if any(c.isspace() for c in token) or not token.isascii():
            raise UserFacingError(f"auth token file {path}: a token contains whitespace or "
                                  "non-ASCII characters; tokens must be single printable words")
    return tokens


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: tuple[str, ...]):
        if not tokens:
            raise ValueError("BearerAuthInterceptor needs at least one token")
        self._tokens = tuple(t.encode() for t in tokens)

    def problem(self, metadata) -> str | None:
        """Why a call with these (key, value) metadata pairs is refused; None if it may
        proceed. Also the HTTP side's check (the dashboard passes its Authorization header)."""
        values = [v for k, v in (metadata or ()) if k == "authorization"]
        if not values:
            return ("missing credentials: this server requires the metadata "
                    "'authorization: Bearer <token>'")
        scheme, _, token = (values[0] if isinstance(values[0], str)
                            else values[0].decode("latin-1")).partition(" ")
        if scheme.lower() != "bearer" or not token:
            return "the authorization metadata must be 'Bearer <token>'"
        given = token.strip().encode()
        # Compare against every token in constant time, so timing reveals nothing.
        if not any([hmac.compare_digest(given, t) for t in self._tokens]):
            return "invalid bearer token"
        return None

    async def intercept_service(self, continuation, details):
        if details.method in OPEN_METHODS:
            return await continuation(details)
        problem = self.problem(details.invocation_metadata)
        handler = await continuation(details)
        if problem is None or handler is None:
            return handler

        def warn(context):
            log.warning("authentication refused", extra={"data": {
                "peer": context.peer(), "reason": problem}})
        return refusing(handler, RequestRejected(grpc.StatusCode.UNAUTHENTICATED,
                                                 UNAUTHENTICATED, problem), before=warn)
