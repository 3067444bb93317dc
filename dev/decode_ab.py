"""Decode speed of one checkout's code on the tokenize bench's corpus, for old-vs-new runs in
one device call (issue 19).

    python dev/decode_ab.py --code DIR --label old --out OUT [--vocabs gpt2,...] [--mb 64]

The corpus is bench/tokenize_bench.py's (this checkout's builder, so both runs decode the
same documents); ids come from the code under test's encode_batch_flat. Per vocabulary:
decode_bytes_batch_flat(ids, offsets) median wall of --repeats passes after --warm seconds
of calls (the GPU's clock up), MB/s of text out, and whether every document came back
exact. Writes OUT/decode_<label>.json and prints one line per vocabulary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
        exact = enc.decode_bytes_batch_flat(ids, offsets) == want
        end = time.perf_counter() + args.warm
        while time.perf_counter() < end:
            enc.decode_bytes_batch_flat(ids, offsets)
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            enc.decode_bytes_batch_flat(ids, offsets)
            times.append(time.perf_counter() - t)
        s = statistics.median(times)
        row = {"exact": exact, "ids": int(ids.size), "median_s": s,
               "MBps": corpus["bytes"] / s / 1e6, "times_s": times}
        result["vocabs"][vocab] = row
        print(f"{args.label} {vocab}: decode {row['MBps']:.0f} MB/s ({s * 1e3:.1f} ms), "
              f"exact={exact}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"decode_{args.label}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
