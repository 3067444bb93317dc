"""`istanbul vocab fetch NAME`: put a published vocabulary (gpt2, r50k_base, cl100k_base,
o200k_base) where `--vocab NAME` finds it, checked against tiktoken's published sha256.

    istanbul vocab fetch o200k_base                        # tiktoken's cache, else download
    istanbul vocab fetch o200k_base --from /mnt/o200k_base.tiktoken     # offline: a copy
    istanbul vocab fetch o200k_base --from DIR             # DIR/o200k_base.tiktoken, or a
                                                           # copy of a tiktoken cache folder

The file is written to the first vocabulary folder ($ISTANBUL_VOCAB_DIR, else
~/.cache/istanbul/vocab) only after its hash matched, atomically.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from istanbul_errors import UserFacingError

from .patterns import KNOWN_VOCABULARIES, KnownVocabulary
from .vocab import search_dirs, tiktoken_cache_file

MAX_BYTES = 64 << 20      # the largest published file is ~3.6 MB


@dataclass(frozen=True)
class Fetched:
    path: Path
    source: str
    sha256: str


def known(name: str) -> KnownVocabulary:
    try:
        return KNOWN_VOCABULARIES[name]
    except KeyError:
        raise UserFacingError(f"unknown vocabulary name {name!r}; published ones: "
                              f"{', '.join(KNOWN_VOCABULARIES)}") from None


def _candidates(entry: KnownVocabulary, source: Path) -> list[Path]:
    if not source.is_dir():
        return [source]
    return [source / entry.filename, source / f"{entry.name}.tiktoken",
            source / Path(entry.url).name,
            source / hashlib.sha1(entry.url.encode()).hexdigest()]   # a tiktoken cache folder


def _read_local(entry: KnownVocabulary, source: Path) -> tuple[bytes, str]:
    for path in _candidates(entry, source):
        if path.is_file():
            if path.stat().st_size > MAX_BYTES:
                raise UserFacingError(f"--from {path}: {path.stat().st_size:,} bytes is not a "
                                      "vocabulary file")
            return path.read_bytes(), str(path)
    raise UserFacingError(f"--from {source}: no {entry.filename} there (looked for "
                          f"{', '.join(p.name for p in _candidates(entry, source))})")


def _download(url: str, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            data = reply.read(MAX_BYTES + 1)
    except OSError as exc:
        raise UserFacingError(f"cannot download {url}: {exc}. On a machine without internet, "
                              "copy the file there and use --from PATH") from None
    if len(data) > MAX_BYTES:
        raise UserFacingError(f"{url}: more than {MAX_BYTES >> 20} MiB, not a vocabulary file")
    return data


def fetch_vocabulary(name: str, source: str | None = None, dest: Path | None = None,
                     timeout: float = 60.0) -> Fetched:
    """Copy or download vocabulary `name`, check its sha256, write it into `dest`.

    source: None (tiktoken's cache, else the published URL), a path (file or folder) or an
    http(s) URL. dest: default the first folder `--vocab NAME` searches.
    """
    entry = known(name)
    if source is None:
        cached = tiktoken_cache_file(entry.url)
        if cached.is_file():
            data, origin = cached.read_bytes(), f"tiktoken's cache ({cached})"
        else:
            data, origin = _download(entry.url, timeout), entry.url
    elif source.startswith(("http://", "https://")):
        data, origin = _download(source, timeout), source
    else:
        data, origin = _read_local(entry, Path(source).expanduser())
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.sha256:
        raise UserFacingError(f"{origin}: sha256 {digest} is not the published hash of "
                              f"{entry.filename} ({entry.sha256}); the file is damaged or "
                              "another vocabulary. Nothing was written")
    folder = Path(dest) if dest is not None else search_dirs()[0]
    target = folder / entry.filename
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{entry.filename}.")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)            # readers see the old file or the whole new one
    except OSError as exc:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise UserFacingError(f"cannot write {target}: {exc.strerror or exc}") from None
    return Fetched(target, origin, digest)
