"""What the hop through the shared GPU process costs a lone request, on this CPU.

    python dev/service_throughput/gpu_host_hop.py [--code DIR] [--connections 24] [--calls 5000]
                               [--concurrency 1] [--gap-ms 1] [--out FILE.json]

A spawned process runs the product's GpuHost (one thread, as `istanbul serve --workers N`
runs it) with an Encoding whose call returns fixed ids at once, so a round trip is the hop
alone: the worker's message pickled and written on its event loop (uvloop), the host's wait,
receive, round and answer, the worker's read. `--connections` more workers' connections stay
attached and idle (12 workers keep up to two each): the host watches them all at every
wait. `--concurrency C` runs C calls at once from the event loop (C connections in flight:
the host's rounds back to back, its own cost per round the limit). Prints the round trip's
p50 and p10 over the calls after the first fifth, and calls per second. Each caller pauses
--gap-ms between its calls (a real lone client's request comes ~1 ms after its last reply:
gRPC's part; without a pause the host thread is still busy with one round when the next
message is already there, and never sleeps, which no client sees). `--code DIR`
measures another checkout's product code (e.g. a `git worktree` of an older commit).
This is a measurement, not a product path; no GPU is needed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class InstantEncoding:
    """An Encoding whose encode call costs nothing: `per_doc` fixed ids per document (250 by
    default; --kb gives a quarter of the document's bytes, as real text has)."""

    def __init__(self, per_doc: int = 250):
        self.per_doc = per_doc

    def encode_utf8_batch_flat(self, docs):
        import numpy as np
        n, k = len(docs), self.per_doc
        return (np.tile(np.arange(k, dtype=np.uint32), n),
                np.arange(0, k * (n + 1), k, dtype=np.int64))

    def encode_batch_flat(self, docs, **kw):
        return self.encode_utf8_batch_flat(docs)


def _host_main(code: str, address: str, key: bytes, ready, per_doc: int = 250) -> None:
    sys.path.insert(0, code)
    from multiprocessing.connection import Listener
    from tokenizer_svc.server.gpu_host import GpuHost
    host = GpuHost(InstantEncoding(per_doc), max_call_bytes=16 << 20)
    listener = Listener(address, family="AF_UNIX", authkey=key, backlog=256)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    ready.set()
    while True:
        host.attach(listener.accept())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--code", type=Path, default=REPO, help="the checkout whose code runs")
    p.add_argument("--connections", type=int, default=24, help="idle connections attached")
    p.add_argument("--calls", type=int, default=5000)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--gap-ms", type=float, default=1.0)
    p.add_argument("--kb", type=float, default=1.0, help="document size in KB (default 1); "
                   "its answer carries a quarter as many ids")
    p.add_argument("--vocab", default=str(REPO.parent / "shared" / "vocab" / "gpt2.tiktoken"))
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    code = str(args.code.resolve())
    sys.path.insert(0, code)
    from multiprocessing.connection import Client
    import uvloop
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.server.gpu_host import RemoteEncoding
    tmp = tempfile.mkdtemp()
    address, key = os.path.join(tmp, "gpu.sock"), os.urandom(16)
    ready = mp.get_context("spawn").Event()
    per_doc = 250 if args.kb == 1.0 else max(1, int(args.kb * 1024) // 4)
    host = mp.get_context("spawn").Process(target=_host_main, daemon=True,
                                           args=(code, address, key, ready, per_doc))
    host.start()
    ready.wait(120)
    idle = [Client(address, family="AF_UNIX", authkey=key) for _ in range(args.connections)]
    remote = RemoteEncoding(get_encoding(args.vocab, lazy=True), address, key)
    remote.connect(60)
    size = int(args.kb * 1024)
    doc = ("The quick brown fox jumps over the lazy dog. " * (size // 45 + 1))[:size]

    async def caller(times: list, calls: int) -> None:
        import asyncio
        for _ in range(calls):
            start = time.perf_counter()
            await remote.encode_flat_async([doc])
            times.append(time.perf_counter() - start)
            if args.gap_ms > 0:
                await asyncio.sleep(args.gap_ms / 1e3)

    async def run() -> tuple[list, float]:
        import asyncio
        await caller([], 200)                                    # warm-up
        times, start = [], time.perf_counter()
        per = args.calls // args.concurrency
        await asyncio.gather(*(caller(times, per) for _ in range(args.concurrency)))
        return times[len(times) // 5:], len(times) / (time.perf_counter() - start)

    times, rate = uvloop.run(run())
    host.terminate()
    for conn in idle:
        conn.close()
    row = {"code": code, "connections": args.connections, "concurrency": args.concurrency,
           "gap_ms": args.gap_ms,
           "p50_us": statistics.median(times) * 1e6,
           "p10_us": sorted(times)[len(times) // 10] * 1e6, "calls_per_s": rate}
    print(f"{code}: {args.connections} idle connections, {args.concurrency} at once, gap "
          f"{args.gap_ms:g} ms, {args.kb:g} KB "
          f"hop p50 {row['p50_us']:.0f} us, p10 {row['p10_us']:.0f} us, {rate:,.0f} calls/s",
          flush=True)
    if args.out:
        args.out.write_text(json.dumps(row, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
