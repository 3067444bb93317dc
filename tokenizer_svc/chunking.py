"""Token windows of a document, with their spans in the input: what retrieval (RAG) pipelines
cut text into before embedding it.

    from tokenizer_svc.chunking import chunk
    for c in chunk(enc, text, max_tokens=512, overlap=64):
        c.ids, c.text, (c.start, c.end), (c.byte_start, c.byte_end)

The rule (`window_bounds`): the document is encoded whole, then window k holds the tokens
[k * (max_tokens - overlap), k * (max_tokens - overlap) + max_tokens), cut at the end; the
first window that reaches the end is the last, and a document with no tokens has no windows
(LangChain's TokenTextSplitter cuts so). Every token is in a window, neighbours share exactly
`overlap` tokens, only the last window may be shorter.

What holds for every window (`Chunk`):
- `ids` is `token_start:token_end` of the whole document's ids (`Encoding.encode`);
- `[byte_start, byte_end)` are exactly the bytes of those tokens: `decode_bytes(ids) ==
  input_utf8[byte_start:byte_end]`;
- `[start, end)` in characters (code points) covers every character any of those bytes
  belongs to (the rule of the service's character offsets): where a window edge splits a
  multi-byte character between two tokens, both windows hold the whole character, and
  `decode(ids)` shows U+FFFD there while `text[start:end]` has the character; elsewhere
  `text[start:end] == decode(ids)`.
- Encoding `text[start:end]` alone gives `ids` when the text splits at both edges without
  changing the ids (as at whitespace between words). An edge inside a word may encode
  differently alone: BPE looks at the whole pre-tokenizer piece.

A vocabulary whose normalizer changes the text (a tokenizer.json lowercasing, say) has tokens
that are not bytes of the input, so it has no spans: `chunk` raises ValueError.

`windows` is the same from the pieces the service already has (the document's bytes and each
token's byte start): the server's Chunk RPC uses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Collection, Literal

import numpy as np


@dataclass(frozen=True)
class Chunk:
    ids: list                 # the window's token ids
    text: str | bytes         # input[start:end] (str input) or input[byte_start:byte_end]
    start: int                # [start, end): characters (code points) of the input
    end: int
    byte_start: int           # [byte_start, byte_end): bytes of the input's UTF-8
    byte_end: int
    token_start: int          # ids == document_ids[token_start:token_end]
    token_end: int


def check_window_arguments(max_tokens: int, overlap: int) -> None:
    """ValueError naming the argument unless 1 <= max_tokens and 0 <= overlap < max_tokens."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer)) \
            or max_tokens < 1:
        raise ValueError(f"max_tokens must be a whole number of tokens, at least 1; got "
                         f"{max_tokens!r}")
    if isinstance(overlap, bool) or not isinstance(overlap, (int, np.integer)) or overlap < 0:
        raise ValueError(f"overlap must be a whole number of tokens, 0 or more; got {overlap!r}")
    if overlap >= max_tokens:
        raise ValueError(f"overlap must be smaller than max_tokens ({max_tokens}), or no window "
                         f"would advance; got {overlap}")


def window_bounds(n_tokens: int, max_tokens: int, overlap: int) -> np.ndarray:
    """(token_start, token_end) of each window of a document of `n_tokens` tokens, shape (k, 2)."""
    check_window_arguments(max_tokens, overlap)
    if n_tokens <= 0:
        return np.zeros((0, 2), np.int64)
    stride = max_tokens - overlap
    last = -(-max(n_tokens - max_tokens, 0) // stride)   # first k with k*stride+max >= n
    starts = np.arange(last + 1, dtype=np.int64) * stride
    return np.stack([starts, np.minimum(starts + max_tokens, n_tokens)], axis=1)


def windows(data: bytes, token_byte_starts: np.ndarray, max_tokens: int, overlap: int
            ) -> np.ndarray:
    """The windows of a document whose UTF-8 (or raw) bytes are `data` and whose tokens start
    at `token_byte_starts` (tokens tile `data`): an int64 array of shape (k, 6), one row per
    window: token_start, token_end, start, end (characters), byte_start, byte_end."""
    starts = np.asarray(token_byte_starts, np.int64)
    bounds = window_bounds(starts.size, max_tokens, overlap)
    out = np.zeros((bounds.shape[0], 6), np.int64)
    if not bounds.shape[0]:
        return out
    ends = np.append(starts[1:], len(data))
    byte_start, byte_end = starts[bounds[:, 0]], ends[bounds[:, 1] - 1]
    # characters started before each byte position: a byte that is not a UTF-8 continuation
    # byte (0b10xxxxxx) starts one
    raw = np.frombuffer(data, np.uint8)
    started = np.zeros(raw.size + 1, np.int64)
    np.cumsum((raw & 0xC0) != 0x80, out=started[1:])
    out[:, 0:2] = bounds
    out[:, 2] = np.maximum(started[byte_start + 1] - 1, 0)   # the character holding the byte
    out[:, 3] = started[byte_end]                             # characters begun before the end
    out[:, 4], out[:, 5] = byte_start, byte_end
    return out


def chunk(encoding, text: str | bytes, max_tokens: int, overlap: int = 0, *,
          allowed_special: Literal["all"] | AbstractSet[str] = set(),
          disallowed_special: Literal["all"] | Collection[str] = "all") -> list[Chunk]:
    """`text` (str: `encoding.encode` with tiktoken's special-token arguments; bytes:
    `encode_bytes`, raw) cut into windows of at most `max_tokens` tokens, neighbours sharing
    `overlap` tokens (see the module doc for the rule and what the spans guarantee).
    ValueError for bad arguments (naming the argument) or a normalizing vocabulary."""
    check_window_arguments(max_tokens, overlap)
    if isinstance(text, (bytes, bytearray, memoryview)):
        data = bytes(text)
        ids = encoding.encode_bytes(data)
    else:
        data = text.encode("utf-8", "surrogatepass")
        ids = encoding.encode(text, allowed_special=allowed_special,
                              disallowed_special=disallowed_special)
    byte_starts = encoding._token_offsets(ids, "byte")
    covered = int(byte_starts[-1]) + len(encoding.decode_single_token_bytes(ids[-1])) \
        if ids else 0
    if covered != len(data):
        raise ValueError(f"the {encoding.name} vocabulary's tokens of this text are "
                         f"{covered:,} bytes, the text {len(data):,}: its normalizer changes "
                         "the text, so windows have no spans in it; chunk the ids instead "
                         "(window_bounds)")
    rows = windows(data, byte_starts, max_tokens, overlap)
    raw = not isinstance(text, str)
    return [Chunk(ids=ids[a:b], text=data[bs:be] if raw else text[s:e], start=s, end=e,
                  byte_start=bs, byte_end=be, token_start=a, token_end=b)
            for a, b, s, e, bs, be in rows.tolist()]
