"""`istanbul prepare`: files -> the gRPC tokenizer service (streaming) -> shards in Redis.

Every input file is one document. Documents go through one TokenizeStream call in order
(raw bytes, special-token text encoded as ordinary text), and the ids are packed by a
`DatasetWriter`. A file larger than the service's per-document limit is sent in pieces cut
where the split cannot change the tokens: the tokenizer's cut rule (tokenizer_svc/cuts.py)
for every known pattern at once. With the GPT-2, cl100k and o200k patterns no pre-token spans
such a point (tests/test_prepare_split.py checks it with tiktoken), so the pieces' ids
concatenate to the whole file's ids. A file with no such point within the limit
is cut at a character boundary, and the summary counts those cuts.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from istanbul.errors import UserFacingError
from tokenizer_svc.cuts import is_cut, split_points

from .datasets import DatasetInfo, DatasetWriter
from .redis_conn import RedisHandle

log = logging.getLogger(__name__)

DEFAULT_PIECE_BYTES = 1 << 20


def expand_inputs(paths: list[str], include: list[str] | None = None) -> list[Path]:
    """Files named directly, plus the files under named directories (sorted, filtered by the
    `include` glob patterns, e.g. '*.py'). Refuses paths that do not exist."""
    out: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file())
            if include:
                found = [p for p in found if any(p.match(g) for g in include)]
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise UserFacingError(f"{name}: no such file or directory")
    if not out:
        raise UserFacingError("no input files" + (f" matching {include}" if include else ""))
    return out


def is_safe_point(data: bytes, p: int) -> bool:
    """May a document be cut before byte p without changing its tokens? The tokenizer's one
    cut rule (tokenizer_svc/cuts.py), for every known pattern at once (split_document also
    keeps cuts before the first invalid UTF-8 byte)."""
    return is_cut(data, p, None, split=True)


def split_document(data: bytes, limit: int) -> tuple[list[bytes], int]:
    """(pieces, number of unsafe cuts) of one document for a per-request byte limit."""
    ends, unsafe = split_points(data, limit, None)
    return [data[a:b] for a, b in zip([0, *ends], ends)], unsafe


@dataclass
class PrepareResult:
    info: DatasetInfo
    files: int
    bytes: int
    empty_files: int
    unsafe_cuts: int


def prepare_dataset(handle: RedisHandle, client, files: list[Path], name: str, *,
                    shard_tokens: int, replace: bool = False, vocab_files: dict | None = None,
                    eot: str | None = None, piece_bytes: int | None = None,
                    progress: bool = True) -> PrepareResult:
    """Tokenize `files` through `client` (a TokenizerClient) into dataset `name`."""
    info = client.info()
    eot_id = _eot_id(info, eot)
    limit = int(info.limits.max_text_bytes) if info.limits.max_text_bytes else DEFAULT_PIECE_BYTES
    limit = min(limit, piece_bytes or DEFAULT_PIECE_BYTES)
    writer = DatasetWriter(handle, name, vocab_hash=info.vocabulary_hash, n_vocab=info.n_vocab,
                           eot_id=eot_id, vocab_name=info.vocabulary_name,
                           tokenizer=client.target, shard_tokens=shard_tokens, replace=replace)
    total = sum(f.stat().st_size for f in files)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"prepare {name}",
               disable=not progress)
    # One entry per piece sent, in order: (is the last piece of its document, its size).
    sent: collections.deque = collections.deque()
    counts = {"empty": 0, "unsafe": 0, "bytes": 0}

    def pieces():
        for path in files:
            data = path.read_bytes()
            counts["bytes"] += len(data)
            if not data:
                counts["empty"] += 1
                continue
            parts, unsafe = split_document(data, limit)
            counts["unsafe"] += unsafe
            if unsafe:
                log.warning("%s: cut at %d point(s) where tokens may differ from whole-file "
                            "tokenization (no newline+letter boundary within %d bytes)",
                            path, unsafe, limit)
            for k, part in enumerate(parts):
                sent.append((k == len(parts) - 1, len(part)))
                yield part

    try:
        current: list = []
        for ids in client.tokenize_stream(pieces()):
            last, size = sent.popleft()
            current.append(ids)
            bar.update(size)
            if last:
                writer.add_document(np.concatenate(current))
                current = []
        if vocab_files:
            writer.attach_vocabulary(vocab_files)
        result = writer.close()
    except BaseException:
        writer.abort()
        raise
    finally:
        bar.close()
    return PrepareResult(result, len(files), counts["bytes"], counts["empty"], counts["unsafe"])


def _eot_id(info, eot: str | None) -> int:
    if eot is not None:
        if eot not in info.special_tokens:
            raise UserFacingError(f"--eot {eot!r} is not a special token of vocabulary "
                                  f"{info.vocabulary_name} (it has: "
                                  f"{', '.join(sorted(info.special_tokens)) or 'none'})")
        return int(info.special_tokens[eot])
    if info.HasField("eot_token"):
        return int(info.eot_token)
    raise UserFacingError(f"vocabulary {info.vocabulary_name} has no <|endoftext|> token to "
                          "separate documents; name one of its special tokens with --eot "
                          f"(it has: {', '.join(sorted(info.special_tokens)) or 'none'})")


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
