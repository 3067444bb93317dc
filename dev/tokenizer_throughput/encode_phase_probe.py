"""The encoder's GPU phases on the benchmark corpus, with and without the workgroup merge of
long-piece windows, and the pre-tokenizer's walk alone (issue 19).

    python dev/tokenizer_throughput/encode_phase_probe.py --out DIR [--vocabs gpt2,cl100k_base,o200k_base] [--mb 64]

For each vocabulary, on bench/tokenize_bench.py's corpus:
  heap   long-piece windows heap-merged by one invocation each (bpe_merge_long, before)
  wg     windows of at most WG_LONG_MAX bytes merged by one workgroup each
         (bpe_merge_long_wg, the GPUs' default), the rest by the heap merge
  walk   bpe_pretok with MARK_PIECES = 1: the pieces found but not merged (ids meaningless;
         the GPU time of the pre-tokenizer's walk alone, so pretok_merge - walk is the
         short pieces' BPE)
  split  the pieces the walk found (their lengths, compacted: the walk's "ids") merged by
         bpe_merge_pieces, one invocation per piece (GpuEncoder.merge_pieces): is merging
         apart from walking cheaper than pretok_merge's both in one invocation? (ids compared)
Each: median wall of R calls, GPU ms per phase of one profiled call; the ids of heap and wg
compared (they must be identical). Then calls of 64 KB and 1 MB of the corpus (what the
service's batches are) and single pieces of 1 MB, heap vs wg. Writes OUT/encode_phases.md
and .json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.tokenize_bench import build_corpus, median_of as median_wall  # noqa: E402


def profiled(encoder, packed, starts) -> dict:
    encoder.profile = True
    encoder.encode_docs(packed, starts)
    encoder.profile = False
    prof = encoder.last_profile
    return {"gpu_ms": {k: round(v * 1e3, 3) for k, v in prof.gpu.items()},
            "long_windows": prof.long_windows, "long_retried": prof.long_retried,
            "slow_paths": prof.slow_paths}


def doc_prefix(docs: list[str], nbytes: int):
    """The corpus's first documents up to ~nbytes (at least one; the last one cut), packed."""
    from tokenizer_svc.encoding import _pack_utf8
    out, size = [], 0
    for d in docs:
        b = d.encode()
        out.append(b[:nbytes - size].decode(errors="ignore") if size + len(b) > nbytes else d)
        size += len(out[-1].encode())
        if size >= nbytes:
            break
    return _pack_utf8(out)


def probe_vocab(name: str, vocab_dir: Path, mb: float, repeats: int, device) -> dict:
    from tokenizer_svc.encoding import _pack_utf8, get_encoding
    from tokenizer_svc.gpu_encode import ENCODE_FILE, PATTERN_IDS, GpuEncoder
    path = vocab_dir / f"{name}.tiktoken"
    enc = get_encoding(str(path) if path.is_file() else name, device=device)
    tables, pattern = enc.backend.tables, enc.backend.gpu_pattern
    docs, _ = build_corpus(mb)
    packed, starts = _pack_utf8(docs)
    nbytes = int(starts[-1])
    heap = GpuEncoder(device, tables, pattern)
    heap.long_wg = False
    wg = GpuEncoder(device, tables, pattern)
    wg.long_wg = True
    out = {"vocab": name, "bytes": nbytes, "docs": len(docs), "wg_kernel": wg.k_long_wg is not None,
           "window": [wg.long_window, wg.long_overlap], "modes": {}}
    want = [a.copy() for a in heap.encode_docs(packed, starts)]
    got = wg.encode_docs(packed, starts)
    out["wg_ids_identical"] = bool(np.array_equal(got[0], want[0]) and
                                   np.array_equal(got[1], want[1]))
    print(name, "ids identical:", out["wg_ids_identical"], flush=True)
    for label, e in (("heap", heap), ("wg", wg)):
        wall = median_wall(lambda: e.encode_docs(packed, starts), repeats)
        out["modes"][label] = {"median_s": wall, "MBps": nbytes / 1e6 / wall,
                               **profiled(e, packed, starts)}
        print(name, label, json.dumps(out["modes"][label]), flush=True)
    walk = GpuEncoder(device, tables, pattern)
    walk.k_pretok = device.kernel(ENCODE_FILE, "bpe_pretok", {
        "PATTERN": PATTERN_IDS[pattern], "MARK_PIECES": 1,
        "LONG_WINDOW": walk.long_window, "LONG_OVERLAP": walk.long_overlap})
    lengths, _ = walk.encode_docs(packed, starts)
    out["modes"]["walk"] = profiled(walk, packed, starts)
    print(name, "walk", json.dumps(out["modes"]["walk"]), flush=True)
    # pieces tile every document and the documents tile the packed text: the pieces' starts
    # are the running sum of their lengths
    piece_starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    split = GpuEncoder(device, tables, pattern)
    got, _ = split.merge_pieces(packed, piece_starts)
    out["split_ids_identical"] = bool(np.array_equal(got, want[0]))
    wall = median_wall(lambda: split.merge_pieces(packed, piece_starts), repeats)
    split.profile = True
    split.merge_pieces(packed, piece_starts)
    split.profile = False
    out["modes"]["split"] = {"median_s": wall, "MBps": nbytes / 1e6 / wall, "pieces":
                             int(lengths.size), "gpu_ms": {k: round(v * 1e3, 3) for k, v in
                                                           split.last_profile.gpu.items()},
                             "long_windows": split.last_profile.long_windows}
    print(name, "split", out["split_ids_identical"], json.dumps(out["modes"]["split"]),
          flush=True)
    split.pool.release()
    calls = {}
    for size in (64 << 10, 1 << 20):
        sub, sub_starts = doc_prefix(docs, size)
        row = {"bytes": int(sub_starts[-1])}
        for label, e in (("heap", heap), ("wg", wg)):
            e.encode_docs(sub, sub_starts)
            row[label + "_ms"] = 1e3 * median_wall(lambda: e.encode_docs(sub, sub_starts),
                                                   max(5, 4 * repeats))
            row[label + "_gpu_ms"] = profiled(e, sub, sub_starts)["gpu_ms"]
        calls[str(size)] = row
        print(name, "call", json.dumps(row), flush=True)
    out["calls"] = calls
    singles = {}
    for kind, text in (("one letter", "x" * 1_000_000), ("CJK", ("日本語中文한국어" * 200_000)[:333_333]),
                       ("words", "tokenizer" * 111_111)):
        data = text.encode()
        st = np.array([0, len(data)], np.int64)
        row = {"bytes": len(data)}
        for label, e in (("heap", heap), ("wg", wg)):
            e.encode_docs(data, st)
            row[label + "_s"] = median_wall(lambda: e.encode_docs(data, st), 3)
        singles[kind] = row
        print(name, "single", kind, json.dumps(row), flush=True)
    out["singles"] = singles
    for e in (heap, wg, walk):
        e.pool.release()
    return out


def markdown(results: list[dict], adapter: str) -> str:
    lines = [f"# Encoder phases on the benchmark corpus ({adapter})", "",
             "heap: long-piece windows heap-merged by one invocation each (before); wg: by one "
             "workgroup each (bpe_merge_long_wg); walk: bpe_pretok finding pieces without "
             "merging them (MARK_PIECES 1). GPU ms of one profiled call; MB/s from the median "
             "wall.", ""]
    for r in results:
        if "error" in r:
            lines += [f"## {r['vocab']}: error {r['error']}", ""]
            continue
        m = r["modes"]
        lines += [f"## {r['vocab']} ({r['bytes'] / 1e6:.1f} MB, windows {r['window'][0]} "
                  f"(+{r['window'][1]}), ids of wg identical to heap: {r['wg_ids_identical']})", "",
                  "| mode | MB/s | pretok_merge | merge_pieces | merge_long_wg | merge_long | "
                  "stitch | long_copy | cuts | scan | compact | windows |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for label in ("heap", "wg", "walk", "split"):
            if label not in m:
                continue
            x = m[label]
            g = x["gpu_ms"]
            mbps = f"{x['MBps']:.0f}" if "MBps" in x else "-"
            lines.append(f"| {label} | {mbps} | {g.get('pretok_merge', 0):.1f} | "
                         f"{g.get('merge_pieces', 0):.1f} | "
                         f"{g.get('merge_long_wg', 0):.1f} | {g.get('merge_long', 0):.1f} | "
                         f"{g.get('stitch', 0):.1f} | {g.get('long_copy', 0):.1f} | "
                         f"{g.get('cuts', 0):.1f} | {g.get('scan', 0):.1f} | "
                         f"{g.get('compact', 0):.1f} | {x['long_windows']} |")
        if "split_ids_identical" in r:
            lines += ["", f"split: {m['split']['pieces']:,} pieces, ids identical to the "
                          f"one-pass encode: {r['split_ids_identical']}"]
        lines += ["", "| call | bytes | heap ms | wg ms |", "|---|---:|---:|---:|"]
        for size, c in r["calls"].items():
            lines.append(f"| {int(size) >> 10} KB of documents | {c['bytes']:,} | "
                         f"{c['heap_ms']:.2f} | {c['wg_ms']:.2f} |")
        for kind, c in r["singles"].items():
            lines.append(f"| single piece: {kind} | {c['bytes']:,} | {1e3 * c['heap_s']:.1f} | "
                         f"{1e3 * c['wg_s']:.1f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--vocabs", default="gpt2,cl100k_base,o200k_base")
    p.add_argument("--vocab-dir", type=Path, default=REPO.parent / "shared" / "vocab")
    p.add_argument("--mb", type=float, default=64.0)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    from istanbul.shaders.engine import Device
    device = Device(None)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.vocabs.split(","):
        try:
            results.append(probe_vocab(name, args.vocab_dir, args.mb, args.repeats, device))
        except Exception as exc:   # keep the other vocabularies' results
            results.append({"vocab": name, "error": f"{type(exc).__name__}: {exc}"})
            print(name, "error", exc, flush=True)
        (args.out / "encode_phases.json").write_text(json.dumps(
            {"adapter": device.info.name, "results": results}, indent=2) + "\n")
        (args.out / "encode_phases.md").write_text(markdown(results, device.info.name))
    print(markdown(results, device.info.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
