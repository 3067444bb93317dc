"""`RequestRejected`: a request that fails with a gRPC status, a reason and a clear message.

The reason travels in the trailing metadata key `istanbul-error` so that clients can react to
it without parsing the message (the Python client maps it back to the local exception types).
`refusing` answers one in place of a method's handler without reading the request (auth.py,
door.py).
"""

from __future__ import annotations

from urllib.parse import quote

import grpc

ERROR_METADATA_KEY = "istanbul-error"
INVALID_TOKEN_METADATA_KEY = "istanbul-invalid-token"  # "id,position,document"
DOCUMENT_METADATA_KEY = "istanbul-document"  # which document of a batch request failed
SPECIAL_TOKEN_METADATA_KEY = "istanbul-special-token"  # the disallowed special token found
# gRPC metadata values are printable ASCII: the token is percent-encoded (RFC 3986 style:
# '%', controls and non-ASCII escaped; "<|endoftext|>" stays as it is). Clients unquote it.
_TOKEN_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")

# Reasons (the value of the `istanbul-error` trailer).
MALFORMED = "malformed-request"
INVALID_UTF8 = "invalid-utf8"
DISALLOWED_SPECIAL = "disallowed-special"
INVALID_TOKEN = "invalid-token"
BAD_ARGUMENT = "bad-argument"
NOT_READY = "not-ready"
UNAUTHENTICATED = "unauthenticated"


def limit_reason(limit_name: str) -> str:
    return f"limit:{limit_name}"


class RequestRejected(Exception):
    """Raised (or returned by a deserializer) to answer a request with `code` and `message`."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str,
                 extra_metadata: tuple = ()):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.extra_metadata = extra_metadata  # more (key, value) trailers, e.g. the bad id

    def with_prefix(self, prefix: str) -> "RequestRejected":
        return RequestRejected(self.code, self.reason, f"{prefix}: {self.message}",
                               self.extra_metadata)

    def trailing_metadata(self) -> tuple:
        return ((ERROR_METADATA_KEY, self.reason), *self.extra_metadata)


def shutting_down() -> RequestRejected:
    """The answer to work the server no longer takes because it drains: retryable elsewhere."""
    return RequestRejected(grpc.StatusCode.UNAVAILABLE, NOT_READY,
                           "the server is shutting down; retry (another replica)")


def refusing(handler, rejection: RequestRejected, before=None):
    """A handler that answers `rejection` in place of `handler` without reading the request:
    request-streaming handlers only receive a message when they iterate, and this one never
    does (the caller sees the same status whatever the method's shape). `before(context)`
    runs first (a log line)."""
    async def refuse(request_iterator, context):
        if before is not None:
            before(context)
        await context.abort(rejection.code, rejection.message,
                            trailing_metadata=rejection.trailing_metadata())

    if handler.unary_unary or handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(refuse, None, handler.response_serializer)

    async def refuse_stream(request_iterator, context):
        await refuse(request_iterator, context)
        yield  # pragma: no cover (abort raises)

    return grpc.stream_stream_rpc_method_handler(refuse_stream, None,
                                                 handler.response_serializer)


def special_token_metadata(token: str) -> tuple:
    """The trailer naming a disallowed special token (any Unicode: DeepSeek's '<｜User｜>')."""
    return ((SPECIAL_TOKEN_METADATA_KEY, quote(token, safe=_TOKEN_SAFE)),)


def disallowed_special_message(token: str) -> str:
    """The refusal in the protocol's terms (SpecialTokenPolicy fields), for any client; the
    Python client rewrites it into tiktoken's wording from the trailer."""
    return (f"the text contains the special token {token!r}, which the request's "
            f"SpecialTokenPolicy does not allow: add it to `special.allowed` (or set "
            f"`special.allow_all`) to encode it as that special token, or set "
            f"`special.disallow_none` (or list other tokens in `special.disallowed`) to "
            f"encode it as ordinary text")


def parsed(request):
    """A request from tolerant_deserializer: the message, or its RequestRejected raised."""
    if isinstance(request, RequestRejected):
        raise request
    return request


def bad_argument(message: str) -> RequestRejected:
    """INVALID_ARGUMENT with reason `bad-argument`."""
    return RequestRejected(grpc.StatusCode.INVALID_ARGUMENT, BAD_ARGUMENT, message)
