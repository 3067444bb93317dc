"""What one more GPU operation costs a lone small request, and which of the encoder's
operations a lone 1 KB document could do without, in one run.

    python dev/lone_request/lone_ops_probe.py --out DIR [--vocab-dir D] [--calls N]

Rows (p50 ms of N back-to-back calls, the regime of tokenize_bench's lone document):
  floor          K dispatches of a 16-element kernel (each waits for the one before: they
                 write one buffer), then a 16-byte copy into a staging buffer, submitted and
                 mapped; K = 1, 2, 4, 8, 16; and the same with W queue.write_buffer calls
                 before the submit (W = 4)
  encode         Encoding.encode_batch_flat of one 1 KB text per call (bench/service.py's
                 texts, in turn) per vocabulary, as shipped and with variants set on the
                 live encoder: `no-inline-long` (inline_min_bytes above the call: the four
                 long-piece dispatches only on the slow path, when a piece needs them) and
                 `inline-long` (inline_min_bytes 0: recorded in every submit)
  gpu            GPU timestamps per dispatch label (profile=True), mean per call, per variant
Writes DIR/lone_ops.md and .json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.service import load_corpus, make_texts  # noqa: E402
from dev.lone_encode_phases import p50  # noqa: E402   (the same statistic as that probe)


def floor_rows(device, calls: int) -> dict:
    from wgpu import BufferUsage
    from tokenizer_svc.gpu_scan import map_staging
    kernel = device.kernel("infra.wgsl", "scale")
    x = device.upload(np.ones(16, np.float32), label="probe x")
    y = device.zeros(16, label="probe y")
    params = device.uniform("IIfI", 16, 0, 1.0, 0)
    staging = device.buffer(1 << 12, np.uint32, label="probe staging",
                            usage=BufferUsage.MAP_READ | BufferUsage.COPY_DST)
    small = np.zeros(4, np.uint32)
    out = {}
    for writes in (0, 4):
        for k in (1, 2, 4, 8, 16):
            samples = []
            for _ in range(calls):
                t = time.perf_counter()
                for _ in range(writes):
                    device.queue.write_buffer(x.raw, 0, small)
                with device.record("probe") as rec:
                    for _ in range(k):
                        rec.dispatch(kernel, [x, y, params], 1)
                    rec.copy(y, staging, 64)
                map_staging(staging, 64)
                staging.raw.read_mapped(0, 64, copy=False)
                staging.raw.unmap()
                samples.append(time.perf_counter() - t)
            out[f"{k} dispatches, {writes} writes"] = p50(samples)
    return out


def encode_rows(enc, texts, calls: int) -> dict:
    samples = []
    for i in range(calls):
        t = time.perf_counter()
        enc.encode_batch_flat([texts[i % len(texts)]])
        samples.append(time.perf_counter() - t)
    encoder = enc.backend.encoder
    encoder.profile = True
    sums: dict[str, float] = {}
    slow = 0
    n = min(calls, 100)
    try:
        for i in range(n):
            enc.encode_batch_flat([texts[i % len(texts)]])
            for label, s in encoder.last_profile.gpu.items():
                sums[label] = sums.get(label, 0.0) + s
            slow += encoder.last_profile.slow_paths
    finally:
        encoder.profile = False
    gpu = {label: 1e3 * s / n for label, s in sorted(sums.items(), key=lambda kv: -kv[1])}
    return {"p50 ms": p50(samples), "p90 ms": float(np.percentile(samples, 90)) * 1e3,
            "gpu ms": gpu, "gpu ms total": sum(gpu.values()), "slow paths per call": slow / n}


VARIANTS = {
    "shipped": {},
    "no-inline-long": {"inline_min_bytes": 1 << 20},
    "inline-long": {"inline_min_bytes": 0},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab-dir", default=str(REPO.parent / "shared" / "vocab"))
    ap.add_argument("--vocabs", default="gpt2,cl100k_base,o200k_base")
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    from tokenizer_svc.encoding import get_encoding
    texts = make_texts(load_corpus(None), 1024, 256, seed=1)
    result: dict = {"calls": args.calls, "encode": {}}
    for name in args.vocabs.split(","):
        enc = get_encoding(str(Path(args.vocab_dir) / f"{name}.tiktoken"))
        encoder = enc.backend.encoder
        if "floor" not in result:
            result["device"] = str(encoder.device.info)
            result["backend"] = encoder.device.backend.name
            result["floor"] = floor_rows(encoder.device, args.calls)
        want = enc.encode_ordinary_batch(texts[:64])
        for label, knobs in VARIANTS.items():
            saved = {k: getattr(encoder, k) for k in knobs}
            for k, v in knobs.items():
                setattr(encoder, k, v)
            try:
                got = enc.encode_ordinary_batch(texts[:64])
                for t in texts[:50]:
                    enc.encode_batch_flat([t])
                row = encode_rows(enc, texts, args.calls)
                row["exact"] = got == want
            finally:
                for k, v in saved.items():
                    setattr(encoder, k, v)
            result["encode"][f"{name} {label}"] = row
            print(name, label, f"p50 {row['p50 ms']:.3f}",
                  f"gpu {row['gpu ms total']:.3f}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lone_ops.json").write_text(json.dumps(result, indent=1))
    lines = [f"# A lone request's GPU operations ({result['device']}, {result['backend']})", "",
             f"p50 ms of {args.calls} back-to-back calls; `python dev/lone_request/lone_ops_probe.py`.", "",
             "| floor | ms |", "|---|---:|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in result["floor"].items()]
    lines += ["", "| vocabulary, variant | exact | p50 ms | p90 ms | GPU ms | slow paths | "
              "GPU ms per label |", "|---|---|---:|---:|---:|---:|---|"]
    for key, row in result["encode"].items():
        per = ", ".join(f"{k} {v:.3f}" for k, v in row["gpu ms"].items())
        lines.append(f"| {key} | {row['exact']} | {row['p50 ms']:.3f} | {row['p90 ms']:.3f} | "
                     f"{row['gpu ms total']:.3f} | {row['slow paths per call']:.2f} | {per} |")
    text = "\n".join(lines) + "\n"
    (out / "lone_ops.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
