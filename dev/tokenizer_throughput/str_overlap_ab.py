#!/usr/bin/env python
"""Issue 50: does packing `str` documents group by group, each group's UTF-8 made on a second
thread while the group before it is encoded (Encoding._encode_overlapped), beat packing the
whole batch first? The host split of the H100 run (bench/results/h100/tokenize.md) has the
pack at 33 of a 66 ms call and ~10 ms of the calling thread waiting for the GPU.

    python dev/tokenizer_throughput/str_overlap_ab.py [--mb 32] [--vocab gpt2,cl100k_base]
                                                      [--rounds 7] [--groups 0,8,4]

For each vocabulary: the whole corpus of bench/tokenize_corpus.py as `str` objects no library
has seen (decoded from its bytes before each call), through `encode_batch_flat` with
PACK_GROUP_CHARS set per variant (0: one group, the batch packed first; N: N Mi characters per
group), the variants alternating call by call after a warm-up; median MB/s and min-max.
Every variant's ids and offsets are compared with the one-group call's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from bench import tokenize_corpus  # noqa: E402
import tokenizer_svc.encoding as encoding  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=32.0)
    ap.add_argument("--vocab", default="gpt2,cl100k_base")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--groups", default="0,8,4")
    args = ap.parse_args()
    raw = [d.encode() for d in tokenize_corpus.build_corpus(args.mb).docs_of("all")]
    mb = sum(map(len, raw)) / 1e6
    variants = {g: (1 << 62) if g == 0 else g << 20 for g in map(int, args.groups.split(","))}
    for vocab in args.vocab.split(","):
        enc = encoding.get_encoding(vocab)

        def call(g):
            encoding.PACK_GROUP_CHARS = variants[g]
            docs = [r.decode() for r in raw]
            start = time.perf_counter()
            out = enc.encode_batch_flat(docs)
            return time.perf_counter() - start, out

        _, want = call(0)
        for g in variants:
            _, got = call(g)
            if not (np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])):
                raise SystemExit(f"{vocab}: groups of {g} Mi characters give other ids")
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            call(0)
        secs = {g: [] for g in variants}
        for r in range(args.rounds):
            for g in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                secs[g].append(call(g)[0])
        for g, v in secs.items():
            rates = [mb / s for s in v]
            print(f"{vocab:<12} {mb:.1f} MB  groups of {g} Mi chars (0: one): "
                  f"{statistics.median(rates):7.0f} MB/s ({min(rates):.0f}-{max(rates):.0f})",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
