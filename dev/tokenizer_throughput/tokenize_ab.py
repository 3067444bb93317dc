"""Encode and decode speed of one checkout's code on the tokenize bench's corpus, for
old-vs-new runs in one device call (issue 19).

    python dev/tokenizer_throughput/tokenize_ab.py --code DIR --label old --out OUT [--vocabs gpt2,...] [--mb 64]

The corpus is bench/tokenize_bench.py's (this checkout's builder, so both runs see the same
documents). Per vocabulary, each timed as the median wall of --repeats passes after --warm
seconds of calls (the GPU's clock up): encode_batch_flat(docs), with a digest of its ids and
offsets (old and new must agree), and decode_bytes_batch_flat(ids, offsets), MB/s of text,
and whether every document came back exact. Writes OUT/tokenize_<label>.json and prints one
line per vocabulary. (Sessions 14-15 ran it as dev/decode_ab.py, decode only.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--code", type=Path, default=REPO)
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--vocabs", default="gpt2,cl100k_base,o200k_base")
    ap.add_argument("--vocab-dir", type=Path, default=REPO.parent / "shared" / "vocab")
    ap.add_argument("--mb", type=float, default=64.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warm", type=float, default=2.0)
    ap.add_argument("--pipeline-ids", type=int, default=None,
                    help="set the decoder's pipeline_ids (code that has one: ce913da)")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO))
    from bench.tokenize_bench import build_corpus
    docs, corpus = build_corpus(args.mb)
    for name in [m for m in list(sys.modules) if m.split(".")[0] in ("tokenizer_svc", "istanbul")]:
        del sys.modules[name]
    sys.path.insert(0, str(args.code.resolve()))
    from tokenizer_svc.encoding import get_encoding
    want = [d.encode() for d in docs]
    result = {"label": args.label, "code": str(args.code), "bytes": corpus["bytes"],
              "pipeline_ids": args.pipeline_ids, "vocabs": {}}
    for vocab in args.vocabs.split(","):
        enc = get_encoding(str(args.vocab_dir / f"{vocab}.tiktoken"))
        if args.pipeline_ids is not None:
            enc.backend.decoder.pipeline_ids = args.pipeline_ids
        ids, offsets = enc.encode_batch_flat(docs)
        digest = hashlib.sha256(np.ascontiguousarray(ids, np.uint32).tobytes() +
                                np.asarray(offsets, np.int64).tobytes()).hexdigest()[:16]
        exact = enc.decode_bytes_batch_flat(ids, offsets) == want
        row = {"exact": exact, "ids": int(ids.size), "ids_digest": digest}
        for what, run in (("encode", lambda: enc.encode_batch_flat(docs)),
                          ("decode", lambda: enc.decode_bytes_batch_flat(ids, offsets))):
            end = time.perf_counter() + args.warm
            while time.perf_counter() < end:
                run()
            times = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                run()
                times.append(time.perf_counter() - t)
            s = statistics.median(times)
            row[what] = {"median_s": s, "MBps": corpus["bytes"] / s / 1e6, "times_s": times}
        result["vocabs"][vocab] = row
        print(f"{args.label} {vocab}: encode {row['encode']['MBps']:.0f} MB/s "
              f"({row['encode']['median_s'] * 1e3:.1f} ms), decode {row['decode']['MBps']:.0f} "
              f"MB/s ({row['decode']['median_s'] * 1e3:.1f} ms), exact={exact}, "
              f"ids {digest}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"tokenize_{args.label}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
