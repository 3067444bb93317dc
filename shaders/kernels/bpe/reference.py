"""Exact references of the BPE tokenizer kernels: plain, slow, readable.

    explicit_pattern(pattern)       a pattern whose \\p{..} / \\s classes are the class table's
                                    (unicode_table.py), as the GPU reads them
    pre_tokenize(compiled, text)    the pieces of `text`, as tiktoken's find_iter cuts them
    bpe_ranks(piece, ranks)         tiktoken's BPE of one piece (.tiktoken vocabularies)
    bpe_merges(piece, ranks, merges)  the listed merges only (tokenizer.json vocabularies)
    encode(ranks, pattern, docs)    ids and per-document offsets (bpe_encode/bpe_compact)
    exclusive_scan(x)               n + 1 outputs: 0, x0, x0 + x1, ..., the total (u32, wrapping)
    decode(decoder, ids)            the concatenated bytes of the tokens (bpe_decode)

Encoding is two steps, exactly as tiktoken does them:

1. **Pre-tokenize**: cut the text into pieces with the pattern (patterns.py). Its `\\p{..}` and
   `\\s` are first rewritten into explicit character classes read out of tiktoken itself
   (`explicit_pattern`): Python's `regex` ships a newer Unicode version than tiktoken's Rust
   regex crate (tens of thousands of code points are letters for one and not the other), so
   asking `regex` what a letter is would disagree with tiktoken on those code points.
2. **BPE** within each piece: start from single bytes and repeatedly merge the adjacent pair
   with the lowest priority, the leftmost one among equals. For `.tiktoken` vocabularies a
   pair's priority is the rank of its concatenation (if that is a token); first, a piece that
   is itself a token is that token (tiktoken's whole-piece shortcut). For tokenizer.json
   vocabularies only the listed merges apply, priority = position in the merge list.

The product's tokenizer (tokenizer_svc/reference.py: special tokens, tokenizer.json
pipelines, raw bytes) builds on these.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import regex

from .patterns import PATTERNS
from .unicode_table import load_table

NO_PRIORITY = float("inf")
# The regex module's own property for each table key (the fast path of `table_class_item`).
_REGEX_PROPERTY = {"S": r"\s", "D": r"\d", "W": r"\w", "Symbol": r"\p{S}"}
_CLASS_NAMES = ("L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "N")


# ---- pre-tokenization -------------------------------------------------------------------

@lru_cache(maxsize=None)
def table_class_item(family: str, key: str) -> str:
    r"""The class `key` of `family`'s Unicode table (unicode_table.FAMILIES) as an item of a
    `regex` VERSION1 character class.

    Written as the regex module's own property minus the code points where its (newer)
    Unicode tables say yes and the table says no, plus the opposite ones:
    `[\p{L}--[...]][...]`. Exactly the table's members, and several times faster to match
    than the table's full range list.
    """
    from .unicode_table import MAX_CP, all_code_points_text, to_ranges
    table = load_table(family)
    prop = _REGEX_PROPERTY.get(key, f"\\p{{{key}}}")
    text = all_code_points_text()
    theirs = np.zeros(MAX_CP, dtype=bool)
    theirs[[ord(c) for c in regex.findall(f"(?V1){prop}", text)]] = True
    mine = table.members(key)

    def ranges(mask) -> str:
        return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}"
                       for a, b in to_ranges(np.flatnonzero(mask).tolist()))
    extra, missing = theirs & ~mine, mine & ~theirs
    item = f"[{prop}--[{ranges(extra)}]]" if extra.any() else prop
    return item + (f"[{ranges(missing)}]" if missing.any() else "")


def explicit_pattern(pattern: str, family: str = "tiktoken", fast: bool = False) -> str:
    """Rewrite a pattern so that every `\\p{X}` / `\\s` / `\\S` is the explicit class of
    `family`'s table (unicode_table.FAMILIES); handles what the patterns of patterns.py
    contain. `fast`: each class as `regex`'s own property corrected by the table's
    differences (`table_class_item`; a VERSION1 pattern that matches ~10x faster than the full
    range lists). Raises ValueError on a construct it cannot rewrite exactly (`\\S` inside a
    class, `\\P{..}`, a class it has no table for).
    """
    table = load_table(family)
    if fast:
        def class_body(key):
            return table_class_item(family, key)
    else:
        def class_body(key):
            return table.regex_class_body(key)
    out, i, in_class = [], 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1]
            if nxt in "pP":
                close = pattern.index("}", i)
                name = pattern[i + 3:close]
                if nxt == "P" or name not in _CLASS_NAMES:
                    raise ValueError(f"cannot rewrite {pattern[i:close + 1]!r} exactly")
                body = class_body(name)
                out.append(body if in_class else f"[{body}]")
                i = close + 1
                continue
            if nxt == "s":
                body = class_body("S")
                out.append(body if in_class else f"[{body}]")
                i += 2
                continue
            if nxt == "S":
                if in_class:
                    raise ValueError("cannot rewrite \\S inside a character class")
                out.append(f"[^{class_body('S')}]")
                i += 2
                continue
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
            out.append(ch)
            if pattern[i + 1:i + 2] == "^":
                out.append("^")
                i += 1
            i += 1
            continue
        if ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    return ("(?V1)" if fast else "") + "".join(out)


def pre_tokenize(compiled: regex.Pattern, text: str) -> list[str]:
    """The pieces of `text`: like tiktoken's find_iter, text that no alternative matches is
    skipped (and so are empty matches)."""
    return [m.group() for m in compiled.finditer(text) if m.end() > m.start()]


# ---- BPE --------------------------------------------------------------------------------

def bpe_ranks(piece: bytes, ranks: dict) -> list[int]:
    """tiktoken's rule: whole-piece shortcut, then merge the lowest-ranked adjacent pair
    (by the rank of the concatenation), leftmost first, until no pair is a token."""
    if piece in ranks:
        return [ranks[piece]]
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, best_rank = -1, NO_PRIORITY
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], NO_PRIORITY)
            if rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return [ranks[p] for p in parts]


def bpe_merges(piece: bytes, ranks: dict, merges: dict, ignore_merges: bool = False) -> list[int]:
    """Hugging Face's rule: only listed merges apply, lowest list index first, leftmost first."""
    if ignore_merges and piece in ranks:
        return [ranks[piece]]
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, best_prio = -1, NO_PRIORITY
        for i in range(len(parts) - 1):
            prio = merges.get((parts[i], parts[i + 1]), NO_PRIORITY)
            if prio < best_prio:
                best, best_prio = i, prio
        if best < 0:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return [ranks[p] for p in parts]


# ---- the kernels' references ------------------------------------------------------------

@lru_cache(maxsize=None)
def _compiled(pattern: str) -> regex.Pattern:
    return regex.compile(explicit_pattern(PATTERNS[pattern]))


def encode(ranks: dict, pattern: str, docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Ids (u32) and per-document offsets (n_docs + 1) of tiktoken-identical BPE with the
    ranks of a `.tiktoken` vocabulary and one of the GPU's patterns (by name)."""
    parts = [np.array([t for piece in pre_tokenize(_compiled(pattern), d)
                       for t in bpe_ranks(piece.encode("utf-8"), ranks)], dtype=np.uint32)
             for d in docs]
    offsets = np.concatenate([[0], np.cumsum([p.size for p in parts])]).astype(np.int64)
    return np.concatenate(parts) if parts else np.zeros(0, np.uint32), offsets


def exclusive_scan(x: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(x, dtype=np.uint64)]).astype(np.uint32)


def decode(decoder: dict, ids: np.ndarray) -> np.ndarray:
    """`decoder`: id -> token bytes (ordinary and special)."""
    return np.frombuffer(b"".join(decoder[int(i)] for i in ids), np.uint8)
