#!/usr/bin/env python
"""Issue 50: does a big `str` batch encode faster when the GPU encoder encodes its non-ASCII
texts chunk by chunk (LazyPackedText: each chunk's UTF-8 made while the GPU works on the chunk
before) than when the whole batch is encoded first (_pack_utf8)? The host split of the H100
run (bench/results/h100/tokenize.md) had the pack at 33 of a 66 ms call, the GPU idle
meanwhile.

    python dev/tokenizer_throughput/lazy_pack_ab.py [--mb 32] [--vocab gpt2,cl100k_base]
                        [--category all,adversarial] [--rounds 7] [--out FILE.json]

For each vocabulary and category: that part of the corpus of bench/tokenize_corpus.py ("all":
the whole of it) as `str` objects no library has seen (decoded from its bytes before each call, untimed), through `encode_batch_flat` with
LAZY_PACK_CHARS at its default ("lazy") and above the batch ("first"), alternating call by call
after a warm-up; median MB/s and min-max. Both variants' ids and offsets are compared.
"""

from __future__ import annotations

import argparse
import gc
import json
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
    ap.add_argument("--vocab", default="gpt2,cl100k_base,o200k_base")
    ap.add_argument("--category", default="all")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    corpus = tokenize_corpus.build_corpus(args.mb)
    variants = {"first": 1 << 62, "lazy": encoding.LAZY_PACK_CHARS}
    results = {"lazy_pack_chars": encoding.LAZY_PACK_CHARS, "rows": []}
    for vocab, category in ((v, c) for v in args.vocab.split(",")
                            for c in args.category.split(",")):
        enc = encoding.get_encoding(vocab)
        raw = [d.encode() for d in corpus.docs_of(category)]
        mb = sum(map(len, raw)) / 1e6

        def call(name):
            encoding.LAZY_PACK_CHARS = variants[name]
            docs = [r.decode() for r in raw]
            gc.collect()
            start = time.perf_counter()
            out = enc.encode_batch_flat(docs)
            return time.perf_counter() - start, out

        _, want = call("first")
        _, got = call("lazy")
        if not (np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])):
            raise SystemExit(f"{vocab} {category}: the lazy pack gives other ids")
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            call("first")
            call("lazy")
        secs = {name: [] for name in variants}
        for r in range(args.rounds):
            for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
                secs[name].append(call(name)[0])
        medians = {}
        for name, v in secs.items():
            rates = [mb / s for s in v]
            medians[name] = statistics.median(rates)
            results["rows"].append({"vocab": vocab, "category": category, "mb": mb,
                                    "documents": len(raw), "variant": name,
                                    "mb_s": medians[name], "min": min(rates), "max": max(rates)})
            print(f"{vocab:<12} {category:<13} {mb:5.1f} MB  {name:<5}: {medians[name]:7.0f} "
                  f"MB/s ({min(rates):.0f}-{max(rates):.0f})", flush=True)
        print(f"{vocab:<12} {category:<13} lazy / first: "
              f"{medians['lazy'] / medians['first']:.3f}x", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
