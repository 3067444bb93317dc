"""What one batch does with the Encoding, on the GPU thread: jobs in, one result per job out.

Every text of every encode job in the batch goes into ONE `Encoding.encode_batch_flat` call.
Special tokens follow tiktoken's rules exactly as `Encoding.encode` applies them: text that
contains a disallowed special token is refused; allowed special tokens split the text, the
pieces between them are encoded as ordinary text (tiktoken's core does the same: its
pre-tokenizer never runs across a special token) and the special ids are put between them.
Raw-bytes documents that are valid UTF-8 are ordinary text; the others go through
`Encoding.encode_bytes` one by one.

Offsets are derived from the ids: a token's byte offset is the sum of the byte lengths of
the tokens before it; its character offset is the index of the character holding its first
byte (for raw bytes, characters are counted by UTF-8 lead bytes).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable

import grpc
import numpy as np
import regex

from .errors import DISALLOWED_SPECIAL, INVALID_TOKEN, RequestRejected

EMPTY_IDS = np.zeros(0, np.uint32)


@dataclass(frozen=True)
class SpecialRule:
    """Resolved allowed/disallowed special tokens (tiktoken's allowed_special/disallowed_special)."""

    allowed: frozenset
    disallowed: frozenset

    @classmethod
    def resolve(cls, special_tokens: frozenset, *, allow_all: bool = False, allowed=(),
                disallow_none: bool = False, disallowed=()) -> "SpecialRule":
        allowed_set = frozenset(special_tokens) if allow_all else frozenset(allowed)
        if disallow_none:
            disallowed_set = frozenset()
        elif disallowed:
            disallowed_set = frozenset(disallowed)
        else:  # tiktoken's default, disallowed_special="all"
            disallowed_set = frozenset(special_tokens) - allowed_set
        return cls(allowed_set, disallowed_set)


@functools.lru_cache(maxsize=256)
def _alternation(tokens: frozenset):
    """A regex matching any of `tokens`, longest first (so overlapping names resolve alike)."""
    return regex.compile("|".join(regex.escape(t) for t in sorted(tokens, key=lambda t: (-len(t), t))))


@dataclass
class EncodeJob:
    docs: list                   # str: text (special tokens apply); bytes: raw, ordinary
    rule: SpecialRule
    offsets: str | None = None   # None, "byte" or "char"
    max_tokens: int = 0          # 0: no truncation
    keep_end: bool = False       # truncate on the left (keep the last max_tokens)

    @property
    def nbytes(self) -> int:
        return sum(len(d) if isinstance(d, bytes) else _utf8_len(d) for d in self.docs)


@dataclass
class EncodedDoc:
    ids: np.ndarray                # uint32, after truncation
    offsets: np.ndarray | None     # one per id, when asked for
    token_count: int               # before truncation

    @property
    def truncated(self) -> bool:
        return self.token_count > len(self.ids)


@dataclass
class DecodeJob:
    seqs: list                     # each a sequence of ids


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class BatchRunner:
    """Callable run by the DynamicBatcher on the GPU thread: list of jobs -> list of results."""

    def __init__(self, encoding, on_encode_seconds: Callable[[float], None] | None = None):
        self.encoding = encoding
        self.special_tokens = frozenset(encoding.special_tokens_set)
        self.special_ids = dict(encoding.vocab.special_tokens)
        self._on_encode_seconds = on_encode_seconds or (lambda seconds: None)

    @functools.cached_property
    def token_lengths(self) -> np.ndarray:
        """Byte length of every id (0 for ids that are not tokens), for offsets."""
        lengths = np.zeros(self.encoding.n_vocab, np.int64)
        for i, token in self.encoding.vocab.decoder.items():
            if 0 <= i < lengths.size:
                lengths[i] = len(token)
        return lengths

    def __call__(self, jobs: list) -> list:
        results: list = [None] * len(jobs)
        plan = _Plan(self)
        planned = []
        for k, job in enumerate(jobs):
            if isinstance(job, EncodeJob):
                try:
                    where = (lambda n: f"document {n}: ") if len(job.docs) > 1 else (lambda n: "")
                    planned.append((k, job, [plan.add(doc, job.rule, where(n)) for n, doc in
                                             enumerate(job.docs)]))
                except RequestRejected as exc:
                    results[k] = exc
        if planned:
            start = time.perf_counter()
            pieces = plan.encode()
            self._on_encode_seconds(time.perf_counter() - start)
            for k, job, doc_plans in planned:
                results[k] = [self._finish(job, doc, pieces.ids_of(p))
                              for doc, p in zip(job.docs, doc_plans)]
        for k, job in enumerate(jobs):
            if isinstance(job, DecodeJob):
                results[k] = self._decode(job)
        return results

    def _finish(self, job: EncodeJob, doc, ids: np.ndarray) -> EncodedDoc:
        count = int(ids.size)
        offsets = self._offsets(doc, ids, job.offsets) if job.offsets else None
        if job.max_tokens and count > job.max_tokens:
            cut = slice(count - job.max_tokens, None) if job.keep_end else slice(0, job.max_tokens)
            ids = ids[cut]
            offsets = offsets[cut] if offsets is not None else None
        return EncodedDoc(ids, offsets, count)

    def _offsets(self, doc, ids: np.ndarray, unit: str) -> np.ndarray:
        lengths = self.token_lengths[ids]
        starts = np.cumsum(lengths) - lengths
        if unit == "byte":
            return starts
        data = doc if isinstance(doc, bytes) else doc.encode("utf-8", "surrogatepass")
        lead = (np.frombuffer(data, np.uint8) & 0xC0) != 0x80
        chars_through = np.cumsum(lead)
        return chars_through[starts] - 1 if starts.size else starts

    def _decode(self, job: DecodeJob):
        out = []
        for n, seq in enumerate(job.seqs):
            try:
                out.append(self.encoding.decode_bytes(seq))
            except ValueError as exc:  # InvalidTokenError: an id outside the vocabulary
                where = f"sequence {n}: " if len(job.seqs) > 1 else ""
                return RequestRejected(grpc.StatusCode.INVALID_ARGUMENT, INVALID_TOKEN,
                                       f"{where}{exc} (the vocabulary "
                                       f"{self.encoding.name!r} has {self.encoding.n_vocab} ids)")
        return out


class _Pieces:
    def __init__(self, flat_ids, flat_offsets, raw):
        self.flat_ids, self.flat_offsets, self.raw = flat_ids, flat_offsets, raw

    def ids_of(self, doc_plan: list) -> np.ndarray:
        parts = []
        for kind, value in doc_plan:
            if kind == "text":
                parts.append(self.flat_ids[self.flat_offsets[value]:self.flat_offsets[value + 1]])
            elif kind == "raw":
                parts.append(self.raw[value])
            else:
                parts.append(np.array([value], np.uint32))
        if not parts:
            return EMPTY_IDS
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


class _Plan:
    """Splits documents into the pieces one encode_batch_flat call (plus raw bytes) covers."""

    def __init__(self, runner: BatchRunner):
        self.runner = runner
        self.texts: list[str] = []
        self.raw: list[bytes] = []

    def _text(self, text: str) -> list:
        if not text:
            return []
        self.texts.append(text)
        return [("text", len(self.texts) - 1)]

    def add(self, doc, rule: SpecialRule, where: str) -> list:
        if isinstance(doc, bytes):
            try:
                return self._text(doc.decode("utf-8"))
            except UnicodeDecodeError:
                self.raw.append(doc)
                return [("raw", len(self.raw) - 1)]
        if rule.disallowed:
            found = _alternation(rule.disallowed).search(doc)
            if found:
                raise RequestRejected(
                    grpc.StatusCode.INVALID_ARGUMENT, DISALLOWED_SPECIAL,
                    f"{where}the text contains the special token {found.group()!r} "
                    f"at character {found.start()}, which this request does not allow; allow it "
                    "(allowed_special) to encode it as its special id, or disallow none "
                    "(disallowed_special=()) to encode it as ordinary text")
        allowed = rule.allowed & self.runner.special_tokens
        if not allowed:
            return self._text(doc)
        plan, start = [], 0
        for match in _alternation(allowed).finditer(doc):
            plan += self._text(doc[start:match.start()])
            plan.append(("special", self.runner.special_ids[match.group()]))
            start = match.end()
        return plan + self._text(doc[start:])

    def encode(self) -> _Pieces:
        enc = self.runner.encoding
        if self.texts:
            ids, offsets = enc.encode_batch_flat(self.texts)
            ids = np.asarray(ids, np.uint32)
            offsets = np.asarray(offsets, np.int64)
        else:
            ids, offsets = EMPTY_IDS, np.zeros(1, np.int64)
        raw = [np.asarray(enc.encode_bytes(data), np.uint32) for data in self.raw]
        return _Pieces(ids, offsets, raw)
