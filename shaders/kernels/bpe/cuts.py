"""Where a document may be cut without changing its ids: the one rule, owned by the tokenizer.

A cut at byte p is safe when p is provably the start of a pre-tokenized piece: then the
pieces (and so the ids) of text[:p] and text[p:] are exactly the pieces of the whole text.
`cut_rule` decides it from the code points around p; its proofs are in the header of
shaders/kernels/bpe/bpe_encode.wgsl, whose `is_cut` is the same function on the GPU
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

from .unicode_table import BIT_L, BIT_LO, BIT_M, BIT_N, BIT_S, BIT_UP, load_table

PATTERNS = ("gpt2", "cl100k", "o200k")   # the patterns with a proven rule
_CRLF = (0x0A, 0x0D)
_SUFFIX_SECOND = (0x45, 0x4C)   # E, L: (?i:'re|'ve|'ll) continue an Ll with them


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
            return (not cc & (BIT_L | BIT_M) and cur != 0x27) or \
                ((pc & (BIT_UP | BIT_LO)) == BIT_LO and (cc & (BIT_UP | BIT_LO)) == BIT_UP
                 and cur not in _SUFFIX_SECOND)                                        # LU
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


def digit_group_starts(text: str, pattern: str) -> list[int]:
    r"""Byte offsets in `text` (one document) where cl100k's and o200k's `\p{N}{1,3}` pieces
    start inside runs of digits: every third digit from a run's first one (the run's start
    included). No local rule proves these (rule D needs a non-digit after the digit), but they
    are piece starts all the same; the GPU's bpe_digit_cuts (bpe_encode.wgsl) adds them as
    segment starts so that one invocation does not walk a long run alone."""
    if pattern not in ("cl100k", "o200k"):
        return []
    classes = load_table().class_bytes
    out, run, at = [], 0, 0
    for ch in text:
        if int(classes[ord(ch)]) & BIT_N:
            if run % 3 == 0:
                out.append(at)
            run += 1
        else:
            run = 0
        at += len(ch.encode("utf-8", "surrogatepass"))
    return out


def valid_utf8_prefix(data: bytes) -> int:
    """Length of the longest prefix of `data` that is valid UTF-8 (cuts stay inside it)."""
    try:
        bytes(data).decode("utf-8")
        return len(data)
    except UnicodeDecodeError as exc:
        return exc.start


def cut_mask(text: str, pattern: str | None, *, split: bool = False) -> np.ndarray:
    """The rule for every position of `text` at once (numpy): mask[i] says whether the
    position before character i + 1 is a cut (the same answers as is_cut, per character)."""
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    if cps.size < 2:
        return np.zeros(0, bool)
    if pattern is None:
        masks = [cut_mask(text, p, split=split) for p in PATTERNS]
        return np.logical_and.reduce(masks)
    if pattern not in PATTERNS:
        raise ValueError(f"no cut rule for pattern {pattern!r}; known: {', '.join(PATTERNS)}")
    cls = load_table().class_bytes
    prev, cur = cps[:-1], cps[1:]
    pc, cc = cls[prev].astype(np.int32), cls[cur].astype(np.int32)
    has_nxt = np.zeros(cur.size, bool)
    has_nxt[:-1] = True
    nc = np.zeros(cur.size, np.int32)
    nc[:-1] = cls[cps[2:]]
    crlf_prev = (prev == 0x0A) | (prev == 0x0D)
    cur_plain_space = ((cc & BIT_S) != 0) & (cur != 0x0A) & (cur != 0x0D)
    if pattern == "o200k":
        rule_l = (((cc & (BIT_L | BIT_M)) == 0) & (cur != 0x27)) | \
            (((pc & (BIT_UP | BIT_LO)) == BIT_LO) & ((cc & (BIT_UP | BIT_LO)) == BIT_UP)
             & ~np.isin(cur, _SUFFIX_SECOND))
    else:
        rule_l = (cc & BIT_L) == 0
    rule_d = (cc & BIT_N) == 0
    rule_o = (prev != 0x27) & (((cc & BIT_N) != 0) | cur_plain_space)
    nl = crlf_prev & ((cc & BIT_S) == 0)
    if pattern == "o200k":
        nl &= cur != 0x2F
    rule_w = cur_plain_space & has_nxt & ((nc & BIT_S) == 0)
    is_l, is_n = (pc & BIT_L) != 0, (pc & BIT_N) != 0
    is_o = (pc & (BIT_L | BIT_N | BIT_S)) == 0
    mask = np.select([is_l, is_n, is_o, nl], [rule_l, rule_d, rule_o, True], rule_w)
    if split:
        space = (cls[cps].astype(np.int32) & BIT_S) != 0
        # cut before character i + 1: prev = i, earlier = i - 1
        bad = space[:-1] & ~space[1:]
        bad[1:] &= space[:-2]
        bad[0] = False
        mask &= ~bad
    return mask


def _byte_offsets(text: str) -> np.ndarray:
    """Byte offset of each character of `text` in UTF-8, plus the end."""
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    lengths = 1 + (cps >= 0x80) + (cps >= 0x800) + (cps >= 0x10000)
    offsets = np.zeros(cps.size + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def split_cuts(data: bytes, pattern: str | None) -> np.ndarray:
    """Sorted byte positions where `data` (one document, raw bytes) may be cut into separate
    documents: split cuts inside its valid UTF-8 prefix, none next to an invalid byte."""
    valid = valid_utf8_prefix(data)
    text = bytes(data[:valid]).decode("utf-8")
    mask = cut_mask(text, pattern, split=True)
    if valid < len(data) and mask.size:
        mask[-1] = False   # the character after the cut is followed by an invalid byte
    return _byte_offsets(text)[1:-1][mask]


def split_points(data: bytes, limit: int, pattern: str | None) -> tuple[list[int], int]:
    """(ends of consecutive parts, to be encoded as separate documents, of at most `limit`
    bytes, how many ends are not safe cuts).

    Each end is the last safe cut within `limit` bytes of the part's start; where there is
    none the part ends at a UTF-8 character boundary (or at the limit inside invalid bytes)
    and counts as unsafe. The last end is len(data)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1 byte, got {limit}")
    data = bytes(data)
    cuts = split_cuts(data, pattern) if len(data) > limit else np.zeros(0, np.int64)
    valid = valid_utf8_prefix(data)
    ends, unsafe, start = [], 0, 0
    while len(data) - start > limit:
        k = int(np.searchsorted(cuts, start + limit, side="right")) - 1
        if k >= 0 and cuts[k] > start:
            end = int(cuts[k])
        else:
            end = start + limit
            while end > start + 1 and end < valid and (data[end] & 0xC0) == 0x80:
                end -= 1   # not inside a UTF-8 sequence
            unsafe += 1
        ends.append(end)
        start = end
    ends.append(len(data))
    return ends, unsafe


__all__ = ["PATTERNS", "cut_mask", "cut_rule", "digit_group_starts", "find_cut", "is_cut",
           "split_cuts", "split_points", "valid_utf8_prefix"]
