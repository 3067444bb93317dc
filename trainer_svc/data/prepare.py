"""`istanbul prepare`: corpus files -> a tokenizer -> shards (in Redis, or shard files in a
folder).

The tokenizer is the gRPC service (`service_source`: one TokenizeStream call) or the same GPU
encoder in this process (`local_source`, when no --tokenizer is given: one machine, no
server). The documents come from tokenizer_svc/corpus_files.py: a text file is one document;
JSON Lines, JSON arrays, Parquet, Arrow and `datasets` folders hold one per record; any of
them compressed. A thread reads them (at most READ_AHEAD_BYTES ahead) while the tokenizer
encodes. Documents are encoded in order (raw bytes, special-token text encoded as ordinary
text), and the ids are packed by a `DatasetWriter`
(Redis) or a `ShardFileWriter` (trainer_svc/data/files.py, `--out DIR`). A file larger than
the service's per-document limit is sent in pieces cut where the split cannot change the
tokens: the tokenizer's cut rule (shaders/kernels/bpe/cuts.py) for every known pattern at once.
With the GPT-2, cl100k and o200k patterns no pre-token spans such a point
(tests/test_prepare_split.py checks it with tiktoken), so the pieces' ids concatenate to the
whole file's ids. A file with no such point within the limit
is cut at a character boundary, and the summary counts those cuts.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from tqdm import tqdm

from istanbul_errors import UserFacingError
from tokenizer_svc.corpus_files import CorpusReader
from istanbul.shaders.kernels.bpe.cuts import is_cut, split_points

log = logging.getLogger(__name__)

DEFAULT_PIECE_BYTES = 1 << 20


def is_safe_point(data: bytes, p: int) -> bool:
    """May a document be cut before byte p without changing its tokens? The tokenizer's one
    cut rule (shaders/kernels/bpe/cuts.py), for every known pattern at once (split_document also
    keeps cuts before the first invalid UTF-8 byte)."""
    return is_cut(data, p, None, split=True)


def split_document(data: bytes, limit: int) -> tuple[list[bytes], int]:
    """(pieces, number of unsafe cuts) of one document for a per-request byte limit."""
    ends, unsafe = split_points(data, limit, None)
    return [data[a:b] for a, b in zip([0, *ends], ends)], unsafe


@dataclass(frozen=True)
class TokenizerSource:
    """What prepare needs of a tokenizer: its vocabulary and an ordered stream encoder."""
    vocab_name: str
    vocab_hash: str
    n_vocab: int
    special_tokens: dict
    eot_token: int | None
    max_piece_bytes: int          # the per-document limit: longer files go in pieces
    target: str                   # "HOST:PORT" of the service, or "in-process"
    encode_stream: Callable       # iterator of bytes -> iterator of id arrays, in order


def service_source(client) -> TokenizerSource:
    """The gRPC tokenizer service behind a TokenizerClient (one TokenizeStream call)."""
    info = client.info()
    limit = int(info.limits.max_text_bytes) if info.limits.max_text_bytes else \
        DEFAULT_PIECE_BYTES
    return TokenizerSource(info.vocabulary_name, info.vocabulary_hash, int(info.n_vocab),
                           dict(info.special_tokens),
                           int(info.eot_token) if info.HasField("eot_token") else None,
                           limit, client.target, client.tokenize_stream)


LOCAL_BATCH_BYTES = 64 << 20  # bytes per GPU encode call in-process (8 MB calls: ~1/3 the MB/s)


def local_source(vocab_spec: str, device=None) -> TokenizerSource:
    """The same GPU encoder in this process (tokenizer_svc.encoding), no service needed."""
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.vocab import VocabularyError
    try:
        enc = get_encoding(vocab_spec, device=device)
    except (VocabularyError, OSError) as exc:
        raise UserFacingError(f"--vocab {vocab_spec}: {exc}") from None
    vocab = enc.vocab

    def encode_stream(pieces):
        batch, size = [], 0
        for piece in pieces:
            batch.append(piece)
            size += len(piece)
            if size >= LOCAL_BATCH_BYTES:
                yield from _split_flat(*enc.encode_batch_flat(batch))
                batch, size = [], 0
        if batch:
            yield from _split_flat(*enc.encode_batch_flat(batch))

    return TokenizerSource(vocab.name, vocab.content_hash, vocab.n_vocab,
                           dict(vocab.special_tokens), vocab.eot_token, DEFAULT_PIECE_BYTES,
                           "in-process", encode_stream)


def _split_flat(ids, offsets):
    for k in range(len(offsets) - 1):
        yield ids[offsets[k]:offsets[k + 1]]


@dataclass
class PrepareResult:
    name: str
    tokens: int
    shards: int
    documents: int        # documents written (empty ones are skipped)
    source: TokenizerSource
    files: int            # inputs read
    bytes: int            # text in, UTF-8 bytes
    empty_files: int      # empty documents skipped (empty files, for text files)
    unsafe_cuts: int
    skipped: int = 0      # bad records skipped (--skip-bad)
    seconds: float = 0.0  # from the first read to the last shard written

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds else 0.0


READ_AHEAD_BYTES = 32 << 20   # text the reading thread may be ahead of the tokenizer


def prepare_dataset(source: TokenizerSource, corpus: CorpusReader, open_writer, *,
                    vocab_files: dict | None = None, eot: str | None = None,
                    piece_bytes: int | None = None, name: str = "",
                    progress: bool = True) -> PrepareResult:
    """Tokenize the documents of `corpus` with `source` into the writer
    `open_writer(**identity)` returns (a DatasetWriter into Redis, or a ShardFileWriter into
    a folder). Reader errors (CorpusFileError: a bad record without skip_bad, a damaged
    file) abort the writer and propagate."""
    eot_id = _eot_id(source, eot)
    limit = min(source.max_piece_bytes, piece_bytes or DEFAULT_PIECE_BYTES)
    started = time.perf_counter()
    writer = open_writer(vocab_hash=source.vocab_hash, n_vocab=source.n_vocab, eot_id=eot_id,
                         vocab_name=source.vocab_name, tokenizer=source.target)
    # the bar counts text bytes; its total is known for uncompressed text files only
    total = sum(i.size() for i in corpus.inputs) if corpus.all_plain else None
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"prepare {name}",
               disable=None if progress else True)   # None: no bar without a terminal
    # One entry per piece sent, in order: (is the last piece of its document, its size).
    sent: collections.deque = collections.deque()
    counts = {"unsafe": 0}

    def pieces():
        for doc in corpus.documents(as_bytes=True):
            data = doc.data
            if not data:
                continue
            parts, unsafe = split_document(data, limit)
            counts["unsafe"] += unsafe
            if unsafe:
                log.warning("%s: cut at %d point(s) where tokens may differ from whole-file "
                            "tokenization (no newline+letter boundary within %d bytes)",
                            doc.origin, unsafe, limit)
            for k, part in enumerate(parts):
                sent.append((k == len(parts) - 1, len(part)))
                yield part

    try:
        current: list = []
        for ids in source.encode_stream(read_ahead(pieces(), READ_AHEAD_BYTES)):
            last, size = sent.popleft()
            current.append(np.asarray(ids))
            bar.update(size)
            if last:
                writer.add_document(current[0] if len(current) == 1 else
                                    np.concatenate(current))
                current = []
        if vocab_files:
            writer.attach_vocabulary(vocab_files)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    stats = corpus.stats
    return PrepareResult(name, writer.tokens, writer.shards, writer.documents, source,
                         stats.inputs, stats.bytes, stats.empty, counts["unsafe"],
                         stats.skipped, time.perf_counter() - started)


def read_ahead(items: Iterator[bytes], max_bytes: int,
               batch_bytes: int = 1 << 20) -> Iterator[bytes]:
    """`items`, produced by a thread at most about `max_bytes` ahead of the consumer (reading
    and decompressing overlap the tokenizer). The thread's exception is raised here; leaving
    the loop early stops the thread."""
    batches: queue.Queue = queue.Queue(max(1, max_bytes // batch_bytes))
    stop = threading.Event()
    done = object()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                batches.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            batch, size = [], 0
            for item in items:
                batch.append(item)
                size += len(item)
                if size >= batch_bytes:
                    if not put(batch):
                        return
                    batch, size = [], 0
            if put(batch):
                put(done)
        except BaseException as exc:   # noqa: BLE001 - handed to the consumer
            put(exc)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="prepare read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item = batches.get()
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            yield from item
    finally:
        stop.set()
        thread.join()


def _eot_id(source: TokenizerSource, eot: str | None) -> int:
    specials = source.special_tokens
    if eot is not None:
        if eot not in specials:
            raise UserFacingError(f"--eot {eot!r} is not a special token of vocabulary "
                                  f"{source.vocab_name} (it has: "
                                  f"{', '.join(sorted(specials)) or 'none'})")
        return int(specials[eot])
    if source.eot_token is not None:
        return int(source.eot_token)
    raise UserFacingError(f"vocabulary {source.vocab_name} has no <|endoftext|> token to "
                          "separate documents; name one of its special tokens with --eot "
                          f"(it has: {', '.join(sorted(specials)) or 'none'})")


def vocabulary_files_for(spec: str, expected_hash: str) -> dict[str, bytes]:
    """The vocabulary file (and sidecar) named by `spec` (a path or a known name), checked to
    be the service's vocabulary once stored under the names it will have in checkpoints."""
    import tempfile
    from tokenizer_svc.patterns import KNOWN_VOCABULARIES
    from tokenizer_svc.vocab import VocabularyError, find_known, load_vocabulary, sidecar_path
    path = Path(spec).expanduser()
    stored_name = path.name
    if not path.is_file():
        found = find_known(spec) if spec in KNOWN_VOCABULARIES else None
        if found is None:
            raise UserFacingError(f"--vocab {spec}: no such file or known vocabulary")
        path, stored_name = found, KNOWN_VOCABULARIES[spec].filename
    files = {stored_name: path.read_bytes()}
    sidecar = sidecar_path(path)
    if sidecar.is_file():
        files[stored_name + ".json"] = sidecar.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        try:
            vocab_hash = load_vocabulary(str(Path(tmp) / stored_name)).content_hash
        except (VocabularyError, OSError) as exc:
            raise UserFacingError(f"--vocab {spec}: {exc}") from None
    if vocab_hash != expected_hash:
        raise UserFacingError(
            f"--vocab {spec} (hash {vocab_hash[:16]}) is not the vocabulary the tokenizer "
            f"service uses (hash {expected_hash[:16]}); pass the service's vocabulary")
    return files
