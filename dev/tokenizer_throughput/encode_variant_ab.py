"""One encoder variant on the benchmark corpus, for A/B runs in one device call (issue 19).

    python dev/tokenizer_throughput/encode_variant_ab.py --label NAME --out DIR [--code TREE] [--vocabs ...] [--mb 64]

Run once per variant, each in its own process: the code of another checkout (`--code`, e.g.
the commit before a change, put first on sys.path), the backend or Dawn's robustness (the
usual environment variables: ISTANBUL_BACKEND, ISTANBUL_DAWN_ROBUSTNESS). For each vocabulary,
on bench/tokenize_bench.py's corpus: median wall of GpuEncoder.encode_docs (MB/s), GPU ms
per phase of one profiled call, the median of calls of 64 KB and 1 MB of the corpus, and a
digest of the ids and offsets (variants must agree). Writes DIR/NAME.json; `--table DIR`
prints the markdown table of every JSON there.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def median_wall(fn, repeats: int, warm_s: float = 0.0) -> float:
    """The tokenize bench's median_of after a first call and warm_s seconds of calls (the
    GPU's clock rises from ~345 to 1980 MHz only after ~0.5-1 s of work: dev/RESULTS.md)."""
    from bench.tokenize_bench import median_of
    fn()
    return median_of(fn, repeats, warm_s)


def run(args) -> dict:
    import numpy as np
    from bench.tokenize_bench import build_corpus
    from istanbul.shaders.engine import Device
    from tokenizer_svc.encoding import _pack_utf8, get_encoding
    from tokenizer_svc.gpu_encode import GpuEncoder
    from tokenizer_svc import gpu_backend
    from dev.encode_phase_probe import doc_prefix
    device = Device(None, robustness=getattr(gpu_backend, "ROBUSTNESS", True))   # as the product
    docs, _ = build_corpus(args.mb)
    packed, starts = _pack_utf8(docs)
    out = {"label": args.label, "adapter": device.info.name, "backend": device.backend.name,
           "robustness": bool(getattr(device, "robustness", True)), "bytes": int(starts[-1]),
           "vocabs": {}}
    for name in args.vocabs.split(","):
        path = args.vocab_dir / f"{name}.tiktoken"
        enc = get_encoding(str(path) if path.is_file() else name, device=device)
        e = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern)
        ids, offsets = e.encode_docs(packed, starts)
        digest = hashlib.sha1(np.ascontiguousarray(ids).tobytes() +
                              np.asarray(offsets, np.int64).tobytes()).hexdigest()
        wall = median_wall(lambda: e.encode_docs(packed, starts), args.repeats, args.warm)
        row_trace = trace_call(e, packed, starts) if args.trace else None
        e.profile = True
        e.encode_docs(packed, starts)
        e.profile = False
        row = {"MBps": out["bytes"] / 1e6 / wall, "median_s": wall, "digest": digest,
               "gpu_ms": {k: round(v * 1e3, 3) for k, v in e.last_profile.gpu.items()}}
        if row_trace is not None:
            row["trace"] = row_trace
        for size in (64 << 10, 1 << 20):
            sub, sub_starts = doc_prefix(docs, size)
            row[f"call_{size >> 10}k_ms"] = 1e3 * median_wall(
                lambda: e.encode_docs(sub, sub_starts), max(9, 3 * args.repeats))
        out["vocabs"][name] = row
        print(args.label, name, json.dumps(row), flush=True)
        e.pool.release()
    return out


def trace_call(e, packed, starts) -> list:
    """One timed call's host timeline: (step, chunk, start ms, end ms) for each chunk's upload
    (_Chunk()), dispatch, wait (the GPU's work and the map) and collect (the ids' copy)."""
    from tokenizer_svc import gpu_encode as ge
    events, t0 = [], time.perf_counter()
    originals = {}

    def wrap(owner, name, label):
        fn = getattr(owner, name)
        originals[(owner, name)] = fn

        def timed(*a, **k):
            s = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                events.append((label, round((s - t0) * 1e3, 3),
                               round((time.perf_counter() - t0) * 1e3, 3)))
        setattr(owner, name, timed)

    wrap(ge._Chunk, "__init__", "upload")
    wrap(ge._Chunk, "dispatch", "dispatch")
    wrap(ge._Chunk, "wait", "wait")
    wrap(ge.GpuEncoder, "_collect_start", "collect start")
    wrap(ge.GpuEncoder, "_collect_finish", "collect finish")
    try:
        e.encode_docs(packed, starts)
        events.append(("total", 0.0, round((time.perf_counter() - t0) * 1e3, 3)))
    finally:
        for (owner, name), fn in originals.items():
            setattr(owner, name, fn)
    return events


def table(folder: Path) -> str:
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    lines = ["| variant | vocab | MB/s | pretok_merge | digit_cuts | cuts | merge_long_wg | "
             "64 KB call ms | 1 MB call ms | ids |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    first = {}
    for r in runs:
        for name, v in r["vocabs"].items():
            first.setdefault(name, v["digest"])
            g = v["gpu_ms"]
            lines.append(f"| {r['label']} | {name} | {v['MBps']:.0f} | "
                         f"{g.get('pretok_merge', 0):.1f} | {g.get('digit_cuts', 0):.2f} | "
                         f"{g.get('cuts', 0):.2f} | {g.get('merge_long_wg', 0):.1f} | "
                         f"{v['call_64k_ms']:.2f} | {v['call_1024k_ms']:.2f} | "
                         f"{'same' if v['digest'] == first[name] else 'DIFFERENT'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label")
    p.add_argument("--out", type=Path)
    p.add_argument("--code", type=Path, default=REPO, help="checkout whose code runs")
    p.add_argument("--vocabs", default="gpt2,cl100k_base,o200k_base")
    p.add_argument("--vocab-dir", type=Path,
                   default=Path(os.environ.get("ISTANBUL_VOCAB_DIR", REPO.parent / "shared" /
                                               "vocab")))
    p.add_argument("--mb", type=float, default=64.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warm", type=float, default=2.0, help="seconds of calls before timing")
    p.add_argument("--trace", action="store_true", help="record one call's host timeline")
    p.add_argument("--table", type=Path, help="print the table of the JSON files in this folder")
    args = p.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    sys.path.insert(0, str(args.code.resolve()))
    args.out.mkdir(parents=True, exist_ok=True)
    result = run(args)
    (args.out / f"{args.label}.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
