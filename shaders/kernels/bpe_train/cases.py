"""Ladder entries for bpe_train.wgsl (vocabulary training): pair count, best pair (merge_select,
then merge_apply deciding), merge (merge_apply from prepared partials, then merge_select
making the new pairs keys), compact;
for piece_count.wgsl (one chunk's unique pieces, counted on the device) and piece_store.wgsl
(the corpus's unique pieces, kept on the device from chunk to chunk).

Each case builds the device state the kernel expects (the layout of trainer.py), runs it, and
compares exactly against a slow numpy / Python reference written from the contract in
merges.py. Outputs that
the GPU may order freely (pair keys, compacted pieces) are put in a canonical order first.
Outputs have shapes fixed by the inputs (padded tables, dense pair-count matrices), so a
wrong kernel fails the comparison instead of breaking it. Every launch starts by copying
pristine inputs over the buffers the kernels change, so the benchmark rung times the same
work on every repetition.
"""

from __future__ import annotations

import numpy as np

from ...engine import fold_grid
from ...ladder import KernelCase, Launch, register
from .reference import (best_reference, compact_canonical, compact_reference, count_reference,
                        dense_pairs, merge_reference, padded, pair_table, piece_count_reference,
                        piece_counts, piece_store_reference)
from .piece_count import COUNT_FILE
from .piece_store import FILE as STORE_FILE, LONG_MIN
from .trainer import (  # the state layout the trainer uses
    FILE, NO_CAP, S_A, S_B, S_BUDGET, S_CAP, S_ERRORS, S_HASH_MASK, S_KEY_CAP, S_KEY_END,
    S_LIVE, S_MERGES, S_N, S_N_PIECES, S_N_POSITIONS, S_NEXT_ID, S_NUM_KEYS, S_PENDING,
    S_TARGET, S_WORDS, APPLY_TILE, SELECT_ITEMS, WG)

STATE_WORDS = {"a": S_A, "b": S_B, "budget": S_BUDGET, "cap": S_CAP, "hash_mask": S_HASH_MASK,
               "key_cap": S_KEY_CAP, "key_end": S_KEY_END, "live": S_LIVE, "n": S_N,
               "n_pieces": S_N_PIECES, "n_positions": S_N_POSITIONS, "next_id": S_NEXT_ID,
               "num_keys": S_NUM_KEYS, "target": S_TARGET}


def pair_hash(a: int, b: int) -> int:
    """bpe_train.wgsl's pair_hash in Python (u32 arithmetic)."""
    m = 0xFFFFFFFF
    h = ((a * 0x9E3779B1) & m) ^ (((b + 0x7F4A7C15) & m) * 0x85EBCA77 & m)
    h ^= h >> 16
    h = (h * 0x7FEB352D) & m
    h ^= h >> 15
    h = (h * 0x846CA68B) & m
    h ^= h >> 16
    return h


def split64(values) -> tuple[np.ndarray, np.ndarray]:
    v = np.asarray(values, dtype=np.uint64)
    return (v & np.uint64(0xFFFFFFFF)).astype(np.uint32), (v >> np.uint64(32)).astype(np.uint32)


def join64(lo, hi) -> np.ndarray:
    return np.asarray(lo, np.uint64) | (np.asarray(hi, np.uint64) << np.uint64(32))


def _piece_arrays(pieces: list, counts) -> dict:
    """Flat device layout of pieces (lists of token ids) with 64-bit counts."""
    lens = np.array([len(p) for p in pieces], dtype=np.int64)
    lo, hi = split64(counts)
    table = np.zeros((len(pieces), 4), np.uint32)
    table[:, 0] = np.concatenate([[0], np.cumsum(lens)[:-1]]) if len(pieces) else []
    table[:, 1] = lens
    table[:, 2], table[:, 3] = lo, hi
    tokens = (np.concatenate([np.asarray(p, np.uint32) for p in pieces]) if pieces
              else np.zeros(0, np.uint32))
    piece_of = np.repeat(np.arange(len(pieces), dtype=np.uint32), lens)
    return {"tokens": tokens, "piece_of": piece_of, "table": table}


def _state(**words) -> np.ndarray:
    state = np.zeros(S_WORDS, np.uint32)
    for name, value in words.items():
        state[STATE_WORDS[name]] = value
    return state


class _Pristine:
    """Device buffers restored from pristine copies at the start of every launch."""

    def __init__(self, dev):
        self.dev = dev
        self.pairs = []

    def buffer(self, array, label=""):
        work = self.dev.upload(array, label)
        self.pairs.append((self.dev.upload(array, label + " pristine"), work))
        return work

    def restore(self, rec):
        for src, dst in self.pairs:
            rec.copy(src, dst, src.nbytes)


# ---- pair count: the initial byte-pair counts ---------------------------------------------

COUNT_SIZES = {"random": (3000, 12), "runs": (400, 40), "bench": (1_000_000, 8)}


def _count_inputs(rng, variant):
    n, mean = COUNT_SIZES[variant]
    lens = np.maximum(1, rng.poisson(mean, n))
    if variant == "runs":  # runs of one byte and two-byte cycles: overlapping pairs
        pieces = [[int(rng.integers(256))] * int(k) if i % 2 else
                  [int(v) for v in np.resize(rng.integers(256, size=2), int(k))]
                  for i, k in enumerate(lens)]
    else:
        flat = rng.integers(0, 256, size=int(lens.sum()))
        pieces = np.split(flat, np.cumsum(lens)[:-1])
    counts = rng.integers(1, 1 << 20, size=n).astype(np.uint64)
    counts[::7] += np.uint64(0xFFFFFFF0)  # 64-bit sums: carries out of the low word
    return {"pieces": pieces, "counts": counts}


def _count_launch(dev, inp):
    arr = _piece_arrays(inp["pieces"], inp["counts"])
    n = arr["tokens"].size
    keep = _Pristine(dev)
    tokens, piece_of = dev.upload(arr["tokens"]), dev.upload(arr["piece_of"])
    pieces = dev.upload(arr["table"])
    state = dev.upload(_state(n_positions=n))
    counts = keep.buffer(np.zeros(2 * 65536, np.uint32), "counts")
    kern = dev.kernel(FILE, "count_pairs")

    def encode(rec):
        keep.restore(rec)
        rec.dispatch(kern, [tokens, piece_of, pieces, state, counts], max(1, -(-n // WG)))

    def read():
        c = dev.download(counts).reshape(-1, 2)
        return {"counts": join64(c[:, 0], c[:, 1]).astype(np.int64)}
    return Launch(encode, read)


register(KernelCase(
    name="bpe_train_pair_count", family="bpe_train", precision="exact",
    description="initial byte-pair counts, 64-bit atomics with carry",
    kernels=[(FILE, "count_pairs")], inputs=_count_inputs, launch=_count_launch,
    reference=count_reference, variants=("random", "runs"),
    bytes=lambda inp: sum(len(p) for p in inp["pieces"]) * 12.0))


# ---- a merge step: merge_select and merge_apply (one bind group layout) ---------------------

STEP_KERNELS = ["merge_select", "merge_apply", ("merge_apply", {"CONTINUE": 1})]

def _step_buffers(dev, keep, arr, n_pieces: int) -> dict:
    """The piece buffers of merge_select and merge_apply (restored per launch where the
    kernels write them)."""
    return {"piece_of": dev.upload(arr["piece_of"]),
            "tokens": keep.buffer(arr["tokens"], "tokens"),
            "pieces": keep.buffer(arr["table"], "pieces"),
            "stamps": keep.buffer(np.zeros(max(1, n_pieces), np.uint32), "stamps"),
            "resume": keep.buffer(np.zeros((2 * max(1, n_pieces), 4), np.uint32), "resume")}


STEP_BINDINGS = ("piece_of", "tokens", "pieces", "stamps", "resume", "keys", "counts", "slots",
                 "step", "tok_len", "merges", "partials", "seen", "state")


def _hash_keys(keys: np.ndarray, first: int, end: int, slots_n: int) -> np.ndarray:
    """The hash table of keys [first, end) as the kernels build it (linear probing)."""
    slots = np.zeros(slots_n, np.uint32)
    for k in range(first, end):
        h = pair_hash(int(keys[k, 0]), int(keys[k, 1])) & (slots_n - 1)
        while slots[h]:
            h = (h + 1) & (slots_n - 1)
        slots[h] = k + 1
    return slots


def _lookup(slots: np.ndarray, keys: np.ndarray, x: int, y: int) -> int:
    """Key index of pair (x, y) through the device's hash table, -1 if absent."""
    h = pair_hash(x, y) & (slots.size - 1)
    while slots[h]:
        k = int(slots[h]) - 1
        if keys[k, 0] == x and keys[k, 1] == y:
            return k
        h = (h + 1) & (slots.size - 1)
    return -1


# best pair: merge_select, then merge_apply over no positions (it only decides and records
# the merge)

BEST_SIZES = {"random": 20_000, "ties": 9000, "one": 70_000, "new": 20_000, "bench": 4_000_000}
# "new": the previous merge's new pairs wait in the key list, uncounted (select counts and
# hashes them in the same dispatch); the best pair is among them, tied with an older key
NEW_N = 50_000  # the previous merge's token in the "new" variant


def _best_inputs(rng, variant):
    n = BEST_SIZES[variant]
    keys = np.stack([rng.integers(0, 50_000, n), rng.integers(0, 50_000, n)], 1)
    keys = np.unique(keys, axis=0)
    keys = keys[rng.permutation(len(keys))].astype(np.uint32)
    if variant == "ties":  # one count everywhere: the ids decide
        counts = np.full(len(keys), 5 << 32 | 7, np.uint64)
    elif variant == "one":  # all zero but one, in the first block (partials row 0)
        counts = np.zeros(len(keys), np.uint64)
        counts[3] = 1
    else:
        counts = rng.integers(0, 1 << 40, len(keys)).astype(np.uint64)
        counts[rng.integers(len(keys), size=20)] = counts.max()  # ties at the top
        counts[rng.integers(len(keys), size=len(keys) // 3)] = 0
    inp = {"keys": keys, "counts": counts, "codes": np.zeros(0, np.uint32),
           "code_counts": np.zeros(0, np.uint64)}
    if variant == "new":  # codes 2x: (x, NEW_N); 2y + 1: (NEW_N, y); none is a key yet
        codes = rng.choice(2 * NEW_N, size=3000, replace=False).astype(np.uint32)
        code_counts = rng.integers(1, 1 << 40, codes.size).astype(np.uint64)
        code_counts[rng.integers(codes.size, size=5)] = counts.max()  # ties with old keys
        inp.update(codes=codes, code_counts=code_counts)
    return inp


def _code_pairs(codes) -> np.ndarray:
    c = np.asarray(codes, np.int64)
    return np.where((c & 1)[:, None] == 0, np.stack([c >> 1, np.full_like(c, NEW_N)], 1),
                    np.stack([np.full_like(c, NEW_N), c >> 1], 1))


def _best_with_new_pairs(inp):
    """best_reference over the keys and the new pairs (what select registers)."""
    return best_reference({"keys": np.concatenate([inp["keys"].astype(np.int64),
                                                   _code_pairs(inp["codes"])]),
                           "counts": np.concatenate([inp["counts"], inp["code_counts"]])})


def _best_launch(dev, inp):
    keys, codes = inp["keys"], inp["codes"]
    n = len(keys)
    key_cap = n + codes.size + 4 * 65536
    lo, hi = split64(inp["counts"])
    keep = _Pristine(dev)
    all_keys = np.zeros((key_cap, 2), np.uint32)
    all_keys[:n] = keys
    all_keys[n:n + codes.size] = _code_pairs(codes)  # listed by the last merge, not counted
    all_counts = np.zeros((key_cap, 2), np.uint32)
    all_counts[:n, 0], all_counts[:n, 1] = lo, hi
    # only registration writes counts, the step table and slots: restored per launch only
    # when there are new pairs (the benchmark rung times the selection, not copies)
    changed = keep.buffer if codes.size else (lambda array, label: dev.upload(array, label))
    step = np.zeros((2 * NEW_N + 2, 3), np.uint32)
    step[codes, 0], step[codes, 1] = split64(inp["code_counts"])
    step[codes, 2] = 1
    slots_n = 1 << int(2 * key_cap - 1).bit_length()
    state = _state(num_keys=n, key_end=n + codes.size, key_cap=key_cap, next_id=60_000,
                   target=65_000, hash_mask=slots_n - 1, n=NEW_N)
    # one piece for the buffers' shapes; n_positions = 0: apply only decides
    bufs = _step_buffers(dev, keep, _piece_arrays([[0, 0]], [1]), 1)
    bufs.update(keys=dev.upload(all_keys), counts=changed(all_counts.reshape(-1), "counts"),
                step=changed(step.reshape(-1), "step"),
                slots=changed(np.zeros(slots_n, np.uint32), "slots"),
                tok_len=dev.upload(np.ones(65536, np.uint32)), merges=dev.zeros((1, 4), np.uint32),
                partials=dev.zeros((-(-key_cap // SELECT_ITEMS), 4), np.uint32),
                seen=dev.zeros(S_WORDS, np.uint32), state=keep.buffer(state, "state"))
    select, apply, _ = dev.kernels_sharing_layout(FILE, STEP_KERNELS)
    resources = [bufs[name] for name in STEP_BINDINGS]

    def encode(rec):
        keep.restore(rec)
        rec.dispatch_sequence(resources, [(select, fold_grid(-(-key_cap // SELECT_ITEMS))),
                                          (apply, (2, 1, 1))])

    def read():
        st = dev.download(bufs["state"])
        m = dev.download(bufs["merges"])[0]
        if (st[S_NUM_KEYS] != n + codes.size or st[S_ERRORS] or st[S_MERGES] != 1
                or st[S_NEXT_ID] != 60_001 or (st[S_A], st[S_B]) != (m[0], m[1])):
            raise RuntimeError(f"apply left num_keys {st[S_NUM_KEYS]} (want {n + codes.size}), "
                               f"errors {st[S_ERRORS]}, merges {st[S_MERGES]} (want 1), "
                               f"next id {st[S_NEXT_ID]}, pair {st[S_A]}, {st[S_B]}")
        if codes.size:  # the new pairs: counted, hashed, and the step table cleared
            c = dev.download(bufs["counts"]).reshape(-1, 2)[n:n + codes.size]
            slots = dev.download(bufs["slots"])
            found = [_lookup(slots, all_keys, int(x), int(y))
                     for x, y in all_keys[n:n + codes.size]]
            if ((join64(c[:, 0], c[:, 1]) != inp["code_counts"]).any()
                    or found != list(range(n, n + codes.size)) or dev.download(bufs["step"]).any()):
                raise RuntimeError("select registered the new pairs wrongly (counts, hash "
                                   "table or step table)")
        return {"merge": np.array([m[0], m[1], int(join64(m[2], m[3]))], np.int64)}
    return Launch(encode, read)


register(KernelCase(
    name="bpe_train_best_pair", family="bpe_train", precision="exact",
    description="highest 64-bit count, then lowest left id, then lowest right id",
    kernels=[(FILE, "merge_select"), (FILE, "merge_apply")], inputs=_best_inputs,
    launch=_best_launch, reference=_best_with_new_pairs,
    variants=("random", "ties", "one", "new"),
    bytes=lambda inp: len(inp["keys"]) * 8.0))


# merge: merge_apply (the merge decided from prepared partials), CONTINUE passes, then
# merge_select making the new pairs keys

MERGE_SIZES = {"random": (2000, 10), "runs": (600, 30), "capped": (1500, 10),
               "budget": (300, 12), "bench": (200_000, 8)}
# "budget": a few 3,000-token runs rewritten 300 loop iterations at a time (the software-
# device path): apply saves cursors, CONTINUE passes resume them.
BUDGET_VARIANT = (300, 80)  # (iterations per pass, CONTINUE passes recorded)
MERGE_COUNT = 1 << 40  # the merged pair's count in the partials (the reference ignores it)


def _merge_inputs(rng, variant):
    n, mean = MERGE_SIZES[variant]
    vocab = 300  # ids 256..299 stand for earlier merges
    a, b = (97, 97) if variant in ("runs", "budget") else \
        (int(rng.integers(vocab)), int(rng.integers(vocab)))
    pieces = []
    for k in np.maximum(2, rng.poisson(mean, n)):
        if variant == "runs":  # "aaaa..." and "abab..." and mixtures: overlapping occurrences
            kind = rng.integers(3)
            unit = [a] if kind == 0 else [a, 98] if kind == 1 else [a, a, 99]
            pieces.append([int(v) for v in np.resize(unit, int(k))])
        else:
            p = list(rng.integers(0, vocab, size=int(k)))
            for j in range(0, int(k) - 1, int(rng.integers(2, 6))):
                p[j], p[j + 1] = a, b  # plenty of occurrences, some adjacent
            pieces.append([int(v) for v in p])
    if variant == "budget":
        pieces[::100] = [[a] * 3001, [a, 98] * 1500, [a, a, 99] * 1000][: len(pieces[::100])]
    counts = rng.integers(1, 1000, size=n).astype(np.uint64)
    counts[::5] += np.uint64(0xFFFFFF00)
    tok_len = np.ones(vocab + 1, np.uint32)
    tok_len[256:vocab] = rng.integers(2, 6, size=vocab - 256)
    cap = 7 if variant == "capped" else NO_CAP
    budget, passes = BUDGET_VARIANT if variant == "budget" else (NO_CAP, 0)
    return {"pieces": pieces, "counts": counts, "a": a, "b": b, "n": vocab,
            "tok_len": tok_len, "cap": cap, "budget": budget, "passes": passes,
            "best_row": BEST_ROW[variant]}


# where the best row sits among the partials apply reduces (the blocks that hold keys; select
# leaves the others empty): first, last, middle, second
BEST_ROW = {"random": 0, "runs": -1, "capped": None, "budget": 1, "bench": None}


def _merge_partials(rows: int, a: int, b: int, best_row, rng) -> np.ndarray:
    """Select's output as apply finds it: (a, b) the best, beside rows it must beat (the same
    count with a higher left or right id, lower counts) and empty ones."""
    lo, hi = split64([MERGE_COUNT])
    part = np.zeros((rows, 4), np.uint32)
    for r in range(rows):
        kind = r % 4
        if kind == 1:
            part[r] = (hi[0], lo[0], a + 1, 0)  # tied count, higher left id
        elif kind == 2:
            part[r] = (hi[0], lo[0], a, b + 1)  # tied count, same left id, higher right id
        elif kind == 3:
            part[r] = (0, int(rng.integers(1, 1 << 30)), 0, 0)  # a lower count, lowest ids
    part[rows // 2 if best_row is None else best_row] = (hi[0], lo[0], a, b)
    return part


def _merge_launch(dev, inp):
    arr = _piece_arrays(inp["pieces"], inp["counts"])
    n_pos, n_pieces = arr["tokens"].size, len(inp["pieces"])
    table = pair_table(inp["pieces"], inp["counts"], inp["tok_len"], inp["cap"])
    others = sorted(p for p in table if p[0] >= 256 or p[1] >= 256)
    n_keys = 65536 + len(others)
    key_cap = n_keys + 4 * (inp["n"] + 1) + 16
    keys = np.zeros((key_cap, 2), np.uint32)
    keys[:65536, 0], keys[:65536, 1] = np.arange(65536) >> 8, np.arange(65536) & 255
    keys[65536:n_keys] = np.array(others, np.uint32).reshape(-1, 2)
    counts = np.zeros(2 * key_cap, np.uint32)
    slots_n = 1 << int(2 * key_cap - 1).bit_length()
    for (x, y), c in table.items():
        k = x * 256 + y if x < 256 and y < 256 else 65536 + others.index((x, y))
        counts[2 * k], counts[2 * k + 1] = c & 0xFFFFFFFF, c >> 32
    codes = 2 * (inp["n"] + 1) + 2
    # the state as select saw it: running, nothing pending, merge 0 makes token n
    state = _state(n_positions=n_pos, n_pieces=n_pieces, live=n_pos, next_id=inp["n"],
                   target=inp["n"] + 10, cap=inp["cap"], num_keys=n_keys, key_end=n_keys,
                   key_cap=key_cap, hash_mask=slots_n - 1, budget=inp["budget"])
    keep = _Pristine(dev)
    rows = -(-key_cap // SELECT_ITEMS)
    used = -(-n_keys // SELECT_ITEMS)  # blocks holding keys: the partials apply reads
    bufs = _step_buffers(dev, keep, arr, n_pieces)
    bufs.update(keys=keep.buffer(keys, "keys"), counts=keep.buffer(counts, "counts"),
                slots=keep.buffer(_hash_keys(keys, 65536, n_keys, slots_n), "slots"),
                step=keep.buffer(np.zeros(3 * codes, np.uint32), "step"),
                tok_len=keep.buffer(inp["tok_len"], "tok_len"),
                merges=dev.zeros((1, 4), np.uint32),
                partials=keep.buffer(np.concatenate([
                    _merge_partials(used, inp["a"], inp["b"], inp["best_row"],
                                    np.random.default_rng(5)),
                    np.zeros((rows - used, 4), np.uint32)]), "partials"),
                seen=keep.buffer(state, "seen"), state=keep.buffer(state, "state"))
    select, apply, more = dev.kernels_sharing_layout(FILE, STEP_KERNELS)
    resources = [bufs[name] for name in STEP_BINDINGS]

    def encode(rec):
        keep.restore(rec)
        rec.dispatch_sequence(resources, [(apply, fold_grid(-(-n_pos // APPLY_TILE)))]
                              + [(more, fold_grid(-(-n_pieces // WG)))] * inp["passes"]
                              + [(select, fold_grid(rows))])  # the new pairs become keys

    def read():
        st = dev.download(bufs["state"])
        if st[S_ERRORS] or st[S_PENDING]:
            raise RuntimeError(f"kernel error flags {st[S_ERRORS]}, {st[S_PENDING]} pieces "
                               "left unfinished")
        m = dev.download(bufs["merges"])[0]
        if (st[S_MERGES] != 1 or (m[0], m[1]) != (inp["a"], inp["b"])
                or int(join64(m[2], m[3])) != MERGE_COUNT):
            raise RuntimeError(f"apply merged ({m[0]}, {m[1]}) count {join64(m[2], m[3])}, "
                               f"not the partials' best ({inp['a']}, {inp['b']}) {MERGE_COUNT}")
        table_out = dev.download(bufs["pieces"])
        toks = dev.download(bufs["tokens"])
        new = [toks[s:s + min(n, len(p))] for (s, n, _, _), p in zip(table_out, inp["pieces"])]
        kk = dev.download(bufs["keys"])[: min(st[S_KEY_END], key_cap)]
        cc = dev.download(bufs["counts"]).reshape(-1, 2)[: len(kk)]
        gpu_table = {}
        for (x, y), (lo, hi) in zip(kk.tolist(), cc.tolist()):
            if (lo or hi) and max(x, y) <= inp["n"]:
                gpu_table[(x, y)] = gpu_table.get((x, y), 0) + (lo | hi << 32)
        return {"tokens": padded(new, max(len(p) for p in inp["pieces"])),
                "lens": table_out[:, 1].astype(np.int64),
                "pairs": dense_pairs(gpu_table, inp["n"] + 1)}
    return Launch(encode, read)


register(KernelCase(
    name="bpe_train_merge", family="bpe_train", precision="exact",
    description="decide the merge from the partials, apply it to every piece (overlapping "
                "runs), update pair counts, make the new pairs keys",
    inputs=_merge_inputs,
    kernels=[(FILE, "merge_apply"), (FILE, "merge_apply", {"CONTINUE": 1}),
             (FILE, "merge_select")],
    launch=_merge_launch, reference=merge_reference,
    variants=("random", "runs", "capped", "budget"),
    bytes=lambda inp: sum(len(p) for p in inp["pieces"]) * 8.0))


# ---- compact: compact + compact_finish ------------------------------------------------------

COMPACT_SIZES = {"random": 5000, "all_dead": 300, "bench": 1_000_000}


def _compact_inputs(rng, variant):
    n = COMPACT_SIZES[variant]
    full = [list(rng.integers(0, 5000, size=int(k))) for k in np.maximum(2, rng.poisson(6, n))]
    cur = rng.integers(0, 4, size=n) if variant != "all_dead" else rng.integers(0, 2, size=n)
    counts = rng.integers(1, 1 << 40, size=n).astype(np.uint64)
    return {"pieces": full, "cur_lens": np.minimum(cur * 3, [len(p) for p in full]),
            "counts": counts}


def _compact_launch(dev, inp):
    arr = _piece_arrays(inp["pieces"], inp["counts"])
    arr["table"][:, 1] = inp["cur_lens"]  # pieces shrunk by merges: stale tails behind them
    n_pos, n_pieces = arr["tokens"].size, len(inp["pieces"])
    keep = _Pristine(dev)
    tokens, pieces = dev.upload(arr["tokens"]), dev.upload(arr["table"])
    piece_of = dev.upload(arr["piece_of"])
    out_tokens = dev.zeros(n_pos, np.uint32)
    out_piece_of = dev.zeros(n_pos, np.uint32)
    out_pieces = dev.zeros((n_pieces, 4), np.uint32)
    moved = dev.zeros((n_pieces, 2), np.uint32)
    out_stamps = keep.buffer(np.full(n_pieces, 7, np.uint32), "stamps")
    state = keep.buffer(_state(n_pieces=n_pieces, n_positions=n_pos), "state")
    k1, k2, k3 = (dev.kernel(FILE, k) for k in ("compact", "compact_tokens", "compact_finish"))

    def encode(rec):
        keep.restore(rec)
        rec.dispatch(k1, [pieces, out_pieces, out_stamps, moved, state],
                     max(1, -(-n_pieces // WG)))
        rec.dispatch(k2, [tokens, piece_of, pieces, moved, state, out_tokens, out_piece_of],
                     max(1, -(-n_pos // WG)))
        rec.dispatch(k3, [state], 1)

    def read():
        st = dev.download(state)
        n = min(int(st[S_N_PIECES]), n_pieces)
        table = dev.download(out_pieces)[:n]
        toks, owner = dev.download(out_tokens), dev.download(out_piece_of)
        stamps = dev.download(out_stamps)[:n]
        if st[S_N_POSITIONS] != table[:, 1].sum() or stamps.any():
            raise RuntimeError("compacted sizes or stamps are wrong")
        for q, (s, ln, _, _) in enumerate(table):
            if (owner[s:s + ln] != q).any():
                raise RuntimeError(f"piece_of wrong for compacted piece {q}")
        out = compact_canonical([toks[s:s + ln] for s, ln, _, _ in table],
                                 join64(table[:, 2], table[:, 3]), n_pieces,
                                 max(len(p) for p in inp["pieces"]))
        out["n"] = np.array([int(st[S_N_PIECES])], np.int64)
        return out
    return Launch(encode, read)


register(KernelCase(
    name="bpe_train_compact", family="bpe_train", precision="exact",
    description="drop pieces shorter than two tokens, densely, into the other buffer set",
    kernels=[(FILE, "compact"), (FILE, "compact_tokens"), (FILE, "compact_finish")],
    inputs=_compact_inputs,
    launch=_compact_launch, reference=compact_reference, variants=("random", "all_dead"),
    bytes=lambda inp: sum(len(p) for p in inp["pieces"]) * 12.0))


# ---- piece count: count_pieces + list_pieces (piece_count.wgsl) ----------------------------

# (text bytes, alphabet size, mean piece length, table slots or None for the driver's size)
PIECE_SIZES = {"random": (60_000, 3, 4, None), "long": (40_000, 2, 300, None),
               "crowded": (30_000, 2, 6, 2048), "bench": (32 << 20, 26, 5, None)}


def _piece_inputs(rng, variant):
    n, alphabet, mean, slots = PIECE_SIZES[variant]
    text = rng.integers(97, 97 + alphabet, size=n).astype(np.uint8)
    lens = np.maximum(1, rng.poisson(mean, n // 2))
    if variant == "long":  # pieces past LONG_MIN go to the host list; identical long runs
        lens[::5] = LONG_MIN + 1 + rng.integers(0, 2, size=lens[::5].size)
        text[:] = 97
    ends = np.cumsum(lens)
    starts = np.concatenate([[0], ends[:-1]])[ends <= n]
    marks = np.full(n, NO_CAP, np.uint32)
    marks[starts] = lens[: starts.size]
    if slots is None:
        slots = 1 << max(0, int(n // 2 + 1024 - 1).bit_length())
    return {"text": text.tobytes(), "lens": marks, "limit": int(n - n // 10), "slots": slots}


def _piece_launch(dev, inp):
    data, n, slots = inp["text"], len(inp["text"]), inp["slots"]
    words = np.zeros(-(-n // 4) * 4, np.uint8)
    words[:n] = np.frombuffer(data, np.uint8)
    keep = _Pristine(dev)
    text, lens = dev.upload(words.view(np.uint32)), dev.upload(inp["lens"])
    table = keep.buffer(np.zeros(slots, np.uint32), "slots")
    counts = keep.buffer(np.zeros(slots, np.uint32), "counts")
    info = keep.buffer(np.zeros(4, np.uint32), "info")
    out = dev.zeros(3 * slots, np.uint32)
    longs = dev.zeros((n // (LONG_MIN + 1) + 1, 2), np.uint32)
    params = dev.params("IIII", inp["limit"], slots - 1, slots, 0)
    k_count, k_list = dev.kernel(COUNT_FILE, "count_pieces"), dev.kernel(COUNT_FILE, "list_pieces")

    def encode(rec):
        keep.restore(rec)
        binds = [text, lens, table, counts, out, longs, info, params]
        rec.dispatch(k_count, binds, max(1, -(-n // 64)))
        rec.dispatch(k_list, binds, max(1, -(-slots // 64)))

    def read():
        found = dev.download(info)
        if found[1]:
            raise RuntimeError("the piece table reported itself full")
        got: dict = {}
        rows = dev.download(out)[: 3 * int(found[0])].reshape(-1, 3)
        for s, k, c in rows.tolist():
            got[data[s:s + k]] = got.get(data[s:s + k], 0) + c
        for s, k in dev.download(longs)[: int(found[2])].tolist():
            got[data[s:s + k]] = got.get(data[s:s + k], 0) + 1
        want = piece_counts(inp)  # the same keys in the same order, zeros where missing
        long_pieces = {data[s:s + k] for s, k in dev.download(longs)[: int(found[2])].tolist()}
        # one slot per distinct piece: a piece split over two slots shows here
        return {"counts": np.array([got.get(k, 0) for k in sorted(want)], np.int64),
                "unique": np.array([len(rows) + len(long_pieces)], np.int64)}
    return Launch(encode, read)


register(KernelCase(
    name="bpe_train_piece_count", family="bpe_train", precision="exact",
    description="unique pre-tokenized pieces counted in a hash table (bytes compared, exact)",
    kernels=[(COUNT_FILE, "count_pieces"), (COUNT_FILE, "list_pieces")],
    inputs=_piece_inputs, launch=_piece_launch, reference=piece_count_reference,
    variants=("random", "long", "crowded"), bench_variant_software="random",
    bytes=lambda inp: len(inp["text"]) * 9.0))


# ---- piece store: store_begin + store_pieces (piece_store.wgsl) ----------------------------

# (text bytes, alphabet size, mean piece length, pieces per call)
STORE_SIZES = {"random": (40_000, 3, 4, 3000), "bench": (8 << 20, 26, 5, 200_000)}


def _store_inputs(rng, variant):
    """A text and two calls' lists of distinct pieces (start, length, count) into it; the
    calls overlap (the second adds to pieces the first stored) and counts near 2^32 carry."""
    n, alphabet, mean, per_call = STORE_SIZES[variant]
    text = rng.integers(97, 97 + alphabet, size=n).astype(np.uint8)
    calls = []
    for _ in range(2):
        seen, rows = set(), []
        while len(rows) < per_call:
            k = int(max(1, rng.poisson(mean)))
            s = int(rng.integers(0, n - k))
            piece = text[s:s + k].tobytes()
            if piece not in seen:  # one call's pieces are distinct, as list_pieces gives them
                seen.add(piece)
                rows.append((s, k, int(rng.integers(1, 1 << 31)) + (1 << 31)))
        calls.append(np.array(rows, np.uint32))
    return {"text": text.tobytes(), "calls": calls}


def _store_launch(dev, inp):
    data, calls = inp["text"], inp["calls"]
    words = np.zeros(-(-len(data) // 4) * 4, np.uint8)
    words[:len(data)] = np.frombuffer(data, np.uint8)
    records = sum(len(c) for c in calls)
    slots_n = 1 << int(2 * records - 1).bit_length()
    keep = _Pristine(dev)
    text = dev.upload(words.view(np.uint32))
    found = [dev.upload(c.reshape(-1)) for c in calls]
    slots = keep.buffer(np.zeros(slots_n, np.uint32), "slots")
    recs = keep.buffer(np.zeros(2 * records, np.uint32), "records")
    counts = keep.buffer(np.zeros(2 * records, np.uint32), "counts")
    arena = keep.buffer(np.zeros(len(data) // 2 + 2 * records, np.uint32), "arena")
    info = keep.buffer(np.zeros(4, np.uint32), "info")
    params = [dev.params("IIII", len(c), slots_n - 1, 0, 0) for c in calls]
    k_begin = dev.kernel(STORE_FILE, "store_begin")
    k_store = dev.kernel(STORE_FILE, "store_pieces")

    def encode(rec):
        keep.restore(rec)
        for f, p, c in zip(found, params, calls):
            rec.dispatch(k_begin, [info], 1)
            rec.dispatch(k_store, [text, f, slots, recs, counts, arena, info, p],
                         max(1, -(-len(c) // 64)))

    def read():
        used = int(dev.download(info)[0])
        rows = dev.download(recs).reshape(-1, 2)[:used]
        c = dev.download(counts).reshape(-1, 2)[:used]
        mem = dev.download(arena).tobytes()
        got = {}
        for (w, k), (lo, hi) in zip(rows.tolist(), c.tolist()):
            if k:
                piece = mem[4 * w:4 * w + k]
                if piece in got:
                    raise RuntimeError(f"piece {piece!r} stored twice")
                got[piece] = lo | hi << 32
        want = piece_store_reference(inp)["keys"]
        return {"counts": np.array([got.get(k, 0) for k in want], np.int64),
                "unique": np.array([len(got)], np.int64)}
    return Launch(encode, read)


def _store_reference(inp):
    out = piece_store_reference(inp)
    del out["keys"]
    return out


register(KernelCase(
    name="bpe_train_piece_store", family="bpe_train", precision="exact",
    description="the corpus's unique pieces kept on the device across calls (bytes compared, "
                "64-bit counts)",
    kernels=[("piece_store.wgsl", "store_begin"), ("piece_store.wgsl", "store_pieces")],
    inputs=_store_inputs, launch=_store_launch, reference=_store_reference,
    variants=("random",), bench_variant_software="random",
    bytes=lambda inp: sum(len(c) for c in inp["calls"]) * 24.0))
