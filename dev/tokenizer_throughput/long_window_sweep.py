"""Long-piece window size on the benchmark corpus: shorter windows, a shorter merge_long?

    python dev/tokenizer_throughput/long_window_sweep.py --out dev/tokenizer_throughput/results/long_window/h200 [--vocab V] [--mb 64]

bpe_merge_long heap-merges each window of a long piece (over SHORT_MAX bytes) in one
invocation, so its dispatch lasts about as long as the longest window's serial merge: on the
H200 it was 41.6 of the 64 MB corpus's ~70 ms of GPU time at LONG_WINDOW 1536 (+256),
bench/results/h200/tokenize.md. Windows must exceed overlap + the longest token, and
stitch best when their length has the factor 3 of runs of 3-byte characters
(gpu_encode.LONG_WINDOW); a seam that does not stitch is merged again (exact, slower). For
each window/overlap: `GpuEncoder.encode_docs` of bench/tokenize_bench.py's corpus, median
wall of R calls, the GPU ms of merge_long / stitch / long_copy / pretok_merge (one profiled
call), windows and pieces merged again; ids checked equal to the shipped encoder's. Writes
OUT/long_window.md and .json.
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

from bench.service import default_vocab  # noqa: E402
from bench.tokenize_bench import build_corpus  # noqa: E402

CONFIGS = ((1536, 256), (1152, 256), (768, 192), (384, 192))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--vocab", default=default_vocab())
    p.add_argument("--mb", type=float, default=64.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--configs", default=",".join(f"{w}/{o}" for w, o in CONFIGS),
                   help="window/overlap pairs (default %(default)s)")
    args = p.parse_args(argv)
    from istanbul.shaders.engine import Device
    from tokenizer_svc.encoding import _pack_utf8, get_encoding
    from tokenizer_svc.gpu_encode import GpuEncoder
    device = Device(None)
    enc = get_encoding(args.vocab, device=device)
    docs, _ = build_corpus(args.mb)
    packed, starts = _pack_utf8(docs)
    nbytes = int(starts[-1])
    want, want_offsets = enc.backend.encoder.encode_docs(packed, starts)
    want, want_offsets = want.copy(), want_offsets.copy()
    rows = []
    for pair in args.configs.split(","):
        window, overlap = map(int, pair.split("/"))
        encoder = GpuEncoder(device, enc.backend.tables, enc.backend.gpu_pattern,
                             long_window=window, long_overlap=overlap)
        got, got_offsets = encoder.encode_docs(packed, starts)   # warm-up, and the check
        assert np.array_equal(got, want) and np.array_equal(got_offsets, want_offsets), pair
        walls = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            encoder.encode_docs(packed, starts)
            walls.append(time.perf_counter() - t)
        encoder.profile = True
        encoder.encode_docs(packed, starts)
        encoder.profile = False
        prof = encoder.last_profile
        wall = statistics.median(walls)
        rows.append({"window": window, "overlap": overlap, "median_s": wall,
                     "MBps": nbytes / 1e6 / wall,
                     "gpu_ms": {k: v * 1e3 for k, v in prof.gpu.items()},
                     "long_windows": prof.long_windows, "long_retried": prof.long_retried,
                     "long_widened": prof.long_widened, "slow_paths": prof.slow_paths,
                     "inline_words_per_byte": encoder.inline_words_per_byte})
        print(rows[-1], flush=True)
        encoder.pool.release()
    lines = [f"# Long-piece windows on the benchmark corpus ({device.info.name}, "
             f"{Path(args.vocab).name})", "",
             f"{nbytes / 1e6:.1f} MB in {len(docs)} documents; median of {args.repeats} "
             "calls; GPU ms of one profiled call.", "",
             "| window (+ overlap) | median s | MB/s | merge_long | stitch | long_copy | "
             "pretok_merge | windows | merged again | widened | slow paths | words/byte |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        g = r["gpu_ms"]
        lines.append(f"| {r['window']} (+{r['overlap']}) | {r['median_s']:.3f} | "
                     f"{r['MBps']:.0f} | {g.get('merge_long', 0):.1f} | "
                     f"{g.get('stitch', 0):.1f} | {g.get('long_copy', 0):.1f} | "
                     f"{g.get('pretok_merge', 0):.1f} | {r['long_windows']} | "
                     f"{r['long_retried']} | {r['long_widened']} | {r['slow_paths']} | "
                     f"{r['inline_words_per_byte']} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "long_window.md").write_text("\n".join(lines) + "\n")
    (args.out / "long_window.json").write_text(json.dumps(
        {"adapter": device.info.name, "bytes": nbytes, "rows": rows}, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
