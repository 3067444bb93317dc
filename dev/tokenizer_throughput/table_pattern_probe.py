"""Is o200k's short-piece cost its tables or its pattern? (issue 50)

    python dev/tokenizer_throughput/table_pattern_probe.py --out DIR [--mb 32] [--groups prose,code]

walk_merge_probe.py found the short pieces' lookups and merges take 5.81 ms of bpe_pretok's
6.54 per 8.4 MB of prose with o200k_base and 1.50 with gpt2, though tiktoken's pattern gives
o200k half gpt2's BPE work there. This crosses the two: the pre-tokenizer built with each
vocabulary's pattern over each vocabulary's tables (ids of a crossed pair are not any
vocabulary's: only the time means something), each also without the whole-piece lookup and
with its hash tables four times as large (load factor <= 1/8, so probe chains shorten and
the tables spread over 4x the memory). Each group of bench/tokenize_corpus.py's corpus is
one `bytes` batch through GpuEncoder.encode_docs; the GPU phases of one profiled call after
the median wall of R calls. Writes OUT/table_pattern.md and .json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import tokenize_corpus  # noqa: E402
from bench.tokenize_bench import median_of  # noqa: E402
from dev.tokenizer_throughput.walk_merge_probe import HOST_WORK_WARM_S, gpu_ms  # noqa: E402

VOCAB_PATTERN = {"gpt2": "gpt2", "o200k_base": "o200k", "cl100k_base": "cl100k"}


def tables_of(name: str, scale: int):
    """(the device, name's VocabTables with hash tables `scale` times the shipped capacity)."""
    from istanbul.shaders.kernels.bpe import tables as tables_mod
    from tokenizer_svc.encoding import get_encoding
    backend = get_encoding(name).backend
    if scale == 1:
        return backend.device, backend.tables
    shipped = tables_mod._capacity
    tables_mod._capacity = lambda n: scale * shipped(n)
    try:
        return backend.device, tables_mod.VocabTables.build(backend.vocab)
    finally:
        tables_mod._capacity = shipped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--mb", type=float, default=32.0)
    ap.add_argument("--vocab", default="gpt2,o200k_base")
    ap.add_argument("--groups", default="prose,code,multilingual")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from istanbul.shaders.kernels.bpe.encode import GpuEncoder
    from tokenizer_svc.encoding import _pack_utf8
    corpus = tokenize_corpus.build_corpus(args.mb)
    groups = {g: _pack_utf8(corpus.docs_of(g)) for g in args.groups.split(",")}
    vocabs = args.vocab.split(",")
    rows = []
    for tv in vocabs:
        for scale in (1, 4):
            device, tables = tables_of(tv, scale)
            for whole in ((True, False) if scale == 1 else (True,)):
                t = dataclasses.replace(tables, whole_piece=whole and tables.whole_piece)
                for pv in vocabs:
                    enc = GpuEncoder(device, t, VOCAB_PATTERN[pv])
                    warm_s = HOST_WORK_WARM_S
                    for g, (packed, starts) in groups.items():
                        nbytes = int(starts[-1])
                        wall = median_of(lambda: enc.encode_docs(packed, starts), args.repeats,
                                         warm_s=warm_s)
                        warm_s = 0.3
                        gpu = gpu_ms(enc, packed, starts)
                        row = {"tables": tv, "scale": scale, "whole": t.whole_piece,
                               "pattern": pv, "group": g, "bytes": nbytes,
                               "wall_MBps": round(nbytes / 1e6 / wall, 1), "gpu_ms": gpu,
                               "pair_cap": t.layout["pair_mask"] + 1,
                               "piece_cap": t.layout["piece_mask"] + 1}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                    enc.pool.release()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table_pattern.json").write_text(json.dumps(rows, indent=1))
    lines = ["# o200k's short-piece cost: tables x pattern (GPU ms of bpe_pretok)", "",
             "| tables | capacity | whole-piece lookup | pattern | " +
             " | ".join(args.groups.split(",")) + " |",
             "|---|---:|---|---|" + "---:|" * len(groups)]
    keyed = {}
    for r in rows:
        keyed.setdefault((r["tables"], r["scale"], r["whole"], r["pattern"]), {})[r["group"]] = r
    for (tv, scale, whole, pv), by_group in keyed.items():
        cells = [f"{by_group[g]['gpu_ms'].get('pretok_merge', float('nan')):.2f}" for g in groups]
        lines.append(f"| {tv} | x{scale} | {'on' if whole else 'off'} | {pv} | " +
                     " | ".join(cells) + " |")
    md = "\n".join(lines) + "\n"
    (args.out / "table_pattern.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
