#!/usr/bin/env python
"""Where the tokenizer's host time goes: a lone ~1 KB document, a corpus through
`Encoding.encode_batch_flat`, and decoding the corpus's ids (`decode_bytes_batch`).

    python dev/tokenizer_throughput/tokenize_host_probe.py --out dev/results/tokenize_host [--mb 16]
                                      [--vocab cl100k_base] [--lone-calls 200] [--cprofile 25]
                                      [--chunks 128,64,32,16] [--pipeline-mb 16] [--repeats 1]

(a2) is the same over documents of 100 different lengths (a service's traffic: a new size
per request). For each case: the host split of bench/host_split.py (per step: calls, wall ms, the calling
thread's own CPU ms; lavapipe's GPU work runs in driver threads, so wall - own CPU is
waiting), then cProfile's top functions by tottime. The lone document is timed over
--lone-calls calls (p50, and the split divided by the calls); the corpus (bench/
tokenize_bench.py's build_corpus, --mb MB) and its decode once each after a warm-up; (b2) the
corpus encode by pipeline chunk size (--pipeline-mb, median of --repeats); (b3) by
pre-tokenizer chunk size (--corpus-chunks: bytes per invocation); (d) the
lone document through encoders of other pre-tokenizer chunk sizes (p50 and GPU timestamps per
kernel: does a small input's latency fall with shorter chunks on a real GPU?); (e) a lone
document with one long piece, its long-piece merge in the one submit or on the slow path
(GPUs only: software devices always take the slow path); (f) single long pieces (--piece-mb
each: one letter, CJK without spaces, random letters) by long-piece window (--windows). Every
result is checked against tiktoken (ids) and the corpus (bytes). Writes DIR/host_probe.md and
DIR/host_probe.json.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.host_split import HostSplit  # noqa: E402
from bench.tokenize_bench import build_corpus, tiktoken_encoding  # noqa: E402


def top_tottime(fn, lines: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(lines)
    text = out.getvalue()
    return text[text.find("   ncalls"):].rstrip()


def wall_times(call, n: int) -> list[float]:
    """Seconds of each of n calls of `call()`."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--mb", type=float, default=16.0)
    parser.add_argument("--vocab", default="cl100k_base")
    parser.add_argument("--lone-calls", type=int, default=200)
    parser.add_argument("--cprofile", type=int, default=25, help="functions listed per case")
    parser.add_argument("--label", default="", help="a note for the tables (e.g. before/after)")
    parser.add_argument("--pipeline-mb", default="16",
                        help="pipeline chunk sizes in MB for the corpus encode (case b2; "
                             "default 16, the encoder's own)")
    parser.add_argument("--repeats", type=int, default=1, help="timed passes per size in b2")
    parser.add_argument("--windows", default="1024,1536,2304,5760",
                        help="long-piece window sizes in bytes (case f; the shipped overlap)")
    parser.add_argument("--piece-mb", type=float, default=1.0,
                        help="size of each single long piece in case f")
    parser.add_argument("--corpus-chunks", default="32,64,128,256",
                        help="pre-tokenizer chunk sizes for the corpus encode (case b3)")
    parser.add_argument("--corpus-windows", default="768/192",
                        help="long-piece window/overlap pairs also run in case b3 (chunk 128)")
    parser.add_argument("--chunks", default="128,64,32,16",
                        help="pre-tokenizer chunk sizes for the lone document (case d)")
    args = parser.parse_args(argv)
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

    from istanbul.shaders.engine import default_device
    from tokenizer_svc.encoding import _pack_utf8, get_encoding
    from tokenizer_svc.gpu_encode import LONG_OVERLAP, LONG_WINDOW, GpuEncoder
    from tokenizer_svc.vocab import load_vocabulary

    device = default_device()
    vocab_dir = Path(os.environ.get("ISTANBUL_SHARED_VOCAB", REPO.parent / "shared" / "vocab"))
    path = vocab_dir / f"{args.vocab}.tiktoken"
    vocab = load_vocabulary(path if path.is_file() else args.vocab)
    enc = get_encoding(vocab, device=device)
    tik = tiktoken_encoding(vocab)
    result = {"device": device.name, "vocab": args.vocab, "label": args.label, "cases": {}}
    md = [f"# Tokenizer host split — {device.name}, {args.vocab} {args.label}", ""]

    # (a) a lone ~1 KB document
    docs, corpus = build_corpus(args.mb)
    lone = next((d for d in docs if 900 <= len(d.encode()) <= 1100 and d.isascii()), None) or \
        next(d for d in docs if len(d) > 1100 and d.isascii() and len(set(d[:1000])) > 30)[:1000]
    assert enc.encode_ordinary(lone) == tik.encode_ordinary(lone)
    for _ in range(10):
        enc.encode_ordinary(lone)
    times = []
    with HostSplit() as split:
        for _ in range(args.lone_calls):
            t0 = time.perf_counter()
            enc.encode_ordinary(lone)
            times.append(time.perf_counter() - t0)
    p50 = float(np.percentile(times, 50)) * 1e3
    prof = top_tottime(lambda: [enc.encode_ordinary(lone) for _ in range(args.lone_calls)],
                       args.cprofile)
    result["cases"]["lone"] = {"bytes": len(lone.encode()), "p50_ms": p50,
                               "p99_ms": float(np.percentile(times, 99)) * 1e3,
                               "split_per_call": {k: v for k, v in split.as_dict().items()},
                               "calls": args.lone_calls, "cprofile": prof}
    md += [f"## (a) lone {len(lone.encode())} B document: p50 {p50:.3f} ms "
           f"(split per call, {args.lone_calls} calls)", "", split.table(args.lone_calls), "",
           f"cProfile of {args.lone_calls} calls, by tottime:", "", "```", prof, "```", ""]
    print("\n".join(md[-8 - prof.count("\n"):]), flush=True)

    # (a2) lone documents of different sizes (a service's traffic: every request a new n)
    varied = [lone[:900 + (37 * k) % 100] for k in range(args.lone_calls)]
    for d in varied[:3]:
        assert enc.encode_ordinary(d) == tik.encode_ordinary(d)
    times = []
    with HostSplit() as split:
        for d in varied:
            t0 = time.perf_counter()
            enc.encode_ordinary(d)
            times.append(time.perf_counter() - t0)
    p50 = float(np.percentile(times, 50)) * 1e3
    result["cases"]["lone_varied"] = {"bytes": "900-999", "p50_ms": p50,
                                      "p99_ms": float(np.percentile(times, 99)) * 1e3,
                                      "split_per_call": split.as_dict(),
                                      "calls": args.lone_calls}
    md += [f"## (a2) {args.lone_calls} lone documents of 900-999 B (each length ~twice): "
           f"p50 {p50:.3f} ms (split per call)", "", split.table(args.lone_calls), ""]
    print("\n".join(md[-3:]), flush=True)

    # (b) the corpus through encode_batch_flat
    nbytes = corpus["bytes"]
    want = tik.encode_ordinary_batch(docs, num_threads=os.cpu_count() or 1)
    ids, offsets = enc.encode_batch_flat(docs)   # warm-up
    got_ok = np.array_equal(ids, np.fromiter((t for w in want for t in w), np.uint32)) and \
        np.array_equal(np.diff(offsets), [len(w) for w in want])
    with HostSplit() as split:
        ids, offsets = enc.encode_batch_flat(docs)
    prof = top_tottime(lambda: enc.encode_batch_flat(docs), args.cprofile)
    result["cases"]["corpus_encode"] = {"bytes": nbytes, "documents": len(docs), "exact": got_ok,
                                        "MBps": nbytes / 1e6 / split.wall_s,
                                        "split": split.as_dict(), "cprofile": prof}
    md += [f"## (b) encode_batch_flat, {nbytes / 1e6:.1f} MB in {len(docs)} documents: "
           f"{split.wall_s:.3f} s ({nbytes / 1e6 / split.wall_s:.2f} MB/s), exact: {got_ok}",
           "", split.table(), "", "cProfile, by tottime:", "", "```", prof, "```", ""]
    print("\n".join(md[-9 - prof.count("\n"):]), flush=True)

    # (b2) the corpus by pipeline chunk size (GpuEncoder.pipeline_bytes): smaller chunks
    # overlap more of the host's packing, upload and copy-out with the GPU, larger ones pay
    # fewer per-chunk costs
    encoder = enc.backend.encoder
    default_bytes, sweep_b = encoder.pipeline_bytes, []
    for mb in [float(m) for m in args.pipeline_mb.split(",") if m]:
        encoder.pipeline_bytes = int(mb * (1 << 20))
        walls = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            got, got_off = enc.encode_batch_flat(docs)
            walls.append(time.perf_counter() - t0)
        assert np.array_equal(got, ids) and np.array_equal(got_off, offsets), mb
        sweep_b.append({"pipeline_MB": mb, "median_s": float(np.median(walls)),
                        "MBps": nbytes / 1e6 / float(np.median(walls))})
    encoder.pipeline_bytes = default_bytes
    result["cases"]["corpus_pipeline_sweep"] = sweep_b
    md += [f"## (b2) encode_batch_flat by pipeline chunk size (median of {args.repeats})", "",
           "| chunk MB | median s | MB/s |", "|---:|---:|---:|"]
    md += [f"| {r['pipeline_MB']:g} | {r['median_s']:.3f} | {r['MBps']:.1f} |" for r in sweep_b]
    md.append("")
    print("\n".join(md[-len(sweep_b) - 4:]), flush=True)

    # (b3) the corpus by pre-tokenizer chunk size (bytes per bpe_cuts / bpe_pretok
    # invocation): more, shorter invocations against more segment boundaries
    packed, packed_starts = _pack_utf8(docs)
    configs = [(int(c), LONG_WINDOW, LONG_OVERLAP) for c in args.corpus_chunks.split(",") if c]
    configs += [(128, *map(int, wo.split("/"))) for wo in args.corpus_windows.split(",") if wo]
    sweep_c = []
    for chunk, window, overlap in configs:
        encoder = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern, chunk=chunk,
                           long_window=window, long_overlap=overlap)
        encoder.fill_invocations = 0
        got, got_off = encoder.encode_docs(packed, packed_starts)   # warm-up, and the check
        assert np.array_equal(got, ids) and np.array_equal(got_off, offsets), chunk
        walls = wall_times(lambda: encoder.encode_docs(packed, packed_starts), args.repeats)
        encoder.profile = True
        encoder.encode_docs(packed, packed_starts)
        encoder.profile = False
        gpu = {k: v * 1e3 for k, v in encoder.last_profile.gpu.items()}
        sweep_c.append({"chunk": chunk, "window": window, "overlap": overlap,
                        "median_s": float(np.median(walls)),
                        "MBps": nbytes / 1e6 / float(np.median(walls)), "gpu_ms": gpu})
        encoder.pool.release()
    result["cases"]["corpus_chunk_sweep"] = sweep_c
    md += [f"## (b3) the corpus by pre-tokenizer chunk size (GpuEncoder.encode_docs on the "
           f"packed corpus, median of {args.repeats}; GPU timestamps of one profiled call)", "",
           "| chunk | long window (+ overlap) | median s | MB/s | GPU cuts ms | "
           "GPU pretok_merge ms | GPU merge_long ms |",
           "|---:|---|---:|---:|---:|---:|---:|"]
    md += [f"| {r['chunk']} | {r['window']} (+{r['overlap']}) | {r['median_s']:.3f} | "
           f"{r['MBps']:.1f} | "
           f"{r['gpu_ms'].get('cuts', 0):.2f} | {r['gpu_ms'].get('pretok_merge', 0):.2f} | "
           f"{r['gpu_ms'].get('merge_long', 0):.2f} |" for r in sweep_c]
    md.append("")
    print("\n".join(md[-len(sweep_c) - 4:]), flush=True)

    # (c) decode of the same ids
    batch = [ids[offsets[i]:offsets[i + 1]] for i in range(len(docs))]
    enc.decode_bytes_batch(batch)   # warm-up
    with HostSplit() as split:
        out = enc.decode_bytes_batch(batch)
    dec_ok = all(o == d.encode() for o, d in zip(out, docs))
    prof = top_tottime(lambda: enc.decode_bytes_batch(batch), args.cprofile)
    result["cases"]["corpus_decode"] = {"bytes": nbytes, "exact": dec_ok,
                                        "MBps": nbytes / 1e6 / split.wall_s,
                                        "split": split.as_dict(), "cprofile": prof}
    md += [f"## (c) decode_bytes_batch of those ids: {split.wall_s:.3f} s "
           f"({nbytes / 1e6 / split.wall_s:.2f} MB/s), exact: {dec_ok}", "", split.table(), "",
           "cProfile, by tottime:", "", "```", prof, "```", ""]
    print("\n".join(md[-9 - prof.count("\n"):]), flush=True)

    # (d) the lone document with other pre-tokenizer chunk sizes (bytes per invocation of
    # bpe_cuts / bpe_pretok; exact for any size, tests/test_tokenizer_gpu.py): a small input
    # has few invocations, each sequential over its chunk, so latency may fall with the size
    data = np.frombuffer(lone.encode(), np.uint8)
    starts = np.array([0, data.size])
    sweep = []
    for chunk in [int(c) for c in args.chunks.split(",") if c]:
        encoder = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern, chunk=chunk)
        encoder.fill_invocations = 0   # this chunk for every call (not sized by the call)
        for _ in range(5):
            got, _ = encoder.encode_docs(data, starts)
        assert got.tolist() == tik.encode_ordinary(lone), chunk
        times = wall_times(lambda: encoder.encode_docs(data, starts), args.lone_calls)
        encoder.profile = True
        gpu: dict = {}
        for _ in range(10):
            encoder.encode_docs(data, starts)
            for k, v in encoder.last_profile.gpu.items():
                gpu[k] = gpu.get(k, 0.0) + v / 10
        sweep.append({"chunk": chunk, "p50_ms": float(np.percentile(times, 50)) * 1e3,
                      "gpu_ms": {k: v * 1e3 for k, v in gpu.items()}})
    result["cases"]["lone_chunk_sweep"] = sweep
    kernels = sorted({k for row in sweep for k in row["gpu_ms"]})
    md += [f"## (d) the lone document by chunk size (GpuEncoder.encode_docs; p50 of "
           f"{args.lone_calls} calls, GPU timestamps: mean of 10 profiled calls)", "",
           "| chunk | p50 ms | " + " | ".join(f"GPU {k} ms" for k in kernels) + " |",
           "|---:|---:|" + "---:|" * len(kernels)]
    md += [f"| {row['chunk']} | {row['p50_ms']:.3f} | " +
           " | ".join(f"{row['gpu_ms'].get(k, 0):.3f}" for k in kernels) + " |" for row in sweep]
    md.append("")
    print("\n".join(md[-len(sweep) - 4:]), flush=True)

    # (e) a lone document with one long piece (a comment rule of 80 dashes, common in
    # sources): its long-piece merge in the call's one submit (inline_min_bytes 0, the
    # default) or on the slow path (64 KB, the earlier default). GPUs only: a software device
    # has loop budgets and always takes the slow path.
    ruled = lone[:400] + "\n# " + "-" * 80 + "\n" + lone[400:900]
    data = np.frombuffer(ruled.encode(), np.uint8)
    starts = np.array([0, data.size])
    rows = []
    for min_bytes in (0, 64 << 10):
        encoder = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern)
        encoder.inline_min_bytes = min_bytes
        for _ in range(5):
            got, _ = encoder.encode_docs(data, starts)
        assert got.tolist() == tik.encode_ordinary(ruled), min_bytes
        times = []
        with HostSplit() as split:
            for _ in range(args.lone_calls):
                t0 = time.perf_counter()
                encoder.encode_docs(data, starts)
                times.append(time.perf_counter() - t0)
        steps = split.as_dict()["steps"]
        rows.append({"inline_min_bytes": min_bytes, "inline": encoder.inline_long_for(data.size),
                     "p50_ms": float(np.percentile(times, 50)) * 1e3,
                     "submits_per_call": steps.get("wgpu: queue.submit", {}).get("calls", 0)
                     / args.lone_calls})
    result["cases"]["lone_long_piece"] = rows
    md += [f"## (e) a lone {data.size} B document with one 82-byte piece, by inline_min_bytes",
           "", "| inline_min_bytes | merged in the one submit | p50 ms | submits per call |",
           "|---:|---|---:|---:|"]
    md += [f"| {r['inline_min_bytes']} | {r['inline']} | {r['p50_ms']:.3f} | "
           f"{r['submits_per_call']:g} |" for r in rows]
    md.append("")
    print("\n".join(md[-6:]), flush=True)

    # (f) single long pieces by window size: bpe_merge_long merges each window in ONE
    # invocation (sequentially), so a window's length is the piece's latency and the number
    # of windows its parallelism; shorter windows redo more overlap (LONG_OVERLAP bytes each).
    size = int(args.piece_mb * 1e6)
    rng = np.random.default_rng(7)
    pieces = {"one letter": "x" * size,
              "space + one letter": " " + "x" * (size - 1),   # a phase the first window sets
              "CJK without spaces": ("日本語中文漢字" * size)[:size // 3],
              "random letters": "".join(chr(c) for c in rng.integers(ord("a"), ord("z") + 1,
                                                                      size))}
    want = {kind: tik.encode_ordinary(text) for kind, text in pieces.items()}
    rows, windows_ok = [], True
    for window in (int(w) for w in args.windows.split(",")):
        encoder = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern,
                             long_window=window)
        for kind, text in pieces.items():
            data = np.frombuffer(text.encode(), np.uint8)
            starts = np.array([0, data.size])
            got, _ = encoder.encode_docs(data, starts)         # warm-up, and the check
            exact = got.tolist() == want[kind]
            windows_ok &= exact
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                encoder.encode_docs(data, starts)
                times.append(time.perf_counter() - t0)
            encoder.profile = True
            encoder.encode_docs(data, starts)
            gpu = dict(encoder.last_profile.gpu)
            retried, widened = encoder.last_profile.long_retried, encoder.last_profile.long_widened
            encoder.profile = False
            rows.append({"window": window, "piece": kind, "bytes": int(data.size),
                         "exact": exact, "median_s": float(np.median(times)),
                         "retried": retried, "widened": widened,
                         "gpu_ms": {k: v * 1e3 for k, v in gpu.items()}})
    result["cases"]["long_piece_windows"] = rows
    kernels = sorted({k for row in rows for k in row["gpu_ms"] if "long" in k or k == "stitch"})
    md += [f"## (f) single long pieces by long_window (overlap {LONG_OVERLAP} B; median of 3 "
           "calls, GPU timestamps of one profiled call)", "",
           "| window | piece | bytes | exact | median s | pieces merged again (aligned / "
           "widened) | " + " | ".join(f"GPU {k} ms" for k in kernels) + " |",
           "|---:|---|---:|---|---:|---|" + "---:|" * len(kernels)]
    md += [f"| {r['window']} | {r['piece']} | {r['bytes']:,} | {'yes' if r['exact'] else 'NO'} "
           f"| {r['median_s']:.3f} | {r['retried'] - r['widened']} / {r['widened']} | " + " | ".join(f"{r['gpu_ms'].get(k, 0):.2f}"
                                                    for k in kernels) + " |" for r in rows]
    md.append("")
    print("\n".join(md[-len(rows) - 4:]), flush=True)

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "host_probe.json").write_text(json.dumps(result, indent=2) + "\n")
    (out_dir / "host_probe.md").write_text("\n".join(md) + "\n")
    print(f"wrote {out_dir / 'host_probe.md'}")
    return 0 if got_ok and dec_ok and windows_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
