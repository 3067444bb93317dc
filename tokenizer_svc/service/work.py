"""What one batch does with the Encoding, on the GPU thread: jobs in, one result per job out.

Encode jobs are grouped by their allowed special tokens (nearly always one group) and each
group is ONE `Encoding.encode_batch_flat` call over every document of every job in it (split
into calls of at most `max_call_bytes` input bytes when one request alone is larger). Text
that spells a disallowed special token is refused per job before the call (tiktoken's check
and message, from tokenizer_svc.reference), so one bad request never fails its neighbours.
All decode jobs of a batch are one `Encoding.decode_bytes_batch` call; if an id is invalid,
each decode job is retried alone so that only the guilty one fails.

A batch is written once, as steps that ask for Encoding calls (`BatchRunner.steps`): the
GPU thread runs them with blocking calls (`BatchRunner(jobs)`); a worker of the shared GPU
process runs them on its event loop with the calls as the loop's own socket I/O
(`BatchRunner.run_async` with a gpu_worker.RemoteEncoding, which sends each call to the GPU
process, gpu_process.py).

`encode_flat` is the service's one call into the encode path in a server process (batches
and long lane alike). `token_spans` is the one place that turns ids into (start, end)
offsets; it reads the Encoding's per-token tables (byte lengths, characters started).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import grpc
import numpy as np

from ..reference import resolve_special, special_regex
from .errors import (DISALLOWED_SPECIAL, DOCUMENT_METADATA_KEY, INVALID_TOKEN,
                     INVALID_TOKEN_METADATA_KEY, RequestRejected, disallowed_special_message,
                     special_token_metadata)
from .limits import utf8_len

def encode_flat(encoding, docs: list, allowed: frozenset) -> tuple[np.ndarray, np.ndarray]:
    """The service's one call into the encode path: (ids as np.uint32, offsets with n+1
    entries) of `docs`, the `allowed` special tokens recognised, no refusal (that was
    checked per job). The batches and the long lane both come through here."""
    ids, offsets = encoding.encode_batch_flat(docs, allowed_special=allowed,
                                              disallowed_special=())
    return np.asarray(ids, np.uint32), offsets


def special_ids(vocab) -> set:
    """Ids flagged `special` in replies: a tokenizer.json's added tokens marked special, a
    .tiktoken vocabulary's special tokens."""
    hf = getattr(vocab, "hf", None)
    if hf is not None:
        return {a.id for a in hf.added if a.special}
    return set(vocab.special_tokens.values())


def post_process(encoding, ids: list) -> list:
    """`ids` with the vocabulary's post-processor tokens (tokenizers' add_special_tokens=True,
    what Encoding.encode_hf applies); unchanged for vocabularies without one."""
    pipeline = getattr(encoding, "_hf", None)
    return pipeline.post_process(ids) if pipeline is not None else list(ids)


def token_spans(encoding, ids: np.ndarray, unit: str) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of each token of a whole document's `ids` in bytes or characters:
    token i covers [starts[i], ends[i]). In characters a token that begins (ends) inside a
    multi-byte character covers that whole character, so neighbours may share one."""
    starts = encoding._token_offsets(ids, unit)
    if unit == "byte":
        ends = starts + encoding._token_lengths[ids]
    else:   # characters that began before the token's end
        ends = np.cumsum(encoding._token_chars[ids]) if ids.size else np.zeros(0, np.int64)
    return starts, ends.astype(np.int64, copy=False)


@dataclass(frozen=True)
class SpecialRule:
    """Resolved allowed/disallowed special tokens (tiktoken's allowed_special/disallowed_special)."""

    allowed: frozenset
    disallowed: frozenset

    @classmethod
    def from_policy(cls, special_tokens: dict, *, allow_all: bool = False, allowed=(),
                    disallow_none: bool = False, disallowed=()) -> "SpecialRule":
        """From the fields of a SpecialTokenPolicy message (its zero value is tiktoken's
        default: nothing allowed, everything disallowed)."""
        allowed_special = "all" if allow_all else set(allowed)
        disallowed_special = () if disallow_none else (set(disallowed) if disallowed else "all")
        return cls(*resolve_special(special_tokens, allowed_special, disallowed_special))


@dataclass
class EncodeJob:
    docs: list                   # str: text (special tokens apply); bytes: raw, ordinary
    rule: SpecialRule
    offsets: str | None = None   # None, "byte" or "char"
    max_tokens: int = 0          # 0: no truncation
    keep_end: bool = False       # truncate on the left (keep the last max_tokens)


@dataclass
class EncodedDoc:
    ids: np.ndarray                # uint32, after truncation
    offsets: np.ndarray | None     # start of each id, when asked for
    token_count: int               # before truncation
    ends: np.ndarray | None = None # end of each id, when asked for

    @property
    def truncated(self) -> bool:
        return self.token_count > len(self.ids)


@dataclass
class DecodeJob:
    seqs: list                     # each an array of ids


# the Encoding calls a batch's steps ask for: ("encode", docs, allowed), ("decode", seqs)
ENCODE, DECODE = "encode", "decode"


class BatchRunner:
    """Callable run by the DynamicBatcher on the GPU thread: list of jobs -> list of results
    (a list of EncodedDoc per encode job, a list of bytes per decode job, or an exception).
    `run_async` is the same batch on the event loop, for an Encoding with async calls."""

    def __init__(self, encoding, on_encode_seconds: Callable[[float], None] | None = None,
                 max_call_bytes: int = 1 << 62, on_encoder_profile: Callable | None = None):
        self.encoding = encoding
        self.max_call_bytes = max_call_bytes
        self.special_tokens = frozenset(encoding.special_tokens_set)
        self._on_encode_seconds = on_encode_seconds or (lambda seconds: None)
        self._on_encoder_profile = on_encoder_profile or (lambda encoding: None)

    def __call__(self, jobs: list) -> list:
        steps = self.steps(jobs)
        try:
            call = next(steps)
            while True:
                try:
                    answer = self._call(call)
                except Exception as exc:
                    call = steps.throw(exc)
                else:
                    call = steps.send(answer)
        except StopIteration as done:
            return done.value

    async def run_async(self, jobs: list) -> list:
        """`self(jobs)` with the Encoding's `encode_flat_async` / `decode_bytes_batch_async`
        awaited on the running loop."""
        steps = self.steps(jobs)
        try:
            call = next(steps)
            while True:
                try:
                    answer = await self._call_async(call)
                except Exception as exc:
                    call = steps.throw(exc)
                else:
                    call = steps.send(answer)
        except StopIteration as done:
            return done.value

    def _call(self, call: tuple):
        if call[0] == ENCODE:
            return encode_flat(self.encoding, call[1], call[2])
        return self.encoding.decode_bytes_batch(call[1])

    async def _call_async(self, call: tuple):
        if call[0] == ENCODE:
            ids, offsets = await self.encoding.encode_flat_async(call[1], call[2])
            return np.asarray(ids, np.uint32), offsets
        return await self.encoding.decode_bytes_batch_async(call[1])

    def steps(self, jobs: list):
        """The batch as a generator: it yields each Encoding call, (ENCODE, docs, allowed)
        or (DECODE, seqs), is sent the call's answer (or has its exception thrown in), and
        returns the results."""
        results: list = [None] * len(jobs)
        yield from self._encode(jobs, results)
        yield from self._decode(jobs, results)
        return results

    # ---- encoding -------------------------------------------------------------------------

    def refusal(self, job: EncodeJob) -> RequestRejected | None:
        if not job.rule.disallowed:
            return None
        pattern = special_regex(job.rule.disallowed)
        for n, doc in enumerate(job.docs):
            found = pattern.search(doc) if isinstance(doc, str) else None
            if found:
                token = special_token_metadata(found.group())
                message = disallowed_special_message(found.group())
                if len(job.docs) == 1:
                    return RequestRejected(grpc.StatusCode.INVALID_ARGUMENT,
                                           DISALLOWED_SPECIAL, message, token)
                return RequestRejected(grpc.StatusCode.INVALID_ARGUMENT, DISALLOWED_SPECIAL,
                                       f"document {n} (`texts[{n}]`): {message}",
                                       ((DOCUMENT_METADATA_KEY, str(n)), *token))
        return None

    def _encode(self, jobs: list, results: list) -> None:
        groups: dict = {}  # allowed specials -> indices of the jobs that share them
        for k, job in enumerate(jobs):
            if isinstance(job, EncodeJob):
                refusal = self.refusal(job)
                if refusal is not None:
                    results[k] = refusal
                else:
                    groups.setdefault(job.rule.allowed & self.special_tokens, []).append(k)
        if not groups:
            return
        start = time.perf_counter()
        for allowed, members in groups.items():
            docs = [doc for k in members for doc in jobs[k].docs]
            encoded = []  # per document, in order
            for chunk in self._chunks(docs):
                ids, offsets = yield (ENCODE, chunk, allowed)
                self._on_encoder_profile(self.encoding)
                encoded += [ids[offsets[n]:offsets[n + 1]] for n in range(len(chunk))]
            i = 0
            for k in members:
                job = jobs[k]
                results[k] = [self.finish(job, ids) for ids in encoded[i:i + len(job.docs)]]
                i += len(job.docs)
        self._on_encode_seconds(time.perf_counter() - start)

    def _chunks(self, docs: list):
        """Consecutive runs of documents of at most max_call_bytes (at least one document)."""
        start, size = 0, 0
        for n, doc in enumerate(docs):
            nbytes = utf8_len(doc)
            if n > start and size + nbytes > self.max_call_bytes:
                yield docs[start:n]
                start, size = n, 0
            size += nbytes
        if docs:
            yield docs[start:]

    def finish(self, job: EncodeJob, ids: np.ndarray) -> EncodedDoc:
        count = int(ids.size)
        offsets = ends = None
        if job.offsets:
            offsets, ends = token_spans(self.encoding, ids, job.offsets)
        if job.max_tokens and count > job.max_tokens:
            cut = slice(count - job.max_tokens, None) if job.keep_end else slice(0, job.max_tokens)
            ids = ids[cut]
            if offsets is not None:
                offsets, ends = offsets[cut], ends[cut]
        return EncodedDoc(ids, offsets, count, ends)

    # ---- decoding -------------------------------------------------------------------------

    def _decode(self, jobs: list, results: list) -> None:
        members = [k for k, job in enumerate(jobs) if isinstance(job, DecodeJob)]
        if not members:
            return
        seqs = [seq for k in members for seq in jobs[k].seqs]
        try:
            decoded = yield (DECODE, seqs)
        except ValueError:  # an invalid id somewhere: find the guilty job(s)
            for k in members:
                results[k] = yield from self._decode_one(jobs[k])
            return
        i = 0
        for k in members:
            results[k] = decoded[i:i + len(jobs[k].seqs)]
            i += len(jobs[k].seqs)

    def _decode_one(self, job: DecodeJob):
        try:
            return (yield (DECODE, job.seqs))
        except ValueError as exc:  # InvalidTokenError
            token, position, seq = (getattr(exc, "token", ""), getattr(exc, "position", ""),
                                    getattr(exc, "document", ""))
            message = str(exc)  # the Encoding's own words, as a local decode would say them
            if len(job.seqs) == 1:
                message = message.replace(" of document 0", "")
            return RequestRejected(grpc.StatusCode.INVALID_ARGUMENT, INVALID_TOKEN, message,
                                   ((INVALID_TOKEN_METADATA_KEY, f"{token},{position},{seq}"),))
