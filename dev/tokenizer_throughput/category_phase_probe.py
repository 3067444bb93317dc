#!/usr/bin/env python
"""Issue 50: where does the encoder lose on some kinds of text, and why is `bytes` input slower
than `str` on a GPU when the two take the same path on lavapipe?

    python dev/tokenizer_throughput/category_phase_probe.py --out DIR [--mb 32]
                                      [--vocab gpt2,cl100k_base,o200k_base] [--repeats 5]

For each vocabulary and each category of bench/tokenize_corpus.py (and the whole corpus):
`Encoding.encode_batch_flat` on the `str` documents and on their UTF-8 `bytes`, alternated
(--repeats each, after a warm-up that brings the GPU to its clock), median MB/s; then one
profiled call of each (the encoder's `profile`: GPU timestamps per dispatch label, host upload
and readback walls; a profiled call waits for every submit, so its wall is above the timed
calls'), then a cProfile of one `str` and one `bytes` call of the whole corpus (top functions
by own time). Every result is compared with the `str` call's ids. Writes DIR/phases.json and
DIR/phases.md.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from bench import tokenize_corpus  # noqa: E402
from tokenizer_svc.encoding import get_encoding  # noqa: E402


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def profiled(enc, docs) -> dict:
    encoder = enc.backend.encoder
    encoder.profile = True
    try:
        wall = timed(lambda: enc.encode_batch_flat(docs))
    finally:
        encoder.profile = False
    prof = encoder.last_profile
    phases = {"upload": prof.upload_s, "readback": prof.readback_s,
              **{f"gpu:{k}": v for k, v in prof.gpu.items()}, "wall": wall}
    return {k: round(v * 1e3, 3) for k, v in phases.items()}


def top(fn, lines: int = 14) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(lines)
    text = out.getvalue()
    return text[text.find("   ncalls"):].rstrip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--mb", type=float, default=32.0)
    ap.add_argument("--vocab", default="gpt2,cl100k_base,o200k_base")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warm-s", type=float, default=1.0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = tokenize_corpus.build_corpus(args.mb)
    cats = list(corpus.names())
    result = {"mb": args.mb, "composition": corpus.composition, "vocabs": {}}
    md = [f"# Encoder by kind of text, str vs bytes ({args.mb:g} MB corpus)", ""]
    for vocab in args.vocab.split(","):
        enc = get_encoding(vocab)
        rows = {}
        for cat in cats:
            docs = corpus.docs_of(cat)
            raw = [d.encode() for d in docs]
            mb = sum(map(len, raw)) / 1e6
            want = enc.encode_batch_flat(docs)
            got = enc.encode_batch_flat(raw)
            exact = bool(np.array_equal(want[0], got[0]) and np.array_equal(want[1], got[1]))
            end = time.perf_counter() + args.warm_s
            while time.perf_counter() < end:
                enc.encode_batch_flat(docs)
            secs = {"str": [], "bytes": []}
            for r in range(args.repeats):
                order = (("str", docs), ("bytes", raw)) if r % 2 == 0 else \
                    (("bytes", raw), ("str", docs))
                for kind, batch in order:
                    secs[kind].append(timed(lambda: enc.encode_batch_flat(batch)))
            row = {"MB": mb, "documents": len(docs), "tokens": int(want[0].size),
                   "bytes_exact": exact,
                   **{f"{k} MB/s": mb / statistics.median(v) for k, v in secs.items()},
                   "seconds": secs,
                   "phases_str": profiled(enc, docs), "phases_bytes": profiled(enc, raw)}
            rows[cat] = row
            print(f"{vocab:<12} {cat:<13} {mb:6.1f} MB  str {row['str MB/s']:7.0f}  bytes "
                  f"{row['bytes MB/s']:7.0f} MB/s  exact {exact}  gpu:pretok_merge "
                  f"{row['phases_str'].get('gpu:pretok_merge', 0):.1f} ms", flush=True)
        docs = corpus.docs_of("all")
        raw = [d.encode() for d in docs]
        result["vocabs"][vocab] = {"categories": rows,
                                   "cprofile_str": top(lambda: enc.encode_batch_flat(docs)),
                                   "cprofile_bytes": top(lambda: enc.encode_batch_flat(raw))}
        labels = sorted({k for r in rows.values() for k in (*r["phases_str"], *r["phases_bytes"])},
                        key=lambda k: (k == "wall", k))
        md += [f"## {vocab}", "", "| | " + " | ".join(cats) + " |",
               "|---|" + "---:|" * len(cats)]
        md.append("| str MB/s | " + " | ".join(f"{rows[c]['str MB/s']:.0f}" for c in cats) + " |")
        md.append("| bytes MB/s | " + " | ".join(f"{rows[c]['bytes MB/s']:.0f}" for c in cats)
                  + " |")
        for kind in ("str", "bytes"):
            for lab in labels:
                md.append(f"| {kind} {lab} ms | " + " | ".join(
                    f"{rows[c][f'phases_{kind}'].get(lab, 0):.2f}" for c in cats) + " |")
        md += ["", "cProfile, whole corpus, str:", "```",
               result["vocabs"][vocab]["cprofile_str"], "```", "bytes:", "```",
               result["vocabs"][vocab]["cprofile_bytes"], "```", ""]
    (args.out / "phases.json").write_text(json.dumps(result, indent=1))
    (args.out / "phases.md").write_text("\n".join(md) + "\n")
    print(f"wrote {args.out}/phases.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
