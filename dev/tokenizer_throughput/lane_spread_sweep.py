"""Spreading a call's pre-tokenizer chunks over subgroups (lane_shift): which shift, per call size?

    python dev/tokenizer_throughput/lane_spread_sweep.py --out dev/tokenizer_throughput/results/lane_spread/h200 [--vocab V]

A chunk's walk in bpe_cuts / bpe_pretok is serial and divergent: lanes of one subgroup that
walk different text take turns, so a lone 1 KB document (64 chunks of 16 bytes, two
subgroups) spent ~0.83 ms in bpe_pretok on the H200 (dev/lone_request/lone_encode_phases.py). With lane
shift s, chunk c runs on invocation c << s (2^5 = one chunk per NVIDIA subgroup). For calls
of 1 KB (one bench text per call, 256 texts in turn) to 16 MB (64 KB documents), at chunks
of 8 and 16 bytes and shifts 0 to 5: p50 wall ms of R calls and the GPU time of cuts +
pretok_merge (timestamps, mean of a few profiled calls), the ids checked equal across
configurations. Writes OUT/lane_spread.md and .json.
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

SIZES_KB = (1, 16, 64, 256, 1024, 4096, 16384)
SHIFTS = (0, 2, 3, 4, 5)


def configs(size_kb: int):
    chunks = (8, 16) if size_kb <= 1024 else (16,)
    shifts = SHIFTS if size_kb <= 1024 else (0, 1, 2, 3)
    return [(c, s) for c in chunks for s in shifts]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--vocab", default=default_vocab())
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--lone-calls", type=int, default=200)
    p.add_argument("--max-kb", type=int, default=max(SIZES_KB), help="largest call measured")
    args = p.parse_args(argv)
    from istanbul.shaders.engine import Device
    from tokenizer_svc.encoding import get_encoding
    device = Device(None)
    enc = get_encoding(args.vocab, device=device)
    encoder = enc.backend.encoder
    rule = {"fill_invocations": encoder.fill_invocations, "chunk": encoder.chunk,
            "spread_invocations": encoder.spread_invocations}
    corpus = load_corpus(None)
    lone = make_texts(corpus, 1024, 256, seed=1024)
    docs = make_texts(corpus, 65536, max(SIZES_KB) // 64, seed=1)
    rows = []
    for size_kb in [s for s in SIZES_KB if s <= args.max_kb]:
        batches = [[t] for t in lone] if size_kb == 1 else \
            [docs[:size_kb // 64]] if size_kb >= 64 else [[d[:size_kb * 1024]] for d in docs[:8]]
        calls = args.lone_calls if size_kb < 64 else args.repeats
        nbytes = len(batches[0][0].encode()) * len(batches[0])
        row = {"call_kb": size_kb, "wall_ms": {}, "gpu_ms": {}}
        want = None
        for chunk, shift in configs(size_kb):
            encoder.fill_invocations, encoder.chunk = 0, chunk
            n_chunks = -(-nbytes // chunk)
            encoder.spread_invocations = n_chunks << shift
            got = [enc.encode_batch_flat(b)[0].tolist() for b in batches]
            want = want if want is not None else got
            assert got == want, f"ids differ at chunk {chunk} shift {shift}, {size_kb} KB"
            samples = []
            for i in range(calls):
                t = time.perf_counter()
                enc.encode_batch_flat(batches[i % len(batches)])
                samples.append(time.perf_counter() - t)
            encoder.profile = True
            gpu = []
            for i in range(5):
                enc.encode_batch_flat(batches[i % len(batches)])
                g = encoder.last_profile.gpu
                gpu.append(g.get("cuts", 0.0) + g.get("pretok_merge", 0.0))
            encoder.profile = False
            key = f"{chunk}/{shift}"
            row["wall_ms"][key] = statistics.median(samples[len(samples) // 10:]) * 1e3
            row["gpu_ms"][key] = statistics.mean(gpu) * 1e3
        for k, v in rule.items():
            setattr(encoder, k, v)
        row["best"] = min(row["wall_ms"], key=row["wall_ms"].get)
        row["rule"] = f"{encoder.chunk_for(nbytes)}/" \
                      f"{encoder.lane_shift_for(-(-nbytes // encoder.chunk_for(nbytes)))}"
        rows.append(row)
        print(row, flush=True)
    lines = [f"# Pre-tokenizer chunks spread over subgroups ({device.info.name})", "",
             f"p50 wall ms of {args.lone_calls} (1-16 KB) or {args.repeats} calls, and in "
             "brackets the GPU ms of cuts + pretok_merge; columns chunk bytes / lane shift; "
             f"the rule: FILL_INVOCATIONS {rule['fill_invocations']}, SPREAD_INVOCATIONS "
             f"{rule['spread_invocations']}.", ""]
    for r in rows:
        keys = list(r["wall_ms"])
        lines += [f"## {r['call_kb']:,} KB per call (best {r['best']}, the rule picks "
                  f"{r['rule']})", "", "| " + " | ".join(keys) + " |",
                  "|" + "---:|" * len(keys),
                  "| " + " | ".join(f"{r['wall_ms'][k]:.3f} ({r['gpu_ms'][k]:.3f})"
                                    for k in keys) + " |", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lane_spread.md").write_text("\n".join(lines) + "\n")
    (args.out / "lane_spread.json").write_text(json.dumps(
        {"adapter": device.info.name, "rule": rule, "rows": rows}, indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
