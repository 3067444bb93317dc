"""Python client of the gRPC tokenizer service, shaped like `tiktoken.Encoding`.

    from tokenizer_svc.service.client import TokenizerClient

    with TokenizerClient("localhost:50051") as enc:           # token=..., tls=True, ...
        ids = enc.encode("hello <|endoftext|>", allowed_special="all")
        text = enc.decode(ids)
        enc.name, enc.n_vocab, enc.eot_token, enc.special_tokens_set, enc.vocabulary_hash

Many documents (what `istanbul prepare` does) take one of two shapes:

    ids, offsets = enc.encode_batch_flat(documents)
    # ids: np.uint32, every document's ids concatenated; offsets: np.int64, n+1 entries,
    # document i is ids[offsets[i]:offsets[i+1]]. Sent as TokenizeBatch requests of at most
    # `batch_bytes` bytes, several in flight at once.

    for ids in enc.tokenize_stream(iter_documents()):       # any iterable, even endless
        ...                                                  # np.uint32 per document, in order
    # One TokenizeStream call with up to `window` documents in flight. If the server becomes
    # UNAVAILABLE mid-stream (restart, failover), the stream resumes on a new call with the
    # documents that were sent but not answered: nothing is lost or repeated.

Beyond tiktoken's API:

    enc.chunk(text, max_tokens=512, overlap=64)   # [chunking.Chunk(ids, text, start, end,
                                                  #  byte_start, byte_end, ...)]: RAG windows
    enc.apply_chat_template(messages, add_generation_prompt=True)   # transformers' ids
    enc.encode_batch(texts, return_exceptions=True)   # a bad document's slot holds its error

Documents are `str` (text; special tokens follow allowed_special/disallowed_special, whose
defaults here are Encoding.encode_batch_flat's: special-token text is ordinary text) or
`bytes` (raw bytes, may be invalid UTF-8, always ordinary text).

Every call has a deadline (`timeout`, seconds, covering its retries) and is retried on
UNAVAILABLE (server starting, restarting, draining) and on a full server queue, with
exponential backoff and jitter. Errors keep tiktoken's types: text with a disallowed special
token raises ValueError, an id outside the vocabulary raises `InvalidTokenError` (a
ValueError), decoding invalid UTF-8 with errors="strict" raises UnicodeDecodeError. Other
failures raise `ServiceError` with the gRPC code and the server's message.

Batches fail whole by default, as tiktoken's `encode_batch` does: one bad document raises and
no ids come back. With `return_exceptions=True` (encode_batch, encode_ordinary_batch,
decode_batch, decode_bytes_batch, chunk_batch; asyncio.gather's word) the request asks the
server for per-item errors, and each bad item's slot in the returned list holds the exception
that item alone would have raised (DisallowedSpecialError, RequestError for a limit,
InvalidTokenError, UnicodeDecodeError) while the others hold their results. The exceptions
are returned, never raised; `document` on them counts over the whole call.
"""

from __future__ import annotations

import collections
import json
import random
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator

import grpc
import numpy as np

from ..chunking import Chunk, check_window_arguments
from ..encoding import InvalidTokenError as LocalInvalidTokenError
from ..reference import DisallowedSpecialTokenError, disallowed_message
from .rpc import tokenizer_pb2 as pb
from .rpc import tokenizer_pb2_grpc as pb_grpc

ERROR_METADATA_KEY = "istanbul-error"   # the server's machine-readable reason (service/errors.py)
INVALID_TOKEN_METADATA_KEY = "istanbul-invalid-token"  # "id,position,document" (service/errors.py)
DOCUMENT_METADATA_KEY = "istanbul-document"  # the failed document of a batch request
SPECIAL_TOKEN_METADATA_KEY = "istanbul-special-token"  # the disallowed token (service/errors.py)
PACKED = pb.ID_FORMAT_PACKED   # the client asks for packed ids: np.frombuffer, no lists


def _unquoted(value: str | None) -> str | None:
    """A percent-encoded trailer value (the server's special_token_metadata) as text."""
    from urllib.parse import unquote
    return None if value is None else unquote(value)


def reply_ids(reply) -> np.ndarray:
    """The ids of a Tokenize/TokenizeBatch reply as np.uint32: `ids_packed` (little-endian
    uint32), or `ids` from a server older than the packed field."""
    if reply.ids_packed:
        return np.frombuffer(reply.ids_packed, "<u4").astype(np.uint32, copy=False)
    return np.asarray(reply.ids, np.uint32)
RETRY_REASONS = ("limit:max_queued_bytes",)  # RESOURCE_EXHAUSTED that is worth retrying


class ServiceError(Exception):
    """A call that failed: the gRPC code, the server's reason and its message."""

    def __init__(self, code: grpc.StatusCode, details: str, reason: str = "", target: str = ""):
        where = f" ({target})" if target else ""
        Exception.__init__(self, f"tokenizer service{where}: {code.name}: {details}")
        self.code, self.details, self.reason = code, details, reason


class RequestError(ServiceError, ValueError):
    """The server refused the request as sent (INVALID_ARGUMENT): fix the input."""


class InvalidTokenError(RequestError, LocalInvalidTokenError):
    """An id outside the vocabulary; also an `encoding.InvalidTokenError`, so code that
    catches the local Encoding's error catches this one, and its text is the local one.
    `token`, `position` and `document` (for batches) say which id."""

    def __init__(self, code, details, reason="", target="", trailer=""):
        super().__init__(code, details, reason, target)
        token, position, document = (trailer.split(",") + ["", "", ""])[:3]
        self.token = int(token) if token.isdigit() else None
        self.position = int(position) if position.isdigit() else None
        self.document = int(document) if document.isdigit() else None

    def __str__(self) -> str:
        return self.details


class DisallowedSpecialError(RequestError, DisallowedSpecialTokenError):
    """Text that spells a special token the call did not allow (tiktoken's ValueError); also
    a `reference.DisallowedSpecialTokenError`, with the local text. `document` says which
    document of a batch, counted over the whole call."""

    def __init__(self, code, details, reason="", target="", document: int | None = None,
                 token: str | None = None):
        super().__init__(code, details, reason, target)
        self.document = document
        self.token = token
        if token is not None:   # the server speaks protocol fields; Python callers tiktoken
            self.message = disallowed_message(token)
        else:
            prefix = f"document {document}: "
            self.message = details[len(prefix):] if document is not None and \
                details.startswith(prefix) else details

    def __str__(self) -> str:
        return self.message


def _fix_surrogates(text: str) -> str:
    """What tiktoken does with lone surrogates (they cannot be sent as UTF-8): U+FFFD."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def special_policy(allowed_special=frozenset(), disallowed_special="all") -> pb.SpecialTokenPolicy:
    """tiktoken's allowed_special/disallowed_special as a SpecialTokenPolicy message."""
    policy = pb.SpecialTokenPolicy()
    if allowed_special == "all":
        policy.allow_all = True
    else:
        policy.allowed.extend(sorted(allowed_special))
    if disallowed_special != "all":
        if disallowed_special:
            policy.disallowed.extend(sorted(disallowed_special))
        else:
            policy.disallow_none = True
    return policy


ORDINARY = pb.SpecialTokenPolicy(disallow_none=True)


def _read(value) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    return Path(value).read_bytes()


class TokenizerClient:
    """A connection to a tokenizer service (thread-safe; reuse it).

    target: "host:port"; for several replicas, gRPC's name forms: "dns:///name:port" (every
    address the name resolves to, e.g. a compose service with replicas) or
    "ipv4:10.0.0.1:50051,10.0.0.2:50051" (a fixed list). Calls are spread over the ready
    replicas round robin (`load_balancing`; "pick_first" keeps one connection), and a call that
    finds its replica gone (UNAVAILABLE) is retried on another. token / token_file: bearer token for servers started with
    --auth-token-file. tls: use TLS; root_certificates: PEM bytes or a path (default: the
    system's roots); server_name: the name to check in the server's certificate when it is not
    the host in `target`. timeout: seconds per call, retries included. retries: attempts after
    the first on UNAVAILABLE. batch_bytes / batch_docs: size of the TokenizeBatch requests of
    encode_batch_flat; inflight: how many of them are in flight at once.
    """

    def __init__(self, target: str, *, token: str | None = None, token_file=None,
                 tls: bool = False, root_certificates=None, server_name: str | None = None,
                 timeout: float = 60.0, retries: int = 8, backoff_s: float = 0.05,
                 max_backoff_s: float = 2.0, batch_bytes: int = 4 << 20, batch_docs: int = 4096,
                 inflight: int = 4, load_balancing: str = "round_robin",
                 options: list | None = None):
        self.target = target
        self.timeout = timeout
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.batch_bytes = batch_bytes
        self.batch_docs = batch_docs
        self.inflight = max(1, inflight)
        if token_file is not None:  # the server's format: the first token in the file
            from .auth import load_tokens
            token = load_tokens(token_file)[0]
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        # Reconnect quickly after a server restart (grpc's default first backoff is 1 s).
        opts = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1),
                ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 2000)]
        if load_balancing not in ("round_robin", "pick_first"):
            raise ValueError(f"load_balancing must be 'round_robin' or 'pick_first', not "
                             f"{load_balancing!r}")
        opts.append(("grpc.service_config",
                     json.dumps({"loadBalancingConfig": [{load_balancing: {}}]})))
        if server_name:
            opts.append(("grpc.ssl_target_name_override", server_name))
        opts += list(options or [])
        if tls or root_certificates is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=_read(root_certificates))
            self.channel = grpc.secure_channel(target, creds, options=opts)
        else:
            self.channel = grpc.insecure_channel(target, options=opts)
        self.stub = pb_grpc.TokenizerStub(self.channel)
        self._info: pb.GetInfoResponse | None = None

    # ---- plumbing -------------------------------------------------------------------------

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "TokenizerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _error(self, exc: grpc.RpcError) -> ServiceError:
        return self._error_from(exc.code() or grpc.StatusCode.UNKNOWN, exc.details() or "",
                                dict(exc.trailing_metadata() or ()))

    def _item_error(self, error: pb.ItemError, document: int) -> ServiceError:
        """The exception a per-item error stands for (what the item alone would raise);
        `document` is its index over the whole call."""
        code = next((c for c in grpc.StatusCode if c.value[0] == error.code),
                    grpc.StatusCode.UNKNOWN)
        trailers = {**error.metadata, ERROR_METADATA_KEY: error.reason,
                    DOCUMENT_METADATA_KEY: str(document)}
        return self._error_from(code, error.message, trailers)

    def _error_from(self, code: grpc.StatusCode, details: str, trailers: dict) -> ServiceError:
        reason = trailers.get(ERROR_METADATA_KEY, "")
        if reason == "invalid-token":
            return InvalidTokenError(code, details, reason, self.target,
                                     trailers.get(INVALID_TOKEN_METADATA_KEY, ""))
        if reason == "disallowed-special":
            document = trailers.get(DOCUMENT_METADATA_KEY)
            return DisallowedSpecialError(code, details, reason, self.target,
                                          int(document) if document is not None else None,
                                          _unquoted(trailers.get(SPECIAL_TOKEN_METADATA_KEY)))
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return RequestError(code, details, reason, self.target)
        return ServiceError(code, details, reason, self.target)

    def _retryable(self, exc: grpc.RpcError) -> bool:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            return True
        reason = dict(exc.trailing_metadata() or ()).get(ERROR_METADATA_KEY, "")
        return exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason in RETRY_REASONS

    def _backoff(self, attempt: int, deadline: float) -> bool:
        """Sleep before retry `attempt` (1-based); False if no time or attempts are left."""
        if attempt > self.retries:
            return False
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        delay *= random.uniform(0.5, 1.0)
        if time.monotonic() + delay >= deadline:
            return False
        time.sleep(delay)
        return True

    def _call(self, method, request, timeout: float | None = None):
        deadline = time.monotonic() + (timeout or self.timeout)
        attempt = 0
        while True:
            try:
                return method(request, timeout=max(deadline - time.monotonic(), 0.001),
                              metadata=self._metadata)
            except grpc.RpcError as exc:
                attempt += 1
                if not (self._retryable(exc) and self._backoff(attempt, deadline)):
                    raise self._error(exc) from None

    # ---- what the server serves -----------------------------------------------------------

    def info(self, refresh: bool = False) -> pb.GetInfoResponse:
        """GetInfo: vocabulary, limits, batching, adapter (cached after the first call)."""
        if self._info is None or refresh:
            self._info = self._call(self.stub.GetInfo, pb.GetInfoRequest())
        return self._info

    @property
    def name(self) -> str:
        return self.info().vocabulary_name

    @property
    def n_vocab(self) -> int:
        return self.info().n_vocab

    @property
    def eot_token(self) -> int | None:
        info = self.info()
        return info.eot_token if info.HasField("eot_token") else None

    @property
    def special_tokens_set(self) -> set[str]:
        return set(self.info().special_tokens)

    @property
    def vocabulary_hash(self) -> str:
        return self.info().vocabulary_hash

    def health(self, service: str = "", timeout: float = 5.0) -> str:
        """The grpc.health.v1 status name: SERVING, NOT_SERVING, SERVICE_UNKNOWN."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        stub = health_pb2_grpc.HealthStub(self.channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Block until the server reports SERVING (or raise TimeoutError)."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                last = self.health(timeout=min(5.0, max(deadline - time.monotonic(), 0.01)))
                if last == "SERVING":
                    return
            except grpc.RpcError as exc:
                last = f"{exc.code().name}: {exc.details()}"
            time.sleep(0.05)
        raise TimeoutError(f"tokenizer service {self.target} not SERVING after {timeout}s "
                           f"(last: {last})")

    # ---- encoding -------------------------------------------------------------------------

    @staticmethod
    def _request(doc, policy, **fields) -> pb.TokenizeRequest:
        if isinstance(doc, (bytes, bytearray, memoryview)):
            return pb.TokenizeRequest(data=bytes(doc), **fields)
        return pb.TokenizeRequest(text=_fix_surrogates(doc), special=policy, **fields)

    def encode(self, text: str, *, allowed_special=frozenset(), disallowed_special="all"
               ) -> list[int]:
        """Text to ids with tiktoken's special-token rules (default: specials are refused)."""
        request = self._request(text, special_policy(allowed_special, disallowed_special),
                                format=PACKED)
        return reply_ids(self._call(self.stub.Tokenize, request)).tolist()

    def encode_to_numpy(self, text: str, *, allowed_special=frozenset(),
                        disallowed_special="all") -> np.ndarray:
        """As `encode`, the ids as np.uint32 straight from the packed reply."""
        request = self._request(text, special_policy(allowed_special, disallowed_special),
                                format=PACKED)
        return reply_ids(self._call(self.stub.Tokenize, request))

    def encode_ordinary(self, text: str) -> list[int]:
        """Text to ids, special tokens encoded as ordinary text."""
        request = self._request(text, ORDINARY, format=PACKED)
        return reply_ids(self._call(self.stub.Tokenize, request)).tolist()

    def encode_bytes(self, data: bytes) -> list[int]:
        """Raw bytes (may be invalid UTF-8) to ids, as tiktoken's _encode_bytes."""
        request = self._request(bytes(data), ORDINARY, format=PACKED)
        return reply_ids(self._call(self.stub.Tokenize, request)).tolist()

    def encode_with_offsets(self, text: str, unit: str = "byte", *,
                            allowed_special=frozenset(), disallowed_special="all"
                            ) -> tuple[list[int], list[int]]:
        """(ids, offsets): each token's first byte (unit="byte") or the index of the
        character holding it (unit="char")."""
        units = {"byte": pb.OFFSET_UNIT_BYTE, "char": pb.OFFSET_UNIT_CHAR}
        if unit not in units:
            raise ValueError(f"unit must be 'byte' or 'char', not {unit!r}")
        request = self._request(text, special_policy(allowed_special, disallowed_special),
                                offsets=units[unit])
        reply = self._call(self.stub.Tokenize, request)
        return list(reply.ids), list(reply.starts)

    def count_tokens(self, text, *, allowed_special=frozenset(), disallowed_special="all") -> int:
        if isinstance(text, (bytes, bytearray)):
            request = pb.CountTokensRequest(data=bytes(text))
        else:
            request = pb.CountTokensRequest(
                text=_fix_surrogates(text),
                special=special_policy(allowed_special, disallowed_special))
        return self._call(self.stub.CountTokens, request).count

    def encode_batch(self, texts: list, *, allowed_special=frozenset(),
                     disallowed_special="all", return_exceptions: bool = False) -> list:
        """Ids per document; a bad document raises, or with `return_exceptions` its slot holds
        the exception (module doc)."""
        if return_exceptions:
            return self._encode_items(list(texts), special_policy(allowed_special,
                                                                  disallowed_special))
        ids, offsets = self.encode_batch_flat(texts, allowed_special=allowed_special,
                                              disallowed_special=disallowed_special)
        return [ids[offsets[k]:offsets[k + 1]].tolist() for k in range(len(texts))]

    def encode_ordinary_batch(self, texts: list, *, return_exceptions: bool = False) -> list:
        return self.encode_batch(texts, disallowed_special=(),
                                 return_exceptions=return_exceptions)

    def _encode_items(self, docs: list, policy) -> list:
        out: list = []
        for first, request in self._batches(docs, policy):
            request.per_item_errors = True
            reply = self._call(self.stub.TokenizeBatch, request)
            ids, bounds = reply_ids(reply), list(reply.doc_offsets)
            errors = {e.index: e for e in reply.errors}
            out += [self._item_error(errors[k], first + k) if k in errors
                    else ids[bounds[k]:bounds[k + 1]].tolist() for k in range(len(bounds) - 1)]
        return out

    def _groups(self, docs: list):
        """(start, stop, raw) of runs of at most batch_docs documents / ~batch_bytes bytes,
        one kind (text or raw bytes) each, in document order."""
        start, size, kind = 0, 0, None
        for k, doc in enumerate(docs):
            doc_kind = isinstance(doc, (bytes, bytearray, memoryview))
            doc_size = len(doc)
            if k > start and (doc_kind != kind or k - start >= self.batch_docs
                              or size + doc_size > self.batch_bytes):
                yield start, k, kind
                start, size = k, 0
            kind = doc_kind
            size += doc_size
        if start < len(docs):
            yield start, len(docs), kind

    def _batches(self, docs: list, policy):
        """(first document's index, TokenizeBatch request) per `_groups` run."""
        for start, stop, raw in self._groups(docs):
            yield start, self._batch_request(docs[start:stop], raw, policy)

    @staticmethod
    def _batch_request(docs: list, raw: bool, policy) -> pb.TokenizeBatchRequest:
        if raw:
            return pb.TokenizeBatchRequest(data=[bytes(d) for d in docs], format=PACKED)
        return pb.TokenizeBatchRequest(texts=[_fix_surrogates(d) for d in docs], special=policy,
                                       format=PACKED)

    def encode_batch_flat(self, docs: list, *, allowed_special=frozenset(),
                          disallowed_special=()) -> tuple[np.ndarray, np.ndarray]:
        """Many documents -> (ids np.uint32, offsets np.int64 with n+1 entries).

        Document i is ids[offsets[i]:offsets[i+1]]. As `Encoding.encode_batch_flat`: `str`
        documents follow the special-token arguments (default: special-token text is ordinary
        text, like encode_ordinary); `bytes` documents are raw (encode_bytes).
        """
        docs = list(docs)
        policy = special_policy(allowed_special, disallowed_special)
        pending: collections.deque = collections.deque()
        parts: list = []
        counts: list = []

        def collect(first, request, future):
            try:
                try:
                    reply = future.result()
                except grpc.RpcError as exc:
                    if not self._retryable(exc):
                        raise self._error(exc) from None
                    reply = self._call(self.stub.TokenizeBatch, request)
            except DisallowedSpecialError as exc:  # count the document over the whole call
                exc.document = first + (exc.document or 0)
                raise
            parts.append(reply_ids(reply))
            counts.append(np.diff(np.asarray(reply.doc_offsets, np.int64)))

        for first, request in self._batches(docs, policy):
            if len(pending) >= self.inflight:
                collect(*pending.popleft())
            pending.append((first, request, self.stub.TokenizeBatch.future(
                request, timeout=self.timeout, metadata=self._metadata)))
        while pending:
            collect(*pending.popleft())
        offsets = np.zeros(len(docs) + 1, np.int64)
        if counts:
            np.cumsum(np.concatenate(counts), out=offsets[1:])
        ids = np.concatenate(parts) if parts else np.zeros(0, np.uint32)
        return ids, offsets

    def tokenize_stream(self, docs: Iterable, *, allowed_special=frozenset(),
                        disallowed_special=(), window: int = 256) -> Iterator[np.ndarray]:
        """Ids (np.uint32) per document, in order, over one TokenizeStream call (special-token
        defaults as encode_batch_flat: ordinary text).

        Up to `window` documents are in flight. On UNAVAILABLE the stream resumes on a new
        call that first re-sends the unanswered documents (each document is answered exactly
        once). Closing the iterator early cancels the call.
        """
        return _ResumableStream(self, iter(docs), special_policy(allowed_special,
                                                                  disallowed_special), window)

    # ---- decoding -------------------------------------------------------------------------

    def decode_bytes(self, tokens) -> bytes:
        request = pb.DetokenizeRequest(ids=list(map(int, tokens)), mode=pb.DECODE_MODE_BYTES)
        return self._call(self.stub.Detokenize, request).data

    def decode(self, tokens, errors: str = "replace") -> str:
        """Ids to text; errors="replace" (tiktoken's default) substitutes U+FFFD for invalid
        UTF-8, "strict" raises UnicodeDecodeError (the exact bytes come back and are decoded
        here, so the result is the local Encoding's)."""
        return self.decode_bytes(tokens).decode("utf-8", errors)

    def decode_bytes_batch(self, batch, *, return_exceptions: bool = False) -> list:
        """Bytes per sequence; an invalid id raises InvalidTokenError, or with
        `return_exceptions` its sequence's slot holds the error (module doc)."""
        seqs = [list(map(int, s)) for s in batch]
        bounds = np.zeros(len(seqs) + 1, np.int64)
        np.cumsum([len(s) for s in seqs], out=bounds[1:])
        request = pb.DetokenizeBatchRequest(ids=[i for s in seqs for i in s],
                                            seq_offsets=bounds.tolist(),
                                            mode=pb.DECODE_MODE_BYTES,
                                            per_item_errors=return_exceptions)
        reply = self._call(self.stub.DetokenizeBatch, request)
        data: list = list(reply.data)
        for error in reply.errors:
            data[error.index] = self._item_error(error, error.index)
        return data

    def decode_batch(self, batch, *, errors: str = "replace",
                     return_exceptions: bool = False) -> list:
        out = self.decode_bytes_batch(batch, return_exceptions=return_exceptions)
        for k, data in enumerate(out):
            if isinstance(data, Exception):
                continue
            try:
                out[k] = data.decode("utf-8", errors)
            except UnicodeDecodeError as exc:
                if not return_exceptions:
                    raise
                out[k] = exc
        return out

    # ---- windows and chats ----------------------------------------------------------------

    def chunk(self, text, max_tokens: int, overlap: int = 0, *, allowed_special=frozenset(),
              disallowed_special="all") -> list[Chunk]:
        """`text` (str, or raw bytes) in windows of at most `max_tokens` tokens, neighbours
        sharing `overlap`: what `tokenizer_svc.chunking.chunk` gives with a local Encoding
        (its doc says what the spans guarantee). Special tokens as `encode`."""
        return self.chunk_batch([text], max_tokens, overlap, allowed_special=allowed_special,
                                disallowed_special=disallowed_special)[0]

    def chunk_batch(self, texts: list, max_tokens: int, overlap: int = 0, *,
                    allowed_special=frozenset(), disallowed_special="all",
                    return_exceptions: bool = False) -> list:
        """`chunk` of each document, in Chunk requests of ~batch_bytes."""
        check_window_arguments(max_tokens, overlap)
        docs = list(texts)
        policy = special_policy(allowed_special, disallowed_special)
        out: list = []
        for start, stop, raw in self._groups(docs):
            group = docs[start:stop]
            request = pb.ChunkRequest(max_tokens=max_tokens, overlap=overlap, format=PACKED,
                                      per_item_errors=return_exceptions)
            if raw:
                request.data.extend(bytes(d) for d in group)
            else:
                request.texts.extend(_fix_surrogates(d) for d in group)
                request.special.CopyFrom(policy)
            reply = self._call(self.stub.Chunk, request)
            errors = {e.index: e for e in reply.errors}
            for k, (doc, chunked) in enumerate(zip(group, reply.documents)):
                if k in errors:
                    out.append(self._item_error(errors[k], start + k))
                    continue
                ids = reply_ids(chunked).tolist()
                data = bytes(doc) if raw else None
                out.append([Chunk(ids=ids[w.token_start:w.token_end],
                                  text=data[w.byte_start:w.byte_end] if raw
                                  else doc[w.start:w.end],
                                  start=w.start, end=w.end, byte_start=w.byte_start,
                                  byte_end=w.byte_end, token_start=w.token_start,
                                  token_end=w.token_end) for w in chunked.windows])
        return out

    def apply_chat_template(self, messages: list, *, add_generation_prompt: bool = False,
                            tokenize: bool = True, tools: list | None = None,
                            documents: list | None = None, template: str | None = None,
                            **variables):
        """transformers' `apply_chat_template(messages, tokenize=..., add_generation_prompt=
        ...)` with the server's vocabulary and its chat template: the ids (tokenize=True) or
        the rendered text. `messages` are JSON objects (role, content, tool_calls...);
        `variables` are more template variables (enable_thinking=False, say)."""
        request = pb.ApplyChatTemplateRequest(
            messages_json=json.dumps(messages, ensure_ascii=False),
            add_generation_prompt=add_generation_prompt, template=template or "",
            format=PACKED)
        for name, value in (("tools_json", tools), ("documents_json", documents),
                            ("variables_json", variables or None)):
            if value is not None:
                setattr(request, name, json.dumps(value, ensure_ascii=False))
        reply = self._call(self.stub.ApplyChatTemplate, request)
        return reply_ids(reply).tolist() if tokenize else reply.text


class _ResumableStream:
    """The iterator behind TokenizerClient.tokenize_stream (see there)."""

    def __init__(self, client: TokenizerClient, source: Iterator, policy, window: int):
        self.client, self.source, self.policy = client, source, policy
        self.window = max(1, window)
        self.lock = threading.Lock()
        self.unanswered: collections.deque = collections.deque()  # sent, not yet answered
        self.slots = threading.Semaphore(self.window)
        self.generation = 0
        self.exhausted = False
        self.source_error: BaseException | None = None  # raised to the caller, after the
        self.call = None                                # documents before it are answered
        self._iterator = self._run()

    def __iter__(self):
        return self

    def __next__(self) -> np.ndarray:
        return next(self._iterator)

    def close(self) -> None:
        self._iterator.close()

    def _requests(self, generation: int, replay: list):
        """Request iterator of one call: the replayed documents, then new ones from source."""
        for doc in replay:
            yield self.client._request(doc, self.policy, format=PACKED)
        while True:
            while not self.slots.acquire(timeout=0.1):
                if generation != self.generation:
                    return
            with self.lock:
                if generation != self.generation or self.exhausted:
                    self.slots.release()
                    return
                try:
                    doc = next(self.source)
                    if not isinstance(doc, (str, bytes, bytearray, memoryview)):
                        raise TypeError(f"tokenize_stream documents are str or bytes, not "
                                        f"{type(doc).__name__}")
                except StopIteration:
                    self.exhausted = True
                    self.slots.release()
                    return
                except Exception as exc:  # grpc would swallow it: keep it for the caller
                    self.source_error = exc
                    self.exhausted = True
                    self.slots.release()
                    return
                self.unanswered.append(doc)
            yield self.client._request(doc, self.policy, format=PACKED)

    def _run(self):
        client = self.client
        attempt = 0
        deadline = None
        try:
            while True:
                with self.lock:
                    self.generation += 1
                    generation, replay = self.generation, list(self.unanswered)
                    if self.exhausted and not replay:
                        return
                self.call = client.stub.TokenizeStream(self._requests(generation, replay),
                                                       metadata=client._metadata)
                try:
                    for reply in self.call:
                        with self.lock:
                            self.unanswered.popleft()
                        self.slots.release()
                        attempt, deadline = 0, None
                        yield reply_ids(reply)
                    with self.lock:
                        if self.exhausted and not self.unanswered:
                            if self.source_error is not None:
                                raise self.source_error
                            return
                    # The server ended the stream early without an error: resume.
                except grpc.RpcError as exc:
                    if not client._retryable(exc):
                        raise client._error(exc) from None
                    attempt += 1
                    deadline = deadline or time.monotonic() + client.timeout
                    if not client._backoff(attempt, deadline):
                        raise client._error(exc) from None
        finally:
            with self.lock:
                self.generation += 1  # stops the request iterator of the last call
            if self.call is not None:
                self.call.cancel()

