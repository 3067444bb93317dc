"""How much Python CPU the tokenizer service spends per request, outside the GPU call.

    python dev/service_throughput/service_overhead.py [--vocab PATH] [--seconds 3] [--profile] [--out DIR]

Runs the real server (BackgroundServer, the session's wgpu device) in this process and
drives it with bench/service.py's closed-loop clients in another process (16 connections,
packed replies). Per text size it reports the CPU time of the server's event-loop thread
(grpc's HTTP/2 and protobuf handling, validation, batching bookkeeping, reply building) and
of its GPU thread (the encode calls, plus splitting results) per request, from
time.thread_time() inside each thread. With --profile BYTES, the event loop's top functions
(cProfile) in that cell. Also times building and serializing one reply of 16,384 ids as
the repeated field vs the packed bytes field. This is a measurement, not a product path.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def _thread_time_on(executor_or_loop, server) -> float:
    if executor_or_loop == "loop":
        async def now():
            return time.thread_time()
        return server.run(now(), 30)
    return server.server.gpu_thread.submit(time.thread_time).result(30)


def reply_costs() -> dict:
    import numpy as np
    from tokenizer_svc.rpc import tokenizer_pb2 as pb
    ids = np.random.default_rng(0).integers(0, 50000, 16384).astype(np.uint32)
    repeated = lambda: pb.TokenizeResponse(ids=ids.tolist()).SerializeToString()  # noqa: E731
    packed = lambda: pb.TokenizeResponse(  # noqa: E731
        ids_packed=ids.astype("<u4").tobytes()).SerializeToString()
    wire_r, wire_p = repeated(), packed()
    parse_r = lambda: np.asarray(pb.TokenizeResponse.FromString(wire_r).ids, np.uint32)  # noqa
    parse_p = lambda: np.frombuffer(pb.TokenizeResponse.FromString(wire_p).ids_packed, "<u4")  # noqa
    n = 200
    return {name: timeit.timeit(fn, number=n) / n * 1e6 for name, fn in (
        ("server_repeated_us", repeated), ("server_packed_us", packed),
        ("client_repeated_us", parse_r), ("client_packed_us", parse_p))} | {
        "wire_repeated_bytes": len(wire_r), "wire_packed_bytes": len(wire_p)}


def _encode_on_cpu(enc, vocab_path: str) -> None:
    """Route `enc`'s batch encode calls to tiktoken (this measurement only)."""
    import numpy as np
    from service import _reference   # bench/service.py's tiktoken twin of the vocabulary
    ref = _reference(vocab_path)

    def flat(seqs):
        offsets = np.zeros(len(seqs) + 1, np.int64)
        offsets[1:] = np.cumsum([len(s) for s in seqs])
        ids = np.fromiter((i for s in seqs for i in s), np.uint32, int(offsets[-1]))
        return ids, offsets

    enc.encode_batch_flat = lambda docs, allowed_special=frozenset(), disallowed_special=(): \
        flat(ref.encode_batch(docs, allowed_special=allowed_special, disallowed_special=()))
    enc.encode_utf8_batch_flat = lambda docs: flat(ref.encode_ordinary_batch(
        [d.decode() for d in docs]))


def main(argv=None) -> int:
    from service import LoadGenerator, sized_cells  # bench/service.py
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from service import default_vocab
    p.add_argument("--vocab", default=default_vocab(), help="default: gpt2.tiktoken as "
                   "bench/service.py finds it")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--profile", type=int, default=None, metavar="BYTES",
                   help="cProfile the event loop during the cell of this text size")
    p.add_argument("--event-loop", default="auto", choices=("auto", "uvloop", "asyncio"),
                   help="the server's event loop (ServerConfig.event_loop)")
    p.add_argument("--encoder", default="gpu", choices=("gpu", "tiktoken"),
                   help="tiktoken: the server's encode calls go to tiktoken on the CPU (same "
                        "ids), so a software GPU's encode does not drown the request handling "
                        "measured here")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    import psutil
    me = psutil.Process()
    from istanbul.shaders.engine import default_device
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.server import BackgroundServer, ServerConfig
    device = default_device()
    enc = get_encoding(args.vocab, device=device)
    if args.encoder == "tiktoken":
        _encode_on_cpu(enc, args.vocab)
    sizes = (100, 1024, 65536)
    cells = sized_cells(sizes, enc.encode_ordinary)
    load = LoadGenerator(1, cells)
    rows = []
    config = ServerConfig(host="127.0.0.1", port=0, event_loop=args.event_loop)
    with BackgroundServer(config, encoding=enc, device=device) as server:
        for n in sizes:
            load.run_cell(server.target, args.clients, str(n), 0.2, 0.5)   # warm-up
            profiler = cProfile.Profile() if args.profile == n else None
            if profiler:
                server.loop.call_soon_threadsafe(profiler.enable)
            loop0, gpu0 = _thread_time_on("loop", server), _thread_time_on("gpu", server)
            proc0 = sum(me.cpu_times()[:2])
            wall = time.perf_counter()
            cell = load.run_cell(server.target, args.clients, str(n), 0.0, args.seconds)
            wall = time.perf_counter() - wall
            loop1, gpu1 = _thread_time_on("loop", server), _thread_time_on("gpu", server)
            proc1 = sum(me.cpu_times()[:2])
            if profiler:
                server.loop.call_soon_threadsafe(profiler.disable)
                time.sleep(0.2)
                buf = io.StringIO()
                pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(18)
                print(buf.getvalue())
            done = cell["checked"]
            rows.append({"text_bytes": n, "requests": done, "req_per_s": done / wall,
                         "loop_us_per_request": (loop1 - loop0) / done * 1e6,
                         "gpu_thread_us_per_request": (gpu1 - gpu0) / done * 1e6,
                         # every thread of this process: the loop, grpc's own threads, the
                         # GPU thread and the software GPU's (lavapipe) threads
                         "process_us_per_request": (proc1 - proc0) / done * 1e6,
                         "loop_busy": (loop1 - loop0) / wall, "errors": cell["errors"]})
            print(json.dumps(rows[-1]), flush=True)
        server_loop = type(server.loop).__module__.split(".")[0]
    load.close()
    print(json.dumps({"event_loop": server_loop}))
    costs = reply_costs()
    print(json.dumps(costs))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "service_overhead.json").write_text(json.dumps(
            {"adapter": device.info.name, "event_loop": server_loop, "rows": rows, "reply_16k_ids": costs}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
