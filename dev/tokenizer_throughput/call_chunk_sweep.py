"""Which pre-tokenizer chunk (bytes per invocation) is fastest for a call of each size?

    python dev/tokenizer_throughput/call_chunk_sweep.py --out dev/tokenizer_throughput/results/call_chunk/h200 [--vocab V]

`Encoding.encode_batch_flat` of N x 64 KB documents (the Python standard library's sources,
the service benchmark's texts) for calls of 64 KB to 16 MB, at every chunk from 16 to 128
bytes (forced: GpuEncoder.fill_invocations = 0 and `chunk` set), p50 wall of R calls, next
to the chunk the encoder's own rule picks (FILL_INVOCATIONS). The shared GPU process of
`serve --workers N` makes calls of ~0.3-4 MB, between the lone document and the 64 MB
corpus the other probes measure. Writes OUT/call_chunk.md and .json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.service import default_vocab, load_corpus, make_texts  # noqa: E402

CHUNKS = (16, 32, 64, 128)
SIZES_KB = (64, 256, 1024, 4096, 16384)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--vocab", default=default_vocab())
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args(argv)
    from istanbul.shaders.engine import Device
    from tokenizer_svc.encoding import get_encoding
    device = Device(None)
    enc = get_encoding(args.vocab, device=device)
    encoder = enc.backend.encoder
    rule = {"fill_invocations": encoder.fill_invocations, "chunk": encoder.chunk}
    docs = make_texts(load_corpus(None), 65536, max(SIZES_KB) // 64, seed=1)
    rows = []
    for size_kb in SIZES_KB:
        batch = docs[:size_kb // 64]
        want = None
        picked = encoder.chunk_for(sum(len(d.encode()) for d in batch))
        row = {"call_kb": size_kb, "rule_chunk": picked, "p50_ms": {}}
        for c in CHUNKS:
            encoder.fill_invocations, encoder.chunk = 0, c
            got = enc.encode_batch_flat(batch)   # warm-up; the same ids at every chunk
            flat = got[0].tolist()
            want = want if want is not None else flat
            assert flat == want, f"ids differ at chunk {c}, {size_kb} KB"
            samples = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                enc.encode_batch_flat(batch)
                samples.append(time.perf_counter() - t)
            row["p50_ms"][c] = statistics.median(samples) * 1e3
        encoder.fill_invocations, encoder.chunk = rule["fill_invocations"], rule["chunk"]
        row["best_chunk"] = min(row["p50_ms"], key=row["p50_ms"].get)
        rows.append(row)
        print(row, flush=True)
    lines = [f"# Pre-tokenizer chunk by call size ({device.info.name})", "",
             f"`encode_batch_flat` of 64 KB documents, p50 of {args.repeats} calls, ms "
             f"(MB/s); the rule: FILL_INVOCATIONS = {rule['fill_invocations']}.", "",
             "| call | " + " | ".join(f"chunk {c}" for c in CHUNKS) + " | best | rule picks |",
             "|---:|" + "---:|" * len(CHUNKS) + "---:|---:|"]
    for r in rows:
        mb = r["call_kb"] / 1024
        cells = " | ".join(f"{r['p50_ms'][c]:.2f} ({mb / r['p50_ms'][c] * 1e3:,.0f})"
                           for c in CHUNKS)
        lines.append(f"| {r['call_kb']:,} KB | {cells} | {r['best_chunk']} | {r['rule_chunk']} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "call_chunk.md").write_text("\n".join(lines) + "\n")
    (args.out / "call_chunk.json").write_text(json.dumps(
        {"adapter": device.info.name, "rule": rule, "rows": rows}, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
