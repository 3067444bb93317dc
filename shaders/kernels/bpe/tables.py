"""The device-side form of a vocabulary: flat u32 tables the BPE kernels read.

`VocabTables.build(vocab)` (numpy, once per vocabulary) produces:

- `vocab_words` (u32), sections at offsets given in `layout`:
    byte_tok[256]              id of each single-byte token
    tok_info[2 * n_table]      (byte offset into the arena, byte length) per id; (0, 0) = no
                               such id (a hole, e.g. cl100k's 100261..100275)
    arena                      all token bytes (ordinary and special) back to back, packed
                               little-endian into u32
    piece slots[2 * P]         open-addressing hash table bytes -> id for the whole-piece
                               shortcut: (FNV-1a-32 of the bytes, id); id NONE = empty slot
- `pairs` (u32, 4 per slot): open-addressing hash table (left id, right id) ->
  (priority, merged id). For `.tiktoken` vocabularies every pair of tokens whose
  concatenation is a token, priority = rank of the concatenation (tiktoken's rule: merge by the
  rank of the bytes). For tokenizer.json only the listed merges, priority = list index.
  Empty slot: left = NONE.
- `classes` (u32): the Unicode class table of `unicode_table` for the vocabulary's family
  (tiktoken's or tokenizers'; stage 1 then stage 2).

The hash functions here and in bpe_encode.wgsl must agree bit for bit
(`pair_hash`, `fnv1a`); tests/test_tokenizer_gpu.py checks lookups through the kernels.
Tables are built with linear probing at load factor <= 1/2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

import numpy as np

from .unicode_table import load_table

NONE = 0xFFFFFFFF
M32 = np.uint64(0xFFFFFFFF)


class TableError(ValueError):
    """A vocabulary the kernels cannot use; the message names its source and the problem."""


class TableVocabulary(Protocol):
    """What `VocabTables.build` reads from a vocabulary (tokenizer_svc's Vocabulary is one;
    `RankVocabulary` is the plain `.tiktoken` kind)."""

    name: str
    source: str               # where it came from, for error messages ("" if nowhere)
    ranks: dict               # ordinary token bytes -> id
    merges: dict | None       # (left bytes, right bytes) -> priority (tokenizer.json), or None:
    #                           every pair whose concatenation is a token, by its rank
    hf_ignore_merges: bool    # tokenizer.json `ignore_merges`: a piece in the vocab is one token
    hf: object | None         # tokenizer.json settings: `continuing_subword_prefix` (bytes)
    decoder: dict             # id -> bytes, ordinary and special tokens
    unicode_family: str       # whose class table the pre-tokenizer reads (unicode_table.FAMILIES)


@dataclass
class RankVocabulary:
    """A `.tiktoken` vocabulary: ranks (bytes -> id) and special tokens (str -> id)."""

    name: str
    ranks: dict
    special_tokens: dict = field(default_factory=dict)
    source: str = ""
    merges = None
    hf_ignore_merges = False
    hf = None
    unicode_family = "tiktoken"

    @cached_property
    def decoder(self) -> dict:
        table = {i: text.encode("utf-8") for text, i in self.special_tokens.items()}
        table.update((i, b) for b, i in self.ranks.items())
        return table


def _mul32(a: np.ndarray, b: int) -> np.ndarray:
    return ((a.astype(np.uint64) * np.uint64(b)) & M32).astype(np.uint32)


def pair_hash(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """32-bit mix of an id pair (same arithmetic as `pair_hash` in bpe_encode.wgsl)."""
    left = np.asarray(left, dtype=np.uint32)
    right = np.asarray(right, dtype=np.uint32)
    r = ((right.astype(np.uint64) + np.uint64(0x7F4A7C15)) & M32).astype(np.uint32)
    h = _mul32(left, 0x9E3779B1) ^ _mul32(r, 0x85EBCA77)
    h ^= h >> np.uint32(15)
    h = _mul32(h, 0x2C1B3C6D)
    h ^= h >> np.uint32(12)
    return h


def fnv1a(tokens: list[bytes]) -> np.ndarray:
    """FNV-1a (32-bit) of each byte string, vectorised over the strings."""
    lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=len(tokens))
    width = int(lengths.max(initial=0))
    mat = np.zeros((len(tokens), max(width, 1)), dtype=np.uint8)
    flat = np.frombuffer(b"".join(tokens), dtype=np.uint8)
    rows = np.repeat(np.arange(len(tokens)), lengths)
    cols = np.arange(flat.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    mat[rows, cols] = flat
    h = np.full(len(tokens), 2166136261, dtype=np.uint32)
    for k in range(width):
        live = lengths > k
        nh = _mul32(h ^ mat[:, k].astype(np.uint32), 16777619)
        h = np.where(live, nh, h)
    return h


def place(home: np.ndarray, capacity: int) -> np.ndarray:
    """Linear-probing slot for each item (item i wants home[i], then home[i]+1, ...)."""
    mask = capacity - 1
    slot_owner = np.full(capacity, -1, dtype=np.int64)
    where = np.empty(home.size, dtype=np.int64)
    pending = np.arange(home.size)
    probe = home.astype(np.int64) & mask
    while pending.size:
        want = probe[pending]
        free = slot_owner[want] < 0
        cand, cand_slot = pending[free], want[free]
        _, first = np.unique(cand_slot, return_index=True)
        winners = cand[first]
        slot_owner[cand_slot[first]] = winners
        where[winners] = cand_slot[first]
        won = np.zeros(home.size, dtype=bool)
        won[winners] = True
        pending = pending[~won[pending]]
        probe[pending] = (probe[pending] + 1) & mask
    return where


def _capacity(n: int) -> int:
    cap = 1
    while cap < 2 * max(n, 1):
        cap *= 2
    return cap


def tiktoken_pairs(ranks: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (left, right) token pair whose concatenation is a token, with that token's rank."""
    lefts, rights, ids = [], [], []
    get = ranks.get
    for token, rank in ranks.items():
        for k in range(1, len(token)):
            a = get(token[:k])
            if a is None:
                continue
            b = get(token[k:])
            if b is not None:
                lefts.append(a)
                rights.append(b)
                ids.append(rank)
    left = np.array(lefts, dtype=np.uint32)
    right = np.array(rights, dtype=np.uint32)
    merged = np.array(ids, dtype=np.uint32)
    return left, right, merged.copy(), merged


def hf_pairs(vocab: TableVocabulary) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    lefts, rights, prios, merged = [], [], [], []
    # HF: a merge drops the right part's continuing_subword_prefix
    cut = len(vocab.hf.continuing_subword_prefix) if vocab.hf is not None else 0
    for (a, b), prio in vocab.merges.items():
        try:
            lefts.append(vocab.ranks[a])
            rights.append(vocab.ranks[b])
            merged.append(vocab.ranks[a + b[cut:]])
        except KeyError as exc:
            raise TableError(f"{vocab.source}: merge {a!r} + {b!r} (#{prio}) uses or makes "
                                  f"a token that is not in the vocabulary: {exc.args[0]!r}") \
                from None
        prios.append(prio)
    return (np.array(lefts, dtype=np.uint32), np.array(rights, dtype=np.uint32),
            np.array(prios, dtype=np.uint32), np.array(merged, dtype=np.uint32))


@dataclass
class VocabTables:
    vocab_words: np.ndarray
    pairs: np.ndarray  # u32, 4 per slot
    classes: np.ndarray
    layout: dict  # info_off, bytes_off, piece_off, piece_mask, pair_mask, n_table, max_tok_len
    token_lengths: np.ndarray  # u32 per id (0 = hole), for host-side offsets
    token_chars: np.ndarray  # per id: count of bytes that start a UTF-8 character
    token_starts_mid_char: np.ndarray  # per id: first byte is a UTF-8 continuation byte
    whole_piece: bool
    n_pairs: int

    @classmethod
    def build(cls, vocab: TableVocabulary) -> "VocabTables":
        """The tables of `vocab`; TableError if the kernels cannot use it."""
        decoder = vocab.decoder  # id -> bytes, ordinary and special
        n_table = max(decoder) + 1
        missing = [b for b in range(256) if bytes([b]) not in vocab.ranks]
        if missing:
            raise TableError(f"{vocab.source or vocab.name}: byte-level BPE needs all 256 "
                                  f"single-byte tokens; missing {missing[:5]}...")
        byte_tok = np.array([vocab.ranks[bytes([b])] for b in range(256)], dtype=np.uint32)

        lengths = np.zeros(n_table, dtype=np.uint32)
        ids = np.fromiter(decoder.keys(), dtype=np.int64, count=len(decoder))
        order = np.sort(ids)
        toks = [decoder[int(i)] for i in order]
        lens = np.fromiter((len(t) for t in toks), dtype=np.int64, count=len(toks))
        lengths[order] = lens
        offsets = np.zeros(n_table, dtype=np.uint32)
        offsets[order] = np.cumsum(lens) - lens
        arena = np.frombuffer(b"".join(toks), dtype=np.uint8)
        arena = np.concatenate([arena, np.zeros(-arena.size % 4, np.uint8)]).view(np.uint32)
        info = np.stack([offsets, lengths], axis=1).reshape(-1)

        cont = np.zeros(n_table, dtype=bool)
        chars = np.zeros(n_table, dtype=np.int64)
        flat = np.frombuffer(b"".join(toks), dtype=np.uint8)
        starts_char = ((flat & 0xC0) != 0x80).astype(np.int64)
        bounds = np.concatenate([[0], np.cumsum(lens)])
        csum = np.concatenate([[0], np.cumsum(starts_char)])
        chars[order] = csum[bounds[1:]] - csum[bounds[:-1]]
        nonempty = lens > 0
        first = np.zeros(len(toks), dtype=bool)
        first[nonempty] = (flat[bounds[:-1][nonempty]] & 0xC0) == 0x80
        cont[order] = first

        # Whole-piece table over the ordinary tokens only (specials are never BPE pieces).
        ordinary = sorted(vocab.ranks.items(), key=lambda kv: kv[1])
        o_bytes = [t for t, _ in ordinary]
        o_ids = np.array([i for _, i in ordinary], dtype=np.uint32)
        hashes = fnv1a(o_bytes)
        p_cap = _capacity(len(o_bytes))
        slots = np.full((p_cap, 2), NONE, dtype=np.uint32)
        where = place(hashes, p_cap)
        slots[where, 0] = hashes
        slots[where, 1] = o_ids

        if vocab.merges is not None:
            left, right, prio, merged = hf_pairs(vocab)
            whole = vocab.hf_ignore_merges
        else:
            left, right, prio, merged = tiktoken_pairs(vocab.ranks)
            whole = True
        q_cap = _capacity(left.size)
        pairs = np.full((q_cap, 4), NONE, dtype=np.uint32)
        if left.size:
            where = place(pair_hash(left, right), q_cap)
            pairs[where] = np.stack([left, right, prio, merged], axis=1)

        info_off = 256
        bytes_off = info_off + info.size
        piece_off = bytes_off + arena.size
        words = np.concatenate([byte_tok, info.astype(np.uint32), arena,
                                slots.reshape(-1)]).astype(np.uint32)
        stage1, stage2 = load_table(vocab.unicode_family).two_level()
        layout = {"info_off": info_off, "bytes_off": bytes_off, "piece_off": piece_off,
                  "piece_mask": p_cap - 1, "pair_mask": q_cap - 1, "n_table": n_table,
                  "max_tok_len": int(max(len(t) for t in o_bytes)),
                  "max_priority": int(prio.max()) if prio.size else 0}
        return cls(vocab_words=words, pairs=pairs.reshape(-1), classes=np.concatenate(
            [stage1, stage2]).astype(np.uint32), layout=layout, token_lengths=lengths,
            token_chars=chars, token_starts_mid_char=cont, whole_piece=whole,
            n_pairs=int(left.size))
