"""The CPU reference trainer: byte-level BPE written to be read (the contract is
istanbul.shaders.kernels.bpe_train.merges).

    result = train({b"hello": 3, b" world": 2}, n_tokens=300)
    result.merges[0]      # Merge(left=108, right=108, token=256, count=3): "l" + "l"

The loop is the textbook one: count every adjacent pair (weighted by piece count), take the
best, replace it in every piece, repeat. To stay usable on real corpora it keeps the counts
between merges instead of recounting: a merge only touches the pieces that hold its pair
(`where`), and for each such piece it subtracts all the piece's old pairs and adds all its
new ones. The best pair comes off a heap ordered by (-count, left, right); entries whose count
changed since they were pushed are skipped when popped.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict

from istanbul.shaders.kernels.bpe_train.merges import (N_BYTES, Merge, TrainingResult, exhausted,
                                                       merge_piece, tokens_from_merges)


def pairs(ids: list):
    return zip(ids, ids[1:])


def train(pieces: dict, n_tokens: int, max_token_bytes: int | None = None,
          n_specials: int = 0, progress=None) -> TrainingResult:
    """Learn merges until there are `n_tokens` ordinary tokens.

    pieces: {bytes: count}. progress: called as progress(merges_done, tokens) now and then.
    Raises CorpusExhausted when no pair is left first.
    """
    start = time.perf_counter()
    tokens = [bytes([b]) for b in range(N_BYTES)]

    def fits(pair) -> bool:
        return max_token_bytes is None or \
            len(tokens[pair[0]]) + len(tokens[pair[1]]) <= max_token_bytes

    words = [list(p) for p in pieces if len(p) >= 2]
    weights = [n for p, n in pieces.items() if len(p) >= 2]
    counts: dict = defaultdict(int)
    where: dict = defaultdict(set)  # pair -> pieces that hold (or once held) it
    for w, ids in enumerate(words):
        for pair in pairs(ids):
            if fits(pair):
                counts[pair] += weights[w]
                where[pair].add(w)
    heap = [(-c, a, b) for (a, b), c in counts.items()]
    heapq.heapify(heap)

    merges = []
    while len(tokens) < n_tokens:
        best = None
        while heap:
            neg, a, b = heapq.heappop(heap)
            if counts.get((a, b), 0) == -neg > 0:
                best = (a, b)
                break
        if best is None:
            raise exhausted(len(tokens), n_tokens, n_specials, max_token_bytes)
        a, b = best
        token = len(tokens)  # rule 5: always a new token (tokens_from_merges checks it)
        tokens.append(tokens[a] + tokens[b])
        merges.append(Merge(a, b, token, counts[best]))

        changed = set()
        for w in where.pop(best):
            old = words[w]
            new = merge_piece(old, a, b, token)
            if len(new) == len(old):
                continue  # a stale entry: this piece lost the pair to an earlier merge
            for pair in pairs(old):
                if fits(pair):
                    counts[pair] -= weights[w]
                    changed.add(pair)
            for pair in pairs(new):
                if fits(pair):
                    counts[pair] += weights[w]
                    where[pair].add(w)
                    changed.add(pair)
            words[w] = new
        assert counts[best] == 0, "a merge leaves no occurrence of its pair"
        for pair in changed:
            if counts[pair] > 0:
                heapq.heappush(heap, (-counts[pair], *pair))
            else:
                del counts[pair]
        if progress is not None and (len(merges) % 64 == 0 or len(tokens) == n_tokens):
            progress(len(merges), len(tokens))
    assert tokens == tokens_from_merges(merges)
    return TrainingResult(merges=merges, tokens=tokens, pieces=len(words),
                          seconds=time.perf_counter() - start)
