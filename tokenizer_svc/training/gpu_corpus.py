"""GPU pre-tokenization and piece counting: files -> unique pieces + counts, as corpus.py.

    corpus = count_pieces_gpu(["a.txt"], "o200k", specials=["<|endoftext|>"], device=dev)
    corpus.pieces == corpus_cpu.pieces          # always (tests/test_vocab_train_gpu_corpus.py)

The pieces are those of corpus.py (the same semantics, the CPU path is the reference); only
how they are found differs. Per chunk of a file (bytes, at most `chunk_bytes`):

- the host checks the bytes are UTF-8, cuts the chunk at special tokens (each stretch between
  them becomes one document of the chunk, the special's bytes left out), uploads it;
- the device counts the chunk's pieces (istanbul.shaders.kernels.bpe_train.piece_count: the
  encoder's own pre-tokenizer marks them, piece_count.wgsl counts them exactly) into a store
  on the device that lives for the whole corpus (piece_store.py): the store comes back once,
  at the end; pieces longer than LONG_MIN bytes are counted on the host (rare: long runs of
  one kind).

Files of at most a quarter chunk are read whole and gathered, many to one device call (each
file its own documents: pieces never span files). Chunks of larger files end at a provable
piece boundary (cuts.find_cut, the CPU twin of the kernels' `is_cut`) that is not next
to a special token, and carry CONTEXT_BYTES after it (seen, not counted: a match may look a few
characters ahead), so the pieces equal those of one scan of the whole file. A file with invalid UTF-8 stops with corpus.py's error, or with
`invalid_utf8="keep"` is pre-tokenized by corpus.py on the CPU (the kernels need valid UTF-8);
so is a file with a stretch longer than one device call that has no provable boundary.

Inputs other than text files (a `corpus_files.CorpusReader`'s): a compressed text file or
stdin is one text read through its decompressor like a large file; each record of a JSONL,
JSON, Parquet, Arrow or `datasets` input is one text, gathered with others like a small file,
or chunked like a large one when it is larger than a quarter chunk.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
import regex

from istanbul.shaders.kernels.bpe.cuts import find_cut
from istanbul.shaders.kernels.bpe.patterns import PATTERN_IDS
from istanbul.shaders.kernels.bpe_train.piece_count import GpuPieceCounter
from istanbul.shaders.kernels.bpe_train.piece_store import CapacityError, CorpusPieces
from ..patterns import PATTERNS
from .corpus import (DEFAULT_CHUNK_BYTES, CorpusError, PieceCounts, Pretokenizer,
                     TextInMemory, _open, _scan_file_sequential, split_inputs, utf8_cut)

GPU_CHUNK_BYTES = 32 << 20
CONTEXT_BYTES = 64  # text after a chunk's cut the pre-tokenizer sees (matches look <= 4 ahead)


def gpu_pattern(pattern: str) -> str | None:
    """The GPU pre-tokenizer for a pattern (a name or its regex text), None when there is none."""
    name = {"r50k": "gpt2"}.get(pattern, pattern)
    if name in PATTERN_IDS:
        return name
    for known, text in PATTERNS.items():
        if text == pattern:
            return {"r50k": "gpt2"}.get(known, known)
    return None


class _NoCut(Exception):
    """A stretch with no provable boundary longer than one device call, from `offset` on
    (a piece boundary: the CPU path continues from there)."""

    def __init__(self, offset: int, specials: int):
        super().__init__(offset)
        self.offset, self.specials = offset, specials


class _FileChunker:
    """One file as chunks that end at provable piece boundaries, with their documents."""

    def __init__(self, pre: Pretokenizer, pattern: str, chunk_bytes: int, max_chunk: int):
        self.pre = pre
        self.pattern = pattern
        self.chunk_bytes = chunk_bytes
        self.max_chunk = max_chunk
        self.longest_special = max((len(s.encode()) for s in pre.specials), default=0)
        specials = sorted(set(pre.specials), key=lambda s: (-len(s), s))
        self.special_re = (regex.compile(b"|".join(regex.escape(s.encode()) for s in specials))
                           if specials else None)

    def documents(self, buf: bytes, end: int):
        """(stretches between specials of buf[:end] as byte ranges, the specials' starts)."""
        if self.special_re is None:
            return [(0, end)], []
        docs, start, found = [], 0, []
        for m in self.special_re.finditer(buf, 0, end):
            docs.append((start, m.start()))
            start = m.end()
            found.append(m.start())
        docs.append((start, end))
        return docs, found

    def cut(self, buf: bytes, complete: int) -> int | None:
        """Where to end a chunk of buf[:complete] (whole characters): a provable boundary, at
        least `margin` bytes before `complete`, not inside or just before a special."""
        margin = self.longest_special + 16
        hi = min(complete - margin, self.chunk_bytes)
        arr = np.frombuffer(buf, np.uint8, count=complete)
        while hi > 0:
            c = find_cut(arr, max(0, hi - (1 << 20)), hi, self.pattern)
            if c is None:
                return None
            if self.special_re is None:
                return c
            lo = max(0, c - self.longest_special)
            near = [m for m in self.special_re.finditer(buf, lo, min(complete, c + margin))
                    if m.start() < c < m.end() or c < m.start() <= c + 16]
            if not near:
                return c
            hi = c - 1
        return None


def _scan_file_gpu(counter_dev: GpuPieceCounter, chunker: _FileChunker, path: Path,
                   counter: Counter, progress=None, to_store: bool = True) -> tuple[int, int]:
    """Count one file's pieces into `counter`; returns (bytes, specials). Raises _NoCut or
    UnicodeDecodeError (caught by the caller) when the file needs the CPU path."""
    pre = chunker.pre
    total = specials = 0
    offset = 0  # file offset of buf[0]
    buf = b""
    with _open(path) as fh:
        eof = False
        while True:
            want = max(chunker.chunk_bytes, len(buf) + 1) + chunker.longest_special + 64
            while not eof and len(buf) < want:
                try:
                    block = fh.read(want - len(buf))
                except OSError as exc:
                    raise CorpusError(f"{path}: read failed: {exc.strerror or exc}") from None
                if not block:
                    eof = True
                    break
                total += len(block)
                if progress is not None:
                    progress.update(len(block))
                buf += block
            complete = len(buf) if eof else utf8_cut(buf)
            if eof and len(buf) <= chunker.max_chunk:
                end = len(buf)
            else:
                end = chunker.cut(buf, complete)
                if end is None or end <= 0:
                    if len(buf) >= chunker.max_chunk or eof:
                        raise _NoCut(offset, specials)
                    chunker.chunk_bytes = min(2 * chunker.chunk_bytes, chunker.max_chunk)
                    continue
            # A few characters after the cut go along as context (never counted): the pieces
            # that end at the cut were matched with the text after it in view.
            ctx = min(complete, end + CONTEXT_BYTES)
            while end < ctx < len(buf) and buf[ctx] & 0xC0 == 0x80:
                ctx -= 1
            window = buf[:ctx]
            if pre.invalid_utf8 == "error":
                pre.decode(window, str(path), offset)  # raises CorpusError with the offset
            else:
                window.decode("utf-8")  # invalid: the caller takes the CPU path
            docs, found = chunker.documents(window, ctx)
            specials += sum(1 for start in found if start < end)
            kept = [(s, e) for s, e in docs if e > s]
            if kept:
                data = b"".join(window[s:e] for s, e in kept) if found else window
                sizes = np.array([e - s for s, e in kept], np.int64)
                starts = np.concatenate([[0], np.cumsum(sizes)])
                limit = sum(max(0, min(e, end) - s) for s, e in kept)  # the cut, without specials
                counter_dev.count(data, starts, counter, limit, to_store)
            buf = buf[end:]
            offset += end
            if eof and not buf:
                return total, specials


class _SmallFiles:
    """Whole small files gathered into one device call (each file its own documents)."""

    def __init__(self, counter_dev: GpuPieceCounter, chunker: _FileChunker, counter: Counter,
                 chunk_bytes: int):
        self.dev, self.chunker, self.counter = counter_dev, chunker, counter
        self.chunk_bytes = chunk_bytes
        self.parts: list = []
        self.sizes: list = []
        self.bytes = 0

    def add(self, path: Path, progress=None) -> tuple[int | None, int]:
        """Queue one file: (bytes, specials), or (None, 0) when it needs the CPU path."""
        with _open(path) as fh:
            try:
                data = fh.read()
            except OSError as exc:
                raise CorpusError(f"{path}: read failed: {exc.strerror or exc}") from None
        return self.add_text(data, str(path), progress)

    def add_text(self, data: bytes, origin: str, progress=None) -> tuple[int | None, int]:
        """Queue one text (a file's bytes, a record): (bytes, specials), or (None, 0) when it
        needs the CPU path."""
        pre = self.chunker.pre
        if progress is not None:
            progress.update(len(data))
        if pre.invalid_utf8 == "error":
            pre.decode(data, origin, 0)  # raises CorpusError with the offset
        else:
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                return None, 0
        docs, found = self.chunker.documents(data, len(data))
        for s, e in docs:
            if e > s:
                self.parts.append(data[s:e] if found else data)
                self.sizes.append(e - s)
                self.bytes += e - s
        if self.bytes >= self.chunk_bytes:
            self.flush()
        return len(data), len(found)

    def flush(self) -> None:
        if self.parts:
            starts = np.concatenate([[0], np.cumsum(np.array(self.sizes, np.int64))])
            self.dev.count(b"".join(self.parts), starts, self.counter)
        self.parts, self.sizes, self.bytes = [], [], 0


def count_pieces_gpu(paths, pattern: str, specials=(), invalid_utf8: str = "error",
                     device=None, chunk_bytes: int = GPU_CHUNK_BYTES,
                     progress: bool = False, max_chunk_bytes: int | None = None,
                     first_slots: int | None = None,
                     first_store_records: int | None = None,
                     buffer_limit: int | None = None) -> PieceCounts:
    """corpus.count_pieces on the GPU for the built-in patterns (gpt2, cl100k, o200k).

    chunk_bytes: bytes per device call (bounded by the device's binding size; host and device
    memory stay bounded by it); max_chunk_bytes: the most a chunk may grow to find a piece
    boundary (default: what the device allows), beyond that the file goes the CPU path;
    first_slots, first_store_records: first sizes of the chunk table and of the device store
    (tests: force them to grow); buffer_limit: the largest store buffer (default: what the
    device allows; tests scale it down to see the error for too many unique pieces).

    Peak memory: host, a few copies of one chunk (reading, cutting, joining documents) plus
    the result; device, ~15-25 bytes per chunk byte (text, piece lengths, the chunk's table:
    20 bytes per slot, one slot per two bytes rounded up to a power of two) plus the store
    (bpe_train/piece_store.py: 30-60 bytes per unique piece and its bytes). Neither grows with the
    corpus, only with its unique pieces.
    """
    reader, items = split_inputs(paths)
    name = gpu_pattern(pattern)
    if name is None:
        raise CorpusError(f"pattern {pattern[:80]!r} has no GPU pre-tokenizer (gpt2, cl100k, "
                          "o200k have); use corpus.count_pieces")
    pre = Pretokenizer(PATTERNS[name], tuple(specials), invalid_utf8)
    if device is None:
        from istanbul.shaders.engine import default_device
        device = default_device()
    try:
        dev_counter = GpuPieceCounter(device, name, max_chunk_bytes, first_slots,
                                      first_store_records, buffer_limit)
    except CapacityError as exc:
        raise CorpusError(str(exc)) from None
    chunk = max(1 << 12, min(int(chunk_bytes), dev_counter.max_chunk // 2))
    all_files = all(isinstance(p, Path) for p in items)
    total_size = sum(p.stat().st_size for p in items if isinstance(p, Path))
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=total_size if all_files else None, unit="B", unit_scale=True,
                   desc="pre-tokenizing + counting (GPU)", disable=None)  # no bar without a TTY
    counter: Counter = Counter()
    total = specials_seen = fallbacks = documents = 0
    small = _SmallFiles(dev_counter, _FileChunker(pre, name, chunk, dev_counter.max_chunk),
                        counter, chunk)

    def on_cpu(source, start: int = 0) -> tuple[int, int]:
        """The CPU path for one text from byte `start`: (bytes, specials)."""
        nonlocal fallbacks
        fallbacks += 1
        text_counts: Counter = Counter()
        t, _, s = _scan_file_sequential(pre, source, text_counts, DEFAULT_CHUNK_BYTES,
                                        start=start)
        for k, v in text_counts.items():
            counter[k.encode("utf-8", pre.errors)] += v
        return t, s

    def count_large(source) -> tuple[int, int]:
        """One text in chunks (a large file, a stream, a large record): (bytes, specials)."""
        # with --invalid-utf8 keep a text may turn out to need the CPU path after some of
        # its chunks were counted: count it on its own (on the host, not in the device
        # store, which cannot take pieces back) until it is done
        mine: Counter = Counter() if invalid_utf8 == "keep" else counter
        chunker = _FileChunker(pre, name, chunk, dev_counter.max_chunk)
        cpu_from = None  # where the CPU path takes over, if it does
        try:
            t, s = _scan_file_gpu(dev_counter, chunker, source, mine, bar,
                                  to_store=mine is counter)
        except _NoCut as stop:  # the rest of the text on the CPU, from a piece boundary
            cpu_from, s = stop.offset, stop.specials
        except UnicodeDecodeError:  # keep mode: the whole text on the CPU
            mine, cpu_from, s = Counter(), 0, 0
        if mine is not counter:
            counter.update(mine)
        if cpu_from is not None:
            tail, s_cpu = on_cpu(source, cpu_from)
            t, s = cpu_from + tail, s + s_cpu
        return t, s

    try:
        for item in items:
            if isinstance(item, Path) and item.stat().st_size <= chunk // 4:
                # many small files share one device call
                t, s = small.add(item, bar)
                if t is None:  # keep mode, invalid UTF-8: the CPU path
                    t, s = on_cpu(item)
                documents += 1
            elif isinstance(item, Path) or item.format == "text":
                t, s = count_large(item)  # a large file, or a compressed one or stdin
                documents += 1
            else:  # records: each its own text, small ones gathered as small files are
                t = s = 0
                for doc in reader.documents_of(item, as_bytes=True):
                    documents += 1
                    if len(doc.data) <= chunk // 4:
                        dt, ds = small.add_text(doc.data, doc.origin, bar)
                        if dt is None:
                            dt, ds = on_cpu(TextInMemory(doc.data, doc.origin))
                    else:
                        dt, ds = count_large(TextInMemory(doc.data, doc.origin))
                    t, s = t + dt, s + ds
            total, specials_seen = total + t, specials_seen + s
        small.flush()
        t_store = time.perf_counter()
        pieces = CorpusPieces(dev_counter.store.download(), dict(counter))
        dev_counter.seconds["store_download"] = time.perf_counter() - t_store
    except CapacityError as exc:
        raise CorpusError(str(exc)) from None
    finally:
        dev_counter.pool.release()  # the merge phase gets the device memory back
        dev_counter.store.release()
        if bar is not None:
            bar.close()
    return PieceCounts(pieces=pieces, files=len(items), bytes_read=total,
                       occurrences=pieces.occurrences(), specials_seen=specials_seen,
                       fallback_chunks=fallbacks, documents=documents,
                       skipped=reader.stats.skipped if reader is not None else 0,
                       details=dict(dev_counter.seconds, device_calls_made=dev_counter.calls,
                                    store_growths=dev_counter.store.growths))
