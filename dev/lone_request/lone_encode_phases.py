"""Where a lone 1 KB encode's millisecond goes on a GPU, phase by phase, in one run.

    python dev/lone_request/lone_encode_phases.py --out dev/lone_request/results/lone_encode/h200 [--vocab V] [--calls N]

Rows (p50 of N calls on bench/service.py's 1 KB texts, in turn):
  round-trip floors   a 4 KB buffer copy into a mapped staging buffer, submitted and mapped:
                      waiting on wgpu-py's poll thread (map_async().sync_wait(), what the
                      encoder does) and polling on the calling thread (device.sync() first)
  encode phases       Encoding.encode_batch_flat([doc]) timed whole and split into its
                      _Chunk steps: upload (text/starts/counters writes), dispatch (record +
                      submit; the submit, Recorder.submit: finish and queue.submit, also
                      alone), wait (map of the staging buffer), collect (ids copy), and the
                      rest (UTF-8 packing, checks, offsets)
  with a busy thread  the same while another Python thread runs a pure-Python loop (the GIL
                      is contended, as in a server's event loop under load)
  GPU timestamps      profile=True: the GPU time of each dispatch label, mean per call
Writes OUT/lone_encode.md and .json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.service import default_vocab, load_corpus, make_texts  # noqa: E402


def p50(samples) -> float:
    return statistics.median(samples[len(samples) // 10:]) * 1e3


def floors(device, n: int) -> dict:
    from wgpu import BufferUsage
    from tokenizer_svc.gpu_scan import map_staging
    src = device.upload(np.zeros(1024, np.uint32), label="floor src")
    staging = device.buffer(1 << 16, np.uint32, label="floor staging",
                            usage=BufferUsage.MAP_READ | BufferUsage.COPY_DST)
    out = {}
    for name, own_poll in (("copy + map, poll thread", False), ("copy + map, own poll", True)):
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            with device.record("floor") as rec:
                rec.copy(src, staging, 4096)
            if own_poll:
                device.sync()
            map_staging(staging, 4096)
            staging.raw.read_mapped(0, 4096, copy=False)
            staging.raw.unmap()
            samples.append(time.perf_counter() - t)
        out[name] = p50(samples)
    return out


def phases(enc, texts, n: int) -> dict:
    """p50 ms of the whole call and of each _Chunk step (monkeypatched timers)."""
    from istanbul.shaders.engine import Recorder
    from tokenizer_svc import gpu_encode
    spent: dict[str, float] = {}
    originals = {}

    def timed(owner, name, label):
        fn = getattr(owner, name)
        originals[(owner, name)] = fn

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t
        setattr(owner, name, wrapper)

    timed(gpu_encode._Chunk, "__init__", "upload")
    timed(gpu_encode._Chunk, "dispatch", "dispatch")
    timed(gpu_encode._Chunk, "wait", "wait")
    timed(gpu_encode.GpuEncoder, "_collect_start", "collect")
    timed(gpu_encode.GpuEncoder, "_collect_finish", "collect")
    timed(Recorder, "submit", "of which submit")
    rows: dict[str, list] = {k: [] for k in ("total", "upload", "dispatch", "of which submit",
                                             "wait", "collect", "rest")}
    try:
        for i in range(n):
            spent.clear()
            t = time.perf_counter()
            enc.encode_batch_flat([texts[i % len(texts)]])
            total = time.perf_counter() - t
            rows["total"].append(total)
            for k in ("upload", "dispatch", "of which submit", "wait", "collect"):
                rows[k].append(spent.get(k, 0.0))
            rows["rest"].append(total - sum(v for k, v in spent.items()
                                            if k != "of which submit"))
    finally:
        for (owner, name), fn in originals.items():
            setattr(owner, name, fn)
    return {k: p50(v) for k, v in rows.items()}


def gpu_times(enc, texts, n: int) -> dict:
    encoder = enc.backend.encoder
    encoder.profile = True
    sums: dict[str, float] = {}
    slow = 0
    try:
        for i in range(n):
            enc.encode_batch_flat([texts[i % len(texts)]])
            for label, s in encoder.last_profile.gpu.items():
                sums[label] = sums.get(label, 0.0) + s
            slow += encoder.last_profile.slow_paths
    finally:
        encoder.profile = False
    out = {label: 1e3 * s / n for label, s in sorted(sums.items(), key=lambda kv: -kv[1])}
    out["slow paths per call"] = slow / n
    return out


def beside_busy_thread(enc, device, texts, n: int) -> dict:
    stop = threading.Event()

    def spin():
        x = 0
        while not stop.is_set():
            x += 1
    busy = threading.Thread(target=spin, daemon=True)
    busy.start()
    try:
        return {"phases, busy thread": phases(enc, texts, n),
                "floors, busy thread": floors(device, n)}
    finally:
        stop.set()
        busy.join()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", default=None)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--busy", action=argparse.BooleanOptionalAction, default=True,
                    help="also measure beside a busy Python thread (default on)")
    args = ap.parse_args()
    from tokenizer_svc.encoding import get_encoding
    enc = get_encoding(args.vocab or default_vocab())
    device = enc.backend.encoder.device
    texts = make_texts(load_corpus(None), 1024, 256, seed=1)
    for t in texts[:50]:
        enc.encode_batch_flat([t])
    result = {"device": str(device.info), "calls": args.calls}
    result["floors"] = floors(device, args.calls)
    result["phases"] = phases(enc, texts, args.calls)
    if args.busy:
        result.update(beside_busy_thread(enc, device, texts, args.calls))
    result["gpu ms per call"] = gpu_times(enc, texts, min(args.calls, 100))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lone_encode.json").write_text(json.dumps(result, indent=1))
    lines = [f"# A lone 1 KB encode, phase by phase ({result['device']})", "",
             f"p50 ms of {args.calls} calls; `python dev/lone_request/lone_encode_phases.py`.", "",
             "| section | step | ms |", "|---|---|---:|"]
    for section, rows in result.items():
        if isinstance(rows, dict):
            lines += [f"| {section} | {k} | {v:.3f} |" for k, v in rows.items()]
    text = "\n".join(lines) + "\n"
    (out / "lone_encode.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
