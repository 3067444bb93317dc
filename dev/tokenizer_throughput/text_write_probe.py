"""Where a pipeline chunk's text upload goes (issue 19): PackedRange.write_into of the
tokenize bench's corpus in 16 MB ranges into (a) a reused numpy array, (b) the encoder's
mapped MAP_WRITE buffer, (c) a numpy array and then a parallel copy into the mapping, and
the map / unmap alone; median ms of --repeats per row, one process.

    python dev/tokenizer_throughput/text_write_probe.py --out DIR [--mb 64] [--repeats 9]

Writes DIR/text_write_probe.md and .json.
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mb", type=float, default=64.0)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--range-mb", type=float, default=16.0)
    args = ap.parse_args()
    from istanbul.shaders.engine import default_device
    from tokenizer_svc.encoding import _pack_utf8
    from tokenizer_svc.gpu_backend import ROBUSTNESS
    from tokenizer_svc.gpu_scan import COPY_THREADS, ParallelCopy
    from tokenizer_svc.packed_text import PackedRange
    from wgpu import BufferUsage
    docs, corpus = build_corpus(args.mb)
    t = time.perf_counter()
    packed, starts = _pack_utf8(docs)
    pack_ms = (time.perf_counter() - t) * 1e3
    n = int(args.range_mb * (1 << 20))
    ranges = [(lo, min(lo + n, packed.size)) for lo in range(0, packed.size, n)]
    device = default_device(None, robustness=ROBUSTNESS)
    up = device.buffer(1 << (n - 1).bit_length(), np.uint8, label="probe text upload",
                       usage=BufferUsage.MAP_WRITE | BufferUsage.COPY_SRC)
    host = np.empty(n, np.uint8)
    copier = ParallelCopy("probe-copy")

    def mapped():
        up.raw.map_async("WRITE", 0, n).sync_wait()
        return np.frombuffer(up.raw._experimental_get_mapped_range(0, n), np.uint8)

    def case_host(lo, hi):
        PackedRange(packed, lo, hi).write_into(host)

    def case_map(lo, hi):
        dst = mapped()
        PackedRange(packed, lo, hi).write_into(dst)
        del dst
        up.raw.unmap()

    def case_host_then_copy(lo, hi):
        PackedRange(packed, lo, hi).write_into(host)
        dst = mapped()
        copier(dst[:hi - lo], host[:hi - lo], COPY_THREADS, 1 << 20)
        del dst
        up.raw.unmap()

    def case_copy_only(lo, hi):
        dst = mapped()
        copier(dst[:hi - lo], host[:hi - lo], COPY_THREADS, 1 << 20)
        del dst
        up.raw.unmap()

    def case_copy_one_thread(lo, hi):
        dst = mapped()
        dst[:hi - lo] = host[:hi - lo]
        del dst
        up.raw.unmap()

    def case_map_unmap(lo, hi):
        dst = mapped()
        del dst
        up.raw.unmap()

    cases = {"write_into host array": case_host, "write_into the mapping": case_map,
             "write_into host, parallel copy to mapping": case_host_then_copy,
             "parallel copy host -> mapping": case_copy_only,
             "one-thread copy host -> mapping": case_copy_one_thread,
             "map + unmap only": case_map_unmap}
    rows = {}
    for _ in range(2):   # warm-up: pages, pool threads
        for f in cases.values():
            for lo, hi in ranges:
                f(lo, hi)
    for name, f in cases.items():
        per_range = []
        for lo, hi in ranges:
            samples = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                f(lo, hi)
                samples.append((time.perf_counter() - t) * 1e3)
            per_range.append(statistics.median(samples))
        rows[name] = {"per_range_ms": per_range, "sum_ms": sum(per_range)}
    lines = ["# Text upload of one call, by where the bytes are written", "",
             f"{packed.size / 1e6:.1f} MB corpus in {len(ranges)} ranges of <= "
             f"{args.range_mb:g} MiB; pack (_pack_utf8) {pack_ms:.1f} ms; median of "
             f"{args.repeats} per range; copy threads {COPY_THREADS}.", "",
             "| case | sum over ranges ms | per range ms |", "|---|---:|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['sum_ms']:.1f} | "
                     f"{' / '.join(f'{v:.2f}' for v in r['per_range_ms'])} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "text_write_probe.json").write_text(json.dumps(
        {"bytes": packed.size, "pack_ms": pack_ms, "rows": rows}, indent=1))
    (args.out / "text_write_probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
