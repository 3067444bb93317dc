"""The RPCs of istanbul.tokenizer.v1.Tokenizer: protobuf in, jobs to the batcher, protobuf out.

Chunk cuts the batcher's ids into windows (tokenizer_svc/chunking.py); ApplyChatTemplate
renders the vocabulary's chat template (tokenizer_svc/hf/chat_template.py, off the event loop)
and sends the text to the batcher like any other document. With `per_item_errors` the batch
methods check each item themselves (its size, its disallowed special tokens, its ids) and
answer the failed ones as ItemErrors instead of failing the call.

Requests are parsed by tolerant deserializers: a message over `max_message_bytes` or one
that does not parse (for example invalid UTF-8 in a `string` field) becomes a
`RequestRejected` that the method answers with a clear status, instead of grpc's generic
"exception deserializing request" INTERNAL error.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import json
import logging

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from .. import chunking
from ..hf.chat_template import (ChatTemplate, ChatTemplateError, ChatTemplateUnavailable,
                             NoChatTemplate, chat_template_of, check_jinja)
from ..encoding import InvalidTokenError
from ..reference import special_regex
from .rpc import tokenizer_pb2 as pb
from . import limits as checks
from .batcher import BatcherClosed, DeadlineExpired
from .config import ServerConfig
from .errors import (DISALLOWED_SPECIAL, INVALID_TOKEN, INVALID_TOKEN_METADATA_KEY,
                     INVALID_UTF8, MALFORMED, NOT_READY, RequestRejected, bad_argument,
                     disallowed_special_message, parsed, shutting_down, special_token_metadata)
from .limits import utf8_len
from .work import DecodeJob, EncodedDoc, EncodeJob, SpecialRule, special_ids

log = logging.getLogger(__name__)

SERVICE = pb.DESCRIPTOR.services_by_name["Tokenizer"]
SERVICE_NAME = SERVICE.full_name
OFFSET_UNITS = {pb.OFFSET_UNIT_NONE: None, pb.OFFSET_UNIT_BYTE: "byte", pb.OFFSET_UNIT_CHAR: "char"}
ID_FORMATS = (pb.ID_FORMAT_REPEATED, pb.ID_FORMAT_PACKED)
DECODE_MODES = (pb.DECODE_MODE_BYTES, pb.DECODE_MODE_TEXT_STRICT, pb.DECODE_MODE_TEXT_REPLACE)
_END = object()
NO_CHAT_TEMPLATE = "no-chat-template"        # reasons of ApplyChatTemplate and Chunk
CHAT_TEMPLATE_ERROR = "chat-template-error"
NO_SPANS = "no-spans"
SCAN_OFF_LOOP_BYTES = 64 << 10   # per-item special-token scans this large run in a thread
# True while the current unary RPC has announced itself to the batcher and not yet submitted.
_ANNOUNCED = contextvars.ContextVar("announced", default=False)


def _as_rejection(exc: BaseException) -> RequestRejected | None:
    if isinstance(exc, RequestRejected):
        return exc
    if isinstance(exc, DeadlineExpired):
        return RequestRejected(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline",
                               "the deadline passed while the request waited for the GPU")
    if isinstance(exc, BatcherClosed):
        return shutting_down()
    return None


async def _abort_for(exc: Exception, context, method: str):
    rejection = _as_rejection(exc)
    if rejection is None:
        log.exception("internal error in %s", method)
        rejection = RequestRejected(grpc.StatusCode.INTERNAL, "internal",
                                    f"internal error: {type(exc).__name__}: {exc}")
    await context.abort(rejection.code, rejection.message,
                        trailing_metadata=rejection.trailing_metadata())


def unary(fn):
    @functools.wraps(fn)
    async def method(self, request, context):
        batcher = self.batcher

        def withdraw():
            if _ANNOUNCED.get():
                _ANNOUNCED.set(False)
                batcher.withdraw()

        if batcher is not None:  # tells eager batch closing that a request is on its way
            batcher.announce()
            _ANNOUNCED.set(True)
        try:
            return await fn(self, request, context)
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:
            withdraw()  # before the caller hears of the failure
            await _abort_for(exc, context, fn.__name__)
        finally:
            withdraw()
    return method


def streaming(fn):
    @functools.wraps(fn)
    async def method(self, request_iterator, context):
        try:
            async for response in fn(self, request_iterator, context):
                yield response
        except (grpc.aio.AbortError, asyncio.CancelledError):
            raise
        except Exception as exc:
            await _abort_for(exc, context, fn.__name__)
    return method


def tolerant_deserializer(message_cls, limits):
    """FromString that returns a RequestRejected instead of raising (see module doc)."""
    type_name = message_cls.DESCRIPTOR.name

    def deserialize(raw: bytes):
        try:
            checks.check_message_size(limits, len(raw), type_name)
        except RequestRejected as exc:
            return exc
        try:
            return message_cls.FromString(raw)
        except DecodeError as exc:
            if "UTF-8" in str(exc):
                try:
                    field = _invalid_utf8_field(message_cls.DESCRIPTOR, raw)
                except Exception:   # never let the diagnosis fail the answer
                    field = None
                field = field or "a string field"
                advice = ("send raw bytes in the `data` field instead" if "text" in field
                          else "string fields must be valid UTF-8")
                return RequestRejected(
                    grpc.StatusCode.INVALID_ARGUMENT, INVALID_UTF8,
                    f"the {type_name} holds invalid UTF-8 in {field}; {advice}")
            return RequestRejected(grpc.StatusCode.INVALID_ARGUMENT, MALFORMED,
                                   f"the request is not a valid {type_name} message: {exc}")
    return deserialize


def _varint(raw: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = raw[i]
        value |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return value, i
        shift += 7


def _invalid_utf8_field(descriptor, raw: bytes, prefix: str = "") -> str | None:
    """The name (`id`, `texts[3]`, `special.allowed[0]`) of the first string field of the
    wire message `raw` that is not valid UTF-8, or None (the wire is walked by hand because
    protobuf's DecodeError does not say which field it was)."""
    counts: dict = {}
    try:
        i = 0
        while i < len(raw):
            key, i = _varint(raw, i)
            number, wire = key >> 3, key & 7
            if wire == 0:
                _, i = _varint(raw, i)
                continue
            if wire in (1, 5):
                i += 8 if wire == 1 else 4
                continue
            if wire != 2:
                return None
            length, i = _varint(raw, i)
            value, i = raw[i:i + length], i + length
            field = descriptor.fields_by_number.get(number)
            if field is None:
                continue
            name = prefix + field.name
            repeated = getattr(field, "is_repeated", None)
            if repeated is None:   # older protobuf
                repeated = field.label == field.LABEL_REPEATED
            if repeated:
                k = counts[number] = counts.get(number, -1) + 1
                name = f"{name}[{k}]"
            if field.type == field.TYPE_STRING:
                try:
                    bytes(value).decode("utf-8")
                except UnicodeDecodeError:
                    return f"`{name}`"
            elif field.type == field.TYPE_MESSAGE:
                inner = _invalid_utf8_field(field.message_type, bytes(value), name + ".")
                if inner:
                    return inner
    except IndexError:
        return None
    return None


def _quiet(task) -> None:
    """Mark a task's outcome retrieved (no "exception was never retrieved" at ERROR)."""
    if not task.cancelled():
        task.exception()


def item_error(index: int, rejection: RequestRejected) -> pb.ItemError:
    """What `rejection` would have said about a whole call, as one item's ItemError."""
    return pb.ItemError(index=index, code=rejection.code.value[0], reason=rejection.reason,
                        message=rejection.message, metadata=dict(rejection.extra_metadata))


def _json_field(request, name: str, kind: type):
    """The JSON in string field `name` of `request` (None when empty), of type `kind`."""
    text = getattr(request, name)
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise bad_argument(f"`{name}` is not valid JSON ({exc})") from None
    if not isinstance(value, kind):
        raise bad_argument(f"`{name}` must be a JSON {'array' if kind is list else 'object'}, not "
                   f"{type(value).__name__}")
    return value


def packed_u32(values: np.ndarray) -> bytes:
    """The little-endian uint32 bytes of `values` (the `*_packed` fields)."""
    return np.asarray(values).astype("<u4", copy=False).tobytes()


def _pairs(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    out = np.empty(2 * starts.size, np.uint32)
    out[0::2], out[1::2] = starts, ends
    return out


def unpack_ids(request, field: str = "ids_packed") -> np.ndarray:
    """The ids of a detokenize request: `ids` or `ids_packed`, not both."""
    packed = getattr(request, field)
    if packed and len(request.ids):
        raise bad_argument(f"the {type(request).__name__} has both `ids` and `{field}`; give one")
    if packed:
        if len(packed) % 4:
            raise bad_argument(f"`{field}` is {len(packed)} bytes, not a whole number of "
                       "little-endian uint32 ids (4 bytes each)")
        return np.frombuffer(packed, "<u4").astype(np.uint32, copy=False)
    return np.asarray(request.ids, dtype=np.uint32)


class TokenizerServicer:
    """Implements every method of the service; `attach` makes it ready."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.limits = config.limits
        self.encoding = None
        self.batcher = None
        self.info: pb.GetInfoResponse | None = None
        self.metrics = None
        self.long_lane = None         # LongLane: decides which jobs are expensive (app.py)
        self.run_long = None          # async (job, timeout) -> results, in the long lane
        self._streams_cut = asyncio.Event()
        self._stream_tasks: set = set()   # every stream's reader and request tasks, until done
        self._texts_cache: dict = {}
        self._special_ids = None
        self._rules: dict = {}        # SpecialTokenPolicy fields -> SpecialRule (_rule)
        self._valid_ids = None        # bool per id < n_vocab: in the vocabulary
        self._chat: ChatTemplate | ChatTemplateUnavailable | None = None

    def attach(self, encoding, batcher, info: pb.GetInfoResponse, metrics) -> None:
        self._chat = self._find_chat_template(encoding)
        if isinstance(self._chat, ChatTemplate) and info is not None:
            info = _with_chat_templates(info, self._chat.names)
        self.encoding, self.batcher, self.info, self.metrics = encoding, batcher, info, metrics
        self._rules.clear()           # they name this encoding's special tokens
        self._valid_ids = None

    @staticmethod
    def _find_chat_template(encoding):
        """The vocabulary's ChatTemplate, or why there is none (ApplyChatTemplate says it);
        a template that is there but cannot be used is logged at WARNING."""
        try:
            found = chat_template_of(encoding)
            check_jinja()
        except NoChatTemplate as exc:
            return exc
        except ChatTemplateUnavailable as exc:
            log.warning("ApplyChatTemplate unavailable: %s", exc)
            return exc
        return found

    def method_handlers(self) -> dict:
        """grpc method handlers for every method of the service descriptor."""
        handlers = {}
        for method in SERVICE.methods:
            request_cls = getattr(pb, method.input_type.name)
            response_cls = getattr(pb, method.output_type.name)
            make = {(False, False): grpc.unary_unary_rpc_method_handler,
                    (False, True): grpc.unary_stream_rpc_method_handler,
                    (True, False): grpc.stream_unary_rpc_method_handler,
                    (True, True): grpc.stream_stream_rpc_method_handler}[
                (method.client_streaming, method.server_streaming)]
            handlers[method.name] = make(getattr(self, method.name),
                                         request_deserializer=tolerant_deserializer(request_cls,
                                                                                    self.limits),
                                         response_serializer=response_cls.SerializeToString)
        return handlers

    # ---- shared parsing -------------------------------------------------------------------

    def _ready(self):
        if self.batcher is None:
            raise RequestRejected(grpc.StatusCode.UNAVAILABLE, NOT_READY,
                                  "the server is starting (loading the GPU device and the "
                                  "vocabulary); retry shortly")

    def _doc(self, request):
        which = request.WhichOneof("input")
        if which is None:
            raise bad_argument(f"the {type(request).__name__} has no input: set `text` (UTF-8) or "
                       "`data` (raw bytes)")
        doc = request.text if which == "text" else bytes(request.data)
        nbytes = utf8_len(doc)
        checks.check_text_bytes(self.limits, nbytes, f"`{which}`")
        return doc, nbytes

    def _rule(self, policy: pb.SpecialTokenPolicy) -> SpecialRule:
        # resolved once per distinct policy (nearly every request sends the default one);
        # bounded, since clients choose the token lists
        key = (policy.allow_all, tuple(policy.allowed), policy.disallow_none,
               tuple(policy.disallowed))
        rule = self._rules.get(key)
        if rule is None:
            rule = SpecialRule.from_policy(self.encoding.vocab.special_tokens,
                                           allow_all=policy.allow_all, allowed=policy.allowed,
                                           disallow_none=policy.disallow_none,
                                           disallowed=policy.disallowed)
            if len(self._rules) >= 256:
                self._rules.clear()
            self._rules[key] = rule
        return rule

    def _encode_job(self, docs: list, request) -> EncodeJob:
        if request.offsets not in OFFSET_UNITS:
            raise bad_argument(f"offsets: unknown OffsetUnit value {request.offsets}")
        if request.format not in ID_FORMATS:
            raise bad_argument(f"format: unknown IdFormat value {request.format}")
        if request.truncation.side not in (pb.TRUNCATION_SIDE_RIGHT, pb.TRUNCATION_SIDE_LEFT):
            raise bad_argument(f"truncation.side: unknown TruncationSide value {request.truncation.side}")
        return EncodeJob(docs, self._rule(request.special), OFFSET_UNITS[request.offsets],
                         request.truncation.max_tokens,
                         request.truncation.side == pb.TRUNCATION_SIDE_LEFT)

    async def _run(self, job, items: int, nbytes: int, context, method: str):
        if isinstance(job, EncodeJob):
            self.metrics.input_bytes_of[method].inc(nbytes)
        announced = _ANNOUNCED.get()
        _ANNOUNCED.set(False)
        if isinstance(job, EncodeJob) and self.long_lane is not None and \
                self.long_lane.admits(job, nbytes):
            if announced:
                self.batcher.withdraw()   # it will not join a batch
            self.batcher.hold(nbytes)     # but it counts against max_queued_bytes
            try:
                return await self.run_long(job, context.time_remaining())
            finally:
                self.batcher.unhold(nbytes)
        return await self.batcher.submit(job, items=items, nbytes=nbytes,
                                         timeout=context.time_remaining(), announced=announced)

    def _ids(self, request) -> np.ndarray:
        ids = unpack_ids(request)
        checks.check_decode_ids(self.limits, ids.size)
        return ids

    def _token_texts(self, ids: np.ndarray) -> tuple[list, np.ndarray]:
        """(text of each token, special flag of each token) for TokenizeResponse.texts."""
        cache, enc = self._texts_cache, self.encoding
        texts = []
        for t in ids.tolist():
            text = cache.get(t)
            if text is None:
                text = cache[t] = enc.decode_single_token_bytes(t).decode("utf-8", "replace")
            texts.append(text)
        return texts, np.isin(ids, self.special_id_array())

    def special_id_array(self) -> np.ndarray:
        if self._special_ids is None:
            self._special_ids = np.array(sorted(special_ids(self.encoding.vocab)), np.int64)
        return self._special_ids

    @staticmethod
    def _decoded(data: bytes, mode: int, what: str):
        if mode not in DECODE_MODES:
            raise bad_argument(f"mode: unknown DecodeMode value {mode}")
        if mode == pb.DECODE_MODE_BYTES:
            return {"data": data}
        if mode == pb.DECODE_MODE_TEXT_REPLACE:
            return {"text": data.decode("utf-8", "replace")}
        try:
            return {"text": data.decode("utf-8")}
        except UnicodeDecodeError as exc:
            raise RequestRejected(
                grpc.StatusCode.INVALID_ARGUMENT, INVALID_UTF8,
                f"{what} decodes to bytes that are not valid UTF-8 (at byte {exc.start}: "
                f"{exc.reason}); ask for DECODE_MODE_BYTES or DECODE_MODE_TEXT_REPLACE") from None

    # ---- tokenize -------------------------------------------------------------------------

    async def _tokenize_one(self, request, context, what: str, method: str) -> pb.TokenizeResponse:
        request = parsed(request)
        self._ready()
        doc, nbytes = self._doc(request)
        job = self._encode_job([doc], request)
        [result] = await self._run(job, 1, nbytes, context, method)
        self.metrics.tokens_of["encode"].inc(result.ids.size)
        response = pb.TokenizeResponse(token_count=result.token_count,
                                       truncated=result.truncated, id=request.id)
        packed = request.format == pb.ID_FORMAT_PACKED
        if packed:
            response.ids_packed = packed_u32(result.ids)
        else:
            response.ids.extend(result.ids.tolist())
        if result.offsets is not None:
            if packed:
                response.offsets_packed = packed_u32(_pairs(result.offsets, result.ends))
            else:
                response.starts.extend(result.offsets.tolist())
                response.ends.extend(result.ends.tolist())
        if request.token_texts:
            texts, special = self._token_texts(result.ids)
            response.texts.extend(texts)
            response.special.extend(special.tolist())
        return response

    @unary
    async def Tokenize(self, request, context):
        return await self._tokenize_one(request, context, "the text", "Tokenize")

    def _batch_docs(self, request) -> tuple[str, list]:
        """(`texts` or `data`, the documents) of a batch request, their number checked."""
        if request.texts and request.data:
            raise bad_argument(f"{type(request).__name__} has both `texts` and `data`; send one kind "
                       "per request")
        field = "texts" if request.texts else "data"
        docs = list(request.texts) if request.texts else [bytes(d) for d in request.data]
        checks.check_batch_items(self.limits, len(docs), f"documents in `{field}`")
        return field, docs

    async def _encode_items(self, field: str, docs: list, job: EncodeJob, per_item: bool,
                            context, method: str) -> tuple[list, list]:
        """(an EncodedDoc per document, the ItemErrors). Without `per_item` the first
        document over max_text_bytes, or with a disallowed special token (the batch runner's
        check), fails the call; with it such documents are ItemErrors and empty EncodedDocs,
        the others are encoded (the special-token check done here, once)."""
        sizes = [utf8_len(doc) for doc in docs]
        failed: dict = {}
        for n, size in enumerate(sizes):
            try:
                checks.check_text_bytes(self.limits, size, f"`{field}[{n}]`")
            except RequestRejected as exc:
                if not per_item:
                    raise
                failed[n] = exc
        if per_item and job.rule.disallowed and field == "texts":
            candidates = [n for n in range(len(docs)) if n not in failed]
            scan = functools.partial(_special_refusals, docs, candidates, job.rule.disallowed)
            found = await asyncio.to_thread(scan) if \
                sum(sizes[n] for n in candidates) > SCAN_OFF_LOOP_BYTES else scan()
            failed.update(found)
        if per_item:
            job = dataclasses.replace(job, docs=[d for n, d in enumerate(docs) if n not in failed],
                                      rule=SpecialRule(job.rule.allowed, frozenset()))
        nbytes = sum(size for n, size in enumerate(sizes) if n not in failed)
        results = await self._run(job, max(len(job.docs), 1), nbytes, context, method) \
            if job.docs else []
        if failed:
            empty = np.zeros(0, np.int64)
            blank = EncodedDoc(np.zeros(0, np.uint32), empty if job.offsets else None, 0,
                               empty if job.offsets else None)
            done = iter(results)
            results = [blank if n in failed else next(done) for n in range(len(docs))]
        return results, [item_error(n, failed[n]) for n in sorted(failed)]

    @unary
    async def TokenizeBatch(self, request, context):
        request = parsed(request)
        self._ready()
        field, docs = self._batch_docs(request)
        job = self._encode_job(docs, request)
        results, errors = await self._encode_items(field, docs, job, request.per_item_errors,
                                                   context, "TokenizeBatch")
        counts = np.array([r.ids.size for r in results], np.int64)
        doc_offsets = np.zeros(len(results) + 1, np.int64)
        np.cumsum(counts, out=doc_offsets[1:])
        ids = np.concatenate([r.ids for r in results]) if results else np.zeros(0, np.uint32)
        self.metrics.tokens_of["encode"].inc(ids.size)
        bounds = doc_offsets.tolist()
        token_counts = [r.token_count for r in results]
        response = pb.TokenizeBatchResponse(doc_offsets=bounds, token_counts=token_counts,
                                            errors=errors)
        packed = request.format == pb.ID_FORMAT_PACKED
        if packed:
            response.ids_packed = packed_u32(ids)
        else:
            response.ids.extend(ids.tolist())
        if job.offsets and results:
            starts = np.concatenate([r.offsets for r in results])
            ends = np.concatenate([r.ends for r in results])
            if packed:
                response.offsets_packed = packed_u32(_pairs(starts, ends))
            else:
                response.starts.extend(starts.tolist())
                response.ends.extend(ends.tolist())
        return response

    @streaming
    async def TokenizeStream(self, request_iterator, context):
        async for response in self._pipelined(
                request_iterator, lambda request, n: self._tokenize_one(
                    request, context, "the text", "TokenizeStream"), context):
            yield response

    @unary
    async def CountTokens(self, request, context):
        request = parsed(request)
        self._ready()
        doc, nbytes = self._doc(request)
        job = EncodeJob([doc], self._rule(request.special))
        [result] = await self._run(job, 1, nbytes, context, "CountTokens")
        return pb.CountTokensResponse(count=result.token_count)

    # ---- detokenize -----------------------------------------------------------------------

    async def _detokenize_one(self, request, context, what: str) -> pb.DetokenizeResponse:
        request = parsed(request)
        self._ready()
        ids = self._ids(request)
        if request.mode not in DECODE_MODES:
            raise bad_argument(f"mode: unknown DecodeMode value {request.mode}")
        result = await self._run(DecodeJob([ids]), 1, 4 * ids.size, context, "Detokenize")
        self.metrics.tokens_of["decode"].inc(ids.size)
        return pb.DetokenizeResponse(id=request.id, **self._decoded(result[0], request.mode, what))

    @unary
    async def Detokenize(self, request, context):
        return await self._detokenize_one(request, context, "the request")

    @unary
    async def DetokenizeBatch(self, request, context):
        request = parsed(request)
        self._ready()
        ids = self._ids(request)
        given = list(request.seq_offsets)          # uint64: shown as sent, never wrapped
        if not given and ids.size == 0:
            return pb.DetokenizeBatchResponse()
        bounds = np.asarray([min(v, ids.size + 1) for v in given], dtype=np.int64)
        if (bounds.size < 1 or bounds[0] != 0 or bounds[-1] != ids.size
                or np.any(np.diff(bounds) < 0) or max(given) > ids.size):
            raise bad_argument(f"`seq_offsets` must be n+1 non-decreasing positions from 0 to the "
                       f"number of ids ({ids.size}); got {given[:8]}"
                       f"{'...' if len(given) > 8 else ''}")
        checks.check_batch_items(self.limits, bounds.size - 1, "sequences in the batch")
        if request.mode not in DECODE_MODES:
            raise bad_argument(f"mode: unknown DecodeMode value {request.mode}")
        seqs = [ids[bounds[k]:bounds[k + 1]] for k in range(bounds.size - 1)]
        failed = self._invalid_sequences(seqs) if request.per_item_errors else {}
        good = [seq for n, seq in enumerate(seqs) if n not in failed]
        result = await self._run(DecodeJob(good), len(good), 4 * ids.size, context,
                                 "DetokenizeBatch") if good else []
        self.metrics.tokens_of["decode"].inc(ids.size)
        done = iter(result)
        result = [b"" if n in failed else next(done) for n in range(len(seqs))]
        if request.mode == pb.DECODE_MODE_BYTES:
            return pb.DetokenizeBatchResponse(
                data=result, errors=[item_error(n, failed[n]) for n in sorted(failed)])
        texts = []
        for n, data in enumerate(result):
            try:
                texts.append(self._decoded(data, request.mode, f"sequence {n}")["text"])
            except RequestRejected as exc:
                if not request.per_item_errors:
                    raise
                failed[n] = exc
                texts.append("")
        return pb.DetokenizeBatchResponse(
            texts=texts, errors=[item_error(n, failed[n]) for n in sorted(failed)])

    def _invalid_sequences(self, seqs: list) -> dict:
        """{sequence index: the rejection its first invalid id gives} (per_item_errors), with
        the words and trailer a call with that sequence alone would have had."""
        if self._valid_ids is None:
            valid = np.zeros(self.encoding.n_vocab, bool)
            valid[np.fromiter(self.encoding.vocab.decoder, np.int64)] = True
            self._valid_ids = valid
        valid, failed = self._valid_ids, {}
        for n, seq in enumerate(seqs):
            bad = seq >= valid.size
            bad[~bad] = ~valid[seq[~bad]]
            if bad.any():
                position = int(np.argmax(bad))
                token = int(seq[position])
                message = str(InvalidTokenError(token, position, self.encoding.name,
                                                self.encoding.n_vocab, document=n))
                failed[n] = RequestRejected(
                    grpc.StatusCode.INVALID_ARGUMENT, INVALID_TOKEN, message,
                    ((INVALID_TOKEN_METADATA_KEY, f"{token},{position},{n}"),))
        return failed

    @streaming
    async def DetokenizeStream(self, request_iterator, context):
        async for response in self._pipelined(
                request_iterator,
                lambda request, n: self._detokenize_one(request, context, "the request"), context):
            yield response

    # ---- chunk ----------------------------------------------------------------------------

    @unary
    async def Chunk(self, request, context):
        request = parsed(request)
        self._ready()
        field, docs = self._batch_docs(request)
        if request.max_tokens < 1:
            raise bad_argument("`max_tokens` (tokens per window) must be at least 1; got 0")
        if request.overlap >= request.max_tokens:
            raise bad_argument(f"`overlap` ({request.overlap}) must be smaller than `max_tokens` "
                       f"({request.max_tokens}), or no window would advance")
        if request.format not in ID_FORMATS:
            raise bad_argument(f"format: unknown IdFormat value {request.format}")
        job = EncodeJob(docs, self._rule(request.special), "byte")
        results, errors = await self._encode_items(field, docs, job, request.per_item_errors,
                                                   context, "Chunk")
        packed = request.format == pb.ID_FORMAT_PACKED
        response = pb.ChunkResponse(errors=errors)
        failed = {e.index for e in errors}
        for n, (doc, result) in enumerate(zip(docs, results)):
            out = response.documents.add()
            if n in failed:
                continue
            data = doc if isinstance(doc, bytes) else doc.encode("utf-8", "surrogatepass")
            covered = int(result.ends[-1]) if result.ids.size else 0
            if covered != len(data):
                raise RequestRejected(
                    grpc.StatusCode.FAILED_PRECONDITION, NO_SPANS,
                    f"the {self.encoding.name} vocabulary's normalizer changes the text (the "
                    f"tokens of `{field}[{n}]` are {covered:,} bytes, the text {len(data):,}), "
                    "so windows have no spans in it; use TokenizeBatch and cut the ids")
            if packed:
                out.ids_packed = packed_u32(result.ids)
            else:
                out.ids.extend(result.ids.tolist())
            rows = chunking.windows(data, result.offsets, request.max_tokens, request.overlap)
            for a, b, start, end, byte_start, byte_end in rows.tolist():
                out.windows.add(token_start=a, token_end=b, start=start, end=end,
                                byte_start=byte_start, byte_end=byte_end)
        self.metrics.tokens_of["encode"].inc(sum(r.ids.size for r in results))
        return response

    # ---- chat templates -------------------------------------------------------------------

    @unary
    async def ApplyChatTemplate(self, request, context):
        request = parsed(request)
        self._ready()
        if isinstance(self._chat, ChatTemplateUnavailable) or self._chat is None:
            raise RequestRejected(grpc.StatusCode.FAILED_PRECONDITION, NO_CHAT_TEMPLATE,
                                  str(self._chat or "this server has no chat template"))
        if request.messages and request.messages_json:
            raise bad_argument("ApplyChatTemplateRequest has both `messages` and `messages_json`; give "
                       "one")
        if request.format not in ID_FORMATS:
            raise bad_argument(f"format: unknown IdFormat value {request.format}")
        messages = _json_field(request, "messages_json", list) if request.messages_json else \
            [{"role": m.role, "content": m.content} for m in request.messages]
        if not messages:
            raise bad_argument("the conversation is empty: give `messages` or `messages_json`")
        tools = _json_field(request, "tools_json", list)
        documents = _json_field(request, "documents_json", list)
        variables = _json_field(request, "variables_json", dict) or {}
        render = functools.partial(self._chat.render, messages,
                                   add_generation_prompt=request.add_generation_prompt,
                                   tools=tools, documents=documents,
                                   template=request.template or None, **variables)
        try:
            text = await asyncio.to_thread(render)
        except ChatTemplateUnavailable as exc:   # Jinja2 is missing on the server
            raise RequestRejected(grpc.StatusCode.FAILED_PRECONDITION, NO_CHAT_TEMPLATE,
                                  str(exc)) from None
        except ChatTemplateError as exc:
            raise RequestRejected(grpc.StatusCode.INVALID_ARGUMENT, CHAT_TEMPLATE_ERROR,
                                  str(exc)) from None
        nbytes = utf8_len(text)
        checks.check_text_bytes(self.limits, nbytes, "the rendered conversation")
        # every added token spelled in the text is that token: transformers' tokenization
        rule = self._rule(pb.SpecialTokenPolicy(allow_all=True, disallow_none=True))
        [result] = await self._run(EncodeJob([text], rule), 1, nbytes, context,
                                   "ApplyChatTemplate")
        self.metrics.tokens_of["encode"].inc(result.ids.size)
        response = pb.ApplyChatTemplateResponse(text=text, token_count=result.ids.size)
        if request.format == pb.ID_FORMAT_PACKED:
            response.ids_packed = packed_u32(result.ids)
        else:
            response.ids.extend(result.ids.tolist())
        return response

    # ---- info -----------------------------------------------------------------------------

    @unary
    async def GetInfo(self, request, context):
        parsed(request)
        self._ready()
        return self.info

    # ---- streams --------------------------------------------------------------------------

    def cut_streams(self) -> None:
        """End every open stream with UNAVAILABLE (the drain's grace period is running out)."""
        self._streams_cut.set()

    async def _or_cut(self, awaitable, answered: int):
        """Await `awaitable` unless the streams are cut first (then UNAVAILABLE)."""
        task = asyncio.ensure_future(awaitable)
        cut = asyncio.ensure_future(self._streams_cut.wait())
        try:
            await asyncio.wait({task, cut}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:   # the stream itself ends (client cancel): leave nothing pending
            task.cancel()
            raise
        finally:
            cut.cancel()
        if task.done():
            return task.result()
        task.cancel()
        raise RequestRejected(grpc.StatusCode.UNAVAILABLE, NOT_READY,
                              f"the server is shutting down: stream ended after {answered} "
                              "responses; resume the rest on a new call (another replica)")

    async def _pipelined(self, request_iterator, handle, context):
        """Results of `handle(request, index)` in request order, up to max_stream_inflight
        requests in progress at once (so one stream's requests share GPU batches). A failed
        request ends the stream; its status message starts with "stream request N".

        A reader task takes the requests and starts a task for each. They end with the RPC,
        however it ends: grpc drops this generator without closing it when the RPC ends
        outside it (a client's cancel while a reply is written), and a reader left waiting
        (for the client, or for room in the queue) would be destroyed pending by the garbage
        collector ("Task was destroyed but it is pending!" at ERROR). So the RPC's done
        callback cancels them, the servicer holds them until they are done, and the generator
        cancels and awaits them when it ends."""
        queue: asyncio.Queue = asyncio.Queue(self.limits.max_stream_inflight)
        tasks: set = set()   # this stream's reader and request tasks still running

        def start(coro) -> asyncio.Task:
            task = asyncio.ensure_future(coro)
            task.add_done_callback(_quiet)   # its caller may be gone (cancel)
            for owner in (tasks, self._stream_tasks):
                owner.add(task)
                task.add_done_callback(owner.discard)
            return task

        def end(_context=None) -> None:
            for task in list(tasks):   # queued or being awaited: nobody will read them now
                task.cancel()

        async def numbered(request, index):
            try:
                return await handle(request, index)
            except Exception as exc:
                rejection = _as_rejection(exc)
                if rejection is None:
                    raise
                raise rejection.with_prefix(f"stream request {index}") from None

        async def read():
            try:
                index = 0
                async for request in request_iterator:
                    await queue.put(start(numbered(request, index)))
                    index += 1
                await queue.put(_END)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await queue.put(exc)

        context.add_done_callback(end)
        reader = start(read())
        answered = 0
        try:
            while True:
                item = await self._or_cut(queue.get(), answered)
                if item is _END:
                    return
                if isinstance(item, Exception):
                    raise item
                yield await self._or_cut(item, answered)
                answered += 1
        finally:
            end()
            await asyncio.wait({reader, *tasks})


def _with_chat_templates(info: pb.GetInfoResponse, names: list) -> pb.GetInfoResponse:
    out = pb.GetInfoResponse()
    out.CopyFrom(info)
    out.chat_templates[:] = names
    return out


def _special_refusals(docs: list, indices: list, disallowed: frozenset) -> dict:
    """{index: rejection} of the documents (of `indices`) that spell a disallowed special
    token: the batch runner's check and words, per document (per_item_errors)."""
    pattern, out = special_regex(disallowed), {}
    for n in indices:
        found = pattern.search(docs[n])
        if found:
            out[n] = RequestRejected(
                grpc.StatusCode.INVALID_ARGUMENT, DISALLOWED_SPECIAL,
                f"document {n} (`texts[{n}]`): {disallowed_special_message(found.group())}",
                special_token_metadata(found.group()))
    return out
