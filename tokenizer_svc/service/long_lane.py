"""The long lane: expensive documents run outside the shared low-latency batch.

Admission by cost (`is_long`): a request is long when one document is over `doc_bytes`, or
may pre-tokenize into a piece of `piece_bytes` or more (`may_hold_long_piece`: a bound from
its longest run with or without whitespace, and in bytes mode the tail after the first
invalid UTF-8 byte, which tiktoken merges as one piece). Long requests queue here, one at a
time, on their own worker thread with their own GPU encoder (the device's queue interleaves
its short submits with the batches').

Each document is cut at the tokenizer's split points (shaders/kernels/bpe/cuts.py: the ids do not
change) into chunks of about `chunk_bytes`, encoded one after the other; between chunks, and
between the budgeted resume rounds of one long piece inside a chunk, the lane checks the
request's cancellation and deadline and the server's shutdown, so those stop it within one
round. Every check is a heartbeat for the watchdog.
"""

from __future__ import annotations

import re
import threading
import time

import grpc
import numpy as np

from istanbul.shaders.kernels.bpe.cuts import PATTERNS, split_cuts, valid_utf8_prefix
from .config import LaneConfig
from .errors import RequestRejected, shutting_down
from .limits import utf8_len
from .work import encode_flat

MiB = 1 << 20
_RUN = {}  # piece_bytes -> compiled regex


def may_hold_long_piece(doc, piece_bytes: int) -> bool:
    r"""Could `doc` (str, or bytes encoded by tiktoken's bytes rule) pre-tokenize into a piece
    of `piece_bytes` bytes or more?

    Every piece of the known patterns is a run of whitespace, or a run without whitespace
    plus at most one run of newlines (cl100k/o200k "others + [\r\n]*"), so it is shorter
    than 2 x (the longest such run) + 1 characters of at most 4 bytes. The threshold is a
    run of piece_bytes // 4 characters (Unicode \s, one regex scan in C): what stays in the
    batch has no piece of 2 x piece_bytes or more. In bytes mode everything after the first
    invalid UTF-8 sequence is one piece with the last one.
    """
    if isinstance(doc, str):
        text = doc
    else:
        data = bytes(doc)
        valid = valid_utf8_prefix(data)
        if len(data) - valid + 1 >= piece_bytes // 2:
            return True
        text = data[:valid].decode("utf-8")
    n = max(1, piece_bytes // 4)
    pattern = _RUN.get(n)
    if pattern is None:
        pattern = _RUN[n] = re.compile(r"\S{%d}|\s{%d}" % (n, n))
    if n < 64:
        return pattern.search(text) is not None
    # A run of n or more characters covers a whole aligned block of n // 2: only blocks that
    # are all whitespace or hold none can be part of one, and the regex runs only around
    # those (a regex search over the whole text costs ~30 ns per character on the event
    # loop: 2 ms per 64 KB request; the blocks cost a few C calls each). str.isspace and
    # str.split use the same Unicode whitespace as re's \s.
    block = n // 2
    for start in range(0, len(text) - block + 1, block):
        chunk = text[start:start + block]
        if chunk.isspace() or len(chunk.split(None, 1)[0]) == block:
            window = text[max(0, start - n):start + block + n]
            if pattern.search(window) is not None:
                return True
    return False


def is_long(docs, nbytes: int, cfg: LaneConfig) -> bool:
    """Does this request's cost (bytes, longest piece) send it to the long lane?"""
    if nbytes < cfg.piece_bytes // 4:
        return False
    return any(utf8_len(d) > cfg.doc_bytes or may_hold_long_piece(d, cfg.piece_bytes)
               for d in docs)


class Interrupted(Exception):
    """The long job was stopped between two steps (cancelled, deadline, shutdown)."""


class LongJobControl:
    """Shared between the event loop (which cancels) and the lane's thread (which checks)."""

    def __init__(self, deadline: float | None, closing: threading.Event, heartbeat):
        self.deadline = deadline      # time.monotonic() seconds, or None
        self.cancelled = threading.Event()
        self._closing = closing
        self._heartbeat = heartbeat

    def check(self) -> None:
        self._heartbeat()
        if self.cancelled.is_set():
            raise Interrupted("cancelled")
        if self._closing.is_set():
            raise shutting_down()
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise RequestRejected(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline",
                                  "the deadline passed while the long document was encoded")


class LongLane:
    """Runs one EncodeJob at a time with `encoding` (its own Encoding, not the batch's)."""

    def __init__(self, encoding, finish, cfg: LaneConfig):
        self.encoding = encoding
        self.cfg = cfg
        self._finish = finish          # (job, ids) -> EncodedDoc (BatchRunner._finish)
        self.closing = threading.Event()
        self.busy_since: float | None = None
        self.last_beat = time.monotonic()
        encoder = getattr(getattr(encoding, "backend", None), "encoder", None)
        self._encoder = encoder
        pattern = getattr(getattr(encoding, "vocab", None), "pattern_name", None)
        self._pattern = pattern if pattern in PATTERNS else None

    def admits(self, job, nbytes: int) -> bool:
        """Is this EncodeJob expensive enough for the long lane?"""
        return is_long(job.docs, nbytes, self.cfg)

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def run(self, job, control: LongJobControl) -> list:
        """On the lane's thread: one EncodedDoc per document, or raises."""
        self.busy_since = time.monotonic()
        self.beat()
        try:
            if self._encoder is not None:
                with self._encoder.interruptible(control.check):
                    return [self._finish(job, self._encode(doc, job, control))
                            for doc in job.docs]
            return [self._finish(job, self._encode(doc, job, control)) for doc in job.docs]
        finally:
            self.busy_since = None

    def _encode(self, doc, job, control: LongJobControl) -> np.ndarray:
        allowed = job.rule.allowed & frozenset(self.encoding.special_tokens_set)
        parts = []
        for chunk in self._chunks(doc, allowed):
            control.check()
            ids, _ = encode_flat(self.encoding, [chunk], allowed)
            parts.append(ids)
        return np.concatenate(parts) if parts else np.zeros(0, np.uint32)

    def _chunks(self, doc, allowed):
        """The document in consecutive chunks whose ids concatenate to the document's ids."""
        text = isinstance(doc, str)
        data = doc.encode("utf-8", "surrogatepass") if text else bytes(doc)
        if self._pattern is None:
            yield doc   # no proven cut rule for this pattern: one step
            return
        specials = [s.encode() for s in allowed if s.encode() in data] if text else []
        cuts = [int(c) for c in split_cuts(data, self._pattern)
                if not specials or _safe_between(data, int(c), specials)]
        start, k = 0, 0
        while len(data) - start > self.cfg.chunk_bytes:
            # the last cut within chunk_bytes of start, else the first one after
            while k + 1 < len(cuts) and cuts[k + 1] <= start + self.cfg.chunk_bytes:
                k += 1
            while k < len(cuts) and cuts[k] <= start:
                k += 1
            if k >= len(cuts):
                break
            part, start = data[start:cuts[k]], cuts[k]
            yield part.decode("utf-8", "surrogatepass") if text else part
        part = data[start:]
        yield part.decode("utf-8", "surrogatepass") if text else part


def _safe_between(data: bytes, end: int, specials: list) -> bool:
    """No allowed special token's text lies within a few characters of byte `end`: a special
    ends the ordinary segment before it, which changes the rule's neighbours there (a cut
    before the last space of a run that a special follows would split one piece in two)."""
    for s in specials:
        if s in data[max(0, end - len(s) - 8):end + len(s) + 8]:
            return False
    return True
