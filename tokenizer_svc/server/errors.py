"""`RequestRejected`: a request that fails with a gRPC status, a reason and a clear message.

The reason travels in the trailing metadata key `istanbul-error` so that clients can react to
it without parsing the message (the Python client maps it back to the local exception types).
"""

from __future__ import annotations

import grpc

ERROR_METADATA_KEY = "istanbul-error"

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
