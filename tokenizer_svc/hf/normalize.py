"""tokenizer.json normalizers with `tokenizers`' own Unicode data.

    normalize = build_normalizer({"type": "Sequence", "normalizers": [{"type": "NFKC"},
                                                                      {"type": "Lowercase"}]})
    normalize("ＡＢＣ")   # 'abc'

Supported: NFC, NFD, NFKC, NFKD, Lowercase, Replace (String or Regex pattern), Prepend,
Sequence of these; anything else is refused (ValueError naming the component).

Why a data file: `tokenizers` normalizes with the `unicode-normalization-alignments` crate,
whose tables are older than Python's `unicodedata`, and lowercases with Rust's
`char::to_lowercase`, whose tables are newer. Python's functions are therefore corrected by
what was read out of `tokenizers` itself (`probe_normalization`, written by
`scripts/gen_unicode_table.py` to `data/hf_normalization.json`):

- `unknown`: code points `tokenizers` does not know for normalization (Python decomposes them
  or gives them a combining class and `tokenizers` does not). They are kept verbatim, and the
  text between them is normalized piece by piece, which is exactly how an unassigned starter
  behaves in the Unicode normalization algorithm.
- `no_compose`: compositions Python makes and `tokenizers` does not; undone after Python's
  NFC/NFKC.
- `lowercase`: code points whose `tokenizers` lowercase differs from Python's `str.lower()`
  of the single character. Lowercase works character by character (no final-sigma rule), as
  Rust's `to_lowercase` per `char` does.
"""

from __future__ import annotations

import json
import os
import unicodedata
from functools import lru_cache
from pathlib import Path
from typing import Callable

import regex

from .. import settings

DATA_FILE = Path(__file__).resolve().parent / "data" / "hf_normalization.json"
FORMS = ("NFC", "NFD", "NFKC", "NFKD")
SEPARATOR = "\n"  # a starter that composes with nothing: keeps probed characters apart


# ---- the data file -----------------------------------------------------------------------

def _probe_code_points() -> list[int]:
    return [c for c in range(0x110000) if not 0xD800 <= c < 0xE000 and chr(c) != SEPARATOR]


def _hf_each(normalizer, items: list[str]) -> list[str]:
    out = normalizer.normalize_str(SEPARATOR.join(items)).split(SEPARATOR)
    if len(out) != len(items):
        raise RuntimeError("a probe item was split or joined by the normalizer; cannot probe")
    return out


def probe_normalization() -> dict:
    """What `tokenizers` does differently from Python, per code point (the data file)."""
    import tokenizers
    from tokenizers import normalizers as hf
    cps = _probe_code_points()
    chars = [chr(c) for c in cps]
    unknown: set[int] = set()
    for form in ("NFD", "NFKD"):
        got = _hf_each(getattr(hf, form)(), chars)
        unknown |= {c for c, g in zip(cps, got) if g != unicodedata.normalize(form, chr(c))}
    # Combining classes: Python reorders a mark of class 1..239 before U+0345 (class 240),
    # and U+0334 (class 1) before a mark of class > 1; `tokenizers` must do the same.
    for probe in ("a\u0345{}", "a{}\u0334"):
        items = [probe.format(ch) for ch in chars]
        got = _hf_each(hf.NFD(), items)
        unknown |= {c for c, g, item in zip(cps, got, items)
                    if g != unicodedata.normalize("NFD", item)}
    pairs = {}
    for c in cps:
        d = unicodedata.decomposition(chr(c))
        if d and not d.startswith("<") and len(d.split()) == 2:
            a, b = (chr(int(x, 16)) for x in d.split())
            if unicodedata.normalize("NFC", a + b) == chr(c):
                pairs[c] = a + b
    got = _hf_each(hf.NFC(), list(pairs.values()))
    no_compose = {c: ab for (c, ab), g in zip(pairs.items(), got) if g != chr(c)}
    lowered = _hf_each(hf.Lowercase(), chars)
    lower = {c: g for c, g in zip(cps, lowered) if g != chr(c).lower()}
    return {"format": "istanbul-hf-normalization", "version": 1,
            "source": f"probed from tokenizers {tokenizers.__version__}, Python unicodedata "
                      f"{unicodedata.unidata_version}",
            "unicodedata_version": unicodedata.unidata_version,
            "unknown": sorted(unknown), "no_compose": {str(c): ab for c, ab in no_compose.items()},
            "lowercase": {str(c): s for c, s in sorted(lower.items())}}


def write_normalization_table(path: Path = DATA_FILE) -> dict:
    data = probe_normalization()
    path.write_text(json.dumps(data, ensure_ascii=True, indent=1) + "\n", encoding="utf-8")
    load_normalization_table.cache_clear()
    return data


def _cache_file() -> Path:
    base = settings.read("XDG_CACHE_HOME") or Path.home() / ".cache"
    return base / "istanbul" / f"hf_normalization-unicodedata-{unicodedata.unidata_version}.json"


def _table_for_this_python() -> dict:
    """The committed table when it was probed with this Python's unicodedata; else one probed
    here from `tokenizers` (a few seconds, once: cached in ~/.cache/istanbul/). The
    corrections are differences from *this* Python's tables, so another unicodedata version
    needs its own probe, never the committed one."""
    data = json.loads(DATA_FILE.read_text(encoding="utf-8"))
    if data.get("format") != "istanbul-hf-normalization":
        raise ValueError(f"{DATA_FILE}: not an istanbul normalization table")
    if data["unicodedata_version"] == unicodedata.unidata_version:
        return data
    cached = _cache_file()
    if cached.is_file():
        data = json.loads(cached.read_text(encoding="utf-8"))
        if data.get("unicodedata_version") == unicodedata.unidata_version:
            return data
    try:
        data = probe_normalization()
    except ImportError:
        raise ValueError(
            f"tokenizer.json normalizers need `tokenizers`' Unicode data for this Python's "
            f"unicodedata {unicodedata.unidata_version} (the shipped table is for "
            f"{data['unicodedata_version']}): `pip install tokenizers` once, and istanbul "
            f"reads it out of `tokenizers` into {cached}") from None
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, ensure_ascii=True) + "\n", encoding="utf-8")
    os.replace(tmp, cached)
    return data


@lru_cache(maxsize=1)
def load_normalization_table() -> dict:
    data = _table_for_this_python()
    unknown = frozenset(data["unknown"])
    return {"unknown": unknown,
            "unknown_re": regex.compile("[" + "".join(f"\\U{c:08x}" for c in sorted(unknown))
                                        + "]") if unknown else None,
            "no_compose": {chr(int(c)): ab for c, ab in data["no_compose"].items()},
            "lowercase": {chr(int(c)): s for c, s in data["lowercase"].items()}}


# ---- the normalizers ---------------------------------------------------------------------

def unicode_normalize(form: str, text: str) -> str:
    """`tokenizers`' NFC/NFD/NFKC/NFKD of `text`."""
    if text.isascii():
        return text
    table = load_normalization_table()
    pieces = table["unknown_re"].split(text) if table["unknown_re"] is not None else [text]
    unknowns = table["unknown_re"].findall(text) if table["unknown_re"] is not None else []
    out = []
    for i, piece in enumerate(pieces):
        norm = unicodedata.normalize(form, piece)
        if form in ("NFC", "NFKC") and table["no_compose"]:
            norm = "".join(table["no_compose"].get(ch, ch) for ch in norm)
        out.append(norm)
        if i < len(unknowns):
            out.append(unknowns[i])
    return "".join(out)


def lowercase(text: str) -> str:
    """`tokenizers`' Lowercase: Rust's `char::to_lowercase`, character by character."""
    if text.isascii():
        return text.lower()
    fixes = load_normalization_table()["lowercase"]
    return "".join(fixes.get(ch) or ch.lower() for ch in text)


def build_normalizer(spec: dict | None, origin: str = "tokenizer.json") -> Callable[[str], str]:
    """The tokenizer.json `normalizer` object as a function str -> str (identity for None)."""
    if spec is None:
        return lambda text: text
    kind = spec.get("type")
    if kind in FORMS:
        return lambda text, form=kind: unicode_normalize(form, text)
    if kind == "Lowercase":
        return lowercase
    if kind == "Sequence":
        steps = [build_normalizer(s, origin) for s in spec.get("normalizers", [])]

        def sequence(text: str) -> str:
            for step in steps:
                text = step(text)
            return text
        return sequence
    if kind == "Prepend":
        prefix = spec["prepend"]
        return lambda text: prefix + text if text else text  # HF prepends to non-empty text
    if kind == "Replace":
        return _replace(spec, origin)
    raise ValueError(f"{origin}: normalizer {kind!r} is not supported (supported: "
                     f"{', '.join(FORMS)}, Lowercase, Replace, Prepend, Sequence)")


def _replace(spec: dict, origin: str) -> Callable[[str], str]:
    from .oniguruma import oniguruma_pattern
    pattern, content = spec.get("pattern") or {}, spec.get("content", "")
    if "String" in pattern:
        if pattern["String"] == "":
            return lambda text: text  # HF: an empty pattern matches nothing
        compiled = regex.compile(regex.escape(pattern["String"]))
    elif "Regex" in pattern:
        try:
            compiled = regex.compile(oniguruma_pattern(pattern["Regex"]))
        except ValueError as exc:
            raise ValueError(f"{origin}: normalizer Replace: {exc}") from None
        if compiled.fullmatch(""):
            raise ValueError(f"{origin}: normalizer Replace pattern {pattern['Regex']!r} can "
                             "match the empty string (not supported)")
    else:
        raise ValueError(f"{origin}: normalizer Replace needs a String or Regex pattern, got "
                         f"{pattern!r}")
    return lambda text: compiled.sub(lambda _m: content, text)
