"""Corpus inputs -> a stream of documents, each with where it came from.

    reader = CorpusReader(["web/", "more/*.jsonl.zst", "-"], text_field="text")
    for doc in reader.documents(as_bytes=True):   # Document(b"...", "more/a.jsonl.zst line 3")
        ...
    reader.stats.documents, reader.stats.bytes, reader.stats.skipped

`istanbul prepare`, `istanbul vocab train` and `istanbul encode FILES` read their inputs here.

What a name means:
- `-`: standard input: one text document unless `format` says otherwise; gzip, zstd, xz and
  bzip2 streams are recognised by their first bytes;
- a directory: the files under it, recursively, sorted by path (the `include` globs, e.g.
  '*.py', keep those whose path matches one); a `datasets` folder under it is read as one
  (below: its Arrow files; its JSON metadata is never read as text);
- a glob pattern, e.g. 'data/*.parquet' or 'web/**/*.jsonl.gz' (quoted, so that the shell
  leaves it to us; `**` spans folders): the matching files and directories, sorted;
- a file. A name that is none of these is an error.

What a file holds is told by its suffix, once a compression suffix (.gz, .zst/.zstd,
.xz/.lzma, .bz2: read through gzip, zstd, lzma, bz2 as a stream) is taken off; `format`
overrides it for every file:
- text (any other suffix): the whole file is one document, its bytes as they are;
- jsonl (.jsonl, .ndjson): one document per line: a JSON string, or an object whose
  `text_field` (default "text") is a string; blank lines are skipped;
- json (.json): a JSON array of such values, read element by element, or JSON Lines (what
  `Dataset.to_json` writes): the first character that is not a space tells which;
- parquet (.parquet, .pq): the `text_field` column (string or binary) of every row, read
  batch by batch of one row group (only that column is read);
- arrow (.arrow, .feather, .ipc): an Arrow IPC file (Feather v2) or stream, record batch by
  record batch; the `text_field` column as for Parquet;
- a `datasets` folder (`Dataset.save_to_disk`: state.json, dataset_info.json, data-*.arrow
  Arrow streams): its Arrow files in state.json's order; a `DatasetDict` folder
  (dataset_dict.json and a folder per split): every split in dataset_dict.json's order (name
  one split's folder to read only it). Read with pyarrow directly: `datasets` is not needed.

Documents come as `bytes` (text files, binary columns) or `str` (JSON, string columns), or all
as UTF-8 `bytes` with `documents(as_bytes=True)`. Each has an origin for messages: `FILE`
for a whole-file document, `FILE line N` (counted from 1), `FILE row N` (counted from 0, as
`dataset[N]`), `FILE element N (line L)` in a JSON array.

Bad records: a line that is not JSON, a value that is neither a string nor an object, a
missing field, a field that is not a string (null included), a line that is not UTF-8, or
(as_bytes) a string with a lone surrogate. Each stops the reading with a `CorpusFileError`
naming the file and line or row; with `skip_bad` it is skipped, counted (`stats.skipped`) and
the first few are kept (`stats.bad_examples`). A syntax error inside a JSON array, a damaged
compressed stream, a missing column or an unreadable file always stops: there is no next
record to go on from, or nothing to read.

Memory stays flat whatever the corpus's size: compressed streams go through 1 MiB buffers,
JSON Lines one line at a time, a JSON array one element at a time (plus at most 1 MiB read
ahead), Parquet one batch of BATCH_ROWS values of one column (its pages through a 1 MiB
buffer, a row group never read whole; a page is decompressed whole, ~1 MB as writers make
them), Arrow one record batch at a time (not memory-mapped). Only a whole-file text document
is held whole: it is one document.

Optional packages: Parquet and Arrow need `pyarrow`; .zst needs `zstandard` (or the standard
library's compression.zstd from Python 3.14): `pip install 'istanbul[corpora]'`. A missing one
is a `CorpusFileError` that says so.
"""

from __future__ import annotations

import glob
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

from istanbul_errors import UserFacingError

FORMATS = ("auto", "text", "jsonl", "json", "parquet", "arrow")
TEXT_FIELD = "text"
EXTRA = "pip install 'istanbul[corpora]'"
BUFFER_BYTES = 1 << 20       # read buffers: decompressed streams, Parquet pages, JSON arrays
BATCH_ROWS = 64              # Parquet rows per batch (documents of 32 KB: 2 MB)
BAD_EXAMPLES = 5             # skipped records whose reason is kept for the summary

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".xz": "xz", ".lzma": "xz",
                ".bz2": "bzip2"}
SUFFIX_FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json",
                  ".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow",
                  ".feather": "arrow", ".ipc": "arrow"}
MAGIC = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"\xfd7zXZ\x00", "xz"),
         (b"BZh", "bzip2"))
DATASET_STATE, DATASET_DICT = "state.json", "dataset_dict.json"


class CorpusFileError(UserFacingError):
    """An input that cannot be read as asked; the message names it (and the line or row)."""


@dataclass(frozen=True)
class Document:
    data: str | bytes
    origin: str        # "FILE", "FILE line N", "FILE row N", "FILE element N (line L)"


@dataclass(frozen=True)
class Input:
    """One input: a file (or standard input: path None) and how to read it."""
    path: Path | None
    format: str                      # text, jsonl, json, parquet, arrow
    compression: str | None = None   # gzip, zstd, xz, bzip2
    stream: BinaryIO | None = field(default=None, compare=False, repr=False)   # stdin's

    @property
    def name(self) -> str:
        return "stdin" if self.path is None else str(self.path)

    def __str__(self) -> str:
        return self.name

    @property
    def plain(self) -> bool:
        """An uncompressed text file: one document, its bytes readable in place (with seek)."""
        return self.format == "text" and self.compression is None and self.path is not None

    def size(self) -> int | None:
        """Bytes on disk (compressed), None for standard input."""
        return None if self.path is None else self.path.stat().st_size

    def reading(self) -> "_Reading":
        """`with inp.reading() as stream:` the input's bytes, decompressed, as a buffered
        stream; closed after (standard input is left open). A damaged compressed stream or a
        failed read inside the block is a CorpusFileError naming the input."""
        return _Reading(self)

    def open(self) -> BinaryIO:
        """The stream `reading()` gives; the caller closes it, except uncompressed stdin."""
        if self.path is None:
            source = self.stream if self.stream is not None else sys.stdin.buffer
            if self.compression is None:
                return source
        else:
            try:
                if self.compression is None:
                    return open(self.path, "rb", buffering=BUFFER_BYTES)
                source = open(self.path, "rb")
            except OSError as exc:
                raise CorpusFileError(f"{self.name}: cannot be read: "
                                      f"{exc.strerror or exc}") from None
        return io.BufferedReader(_decompressor(self.compression, source, self.name,
                                               owned=self.path is not None), BUFFER_BYTES)


def _decompressor(kind: str, source, name: str, owned: bool):
    """A raw reader of `source`'s decompressed bytes; it closes `source` when `owned`."""
    if kind == "gzip":
        import gzip
        stream = gzip.GzipFile(fileobj=source, mode="rb")
    elif kind == "bzip2":
        import bz2
        stream = bz2.BZ2File(source, "rb")
    elif kind == "xz":
        import lzma
        stream = lzma.LZMAFile(source, "rb")
    elif sys.version_info >= (3, 14):
        from compression import zstd
        stream = zstd.ZstdFile(source, "rb")
    else:
        try:
            import zstandard
        except ImportError:
            if owned:
                source.close()
            raise CorpusFileError(f"{name}: reading zstd needs the zstandard package: {EXTRA} "
                                  "(or decompress it first: zstd -d)") from None
        return zstandard.ZstdDecompressor().stream_reader(
            source, read_size=BUFFER_BYTES, read_across_frames=True, closefd=owned)
    return _Owning(stream, source) if owned else stream


class _Owning(io.RawIOBase):
    """A decompressing reader that also closes the file under it (gzip, bz2 and lzma given a
    file object leave it open)."""

    def __init__(self, stream, source):
        self.stream, self.source = stream, source

    def readable(self):
        return True

    def readinto(self, buffer):
        return self.stream.readinto(buffer)

    def close(self):
        if not self.closed:
            try:
                self.stream.close()
            finally:
                self.source.close()
                super().close()


def _stream_errors() -> tuple:
    """What a damaged compressed stream raises while it is read."""
    import lzma
    import zlib
    errors = [OSError, EOFError, zlib.error, lzma.LZMAError]
    try:
        import zstandard
        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errors)


def _pyarrow(name: str, what: str):
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise CorpusFileError(f"{name}: reading {what} needs the pyarrow package: "
                              f"{EXTRA}") from None
    return pyarrow


# ---- finding the inputs ----------------------------------------------------------------------

def input_for(path: Path, format: str = "auto") -> Input:
    """How to read one file: by its suffixes, or as `format` says."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSIONS.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    if format == "auto":
        format = SUFFIX_FORMATS.get(suffixes[-1], "text") if suffixes else "text"
    return Input(path, format, compression)


class _Borrowed(io.RawIOBase):
    """A stream read through without owning it: closing this leaves it open."""

    def __init__(self, stream):
        self.stream = stream

    def readable(self):
        return True

    def readinto(self, buffer):
        data = self.stream.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _stdin_input(format: str) -> Input:
    stream = sys.stdin.buffer
    if not hasattr(stream, "peek"):     # to look at its first bytes (a BytesIO, in tests)
        stream = io.BufferedReader(_Borrowed(stream), BUFFER_BYTES)
    head = stream.peek(8)[:8]
    compression = next((kind for magic, kind in MAGIC if head.startswith(magic)), None)
    return Input(None, "text" if format == "auto" else format, compression, stream)


def _dataset_files(folder: Path) -> list[Path]:
    """The Arrow files of a `save_to_disk` folder (state.json's order), or of every split of
    a DatasetDict folder."""
    splits = folder / DATASET_DICT
    if splits.is_file():
        names = _read_json(splits).get("splits")
        if not isinstance(names, list) or not names:
            raise CorpusFileError(f"{splits}: no \"splits\" list; is this a folder written by "
                                  "DatasetDict.save_to_disk?")
        return [f for split in names for f in _dataset_files(folder / str(split))]
    state = _read_json(folder / DATASET_STATE)
    files = state.get("_data_files")
    if not isinstance(files, list) or not all(isinstance(f, dict) and "filename" in f
                                              for f in files):
        raise CorpusFileError(f"{folder / DATASET_STATE}: no \"_data_files\" list of "
                              "{\"filename\": ...}; is this a folder written by "
                              "Dataset.save_to_disk?")
    out = [folder / f["filename"] for f in files]
    for path in out:
        if not path.is_file():
            raise CorpusFileError(f"{folder}: {path.name}, named in {DATASET_STATE}, is "
                                  "missing; copy the whole folder")
    return out


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CorpusFileError(f"{path.parent}: no {path.name}; a datasets folder written by "
                              "save_to_disk has one") from None
    except (OSError, ValueError) as exc:
        raise CorpusFileError(f"{path}: cannot be read as JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CorpusFileError(f"{path}: expected a JSON object")
    return value


def is_dataset_folder(path: Path) -> bool:
    return (path / DATASET_STATE).is_file() or (path / DATASET_DICT).is_file()


def _walk(root: Path, include, format: str) -> list[Input]:
    """The inputs under a directory: files sorted by path, datasets folders as their Arrow
    files; `include` globs filter both."""
    if is_dataset_folder(root):
        found = [Input(p, "arrow") for p in _dataset_files(root)]
        return [i for i in found if not include or any(i.path.match(g) for g in include)]
    inputs: list[Input] = []
    datasets: set[Path] = set()
    for path in sorted(root.rglob("*")):
        if datasets and any(parent in datasets for parent in path.parents):
            continue
        if path.is_dir():
            if is_dataset_folder(path):
                datasets.add(path)
                inputs.extend(Input(p, "arrow") for p in _dataset_files(path))
            continue
        if path.is_file():
            inputs.append(input_for(path, format))
    if include:
        inputs = [i for i in inputs if any(i.path.match(g) for g in include)]
    return inputs


def find_inputs(names, include=None, format: str = "auto") -> list[Input]:
    """The inputs `names` name (see the module docstring), in order. Raises CorpusFileError
    for a name that matches nothing, and when there is no input at all."""
    if format not in FORMATS:
        raise CorpusFileError(f"--format {format}: give one of {', '.join(FORMATS)}")
    out: list[Input] = []
    for name in names:
        name = str(name)
        path = Path(name)
        if name == "-":
            if any(i.path is None for i in out):
                raise CorpusFileError("'-' (standard input) is given twice")
            out.append(_stdin_input(format))
        elif path.is_dir():
            found = _walk(path, include, format)
            if not found:
                raise CorpusFileError(f"{name}: no files in this directory"
                                      + (f" match --include {' '.join(include)}"
                                         if include else ""))
            out.extend(found)
        elif path.is_file():
            out.append(input_for(path, format))
        elif path.exists():
            raise CorpusFileError(f"{name}: not a regular file or directory")
        elif any(c in name for c in "*?["):
            matches = sorted(glob.glob(name, recursive=True))
            if not matches:
                raise CorpusFileError(f"{name}: no file matches this pattern")
            for match in matches:
                p = Path(match)
                if p.is_dir():
                    out.extend(_walk(p, include, format))
                elif p.is_file():
                    out.append(input_for(p, format))
        else:
            raise CorpusFileError(f"{name}: no such file or directory")
    if not out:
        raise CorpusFileError("no input files" + (f" matching {include}" if include else ""))
    return out


def check_packages(inputs) -> None:
    """Refuse, before any reading, inputs whose optional package is not installed."""
    for inp in inputs:
        if inp.format in ("parquet", "arrow") and not _installed("pyarrow"):
            raise CorpusFileError(f"{inp.name}: reading {inp.format} needs the pyarrow "
                                  f"package: {EXTRA}")
        if inp.compression == "zstd" and sys.version_info < (3, 14) and \
                not _installed("zstandard"):
            raise CorpusFileError(f"{inp.name}: reading zstd needs the zstandard package: "
                                  f"{EXTRA} (or decompress it first: zstd -d)")


def _installed(name: str) -> bool:
    """Is the package importable (without importing it)?"""
    import importlib.util
    if name in sys.modules:
        return sys.modules[name] is not None
    return importlib.util.find_spec(name) is not None


# ---- reading documents -----------------------------------------------------------------------

@dataclass
class ReadStats:
    """What the reader has read so far."""
    inputs: int = 0           # inputs opened
    documents: int = 0        # documents given out (empty ones included)
    bytes: int = 0            # their text, UTF-8 bytes
    empty: int = 0            # of which empty
    skipped: int = 0          # bad records skipped (skip_bad)
    bad_examples: list = field(default_factory=list)   # the first skipped records' reasons

    def describe(self) -> str:
        text = (f"{self.documents:,} document(s), {self.bytes / 1e6:,.1f} MB of text from "
                f"{self.inputs:,} input(s)")
        if self.skipped:
            text += f"; skipped {self.skipped:,} bad record(s), the first: " \
                    f"{self.bad_examples[0]}"
        return text


class _Bad(Exception):
    """One bad record (skippable); the message says what is wrong with it."""


class CorpusReader:
    """The documents of `names` (files, directories, globs, '-'); see the module docstring.

    The inputs are found (and a missing one refused) when the reader is made; they are read
    when `documents()` or `documents_of()` is iterated.
    """

    def __init__(self, names, *, include=None, format: str = "auto",
                 text_field: str = TEXT_FIELD, skip_bad: bool | None = False):
        """skip_bad: skip bad records (True), stop at one (False), or stop without
        suggesting --skip-bad (None: a command that has no such option)."""
        self.inputs = find_inputs(names, include, format)
        check_packages(self.inputs)
        self.text_field = text_field
        self.skip_bad = skip_bad
        self.stats = ReadStats()

    @property
    def all_plain(self) -> bool:
        return all(i.plain for i in self.inputs)

    def documents(self, as_bytes: bool = False) -> Iterator[Document]:
        for inp in self.inputs:
            yield from self.documents_of(inp, as_bytes)

    def documents_of(self, inp: Input, as_bytes: bool = False) -> Iterator[Document]:
        """The documents of one input, in order (counted in `stats`)."""
        self.stats.inputs += 1
        if inp.format == "text":
            records = self._text(inp)
        elif inp.format in ("jsonl", "json"):
            records = self._json(inp)
        elif inp.format in ("parquet", "arrow"):
            records = self._columnar(inp, as_bytes)
        else:
            raise CorpusFileError(f"{inp.name}: unknown format {inp.format!r}")
        stats = self.stats
        for data, origin in records:
            if isinstance(data, _Bad):
                self._bad(origin, data)
                continue
            if isinstance(data, str):
                try:
                    raw = data.encode("utf-8")
                except UnicodeEncodeError as exc:
                    self._bad(origin, _Bad(
                        f"the text has a lone surrogate {data[exc.start]!r} at character "
                        f"{exc.start:,} (not valid Unicode, so it has no UTF-8)"))
                    continue
                stats.bytes += len(raw)
                if as_bytes:
                    data = raw
            else:
                stats.bytes += len(data)
            stats.documents += 1
            if not data:
                stats.empty += 1
            yield Document(data, origin)

    def _bad(self, origin: str, bad: _Bad) -> None:
        message = f"{origin}: {bad}"
        if self.skip_bad is None:
            raise CorpusFileError(message)
        if not self.skip_bad:
            raise CorpusFileError(f"{message}. Fix it, or pass --skip-bad to skip bad "
                                  "records (they are counted)")
        self.stats.skipped += 1
        if len(self.stats.bad_examples) < BAD_EXAMPLES:
            self.stats.bad_examples.append(message)

    # -- text: one document per input

    def _text(self, inp: Input):
        with inp.reading() as stream:
            data = stream.read()
        yield data, inp.name

    # -- JSON Lines and JSON arrays

    def _json(self, inp: Input):
        with inp.reading() as stream:
            if inp.format == "json":
                first = _first_char(stream)
                if first == b"[":
                    yield from self._json_array(inp, stream)
                    return
                if first not in (b"", b"{", b'"'):
                    raise CorpusFileError(
                        f"{inp.name}: starts with {first.decode('latin-1')!r}; a .json corpus "
                        "is a JSON array of documents or JSON Lines (one document per line)")
            for lineno, line in enumerate(stream, 1):
                if line.isspace():
                    continue
                try:
                    value = json.loads(line)
                except UnicodeDecodeError as exc:
                    yield _Bad(f"not UTF-8 at byte {exc.start:,} of the line"), \
                        f"{inp.name} line {lineno}"
                    continue
                except json.JSONDecodeError as exc:
                    yield _Bad(f"not JSON ({exc.msg}); expected {self._expected()} per "
                               "line"), f"{inp.name} line {lineno}"
                    continue
                yield self._text_of(value, "line"), f"{inp.name} line {lineno}"

    def _json_array(self, inp: Input, stream):
        """Elements of a JSON array, one at a time, from a bounded window of the text."""
        text = io.TextIOWrapper(stream, encoding="utf-8", errors="strict")
        try:
            yield from self._json_elements(inp, text)
        finally:
            text.detach()    # the stream is closed by its owner (never stdin)

    def _json_elements(self, inp: Input, text):
        decoder = json.JSONDecoder()
        buf, pos, line, eof, index = "", 0, 1, False, 0

        def more(need_all: bool = False):
            nonlocal buf, pos, eof, line
            line += buf.count("\n", 0, pos)
            try:
                chunk = text.read(max(BUFFER_BYTES, len(buf) - pos if need_all else 0))
            except UnicodeDecodeError as exc:
                raise CorpusFileError(f"{inp.name}: not UTF-8 near line {line} "
                                      f"({exc.reason})") from None
            buf, pos = buf[pos:] + chunk, 0
            eof = not chunk

        def skip_space():
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n":
                    pos += 1
                if pos < len(buf) or eof:
                    return
                more()

        def where(at: int) -> int:
            return line + buf.count("\n", 0, at)

        def syntax(message: str, at: int):
            return CorpusFileError(f"{inp.name} line {where(at)}: {message}; a .json corpus is "
                                   f"one JSON array of {self._expected()}s (a syntax error "
                                   "in it cannot be skipped)")

        more()
        skip_space()
        pos += 1    # the '[' _first_char saw
        while True:
            skip_space()
            if pos >= len(buf):
                raise syntax("the array is not closed (the file ends inside it)", pos)
            if buf[pos] == "]":
                pos += 1
                skip_space()
                if pos < len(buf):
                    raise syntax("text after the array's closing ']'", pos)
                return
            if index:
                if buf[pos] != ",":
                    raise syntax(f"expected ',' or ']' after element {index - 1}, found "
                                 f"{buf[pos]!r}", pos)
                pos += 1
                skip_space()
            while True:
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as exc:
                    # the element may go on past the window: read more (a real error is
                    # found again with the rest in view)
                    cut = exc.pos >= len(buf) - 8 or exc.msg.startswith("Unterminated string")
                    if eof or not cut:
                        raise syntax(f"element {index} is not JSON ({exc.msg})",
                                     exc.pos) from None
                    more(need_all=True)
                    continue
                if end == len(buf) and not eof:   # a number may go on in the next read
                    more(need_all=True)
                    continue
                break
            origin = f"{inp.name} element {index} (line {where(pos)})"
            pos = end
            index += 1
            yield self._text_of(value, "element"), origin

    def _expected(self) -> str:
        return f'a JSON string or an object with a string field "{self.text_field}"'

    def _text_of(self, value, what: str):
        """A record's document: a JSON string, or an object's text field; else _Bad."""
        if isinstance(value, str):
            return value
        field_name = self.text_field
        if not isinstance(value, dict):
            return _Bad(f"a JSON {_json_kind(value)}; expected {self._expected()} per {what}")
        if field_name not in value:
            fields = ", ".join(json.dumps(k) for k in list(value)[:8]) or "none"
            return _Bad(f"the object has no field \"{field_name}\" (its fields: {fields}); "
                        "name the text's field with --text-field")
        text = value[field_name]
        if not isinstance(text, str):
            return _Bad(f"field \"{field_name}\" is a JSON {_json_kind(text)}, not a string")
        return text

    # -- Parquet, Arrow IPC

    def _columnar(self, inp: Input, as_bytes: bool):
        pa = _pyarrow(inp.name, "Parquet" if inp.format == "parquet" else "Arrow")
        if inp.compression is not None:
            raise CorpusFileError(f"{inp.name}: a {inp.compression}-compressed "
                                  f"{inp.format} file cannot be read as a stream; decompress "
                                  f"it first ({inp.format} files compress inside)")
        if inp.path is None and inp.format == "parquet":
            raise CorpusFileError("stdin: Parquet cannot be read from a pipe (its index is at "
                                  "the end of the file); give the file's name")
        try:
            batches = (self._parquet_batches(pa, inp) if inp.format == "parquet"
                       else self._arrow_batches(pa, inp))
            row = 0
            for column in batches:
                for value in _values(pa, column, as_bytes):
                    if value is None:
                        value = _Bad(f"column \"{self.text_field}\" is null")
                    yield value, f"{inp.name} row {row}"
                    row += 1
        except (OSError, pa.ArrowException) as exc:
            raise CorpusFileError(f"{inp.name}: cannot be read as {inp.format}: "
                                  f"{exc}") from None

    def _column_index(self, pa, inp: Input, schema) -> int:
        name = self.text_field
        if name not in schema.names:
            columns = ", ".join(json.dumps(n) for n in schema.names[:12]) or "none"
            raise CorpusFileError(f"{inp.name}: no column \"{name}\" (its columns: {columns}); "
                                  "name the text's column with --text-field")
        index = schema.get_field_index(name)
        kind = schema.field(index).type
        if not any(check(kind) for check in (pa.types.is_string, pa.types.is_large_string,
                                             pa.types.is_binary, pa.types.is_large_binary,
                                             getattr(pa.types, "is_string_view", _no),
                                             getattr(pa.types, "is_binary_view", _no))):
            raise CorpusFileError(f"{inp.name}: column \"{name}\" holds {kind}, not text "
                                  "(string or binary); name the text's column with "
                                  "--text-field")
        return index

    def _parquet_batches(self, pa, inp: Input):
        import pyarrow.parquet as pq
        with pq.ParquetFile(inp.path, buffer_size=BUFFER_BYTES, pre_buffer=False) as pf:
            self._column_index(pa, inp, pf.schema_arrow)
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=[self.text_field],
                                         use_threads=False):
                yield batch.column(0)

    def _arrow_batches(self, pa, inp: Input):
        import pyarrow.ipc as ipc
        with inp.reading() if inp.path is None else pa.OSFile(str(inp.path)) as source:
            head = source.read(6) if inp.path is not None else b""
            if inp.path is not None:
                source.seek(0)
            if head == b"ARROW1":       # the file format (Feather v2): its batches by index
                reader = ipc.open_file(source)
                index = self._column_index(pa, inp, reader.schema)
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i).column(index)
            else:                       # the stream format (datasets' files)
                reader = ipc.open_stream(source)
                index = self._column_index(pa, inp, reader.schema)
                for batch in reader:
                    yield batch.column(index)


def _no(_kind) -> bool:
    return False


def _values(pa, column, as_bytes: bool) -> list:
    """A text column's values: str (string columns, unless as_bytes) or bytes (binary
    columns, or as_bytes); None for null; _Bad for a string that is not UTF-8."""
    kind = column.type
    is_string = pa.types.is_string(kind) or pa.types.is_large_string(kind) or \
        getattr(pa.types, "is_string_view", _no)(kind)
    if is_string and as_bytes:     # the same buffers seen as bytes: no decoding
        binary = pa.large_binary() if pa.types.is_large_string(kind) else \
            pa.binary_view() if getattr(pa.types, "is_string_view", _no)(kind) else pa.binary()
        return column.view(binary).to_pylist()
    try:
        return column.to_pylist()
    except UnicodeDecodeError:     # a string column with invalid UTF-8 in some row
        binary = pa.large_binary() if pa.types.is_large_string(kind) else pa.binary()
        out = []
        for value in column.cast(binary).to_pylist():
            try:
                out.append(None if value is None else value.decode("utf-8"))
            except UnicodeDecodeError as exc:
                out.append(_Bad(f"not UTF-8 at byte {exc.start:,} (a string column)"))
        return out


class _Reading:
    """Input.reading()'s context manager."""

    def __init__(self, inp: Input):
        self.inp = inp

    def __enter__(self):
        self.stream = self.inp.open()
        return self.stream

    def __exit__(self, kind, exc, tb):
        if self.inp.path is not None or self.inp.compression is not None:
            self.stream.close()
        if exc is not None and not isinstance(exc, (CorpusFileError, GeneratorExit)) \
                and isinstance(exc, _stream_errors()):
            what = f"{self.inp.compression} stream" if self.inp.compression else "file"
            raise CorpusFileError(f"{self.inp.name}: cannot be read as a {what}: {exc}; is "
                                  "the file complete and of the kind its name says?") from None
        return False


def _first_char(stream) -> bytes:
    """The first byte that is not JSON whitespace (left in the stream), b"" when none."""
    while True:
        head = stream.peek(1)
        if not head:
            return b""
        stripped = head.lstrip(b" \t\r\n")
        if stripped:
            return stripped[:1]
        stream.read(len(head))


def _json_kind(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "array", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


# ---- the command-line options ----------------------------------------------------------------

def add_corpus_arguments(parser, *, skip_bad: bool = True, text_field: bool = True) -> None:
    """--format, --text-field and --skip-bad, as `prepare`, `vocab train` and `encode` have
    them."""
    parser.add_argument("--format", choices=FORMATS, default="auto",
                        help="how to read every input: by its suffix (auto, default: .jsonl, "
                             ".json, .parquet, .arrow, else one text document per file; "
                             ".gz/.zst/.xz/.bz2 decompressed), or as this format (stdin '-' is "
                             "text unless given)")
    if text_field:
        parser.add_argument("--text-field", metavar="NAME", default=None,
                            help=f"the field (JSON) or column (Parquet, Arrow) that holds the "
                                 f"text (default: {TEXT_FIELD})")
    if skip_bad:
        parser.add_argument("--skip-bad", action="store_true",
                            help="skip records that are not a document (a line that is not "
                                 "JSON, a missing or null field, ...): counted and reported "
                                 "(default: stop, naming the file and line)")
