"""The encoder's host path, variant by variant, in one process (issue 19): does a host change
pay on this machine, measured against the path it replaced, interleaved?

    python dev/tokenizer_throughput/encode_host_ab.py --out DIR [--vocab gpt2] [--mb 64] [--rounds 3]

Variants of `Encoding.encode_batch_flat(docs)` on bench/tokenize_bench.py's corpus (str
documents, as the bench gives them):
  default       ASCII texts encoded range by range inside the pipeline, chunks of >= 4 MB
                written through the slot's mappable buffer on several threads
  write_buffer  the same, text written with queue.write_buffer (one thread)
  eager_pack    every text encoded to UTF-8 before the first device call (as before)
Rounds alternate the variants; the median wall per variant and the ids' equality are
written to DIR/encode_host_ab.md and .json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.tokenize_bench import build_corpus  # noqa: E402


def eager_pack(texts):
    """The packing before session 10: every text encoded up front."""
    from tokenizer_svc.packed_text import PackedText
    try:
        parts = list(map(str.encode, texts))
    except UnicodeEncodeError:
        return None
    starts = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)), out=starts[1:])
    return PackedText(parts, starts), starts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--vocab", default="gpt2")
    p.add_argument("--mb", type=float, default=64.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    import tokenizer_svc.encoding as encoding
    from istanbul.shaders.engine import Device
    device = Device(None)
    enc = encoding.get_encoding(args.vocab, device=device)
    encoder = enc.backend.encoder
    docs, corpus = build_corpus(args.mb)
    nbytes = corpus["bytes"]
    shipped_pack, shipped_mapped = encoding._pack_utf8, encoder.mapped_text_bytes

    def configure(name):
        encoding._pack_utf8 = eager_pack if name == "eager_pack" else shipped_pack
        encoder.mapped_text_bytes = (1 << 62) if name == "write_buffer" else shipped_mapped

    variants = ("default", "write_buffer", "eager_pack")
    want = None
    walls = {v: [] for v in variants}
    same = {}
    for name in variants:   # warm-up and check
        configure(name)
        ids, offsets = enc.encode_batch_flat(docs)
        if want is None:
            want = (ids.copy(), offsets.copy())
        same[name] = bool(np.array_equal(ids, want[0]) and np.array_equal(offsets, want[1]))
    for _ in range(args.rounds):
        for name in variants:
            configure(name)
            t = time.perf_counter()
            enc.encode_batch_flat(docs)
            walls[name].append(time.perf_counter() - t)
    configure("default")
    rows = [{"variant": v, "median_s": statistics.median(walls[v]),
             "MBps": nbytes / 1e6 / statistics.median(walls[v]), "walls_s": walls[v],
             "ids_identical": same[v]} for v in variants]
    lines = [f"# Encoder host path A/B ({device.info.name}, {args.vocab}, "
             f"{nbytes / 1e6:.1f} MB, {len(docs)} str documents)", "",
             f"Median of {args.rounds} interleaved rounds of `encode_batch_flat(docs)`.", "",
             "| variant | median s | MB/s | ids identical |", "|---|---:|---:|---|"]
    lines += [f"| {r['variant']} | {r['median_s']:.4f} | {r['MBps']:.0f} | {r['ids_identical']} |"
              for r in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "encode_host_ab.md").write_text("\n".join(lines) + "\n")
    (args.out / "encode_host_ab.json").write_text(json.dumps(
        {"adapter": device.info.name, "vocab": args.vocab, "bytes": nbytes, "rows": rows},
        indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
