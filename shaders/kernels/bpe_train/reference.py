"""Exact references of the vocabulary-training kernels (plain Python over the pieces).

    count:   the count of every byte pair (a, b) over all pieces, times each piece's count
    best:    the pair with the highest count; ties: lowest left id, then lowest right id
    merge:   every piece with (a, b) merged left to right into id n (merges.merge_piece, the
             contract's rule 4, as the CPU trainer does it), its new pairs counted (pairs
             longer than the token cap not counted)
    compact: the pieces that still hold a pair (length >= 2), in a canonical (sorted) order
    piece count: how often each distinct byte string occurs among the marked pieces of a text
             (pieces starting at or after `limit` are context, not counted), in sorted order
    piece store: the sum of several calls' counts per distinct piece, in sorted order
"""

from __future__ import annotations

import numpy as np

from .merges import merge_piece
from .trainer import NO_CAP


def count_reference(inp):
    total = np.zeros(65536, np.uint64)
    for piece, c in zip(inp["pieces"], inp["counts"]):
        for a, b in zip(piece[:-1], piece[1:]):
            total[int(a) * 256 + int(b)] += c
    return {"counts": total.astype(np.int64)}


def best_reference(inp):
    keys, counts = inp["keys"].astype(np.int64), inp["counts"]
    best = min(np.flatnonzero(counts),
               key=lambda k: (-int(counts[k]), int(keys[k, 0]), int(keys[k, 1])))
    return {"merge": np.array([keys[best, 0], keys[best, 1], int(counts[best])], np.int64)}


def fits(tok_len, cap, x, y):
    return cap == NO_CAP or int(tok_len[x]) + int(tok_len[y]) <= cap


def pair_table(pieces, counts, tok_len, cap) -> dict:
    table: dict = {}
    for piece, c in zip(pieces, counts):
        for x, y in zip(piece, piece[1:]):
            if fits(tok_len, cap, x, y):
                table[(x, y)] = table.get((x, y), 0) + int(c)
    return table


def dense_pairs(table: dict, n_ids: int) -> np.ndarray:
    """Pair counts as an (n_ids, n_ids) matrix (zero where a pair is absent)."""
    dense = np.zeros((n_ids, n_ids), np.int64)
    for (x, y), c in table.items():
        dense[x, y] += c
    return dense


def padded(pieces: list, width: int) -> np.ndarray:
    out = np.full((len(pieces), width), -1, np.int64)
    for i, p in enumerate(pieces):
        out[i, :len(p)] = p
    return out


def merge_reference(inp):
    new = [merge_piece(p, inp["a"], inp["b"], inp["n"]) for p in inp["pieces"]]
    table = pair_table(new, inp["counts"], inp["tok_len"], inp["cap"])
    width = max(len(p) for p in inp["pieces"])
    return {"tokens": padded(new, width), "lens": np.array([len(p) for p in new], np.int64),
            "pairs": dense_pairs(table, inp["n"] + 1)}


def compact_canonical(pieces, counts, rows: int, width: int):
    """Pieces as sorted rows [count, tokens..., -1 padding], padded to the input's shape."""
    found = sorted([int(c)] + [int(t) for t in p] for p, c in zip(pieces, counts))
    table = np.full((rows, width + 1), -2, np.int64)
    for i, r in enumerate(found[:rows]):
        table[i, :len(r)] = r
        table[i, len(r):] = -1
    return {"n": np.array([len(found)], np.int64), "pieces": table}


def compact_reference(inp):
    keep = [(p[:n], c) for p, n, c in zip(inp["pieces"], inp["cur_lens"], inp["counts"])
            if n >= 2]
    return compact_canonical([p for p, _ in keep], [c for _, c in keep],
                              len(inp["pieces"]), max(len(p) for p in inp["pieces"]))


def piece_counts(inp) -> dict:
    """{piece bytes: occurrences} of the pieces marked in inp["lens"] before inp["limit"]."""
    data, lens, found = inp["text"], inp["lens"], {}
    for i in np.flatnonzero(lens[: inp["limit"]] != NO_CAP).tolist():
        piece = data[i:i + int(lens[i])]
        found[piece] = found.get(piece, 0) + 1
    return found


def piece_count_reference(inp):
    found = piece_counts(inp)
    return {"counts": np.array([found[k] for k in sorted(found)], np.int64),
            "unique": np.array([len(found)], np.int64)}


def piece_store_reference(inp):
    """Sum of the calls' counts per distinct piece, in sorted order of the pieces."""
    total: dict = {}
    for call in inp["calls"]:
        for s, k, c in call.tolist():
            piece = inp["text"][s:s + k]
            total[piece] = total.get(piece, 0) + c
    keys = sorted(total)
    return {"counts": np.array([total[k] for k in keys], np.int64),
            "unique": np.array([len(keys)], np.int64), "keys": keys}
