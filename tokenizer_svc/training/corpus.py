"""Corpus reading: files -> the unique pre-tokenized pieces and how often each occurs.

    corpus = count_pieces(["a.txt", "b.txt"], PATTERNS["o200k"], specials=["<|endoftext|>"])
    corpus.pieces           # {b"hello": 12, b" world": 7, ...}

Inputs. A list of text files, or a `corpus_files.CorpusReader` (what `istanbul vocab train`
passes): its uncompressed text files are read here as files (chunked, in parallel); a
compressed text file or stdin is one text streamed through its decompressor (one process);
JSON Lines, JSON, Parquet, Arrow and `datasets` inputs give one text per record, scanned
whole, many records per task (`workers` processes, at most 2 tasks each in flight).

What a piece is. Every file (or record) is one text (pieces never span them). The text is
first cut at occurrences of the special tokens (tiktoken's rule: specials are found first,
longest first, and are never part of a piece), then each stretch between them is split with
the pattern (`regex.finditer`): every non-empty match is one piece, its UTF-8 bytes the
piece's bytes. Text the pattern does not match is dropped, as tiktoken drops it when
encoding.

Invalid UTF-8. `invalid_utf8="error"` (the default) stops with a `CorpusError` naming the
file and the byte offset. `invalid_utf8="keep"` keeps the bytes as bytes: the file is decoded
with `surrogateescape`, so each invalid byte is one character U+DC80..U+DCFF while the pattern
runs (not a letter, digit or space: the built-in patterns group it with punctuation), and
turns back into that same byte inside its piece.

Streaming. Files are read in chunks of `chunk_bytes`, cut before a UTF-8 lead byte. A match
that ends within MARGIN characters of a chunk's end is not trusted (more text could extend it
or change which alternative matches); it and everything after it are carried into the next
chunk. For the built-in patterns (gpt2, cl100k, o200k) a match depends on at most four
characters after its end, so the pieces equal those of a whole-file scan exactly (tested).
A custom pattern that looks further ahead than MARGIN characters, or looks behind, may split
differently at chunk boundaries (every `chunk_bytes`).

Parallel. With `workers > 1` every chunk is pre-tokenized in its own process, scanning from
the chunk's first byte (which may not be where a piece starts). The main process then scans
the carried tail of chunk k together with the head of chunk k+1 until both scans end a match
at the same character; from that boundary on the two scans are identical, so chunk k+1's own
pieces are used. The result is the sequential one (tested); when the scans do not meet within
the head (a single piece longer than the head), the main process scans that chunk itself.
"""

from __future__ import annotations

import bisect
import collections
import io
import itertools
import multiprocessing
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import regex

INVALID_UTF8_MODES = ("error", "keep")
MARGIN = 64  # characters after a match's end that may still change it (built-ins need <= 4)
HEAD_ITEMS = 256  # matches of a parallel chunk's head, where the two scans must meet
DEFAULT_CHUNK_BYTES = 8 << 20


class CorpusError(ValueError):
    """A corpus that cannot be read as asked; the message names the file and what to do."""


@dataclass
class PieceCounts:
    """The corpus as training sees it: unique pieces (bytes) and their occurrence counts."""

    pieces: dict  # bytes -> int (from the GPU counter a read-only mapping, bpe_train.piece_store)
    files: int = 0  # inputs
    bytes_read: int = 0
    occurrences: int = 0  # pieces in the corpus, with repeats
    specials_seen: int = 0
    # parallel chunks the main process had to scan itself; on the GPU path (gpu_corpus.py):
    # files (or their rest) pre-tokenized on the CPU
    fallback_chunks: int = 0
    details: dict = field(default_factory=dict)  # where the time went (gpu_corpus.py)
    documents: int = 0  # texts (a file, or a record of a JSONL/Parquet/... input)
    skipped: int = 0  # bad records skipped (corpus_files, skip_bad)

    def describe(self) -> str:
        docs = f"{self.documents:,} document(s) in " if self.documents != self.files else ""
        skipped = f", {self.skipped:,} bad record(s) skipped" if self.skipped else ""
        return (f"{docs}{self.files} file(s), {self.bytes_read:,} bytes, "
                f"{self.occurrences:,} pieces, {len(self.pieces):,} unique{skipped}")


# ---- pre-tokenization of one text ----------------------------------------------------------

def matching_pattern(pattern: str) -> str:
    """The regex that pre-tokenizes with `pattern`. The built-in patterns (gpt2, cl100k,
    o200k) get tiktoken's Unicode classes, as the GPU pre-tokenizer and tiktoken itself have
    them: `regex`'s own tables are newer (e.g. Kirat Rai, Unicode 16, is a letter there and
    not in tiktoken) and differ between `regex` versions, which made the CPU and GPU pieces of
    one corpus differ on such text. Other patterns run as given."""
    from ..patterns import pattern_name_for
    from ..reference import exact_pattern
    if pattern_name_for(pattern) is None:
        return pattern
    return exact_pattern(pattern, "tiktoken", fast=True)


@dataclass
class Pretokenizer:
    """Splits text into pieces: cut at special tokens, then the pattern's matches."""

    pattern: str
    specials: tuple = ()
    invalid_utf8: str = "error"
    _regex: object = field(init=False, repr=False)
    _special_regex: object = field(init=False, repr=False)

    def __post_init__(self):
        if self.invalid_utf8 not in INVALID_UTF8_MODES:
            raise CorpusError(f"invalid_utf8 must be one of {INVALID_UTF8_MODES}, "
                              f"got {self.invalid_utf8!r}")
        try:
            self._regex = regex.compile(matching_pattern(self.pattern))
        except regex.error as exc:
            raise CorpusError(f"pattern {self.pattern[:80]!r} is not a valid regex: {exc}") \
                from None
        specials = sorted(set(self.specials), key=lambda s: (-len(s), s))
        self._special_regex = (regex.compile("|".join(regex.escape(s) for s in specials))
                               if specials else None)

    @property
    def margin(self) -> int:
        return MARGIN + max((len(s) for s in self.specials), default=0)

    @property
    def errors(self) -> str:
        return "surrogateescape" if self.invalid_utf8 == "keep" else "strict"

    def _segment(self, text: str, offset: int, ends: list, pieces: list) -> None:
        """Append (end offset, piece) of the pattern's matches in `text` (at `offset`)."""
        if not text:
            return
        if self._regex.groups == 0:
            found = self._regex.findall(text, concurrent=True)
            # non-empty matches that tile the text: their ends are prefix sums
            if sum(map(len, found)) == len(text) and "" not in found:
                pieces.extend(found)
                ends.extend(itertools.islice(
                    itertools.accumulate(map(len, found), initial=offset), 1, None))
                return
        for m in self._regex.finditer(text, concurrent=True):
            if m.end() > m.start():
                pieces.append(m.group(0))
                ends.append(offset + m.end())

    def scan(self, text: str, final: bool) -> tuple[list, list, int, int]:
        """Trusted items of `text`: (ends, pieces, consumed, specials).

        `pieces[i]` is a piece ending at character `ends[i]`; a special token is an item with
        piece None. Unless `final`, only items ending at least `margin` characters before the
        end are trusted; `consumed` is where the first untrusted text starts.
        """
        ends: list = []
        pieces: list = []
        if self._special_regex is None:
            self._segment(text, 0, ends, pieces)
        else:
            start = 0
            for m in self._special_regex.finditer(text):
                self._segment(text[start:m.start()], start, ends, pieces)
                ends.append(m.end())
                pieces.append(None)
                start = m.end()
            self._segment(text[start:], start, ends, pieces)
        if final:
            keep = len(ends)
        else:
            # A whitespace run that reaches the end may still grow: where its pieces end
            # depends on what follows it (cl100k/o200k's \s*[\r\n]+ reaches back to the run's
            # first character through any number of spaces), so nothing in it is trusted.
            trusted_end = min(len(text) - self.margin, len(text.rstrip()))
            keep = bisect.bisect_right(ends, trusted_end)
        del ends[keep:], pieces[keep:]
        consumed = ends[-1] if ends else 0
        if final:
            consumed = len(text)
        specials = pieces.count(None) if self._special_regex is not None else 0
        return ends, pieces, consumed, specials

    def decode(self, data: bytes, path: str, offset: int) -> str:
        try:
            return data.decode("utf-8", self.errors)
        except UnicodeDecodeError as exc:
            where = offset + exc.start
            raise CorpusError(
                f"{path}: invalid UTF-8 at byte {where:,} ({exc.reason}: "
                f"{data[exc.start:exc.start + 4]!r}). Fix the file, or pass "
                "--invalid-utf8 keep to train on its bytes as they are") from None


def _count(counter: Counter, pieces: list, has_specials: bool) -> None:
    """Count the pieces of a scan (special-token items are None and not counted)."""
    if has_specials:
        counter.update(p for p in pieces if p is not None)
    else:
        counter.update(pieces)


# ---- reading files --------------------------------------------------------------------------

def _sequence_length(lead: int) -> int:
    return 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


def utf8_cut(data: bytes) -> int:
    """Where to cut `data` so that no UTF-8 sequence is split (the rest waits for more bytes).

    Cuts before the last character's lead byte when that character is incomplete. If none of
    the last four bytes starts a character, no valid sequence can continue past the end (a
    sequence has at most three continuation bytes), so everything is kept.
    """
    n = len(data)
    for i in range(n - 1, max(n - 5, -1), -1):
        if data[i] & 0xC0 != 0x80:
            return n if n - i >= _sequence_length(data[i]) else i
    return n


def align_forward(data: bytes, pos: int) -> int:
    """The first position >= pos that is not inside a valid UTF-8 sequence (looks 4 bytes ahead).

    Two neighbouring parallel chunks compute their shared boundary with this from the same
    file bytes, so they always agree on it. After four continuation bytes no valid sequence
    can still be running, so the cut goes there.
    """
    for i in range(pos, pos + 4):
        if i >= len(data) or data[i] & 0xC0 != 0x80:
            return min(i, len(data))
    return pos + 4


def check_files(paths) -> list[Path]:
    """The input files, each checked to exist and be a readable regular file."""
    files = []
    if not paths:
        raise CorpusError("no input files given")
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise CorpusError(f"{path}: no such file")
        if path.is_dir():
            raise CorpusError(f"{path}: is a directory; pass the files in it "
                              "(for example with a shell glob: DIR/**/*.txt)")
        if not path.is_file():
            raise CorpusError(f"{path}: not a regular file")
        if not os.access(path, os.R_OK):
            raise CorpusError(f"{path}: not readable (permission denied); check its "
                              "permissions or run as a user who can read it")
        files.append(path)
    return files


@dataclass(frozen=True)
class TextInMemory:
    """One text already read (a JSONL line, a Parquet row), read like a file."""

    data: bytes
    origin: str

    def reading(self):
        return io.BytesIO(self.data)

    def __str__(self) -> str:
        return self.origin


def _open(path):
    """A file's bytes, or those of a `corpus_files.Input` or `TextInMemory` (their
    `reading()`), as a context manager."""
    reading = getattr(path, "reading", None)
    if reading is not None:
        return reading()
    try:
        return open(path, "rb")
    except OSError as exc:
        raise CorpusError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def _skip_to(fh, start: int) -> None:
    if not start:
        return
    if fh.seekable():
        fh.seek(start)
        return
    while start > 0:  # a stream (stdin): read past
        got = len(fh.read(min(start, 1 << 20)))
        if not got:
            return
        start -= got


def split_inputs(paths) -> tuple[object, list]:
    """(reader, sources): `paths` (text files) checked, or a corpus_files.CorpusReader's
    inputs with its uncompressed text files as Paths (read here as files) and the rest as
    corpus_files.Input (reader None for a list of files)."""
    from ..corpus_files import CorpusReader
    if isinstance(paths, CorpusReader):
        items = [Path(i.path) if i.plain else i for i in paths.inputs]
        plain = [p for p in items if isinstance(p, Path)]
        if plain:
            check_files(plain)
        return paths, items
    return None, check_files(paths)


def _scan_file_sequential(pre: Pretokenizer, path: Path, counter: Counter, chunk_bytes: int,
                          progress=None, start: int = 0) -> tuple[int, int, int]:
    """Stream one file chunk by chunk from byte `start` (0, or where a piece starts and no
    special token runs through); returns (bytes read, occurrences, specials)."""
    carry = ""
    pending = b""
    offset = start  # file offset of `pending`'s first byte
    occurrences = specials = total = 0
    with _open(path) as fh:
        _skip_to(fh, start)
        while True:
            try:
                block = fh.read(max(chunk_bytes, 2 * len(carry)))  # a long piece: read more
            except OSError as exc:
                raise CorpusError(f"{path}: read failed: {exc.strerror or exc}") from None
            total += len(block)
            if progress is not None:
                progress.update(len(block))
            data = pending + block
            final = not block
            cut = len(data) if final else utf8_cut(data)
            text = carry + pre.decode(data[:cut], str(path), offset)
            pending = data[cut:]
            offset += cut
            _, pieces, consumed, nspecial = pre.scan(text, final)
            _count(counter, pieces, bool(pre.specials))
            occurrences += len(pieces) - nspecial
            specials += nspecial
            carry = text[consumed:]
            if final:
                return total, occurrences, specials


# ---- parallel chunks ------------------------------------------------------------------------

@dataclass
class _ChunkResult:
    """One chunk scanned on its own, from its first character."""

    head_ends: list  # the first HEAD_ITEMS trusted items (not for a file's first chunk)
    head_pieces: list
    head_text: str  # enough text to re-scan the head with the previous chunk's tail before it
    head_is_whole: bool  # head_text is the chunk's whole text
    body: Counter  # the trusted pieces after the head
    body_occurrences: int
    body_specials: int
    tail: str  # untrusted text at the end, carried into the next chunk
    size: int  # bytes


def _read_range(path: str, start: int, end: int, file_size: int) -> tuple[int, bytes]:
    """(offset, bytes) of the chunk [start, end), both ends moved to a character start."""
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read(end - start + 4)
    lo = align_forward(data, 0) if start > 0 else 0
    hi = align_forward(data, end - start) if end < file_size else len(data)
    return start + lo, data[lo:hi]


def _scan_chunk(task) -> _ChunkResult:
    pattern, specials, invalid_utf8, path, start, end, file_size = task
    pre = Pretokenizer(pattern, specials, invalid_utf8)
    first, final = start == 0, end >= file_size
    begin, data = _read_range(path, start, end, file_size)
    text = pre.decode(data, path, begin)
    ends, pieces, consumed, _ = pre.scan(text, final)
    head = 0 if first else min(HEAD_ITEMS, len(ends))
    whole = head == len(ends)
    head_text = text if whole else text[: ends[head - 1] + pre.margin] if head else ""
    body_pieces = pieces[head:]
    body: Counter = Counter()
    _count(body, body_pieces, bool(specials))
    nspecial = body_pieces.count(None) if specials else 0
    return _ChunkResult(head_ends=ends[:head], head_pieces=pieces[:head], head_text=head_text,
                        head_is_whole=whole, body=body,
                        body_occurrences=len(body_pieces) - nspecial, body_specials=nspecial,
                        tail="" if final else text[consumed:], size=len(data))


def _stitch(pre: Pretokenizer, carry: str, chunk: _ChunkResult, last: bool,
            counter: Counter) -> tuple[bool, int, int]:
    """Join the previous chunk's tail to this chunk: (synced, occurrences, specials).

    Scans tail + head until a match ends where one of the chunk's own matches ends; from
    there on the chunk's own scan is the right one.
    """
    combined = carry + chunk.head_text
    ends, pieces, _, _ = pre.scan(combined, final=last and chunk.head_is_whole)
    boundary = {e: j for j, e in enumerate(chunk.head_ends)}
    boundary[0] = -1  # the chunk's own scan starts at its first character
    base = len(carry)
    for i, e in enumerate(ends):
        j = boundary.get(e - base) if e >= base else None
        if j is None:
            continue
        joined = pieces[: i + 1] + chunk.head_pieces[j + 1:]
        _count(counter, joined, bool(pre.specials))
        counter.update(chunk.body)
        nspecial = joined.count(None) if pre.specials else 0
        return (True, len(joined) - nspecial + chunk.body_occurrences,
                nspecial + chunk.body_specials)
    return False, 0, 0


def _ranges(path: Path, chunk_bytes: int) -> list[tuple[int, int, int]]:
    size = path.stat().st_size
    if size == 0:
        return [(0, 0, 0)]
    return [(s, min(s + chunk_bytes, size), size) for s in range(0, size, chunk_bytes)]


def _scan_files_parallel(pre: Pretokenizer, files: list[Path], counter: Counter,
                         chunk_bytes: int, workers: int,
                         progress=None) -> tuple[int, int, int, int]:
    tasks = [(pre.pattern, tuple(pre.specials), pre.invalid_utf8, str(p), s, e, n)
             for p in files for s, e, n in _ranges(p, chunk_bytes)]
    total = occurrences = specials = fallbacks = 0
    context = multiprocessing.get_context("spawn")  # never fork a process holding a GPU device
    with context.Pool(min(workers, len(tasks))) as pool:
        carry = ""
        for task, chunk in zip(tasks, pool.imap(_scan_chunk, tasks)):
            _, _, _, path, start, end, size = task
            total += chunk.size
            if progress is not None:
                progress.update(end - start)
            if start == 0:
                counter.update(chunk.body)
                occurrences += chunk.body_occurrences
                specials += chunk.body_specials
                carry = chunk.tail
                continue
            ok, occ, spc = _stitch(pre, carry, chunk, end >= size, counter)
            if not ok:  # the scans did not meet within the head: scan this chunk here
                fallbacks += 1
                begin, data = _read_range(path, start, end, size)
                text = carry + pre.decode(data, path, begin)
                _, pieces, consumed, spc = pre.scan(text, end >= size)
                _count(counter, pieces, bool(pre.specials))
                occurrences += len(pieces) - spc
                specials += spc
                carry = text[consumed:]
                continue
            occurrences += occ
            specials += spc
            carry = chunk.tail
    return total, occurrences, specials, fallbacks


# ---- records (JSONL, Parquet, ...): many whole texts per task -----------------------------------

def _scan_texts(task) -> tuple[Counter, int, int]:
    """(pieces, occurrences, specials) of whole texts [(bytes, origin), ...]."""
    pattern, specials, invalid_utf8, texts = task
    pre = Pretokenizer(pattern, specials, invalid_utf8)
    counter: Counter = Counter()
    occurrences = nspecial = 0
    for data, origin in texts:
        _, pieces, _, found = pre.scan(pre.decode(data, origin, 0), final=True)
        _count(counter, pieces, bool(specials))
        occurrences += len(pieces) - found
        nspecial += found
    return counter, occurrences, nspecial


def _text_batches(documents, chunk_bytes: int, progress=None):
    """Lists of (bytes, origin) of about `chunk_bytes`."""
    batch, size = [], 0
    for doc in documents:
        batch.append((doc.data, doc.origin))
        size += len(doc.data)
        if progress is not None:
            progress.update(len(doc.data))
        if size >= chunk_bytes:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _scan_records(pre: Pretokenizer, documents, counter: Counter, chunk_bytes: int,
                  workers: int, progress=None) -> tuple[int, int]:
    """Count the pieces of whole texts (records); (occurrences, specials)."""
    occurrences = specials = 0

    def merge(result):
        nonlocal occurrences, specials
        found, occ, spc = result
        counter.update(found)
        occurrences += occ
        specials += spc

    key = (pre.pattern, tuple(pre.specials), pre.invalid_utf8)
    batches = _text_batches(documents, chunk_bytes, progress)
    if workers <= 1:
        for batch in batches:
            merge(_scan_texts((*key, batch)))
        return occurrences, specials
    context = multiprocessing.get_context("spawn")  # never fork a process holding a GPU device
    with context.Pool(workers) as pool:
        pending: collections.deque = collections.deque()
        for batch in batches:  # read here, at most 2 batches per worker in flight
            pending.append(pool.apply_async(_scan_texts, ((*key, batch),)))
            if len(pending) >= 2 * workers:
                merge(pending.popleft().get())
        while pending:
            merge(pending.popleft().get())
    return occurrences, specials


# ---- the entry point ------------------------------------------------------------------------

def count_pieces(paths, pattern: str, specials=(), invalid_utf8: str = "error",
                 workers: int | None = 1, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 progress: bool = False) -> PieceCounts:
    """Pre-tokenize the inputs and count their unique pieces (see the module docstring).

    paths: text files, or a corpus_files.CorpusReader. workers: processes for
    pre-tokenization (None: one per CPU core; 1: this process only).
    """
    reader, items = split_inputs(paths)
    files = [p for p in items if isinstance(p, Path)]
    others = [i for i in items if not isinstance(i, Path)]
    pre = Pretokenizer(pattern, tuple(specials), invalid_utf8)
    if chunk_bytes < 4 * pre.margin:
        raise CorpusError(f"chunk_bytes must be at least {4 * pre.margin}, got {chunk_bytes}")
    workers = (os.cpu_count() or 1) if workers is None else max(1, int(workers))
    total_size = sum(p.stat().st_size for p in files)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=None if others else total_size, unit="B", unit_scale=True,
                   desc="pre-tokenizing", disable=None)   # None: no bar without a terminal
    counter: Counter = Counter()
    fallbacks = 0
    documents = len(files)
    try:
        if workers > 1 and total_size > chunk_bytes:
            total, occurrences, specials_seen, fallbacks = _scan_files_parallel(
                pre, files, counter, chunk_bytes, workers, bar)
        else:
            total = occurrences = specials_seen = 0
            for path in files:
                t, o, s = _scan_file_sequential(pre, path, counter, chunk_bytes, bar)
                total, occurrences, specials_seen = total + t, occurrences + o, specials_seen + s
        for inp in others:
            if inp.format == "text":  # compressed, or stdin: one text, streamed
                t, o, s = _scan_file_sequential(pre, inp, counter, chunk_bytes, bar)
                documents += 1
            else:
                before = (reader.stats.bytes, reader.stats.documents)
                o, s = _scan_records(pre, reader.documents_of(inp, as_bytes=True), counter,
                                     chunk_bytes, workers, bar)
                t = reader.stats.bytes - before[0]
                documents += reader.stats.documents - before[1]
            total, occurrences, specials_seen = total + t, occurrences + o, specials_seen + s
    finally:
        if bar is not None:
            bar.close()
    pieces = {text.encode("utf-8", pre.errors): n for text, n in counter.items()}
    return PieceCounts(pieces=pieces, files=len(items), bytes_read=total,
                       occurrences=occurrences, specials_seen=specials_seen,
                       fallback_chunks=fallbacks, documents=documents,
                       skipped=reader.stats.skipped if reader is not None else 0)


def pieces_of_text(text: str, pattern: str, specials=()) -> dict:
    """Unique pieces of one in-memory text (tests, small corpora): {bytes: count}."""
    pre = Pretokenizer(pattern, tuple(specials), "keep")
    _, pieces, _, _ = pre.scan(text, final=True)
    counter: Counter = Counter()
    _count(counter, pieces, bool(specials))
    return {t.encode("utf-8", "surrogateescape"): n for t, n in counter.items()}
