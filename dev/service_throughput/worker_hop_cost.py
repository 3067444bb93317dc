"""What a worker of the shared GPU process spends per request, its batches run on a thread
(blocking connection) or on its event loop (asyncio streams), on this CPU.

    python dev/service_throughput/worker_hop_cost.py [--vocab PATH] [--paths thread,loop] [--loops asyncio,uvloop]
                                  [--clients 1,32] [--sizes 100,1024] [--seconds 3]
                                  [--gpu-ms 0.5] [--rounds 2] [--out FILE.json]

`istanbul serve --workers N` runs each worker's batches in one GPU process
(tokenizer_svc/server/gpu_host.py). Here a spawned process runs the real GpuHost on a Unix
socket with the GPU call replaced (tiktoken computes the same ids, then the thread spins
--gpu-ms for the GPU: none of it on the worker's CPU); this process is one worker, the real
TokenizerServer (BackgroundServer) with a RemoteEncoding; bench/service.py's closed-loop
clients drive it from other processes, every reply checked against tiktoken. `thread`
hides RemoteEncoding.call_async, so the batches take the path every worker took before
2026-12-05 (the GPU thread and a blocking connection); `loop` is the product's path since.
Per cell: requests/s, p50, and this process's CPU time per request (every thread: the
event loop, grpc's threads, the GPU thread). Paths and loops alternate, --rounds times.
This is a measurement, not a product path; no GPU is needed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


class TiktokenHostEncoding:
    """The GPU process's Encoding for this measurement: tiktoken's ids, then a spin of
    `gpu_s` standing for the device (the host thread waits on the GPU that long)."""

    def __init__(self, vocab_path: str, gpu_s: float):
        from service import _reference
        self.ref, self.gpu_s = _reference(vocab_path), gpu_s

    def _flat(self, seqs):
        import numpy as np
        offsets = np.zeros(len(seqs) + 1, np.int64)
        offsets[1:] = np.cumsum([len(s) for s in seqs])
        ids = np.fromiter((i for s in seqs for i in s), np.uint32, int(offsets[-1]))
        end = time.perf_counter() + self.gpu_s
        while time.perf_counter() < end:
            pass
        return ids, offsets

    def encode_batch_flat(self, docs, allowed_special=frozenset(), disallowed_special=()):
        return self._flat(self.ref.encode_batch(docs, allowed_special=allowed_special,
                                                disallowed_special=()))

    def encode_utf8_batch_flat(self, docs):
        return self._flat(self.ref.encode_ordinary_batch([d.decode() for d in docs]))

    def decode_bytes_batch(self, seqs):
        return [self.ref.decode_bytes(list(s)) for s in seqs]


def _host_main(vocab_path: str, gpu_s: float, address: str, key: bytes, ready) -> None:
    from multiprocessing.connection import Listener
    from tokenizer_svc.server.gpu_host import GpuHost
    host = GpuHost(TiktokenHostEncoding(vocab_path, gpu_s), max_call_bytes=16 << 20)
    listener = Listener(address, family="AF_UNIX", authkey=key, backlog=128)
    threading.Thread(target=host.serve_forever, daemon=True).start()
    ready.set()
    while True:
        host.attach(listener.accept())


class Blocking:
    """A RemoteEncoding without `call_async`: the server runs its batches on the GPU thread
    with blocking calls (the path before 2026-12-05)."""

    def __init__(self, remote):
        self.__dict__["remote"] = remote

    def __getattr__(self, name):
        if name == "call_async":
            raise AttributeError(name)
        return getattr(self.__dict__["remote"], name)


def main(argv=None) -> int:
    from service import LoadGenerator, default_vocab, sized_cells
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", default=default_vocab())
    p.add_argument("--paths", default="thread,loop")
    p.add_argument("--loops", default="asyncio,uvloop")
    p.add_argument("--clients", default="1,32")
    p.add_argument("--sizes", default="100,1024")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--gpu-ms", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.server import BackgroundServer, ServerConfig
    from tokenizer_svc.server.gpu_host import RemoteEncoding
    from service import _reference
    tmp = tempfile.mkdtemp()
    address, key = os.path.join(tmp, "gpu.sock"), os.urandom(16)
    ready = mp.get_context("spawn").Event()
    host = mp.get_context("spawn").Process(target=_host_main, daemon=True, args=(
        args.vocab, args.gpu_ms / 1e3, address, key, ready))
    host.start()
    ready.wait(120)
    local = get_encoding(args.vocab, lazy=True)   # the worker's own (vocabulary, tables)
    ref = _reference(args.vocab)
    sizes = [int(x) for x in args.sizes.split(",")]
    cells = sized_cells(sizes, ref.encode_ordinary)
    load = LoadGenerator(2, cells)
    rows = []
    for rnd in range(args.rounds):
        for loop in args.loops.split(","):
            for path in args.paths.split(","):
                remote = RemoteEncoding(local, address, key)
                remote.connect(60)
                encoding = remote if path == "loop" else Blocking(remote)
                config = ServerConfig(host="127.0.0.1", port=0, event_loop=loop)
                with BackgroundServer(config, encoding=encoding) as server:
                    for clients in (int(x) for x in args.clients.split(",")):
                        for n in sizes:
                            load.run_cell(server.target, clients, str(n), 0.2, 0.5)
                            cpu, wall = time.process_time(), time.perf_counter()
                            cell = load.run_cell(server.target, clients, str(n), 0.0,
                                                 args.seconds)
                            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                            done = cell["checked"]
                            row = {"round": rnd, "path": path, "loop": loop,
                                   "clients": clients, "text_bytes": n,
                                   "req_per_s": done / wall, "p50_ms": cell["p50_ms"],
                                   "worker_cpu_us_per_request": cpu / done * 1e6,
                                   "errors": cell["errors"]}
                            rows.append(row)
                            print(f"round {rnd} {path:6s} {loop:7s} clients {clients:3d} "
                                  f"{n:5d} B: {row['req_per_s']:7.0f} req/s, p50 "
                                  f"{row['p50_ms']:.3f} ms, worker CPU "
                                  f"{row['worker_cpu_us_per_request']:6.1f} us/request, "
                                  f"errors {sum(cell['errors'].values())}", flush=True)
                remote.close()
    load.close()
    host.terminate()
    if args.out:
        args.out.write_text(json.dumps({"gpu_ms": args.gpu_ms, "cpus": os.cpu_count(),
                                        "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
