"""Per-request limit checks: each failure names the limit, the value and what to do; and
`utf8_len`, the size in bytes that the limits, the batches and the GPU calls count."""

from __future__ import annotations

import grpc

from .config import Limits
from .errors import RequestRejected, limit_reason


def utf8_len(doc) -> int:
    """Bytes of a document: raw bytes, or text as UTF-8 (without encoding ASCII text)."""
    if isinstance(doc, (bytes, bytearray, memoryview)):
        return len(doc)
    return len(doc) if doc.isascii() else len(doc.encode("utf-8", "surrogatepass"))


FLAGS = {  # the `istanbul serve` flag that raises each limit
    "max_message_bytes": "--max-message-bytes",
    "max_text_bytes": "--max-text-bytes",
    "max_batch_items": "--max-batch-items",
    "max_decode_ids": "--max-decode-ids",
    "max_queued_bytes": "--max-queued-bytes",
}


def over_limit(code: grpc.StatusCode, name: str, what: str, value: int, limit: int,
               advice: str) -> RequestRejected:
    return RequestRejected(
        code, limit_reason(name),
        f"{what} is {value:,}, over the server's {name} limit of {limit:,}; {advice} "
        f"(server flag {FLAGS[name]})")


def check_message_size(limits: Limits, nbytes: int, message_type: str) -> None:
    if nbytes > limits.max_message_bytes:
        raise over_limit(grpc.StatusCode.RESOURCE_EXHAUSTED, "max_message_bytes",
                         f"the {message_type} message size in bytes", nbytes,
                         limits.max_message_bytes, "send fewer or smaller documents per request")


def check_text_bytes(limits: Limits, nbytes: int, what: str) -> None:
    if nbytes > limits.max_text_bytes:
        raise over_limit(grpc.StatusCode.INVALID_ARGUMENT, "max_text_bytes",
                         f"the size of {what} in bytes", nbytes, limits.max_text_bytes,
                         "split the text into smaller documents")


def check_batch_items(limits: Limits, count: int, what: str) -> None:
    if count > limits.max_batch_items:
        raise over_limit(grpc.StatusCode.INVALID_ARGUMENT, "max_batch_items",
                         f"the number of {what}", count, limits.max_batch_items,
                         "split the batch into several requests")


def check_decode_ids(limits: Limits, count: int) -> None:
    if count > limits.max_decode_ids:
        raise over_limit(grpc.StatusCode.INVALID_ARGUMENT, "max_decode_ids",
                         "the number of ids to detokenize", count, limits.max_decode_ids,
                         "detokenize in several requests")


def queue_full(limits: Limits, queued: int, nbytes: int) -> RequestRejected:
    return over_limit(grpc.StatusCode.RESOURCE_EXHAUSTED, "max_queued_bytes",
                      f"the server's queued input in bytes with this request ({nbytes:,} bytes)",
                      queued + nbytes, limits.max_queued_bytes,
                      "the server is overloaded: retry with backoff, or add replicas")
