"""Unicode character classes exactly as each tokenizer library sees them.

Pre-tokenizer regexes ask "is this a letter?", and the answer depends on the Unicode version a
regex engine was built from: recently assigned code points are letters for one engine and not
for another. The GPU pre-tokenizer and the CPU reference therefore never ask a regex engine
what a letter is; they read a table that was read out of the library they must agree with.
There is one table per vocabulary family (`FAMILIES`):

- "tiktoken" (`.tiktoken` files and the known names): tiktoken matches with Rust's
  `fancy-regex`/`regex` crates; `data/unicode_classes.json`.
- "tokenizers" (Hugging Face tokenizer.json): `tokenizers` matches Split/ByteLevel patterns with
  Oniguruma; `data/unicode_classes_tokenizers.json`. It has more classes (tokenizer.json
  patterns in the wild also use \\p{P}, \\p{S}, ...) and the case folds of every ASCII letter.

How a table is read: tiktoken only emits tokens for text its pattern matches, so an `Encoding`
whose pattern is just `\\p{L}` and whose vocabulary is the 256 single bytes, given every code
point once, returns exactly the UTF-8 bytes of the letters among them (`probe_tiktoken`).
`tokenizers`' `Split(pattern, behavior="removed")` keeps exactly the text the pattern does not
match, with offsets (`probe_tokenizers`). One probe per class. `scripts/gen_unicode_table.py`
writes the results (ranges, committed); `tests/test_tokenizer_unicode.py` probes the installed
libraries again and compares code point by code point.

Classes of the tiktoken table (`CLASSES`): the general categories the three patterns use,
L Lu Ll Lt Lm Lo M N, and S = `\\s` (Unicode White_Space). The contractions' case-insensitive
letters are probed too (`(?i:s)` also matches U+017F LATIN SMALL LETTER LONG S). The
tokenizers table has `HF_CLASSES`: all of those, every general category (Symbol under the key
"Symbol") and `\\d`, `\\w`.

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

DATA_DIR = Path(__file__).resolve().parent / "data"
DATA_FILE = DATA_DIR / "unicode_classes.json"
DATA_FILES = {"tiktoken": DATA_FILE, "tokenizers": DATA_DIR / "unicode_classes_tokenizers.json"}
FAMILIES = tuple(DATA_FILES)
MAX_CP = 0x110000
SURROGATES = range(0xD800, 0xE000)

CLASSES = ("L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "N", "S", "W")
# W: Rust regex's `\w`, which `tokenizers` also uses for added tokens' single_word rule.
PROBE_PATTERNS = {"L": r"\p{L}", "Lu": r"\p{Lu}", "Ll": r"\p{Ll}", "Lt": r"\p{Lt}",
                  "Lm": r"\p{Lm}", "Lo": r"\p{Lo}", "M": r"\p{M}", "N": r"\p{N}", "S": r"\s",
                  "W": r"\w"}
# Every general category Oniguruma knows by its short name (Cn/Cs/C left out: unassigned and
# surrogate code points cannot be probed with text), plus the escapes tokenizer.json patterns use.
HF_GENERAL = ("L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No",
              "P", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So",
              "Z", "Zs", "Zl", "Zp", "Cc", "Cf", "Co")
# Table key of each general category: its name, except Symbol, because "S" is `\\s` in every
# table (the GPU's BIT_S).
CATEGORY_KEY = {name: ("Symbol" if name == "S" else name) for name in HF_GENERAL}
HF_PROBE_PATTERNS = {**{CATEGORY_KEY[name]: f"\\p{{{name}}}" for name in HF_GENERAL},
                     "S": r"\s", "D": r"\d", "W": r"\w"}
# RustNumeric: Rust's `char::is_numeric`, which the Digits pre-tokenizer splits on.
HF_CLASSES = tuple(HF_PROBE_PATTERNS) + ("RustNumeric",)
ASCII_LETTERS = "abcdefghijklmnopqrstuvwxyz"
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


def probe_tokenizers(pattern: str, text: str | None = None) -> set[int]:
    """The code points that `tokenizers`' regex engine (Oniguruma) matches with `pattern`.

    `Split(behavior="removed")` drops what the pattern matches and returns what is left with
    character offsets; everything outside those offsets was matched.
    """
    from tokenizers import Regex, pre_tokenizers
    text = text if text is not None else all_code_points_text()
    kept = np.zeros(len(text), dtype=bool)
    split = pre_tokenizers.Split(Regex(pattern), behavior="removed")
    for _, (start, end) in split.pre_tokenize_str(text):
        kept[start:end] = True
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return set(codes[~kept].tolist())


def probe_digits(text: str | None = None) -> set[int]:
    """The code points `tokenizers`' Digits pre-tokenizer treats as digits (is_numeric).

    Every code point is followed by "a": a digit comes out as a piece of its own, anything
    else joins the "a" after it.
    """
    from tokenizers import pre_tokenizers
    chars = text if text is not None else all_code_points_text()
    pieces = pre_tokenizers.Digits(individual_digits=True).pre_tokenize_str(
        "".join(ch + "a" for ch in chars))
    return {ord(p) for p, _ in pieces if len(p) == 1 and p != "a"}


def probe_single_word(text: str | None = None) -> set[int]:
    """The code points `tokenizers` counts as word characters for an added token's
    `single_word` rule (Rust regex `\\w`): before such a character a single_word token does not
    match."""
    from tokenizers import AddedToken, Tokenizer, models
    chars = text if text is not None else all_code_points_text()
    tok = Tokenizer(models.BPE())
    tok.add_tokens([AddedToken("\x01", single_word=True, normalized=False)])
    results = tok.encode_batch([ch + "\x01" for ch in chars], add_special_tokens=False)
    return {ord(ch) for ch, r in zip(chars, results) if not r.ids}


def probe_all(family: str = "tiktoken") -> dict:
    """Probe every class and the case folds of one family; the content of its data file."""
    text = all_code_points_text()
    if family == "tiktoken":
        import tiktoken
        probe, patterns, letters = probe_tiktoken, PROBE_PATTERNS, CONTRACTION_LETTERS
        source = f"probed from tiktoken {tiktoken.__version__}"
        names = CLASSES
    elif family == "tokenizers":
        import tokenizers
        probe, patterns, letters = probe_tokenizers, HF_PROBE_PATTERNS, ASCII_LETTERS
        source = f"probed from tokenizers {tokenizers.__version__} (Oniguruma)"
        names = HF_CLASSES
    else:
        raise ValueError(f"unknown Unicode table family {family!r}; one of {FAMILIES}")
    classes = {name: to_ranges(probe(patterns[name], text)) for name in names
               if name in patterns}
    if family == "tokenizers":
        classes["RustNumeric"] = to_ranges(probe_digits(text))
    folds = {ch: sorted(probe(f"(?i:{ch})", text)) for ch in letters}
    return {"format": "istanbul-unicode-classes", "version": 1, "family": family,
            "source": source, "classes": classes, "case_folds": folds}


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
    case_folds: dict  # letter -> [code points matching (?i:letter)]
    source: str
    family: str = "tiktoken"

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
        stage2[stage1[cp >> 8] * 64 + (cp & 255) / 4]. The block of code points 0-255 is
        block 0, so for those cp the GPU reads stage2[cp / 4] directly (class_of's one-load
        path)."""
        blocks = self.class_bytes.reshape(MAX_CP // BLOCK, BLOCK)
        unique, stage1 = np.unique(blocks, axis=0, return_inverse=True)
        stage1 = stage1.reshape(-1)
        order = np.arange(len(unique))   # swap block 0 and the first code points' block
        order[[0, stage1[0]]] = order[[stage1[0], 0]]
        unique, stage1 = unique[order], order[stage1]
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
                        source=data.get("source", ""), family=data.get("family", "tiktoken"))


@lru_cache(maxsize=None)
def load_table(family: str = "tiktoken") -> UnicodeTable:
    """The committed table of one family (data/unicode_classes*.json)."""
    if family not in DATA_FILES:
        raise ValueError(f"unknown Unicode table family {family!r}; one of {FAMILIES}")
    path = DATA_FILES[family]
    return table_from_json(json.loads(path.read_text(encoding="utf-8")), str(path))


def write_table(family: str = "tiktoken", path: Path | None = None) -> dict:
    data = probe_all(family)
    path = path or DATA_FILES[family]
    path.parent.mkdir(parents=True, exist_ok=True)
    # One range per line keeps diffs readable when tiktoken's Unicode version moves.
    lines = ["{", f'  "format": {json.dumps(data["format"])},', f'  "version": {data["version"]},',
             f'  "family": {json.dumps(data["family"])},',
             f'  "source": {json.dumps(data["source"])},', '  "classes": {']
    names = list(data["classes"])
    for i, name in enumerate(names):
        body = ", ".join(f"[{a}, {b}]" for a, b in data["classes"][name])
        sep = "," if i < len(names) - 1 else ""
        lines.append(f'    {json.dumps(name)}: [{body}]{sep}')
    lines.append("  },")
    lines.append(f'  "case_folds": {json.dumps(data["case_folds"])}')
    lines.append("}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    load_table.cache_clear()
    return data
