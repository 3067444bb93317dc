"""Unicode character classes exactly as tiktoken sees them.

tiktoken matches its patterns with Rust's `fancy-regex`/`regex` crates, whose Unicode tables
(the Unicode version they were built from) differ from Python's `regex` module and from
`unicodedata`: recently assigned code points are letters for one and not for the other. The
GPU pre-tokenizer and the CPU reference therefore never ask a regex engine what a letter is;
they read this table, which was read out of tiktoken itself.

How the table is read (`probe_tiktoken`): tiktoken only emits tokens for text its pattern
matches, so an `Encoding` whose pattern is just `\\p{L}` and whose vocabulary is the 256 single
bytes, given every code point once, returns exactly the UTF-8 bytes of the letters among them.
One probe per class below. `scripts/gen_unicode_table.py` writes the result to
`data/unicode_classes.json` (ranges, committed); `tests/test_tokenizer_unicode.py` probes the
installed tiktoken again and compares code point by code point.

Classes (`CLASSES`): the general categories the three patterns use, L Lu Ll Lt Lm Lo M N, and
S = `\\s` (Unicode White_Space). The contractions' case-insensitive letters are probed too
(`(?i:s)` also matches U+017F LATIN SMALL LETTER LONG S).

For the GPU the classes are folded into one byte per code point (`class_bytes`, bits below)
and stored as a two-level table (`two_level`): stage 1 maps each block of 256 code points to
one of the distinct blocks of stage 2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np

DATA_FILE = Path(__file__).resolve().parent / "data" / "unicode_classes.json"
MAX_CP = 0x110000
SURROGATES = range(0xD800, 0xE000)

CLASSES = ("L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "N", "S")
PROBE_PATTERNS = {"L": r"\p{L}", "Lu": r"\p{Lu}", "Ll": r"\p{Ll}", "Lt": r"\p{Lt}",
                  "Lm": r"\p{Lm}", "Lo": r"\p{Lo}", "M": r"\p{M}", "N": r"\p{N}", "S": r"\s"}
# Letters of the case-insensitive contractions: cl100k `'(?i:[sdmt]|ll|ve|re)`, o200k's suffix.
CONTRACTION_LETTERS = "sdmtlver"

# Bits of the per-code-point class byte (the GPU's view; shaders/kernels/bpe/bpe_encode.wgsl).
BIT_L = 1    # \p{L}
BIT_N = 2    # \p{N}
BIT_S = 4    # \s
BIT_M = 8    # \p{M}
BIT_UP = 16  # [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]  (o200k's "upper" run)
BIT_LO = 32  # [\p{Ll}\p{Lm}\p{Lo}\p{M}]        (o200k's "lower" run)
BLOCK = 256


def all_code_points_text() -> str:
    """Every Unicode scalar value once, in order (surrogates cannot be encoded)."""
    return "".join(chr(c) for c in range(MAX_CP) if c not in SURROGATES)


def probe_tiktoken(pattern: str, text: str | None = None) -> set[int]:
    """The code points that tiktoken's regex engine matches with `pattern` (one char each)."""
    import tiktoken
    enc = tiktoken.Encoding("istanbul-unicode-probe", pat_str=pattern,
                            mergeable_ranks={bytes([i]): i for i in range(256)},
                            special_tokens={})
    ids = enc.encode_ordinary(text if text is not None else all_code_points_text())
    return {ord(c) for c in bytes(ids).decode("utf-8")}


def probe_all() -> dict:
    """Probe every class and the contraction letters; the content of the data file."""
    text = all_code_points_text()
    classes = {name: to_ranges(probe_tiktoken(PROBE_PATTERNS[name], text)) for name in CLASSES}
    folds = {ch: sorted(probe_tiktoken(f"(?i:{ch})", text)) for ch in CONTRACTION_LETTERS}
    import tiktoken
    return {"format": "istanbul-unicode-classes", "version": 1,
            "source": f"probed from tiktoken {tiktoken.__version__}",
            "classes": classes, "case_folds": folds}


def to_ranges(points) -> list[list[int]]:
    """Sorted code points -> [[first, last], ...] inclusive ranges."""
    ranges: list[list[int]] = []
    for cp in sorted(points):
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1][1] = cp
        else:
            ranges.append([cp, cp])
    return ranges


@dataclass(frozen=True)
class UnicodeTable:
    ranges: dict  # class name -> [[first, last], ...]
    case_folds: dict  # contraction letter -> [code points matching (?i:letter)]
    source: str

    def members(self, name: str) -> np.ndarray:
        """Boolean mask over all code points for one class."""
        mask = np.zeros(MAX_CP, dtype=bool)
        for first, last in self.ranges[name]:
            mask[first:last + 1] = True
        return mask

    @cached_property
    def class_bytes(self) -> np.ndarray:
        """One byte of BIT_* flags per code point."""
        m = {name: self.members(name) for name in CLASSES}
        out = np.zeros(MAX_CP, dtype=np.uint8)
        out |= np.where(m["L"], BIT_L, 0).astype(np.uint8)
        out |= np.where(m["N"], BIT_N, 0).astype(np.uint8)
        out |= np.where(m["S"], BIT_S, 0).astype(np.uint8)
        out |= np.where(m["M"], BIT_M, 0).astype(np.uint8)
        up = m["Lu"] | m["Lt"] | m["Lm"] | m["Lo"] | m["M"]
        lo = m["Ll"] | m["Lm"] | m["Lo"] | m["M"]
        out |= np.where(up, BIT_UP, 0).astype(np.uint8)
        out |= np.where(lo, BIT_LO, 0).astype(np.uint8)
        return out

    def two_level(self) -> tuple[np.ndarray, np.ndarray]:
        """(stage1 u32[4352], stage2 u32[n_blocks * 64]): class byte of cp is byte cp % 4 of
        stage2[stage1[cp >> 8] * 64 + (cp & 255) / 4]."""
        blocks = self.class_bytes.reshape(MAX_CP // BLOCK, BLOCK)
        unique, stage1 = np.unique(blocks, axis=0, return_inverse=True)
        stage2 = np.ascontiguousarray(unique).view(np.uint32).reshape(-1)
        return stage1.astype(np.uint32).reshape(-1), stage2.copy()

    def regex_class_body(self, name: str) -> str:
        """The class as the inside of a regex character class, e.g. `a-zA-Z\\u00aa`."""
        def esc(cp: int) -> str:
            return f"\\U{cp:08x}"
        parts = []
        for first, last in self.ranges[name]:
            parts.append(esc(first) if first == last else f"{esc(first)}-{esc(last)}")
        return "".join(parts)


def table_from_json(data: dict, origin: str) -> UnicodeTable:
    if data.get("format") != "istanbul-unicode-classes":
        raise ValueError(f"{origin}: not an istanbul Unicode class table")
    missing = [c for c in CLASSES if c not in data.get("classes", {})]
    if missing:
        raise ValueError(f"{origin}: classes missing: {missing}; regenerate with "
                         "scripts/gen_unicode_table.py")
    return UnicodeTable(ranges=data["classes"], case_folds=data["case_folds"],
                        source=data.get("source", ""))


@lru_cache(maxsize=1)
def load_table() -> UnicodeTable:
    """The committed table (data/unicode_classes.json)."""
    return table_from_json(json.loads(DATA_FILE.read_text(encoding="utf-8")), str(DATA_FILE))


def write_table(path: Path = DATA_FILE) -> dict:
    data = probe_all()
    path.parent.mkdir(parents=True, exist_ok=True)
    # One range per line keeps diffs readable when tiktoken's Unicode version moves.
    lines = ["{", f'  "format": {json.dumps(data["format"])},', f'  "version": {data["version"]},',
             f'  "source": {json.dumps(data["source"])},', '  "classes": {']
    for i, name in enumerate(CLASSES):
        body = ", ".join(f"[{a}, {b}]" for a, b in data["classes"][name])
        sep = "," if i < len(CLASSES) - 1 else ""
        lines.append(f'    {json.dumps(name)}: [{body}]{sep}')
    lines.append("  },")
    lines.append(f'  "case_folds": {json.dumps(data["case_folds"])}')
    lines.append("}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    load_table.cache_clear()
    return data
