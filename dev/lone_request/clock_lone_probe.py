"""How much of a lone request's latency is the GPU's idle clock (issues 19 and 20).

    python dev/lone_request/clock_lone_probe.py --out DIR [--vocab gpt2] [--calls 100] [--rounds 3]

The H200 idles at 345 MHz and reaches 1980 MHz only after ~0.5-1 s of high utilization; a
lone client (or the service at 30-40% utilization) never gets it there (dev/RESULTS.md). In
turn, `rounds` times: after 3 s idle ("cold"), then right after 2 s of back-to-back 16 MB
encodes ("after a burst", before the clock decays), `calls` lone encodes of a 1 KB text:
p50/p90 wall ms and the mean GPU ms per call by phase (GPU timestamps). Run beside
`nvidia-smi --query-gpu=clocks.sm --format=csv -lms 50` to see the clock. Writes
DIR/clock_lone.json and .md.
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


def lone_calls(enc, text: str, calls: int) -> dict:
    walls = []
    for _ in range(calls):
        t0 = time.perf_counter()
        enc.encode_ordinary(text)
        walls.append(time.perf_counter() - t0)
    walls.sort()
    encoder = enc.backend.encoder
    encoder.profile = True
    gpu = {}
    for _ in range(10):
        enc.encode_ordinary(text)
        for k, v in encoder.last_profile.gpu.items():
            gpu[k] = gpu.get(k, 0.0) + v * 1e3 / 10
    encoder.profile = False
    return {"p50_ms": statistics.median(walls) * 1e3, "p90_ms": walls[int(0.9 * len(walls))] * 1e3,
            "gpu_ms": {k: round(v, 4) for k, v in gpu.items()},
            "gpu_total_ms": round(sum(gpu.values()), 4), "at": time.time()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--vocab", default="gpt2")
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from bench.tokenize_bench import build_corpus
    from istanbul.shaders.engine import Device
    from tokenizer_svc import gpu_backend
    from tokenizer_svc.encoding import get_encoding
    import os
    vocab_dir = Path(os.environ.get("ISTANBUL_VOCAB_DIR", REPO.parent / "shared" / "vocab"))
    path = vocab_dir / f"{args.vocab}.tiktoken"
    device = Device(None, robustness=gpu_backend.ROBUSTNESS)
    enc = get_encoding(str(path) if path.is_file() else args.vocab, device=device)
    docs, _ = build_corpus(16, 0.0)
    text = next(d for d in docs if 900 <= len(d.encode()) <= 1100 and d.isascii())
    enc.encode_batch_flat(docs)
    lone_calls(enc, text, 10)
    rows = []
    for r in range(args.rounds):
        time.sleep(3.0)
        rows.append({"round": r, "state": "cold", **lone_calls(enc, text, args.calls)})
        print(json.dumps(rows[-1]), flush=True)
        end = time.perf_counter() + 2.0
        while time.perf_counter() < end:
            enc.encode_batch_flat(docs)
        rows.append({"round": r, "state": "after a burst", **lone_calls(enc, text, args.calls)})
        print(json.dumps(rows[-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "clock_lone.json").write_text(json.dumps(
        {"adapter": device.info.name, "bytes": len(text.encode()), "rows": rows}, indent=2) + "\n")
    lines = [f"# A lone {len(text.encode())} B encode, cold GPU vs right after a burst "
             f"({device.info.name}, {args.vocab})", "",
             "| round | state | p50 ms | p90 ms | GPU ms per call |", "|---:|---|---:|---:|---:|"]
    lines += [f"| {x['round']} | {x['state']} | {x['p50_ms']:.3f} | {x['p90_ms']:.3f} | "
              f"{x['gpu_total_ms']:.3f} |" for x in rows]
    (args.out / "clock_lone.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
