"""Vocabularies: `.tiktoken` files, Hugging Face `tokenizer.json` byte-level BPE, and our own.

A `Vocabulary` is what every encoder (CPU reference, GPU) needs:

- `ranks`: token bytes -> id. For `.tiktoken` files the id is also the merge priority
  (tiktoken's rule: merge the adjacent pair whose concatenation has the lowest rank).
- `merges`: for `tokenizer.json` files, (left bytes, right bytes) -> merge priority (HF's rule:
  a pair merges only if it is listed; lower index first). None for tiktoken-style files.
- `pattern`: the pre-tokenizer regex; `pattern_name` is "gpt2", "cl100k" or "o200k" when it is
  one the GPU pre-tokenizer implements, else None (CPU pre-tokenization).
- `hf`: for tokenizer.json, everything else that changes ids (normalizer, pre-tokenizer steps,
  added tokens and their options, BPE options, post-processor): `hf.tokenizer_json.HFConfig`, loaded
  and validated by `hf.tokenizer_json.load_hf_tokenizer`, applied by `hf.pipeline.HFPipeline`.
  `hf_splits` lists its regexes (for display); `pattern` is then unused.
- `special_tokens`: text -> id.

The project's own trained vocabularies are a `.tiktoken` file plus a sidecar JSON
(`NAME.tiktoken.json`):

    {"format": "istanbul-vocab", "version": 1, "name": "my", "pattern": "o200k" | "<regex>",
     "special_tokens": {"<|endoftext|>": 32000}}

`load_vocabulary(spec)` accepts a path or a known name (gpt2, r50k_base, cl100k_base,
o200k_base), looked up in $ISTANBUL_VOCAB_DIR, then ~/.cache/istanbul/vocab, then tiktoken's
cache ($TIKTOKEN_CACHE_DIR or the temp dir's data-gym-cache, file named sha1(url)).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import tempfile
from pathlib import Path

from istanbul.shaders import settings as device_settings

from . import settings
from .hf.tokenizer_json import HFConfig, bytes_to_unicode, load_hf_tokenizer  # noqa: F401 (re-exported)
from .vocabulary import Vocabulary, VocabularyError  # noqa: F401 (re-exported)
from .patterns import KNOWN_VOCABULARIES, PATTERNS, pattern_name_for

SIDECAR_FORMAT = "istanbul-vocab"
SIDECAR_VERSION = 1


# ---- .tiktoken ---------------------------------------------------------------------------------

def parse_tiktoken(data: bytes, origin: str) -> dict:
    """Parse `base64-token rank` lines into {bytes: rank}, refusing anything ambiguous."""
    ranks: dict = {}
    seen_ranks: dict = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise VocabularyError(f"{origin}:{lineno}: expected 'BASE64 RANK', got {line[:60]!r}")
        try:
            token = base64.b64decode(parts[0], validate=True)
        except (binascii.Error, ValueError):
            raise VocabularyError(f"{origin}:{lineno}: bad base64 token {parts[0][:40]!r}") from None
        try:
            rank = int(parts[1])
        except ValueError:
            raise VocabularyError(f"{origin}:{lineno}: rank {parts[1][:20]!r} is not an integer") \
                from None
        if rank < 0:
            raise VocabularyError(f"{origin}:{lineno}: negative rank {rank}")
        if token in ranks:
            raise VocabularyError(f"{origin}:{lineno}: token {token!r} appears twice "
                                  f"(ranks {ranks[token]} and {rank})")
        if rank in seen_ranks:
            raise VocabularyError(f"{origin}:{lineno}: rank {rank} appears twice "
                                  f"(tokens {seen_ranks[rank]!r} and {token!r})")
        ranks[token] = rank
        seen_ranks[rank] = token
    if not ranks:
        raise VocabularyError(f"{origin}: no tokens")
    missing = len(ranks) - 1 - max(ranks.values())
    if missing:
        holes = sorted(set(range(max(ranks.values()) + 1)) - set(seen_ranks))[:5]
        raise VocabularyError(f"{origin}: ranks are not contiguous from 0; missing {holes}...")
    single = {bytes([b]) for b in range(256)}
    if not single <= ranks.keys():
        lost = sorted(single - ranks.keys())[:5]
        raise VocabularyError(f"{origin}: byte-level BPE needs all 256 single-byte tokens; "
                              f"missing {lost}...")
    return ranks


def write_tiktoken(path: str | Path, ranks: dict) -> None:
    lines = [base64.b64encode(tok).decode("ascii") + f" {rank}\n"
             for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    Path(path).write_text("".join(lines), encoding="ascii")


def sidecar_path(path: str | Path) -> Path:
    return Path(str(path) + ".json")


def save_vocabulary(vocab: Vocabulary, path: str | Path) -> None:
    """Write `path` (.tiktoken) and its sidecar atomically (temp files, then rename)."""
    path = Path(path)
    side = sidecar_path(path)
    tmp_tok = path.with_name(path.name + ".tmp")
    tmp_side = side.with_name(side.name + ".tmp")
    try:
        write_tiktoken(tmp_tok, vocab.ranks)
        meta = {"format": SIDECAR_FORMAT, "version": SIDECAR_VERSION, "name": vocab.name,
                "pattern": vocab.pattern_name or vocab.pattern,
                "special_tokens": vocab.special_tokens}
        tmp_side.write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp_tok, path)
        os.replace(tmp_side, side)
    finally:
        for tmp in (tmp_tok, tmp_side):
            if tmp.exists():
                tmp.unlink()


def _resolve_pattern(value: str, origin: str) -> tuple[str, str | None]:
    if value in PATTERNS:
        return PATTERNS[value], ("gpt2" if value == "r50k" else value)
    try:
        import regex
        regex.compile(value)
    except Exception as exc:
        raise VocabularyError(f"{origin}: pattern {value[:60]!r} is neither a known name "
                              f"({', '.join(PATTERNS)}) nor a valid regex: {exc}") from None
    return value, pattern_name_for(value)


def load_tiktoken_file(path: Path, pattern: str | None = None,
                       special_tokens: dict | None = None) -> Vocabulary:
    ranks = parse_tiktoken(path.read_bytes(), str(path))
    side = sidecar_path(path)
    name = path.name.removesuffix(".tiktoken")
    known = KNOWN_VOCABULARIES.get(name)
    pat_value = pattern
    specials = special_tokens
    if side.is_file():
        try:
            meta = json.loads(side.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise VocabularyError(f"{side}: not valid JSON: {exc}") from None
        if meta.get("format") != SIDECAR_FORMAT:
            raise VocabularyError(f"{side}: format is {meta.get('format')!r}, expected "
                                  f"{SIDECAR_FORMAT!r}")
        name = meta.get("name", name)
        pat_value = pat_value or meta.get("pattern")
        if specials is None:
            specials = meta.get("special_tokens", {})
    elif known is not None:
        pat_value = pat_value or known.pattern
        if specials is None:
            specials = dict(known.special_tokens)
    if pat_value is None:
        raise VocabularyError(f"{path}: no pattern known for this file; give --pattern "
                              f"({', '.join(PATTERNS)} or a regex) or add a sidecar {side.name}")
    regex_text, pname = _resolve_pattern(pat_value, str(path))
    specials = dict(specials or {})
    for text, i in specials.items():
        if i in ranks.values() and ranks.get(text.encode()) != i:
            raise VocabularyError(f"{path}: special token {text!r} id {i} collides with an "
                                  "ordinary token")
    return Vocabulary(name=name, ranks=ranks, pattern=regex_text, pattern_name=pname,
                      special_tokens=specials, source=str(path),
                      explicit_n_vocab=known.explicit_n_vocab if known else None)


# ---- Hugging Face tokenizer.json: hf/tokenizer_json.py ----------------------------------------

# ---- lookup by name ----------------------------------------------------------------------------

def search_dirs() -> list[Path]:
    dirs = []
    if device_settings.read("ISTANBUL_VOCAB_DIR") is not None:
        dirs.append(device_settings.read("ISTANBUL_VOCAB_DIR"))
    dirs.append(Path.home() / ".cache" / "istanbul" / "vocab")
    return dirs


def tiktoken_cache_file(url: str) -> Path:
    cache = settings.read("TIKTOKEN_CACHE_DIR") or settings.read("DATA_GYM_CACHE_DIR") or \
        os.path.join(tempfile.gettempdir(), "data-gym-cache")
    return Path(cache) / hashlib.sha1(url.encode()).hexdigest()


def find_known(name: str) -> Path | None:
    known = KNOWN_VOCABULARIES[name]
    for d in search_dirs():
        for candidate in (known.filename, f"{name}.tiktoken"):
            if (d / candidate).is_file():
                return d / candidate
    cached = tiktoken_cache_file(known.url)
    if not cached.is_file():
        return None
    # tiktoken's cache may be world-writable (/tmp/data-gym-cache): trust only its hash
    digest = hashlib.sha256(cached.read_bytes()).hexdigest()
    if known.sha256 and digest != known.sha256:
        raise VocabularyError(
            f"vocabulary {name!r}: the file in tiktoken's cache {cached} has sha256 {digest}, "
            f"not tiktoken's published {known.sha256}; someone may have planted it. Delete it, "
            f"or put a verified {known.filename} in $ISTANBUL_VOCAB_DIR")
    return cached


def not_found_message(name: str) -> str:
    """Which file was expected, where it was looked for, where the published one comes from."""
    known = KNOWN_VOCABULARIES[name]
    searched = [str(d / known.filename) for d in search_dirs()]
    if device_settings.read("ISTANBUL_VOCAB_DIR") is None:
        searched.insert(0, "$ISTANBUL_VOCAB_DIR (not set)")
    searched.append(f"{tiktoken_cache_file(known.url)} (tiktoken's cache)")
    return (f"vocabulary {name!r} not found: expected {known.filename}; searched "
            f"{', '.join(searched)}. It is published at {known.url} (sha256 {known.sha256}); "
            f"`istanbul vocab fetch {name}` downloads it, or on a machine without internet "
            f"copies it from a path (`--from FILE`); or give the file's path as --vocab")


def load_known_file(name: str, path: Path, pattern: str | None = None) -> Vocabulary:
    """A known vocabulary (its pattern, special tokens and name) from a given file."""
    known = KNOWN_VOCABULARIES[name]
    vocab = load_tiktoken_file(Path(path), pattern or known.pattern, dict(known.special_tokens))
    vocab.name = known.name
    vocab.explicit_n_vocab = known.explicit_n_vocab
    return vocab


def load_vocabulary(spec: str | os.PathLike, pattern: str | None = None) -> Vocabulary:
    """Load a vocabulary from a path (.tiktoken or tokenizer.json) or a known name."""
    text = str(spec)
    path = Path(text).expanduser()
    if not path.exists() and text in KNOWN_VOCABULARIES:
        found = find_known(text)
        if found is None:
            raise VocabularyError(not_found_message(text))
        return load_known_file(text, found, pattern)
    if not path.exists():
        raise VocabularyError(f"vocabulary {text!r}: no such file, and not a known name "
                              f"({', '.join(KNOWN_VOCABULARIES)})")
    if path.suffix == ".json":
        return _validated_hf(load_hf_tokenizer(path), path)
    return load_tiktoken_file(path, pattern)


def _validated_hf(vocab: Vocabulary, path: Path) -> Vocabulary:
    """Compile every pattern of a tokenizer.json's pipeline now: refuse at load, not at the
    first encode."""
    from .hf.pipeline import HFPipeline
    try:
        HFPipeline(vocab)
    except ValueError as exc:
        raise VocabularyError(f"{path}: {exc}") from None
    return vocab
