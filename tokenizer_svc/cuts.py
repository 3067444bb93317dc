"""Where a document may be cut without changing its ids: the one rule, owned by the tokenizer.

A cut at byte p is safe when p is provably the start of a pre-tokenized piece: then the
pieces (and so the ids) of text[:p] and text[p:] are exactly the pieces of the whole text.
`cut_rule` decides it from the code points around p; its proofs are in the header of
shaders/wgsl/bpe_encode.wgsl, whose `is_cut` is the same function on the GPU
(tests/test_cut_rule.py runs both on adversarial text and compares them position by
position). Users:

- GpuEncoder splits documents larger than one device call (`find_cut`);
- the service cuts long documents into chunks it runs one after the other, so deadlines and
  cancellation stop them between chunks (`split_points`);
- `istanbul prepare` sends files larger than the service's per-document limit in pieces
  (`split_points` with pattern=None: safe for every known pattern).

Raw bytes: tiktoken encodes everything after the first invalid UTF-8 sequence of a document
together with its last valid piece, so cuts are only ever placed before that point.
"""

from __future__ import annotations

import numpy as np

from .unicode_table import BIT_L, BIT_M, BIT_N, BIT_S, load_table

PATTERNS = ("gpt2", "cl100k", "o200k")   # the patterns with a proven rule
_CRLF = (0x0A, 0x0D)


def cut_rule(prev: int, cur: int, nxt: int | None, pattern: str | None) -> bool:
    """Is the position between code points `prev` and `cur` (followed by `nxt`, None at the end
    of the text) provably a piece boundary for `pattern` (None: for every pattern in PATTERNS)?
    """
    if pattern is None:
        return all(cut_rule(prev, cur, nxt, p) for p in PATTERNS)
    if pattern not in PATTERNS:
        raise ValueError(f"no cut rule for pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    classes = load_table().class_bytes
    pc, cc = int(classes[prev]), int(classes[cur])
    if pc & BIT_L:                                                           # L
        if pattern == "o200k":
            return not cc & (BIT_L | BIT_M) and cur != 0x27
        return not cc & BIT_L
    if pc & BIT_N:                                                           # D
        return not cc & BIT_N
    cur_plain_space = bool(cc & BIT_S) and cur not in _CRLF
    if not pc & (BIT_L | BIT_N | BIT_S):                                     # O
        return prev != 0x27 and (bool(cc & BIT_N) or cur_plain_space)
    if prev in _CRLF and not cc & BIT_S and not (pattern == "o200k" and cur == 0x2F):   # NL
        return True
    if cur_plain_space:                                                      # W
        return nxt is not None and not int(classes[nxt]) & BIT_S
    return False


def _char(data, i: int) -> tuple[int, int] | None:
    """(code point, length) of the UTF-8 character at byte i, None if none starts there."""
    b0 = int(data[i])
    n = 1 if b0 < 0x80 else 2 if 0xC2 <= b0 < 0xE0 else 3 if 0xE0 <= b0 < 0xF0 else \
        4 if 0xF0 <= b0 < 0xF5 else 0
    if n == 0:
        return None
    try:
        return ord(bytes(data[i:i + n]).decode("utf-8")), n
    except (UnicodeDecodeError, TypeError):
        return None


def _char_before(data, p: int) -> tuple[int, int] | None:
    """(code point, start) of the UTF-8 character that ends at byte p, None if invalid."""
    start = p - 1
    while start > 0 and p - start < 4 and (data[start] & 0xC0) == 0x80:
        start -= 1
    ch = _char(data, start)
    if ch is None or start + ch[1] != p:
        return None
    return ch[0], start


def _is_space(cp: int) -> bool:
    return bool(int(load_table().class_bytes[cp]) & BIT_S)


def is_cut(data, p: int, pattern: str | None, *, split: bool = False) -> bool:
    r"""Is byte p (0 < p < len) of one document `data` (UTF-8) provably a piece start?

    split=False: for a matcher that sees the whole text (the GPU's segments). split=True:
    also when text[:p] and text[p:] are encoded as separate documents. Then text[:p] must
    not end in a whitespace piece of two or more characters before a non-space, because at
    the end of a text `\s+(?!\S)` takes the whole run ("x\n\n" + "A": "\n\n" alone but
    "\n", "\n" in the whole text)."""
    if not 0 < p < len(data) or (data[p] & 0xC0) == 0x80:
        return False
    before, cur = _char_before(data, p), _char(data, p)
    if before is None or cur is None:
        return False
    prev, prev_start = before
    after = p + cur[1]
    nxt = None
    if after < len(data):
        following = _char(data, after)
        if following is None:
            return False
        nxt = following[0]
    if not cut_rule(prev, cur[0], nxt, pattern):
        return False
    if split and _is_space(prev) and not _is_space(cur[0]) and prev_start > 0:
        earlier = _char_before(data, prev_start)
        return earlier is not None and not _is_space(earlier[0])
    return True


def find_cut(data, lo: int, hi: int, pattern: str | None, *, split: bool = False
             ) -> int | None:
    """The last cut p with lo < p <= hi in one document data[..] of valid UTF-8 (hi may be
    len(data): the end is not a cut), or None. `split` as in is_cut."""
    hi = min(hi, len(data) - 1)
    for p in range(hi, lo, -1):
        if (data[p] & 0xC0) != 0x80 and is_cut(data, p, pattern, split=split):
            return p
    return None


def valid_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix of `data` that is valid UTF-8 (cuts stay inside it)."""
    try:
        bytes(data).decode("utf-8")
        return len(data)
    except UnicodeDecodeError as exc:
        return exc.start


def split_points(data: bytes, limit: int, pattern: str | None) -> tuple[list[int], int]:
    """(ends of consecutive parts, to be encoded as separate documents, of at most `limit` bytes, how many ends are not safe cuts).

    Each end is the last safe cut within `limit` bytes of the part's start; where there is
    none the part ends at a UTF-8 character boundary (or at the limit inside invalid bytes)
    and counts as unsafe. The last end is len(data)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1 byte, got {limit}")
    view = np.frombuffer(bytes(data), dtype=np.uint8)
    valid = valid_utf8_prefix(data)
    ends, unsafe, start = [], 0, 0
    while len(data) - start > limit:
        end = find_cut(view, start, min(start + limit, valid - 1), pattern,
                       split=True) if start + 1 < valid else None
        if end is None:
            end = start + limit
            while end > start + 1 and end < valid and (view[end] & 0xC0) == 0x80:
                end -= 1   # not inside a UTF-8 sequence
            unsafe += 1
        ends.append(end)
        start = end
    ends.append(len(data))
    return ends, unsafe


__all__ = ["PATTERNS", "cut_rule", "find_cut", "is_cut", "split_points", "valid_utf8_prefix"]
