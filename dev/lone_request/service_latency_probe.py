"""Where a lone request's time goes (issue 20's 1 KB p50 target), step by step, in one run.

    python dev/lone_request/service_latency_probe.py --out dev/lone_request/results/service_latency/h200 [--vocab V]

Each row adds one layer to the one before, all on the same 1 KB document, p50 of N calls:
  encode, in-process        Encoding.encode_batch_flat([doc]) in the calling thread
  encode, executor thread   the same through a one-thread executor from an asyncio loop (the
                            server's GPU thread hop)
  encode, idle gaps         in-process again with 2 ms of sleep between calls, as a lone
                            client's requests come (an idle GPU and CPU between calls)
  encode, bench texts       in-process over bench/service.py's 256 texts of 1 KB in turn
                            (code cut at random places: runs of spaces), with and without gaps
  GPU process round trip    RemoteEncoding -> GpuHost in another process: an empty decode
                            (the IPC floor) and the 1 KB encode
  gRPC GetInfo              a server's cheapest RPC (no batcher, no GPU): the gRPC floor, sync
                            and grpc.aio clients
  gRPC Tokenize             the whole request, sync (what TokenizerClient uses) and aio clients
for `istanbul serve --workers 1` and `--workers N` with the shared GPU process and with a
device per worker. Writes OUT/service_latency.md and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.service import default_vocab, load_corpus, make_texts  # noqa: E402


def p50_ms(fn, n: int, gap_s: float = 0.0) -> float:
    samples = []
    for _ in range(n):
        if gap_s:
            time.sleep(gap_s)
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples[n // 10:]) * 1e3


async def p50_ms_async(fn, n: int) -> float:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples[n // 10:]) * 1e3


def in_process(vocab: str, doc: str, n: int) -> list:
    from istanbul.shaders.engine import Device
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.server.config import ServerConfig
    from tokenizer_svc.server.gpu_host import RemoteEncoding, host_main
    enc = get_encoding(vocab, device=Device(None))

    def encode(e=enc):
        e.encode_batch_flat([doc], allowed_special=frozenset(), disallowed_special=())
    rows = [("encode, in-process", p50_ms(encode, n)),
            ("encode, in-process, 2 ms idle gaps", p50_ms(encode, n, gap_s=0.002))]
    texts = iter(make_texts(load_corpus(None), 1024, 256, seed=1024) * (2 * n // 256 + 2))

    def encode_next():
        enc.encode_batch_flat([next(texts)], allowed_special=frozenset(),
                              disallowed_special=())
    rows += [("encode, bench texts", p50_ms(encode_next, n)),
             ("encode, bench texts, 2 ms idle gaps", p50_ms(encode_next, n, gap_s=0.002))]
    pool = concurrent.futures.ThreadPoolExecutor(1)

    async def through_executor():
        loop = asyncio.get_running_loop()
        return await p50_ms_async(lambda: loop.run_in_executor(pool, encode), n)
    rows.append(("encode, executor thread", asyncio.run(through_executor())))
    tmp = tempfile.mkdtemp()
    address, key = os.path.join(tmp, "gpu.sock"), os.urandom(16)
    ctx = mp.get_context("spawn")
    status = ctx.Queue()
    host = ctx.Process(target=host_main, args=(ServerConfig(), vocab, None, address, key,
                                               "text", False, status))
    host.start()
    status.get(timeout=300)
    remote = RemoteEncoding(enc, address, key)
    remote.connect(60)
    rows.append(("GPU process round trip, empty decode", p50_ms(
        lambda: remote.decode_bytes_batch([]), n)))
    rows.append(("GPU process round trip, encode", p50_ms(lambda: encode(remote), n)))
    remote.close()
    host.terminate()
    host.join()
    return rows


def through_server(vocab: str, doc: str, n: int, workers: int, layout: str) -> list:
    import grpc
    from tokenizer_svc.client import TokenizerClient
    from tokenizer_svc.rpc import tokenizer_pb2 as pb, tokenizer_pb2_grpc as pb_grpc
    port_file = Path(tempfile.mkdtemp()) / "port"
    cmd = [sys.executable, "-m", "tokenizer_svc", "--vocab", vocab, "--port", "0",
           "--port-file", str(port_file), "--workers", str(workers)]
    if workers > 1:
        cmd += ["--gpu-process", layout]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                     os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.DEVNULL)
    try:
        while not port_file.exists():
            if proc.poll() is not None:
                raise SystemExit(f"server exited with {proc.returncode}")
            time.sleep(0.05)
        target = f"127.0.0.1:{port_file.read_text().strip()}"
        with TokenizerClient(target) as client:
            client.wait_ready(300)
        request = pb.TokenizeRequest(text=doc, format=pb.ID_FORMAT_PACKED)
        info = pb.GetInfoRequest()
        channel = grpc.insecure_channel(target)
        stub = pb_grpc.TokenizerStub(channel)
        for _ in range(50):
            stub.Tokenize(request, timeout=60)
        rows = [("gRPC GetInfo, sync client", p50_ms(lambda: stub.GetInfo(info, timeout=60), n)),
                ("gRPC Tokenize, sync client", p50_ms(lambda: stub.Tokenize(request, timeout=60),
                                                      n))]
        channel.close()

        async def aio():
            async with grpc.aio.insecure_channel(target) as ch:
                s = pb_grpc.TokenizerStub(ch)
                await s.Tokenize(request, timeout=60)
                return [("gRPC GetInfo, aio client",
                         await p50_ms_async(lambda: s.GetInfo(info, timeout=60), n)),
                        ("gRPC Tokenize, aio client",
                         await p50_ms_async(lambda: s.Tokenize(request, timeout=60), n))]
        return rows + asyncio.run(aio())
    finally:
        proc.terminate()
        proc.wait(60)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--vocab", default=default_vocab())
    p.add_argument("--calls", type=int, default=300, help="calls per row (default 300)")
    p.add_argument("--workers", type=int, default=6, help="N of the multi-worker servers")
    p.add_argument("--servers", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure through servers (default on)")
    args = p.parse_args(argv)
    doc = (REPO / "tokenizer_svc" / "server" / "batcher.py").read_text()[:1024]
    results = [("in-process", "-", *row) for row in in_process(args.vocab, doc, args.calls)]
    layouts = ((1, "own"), (args.workers, "shared"), (args.workers, "per-worker"))
    for workers, layout in layouts if args.servers else ():
        for row in through_server(args.vocab, doc, args.calls, workers, layout):
            results.append((f"serve --workers {workers}", layout, *row))
        print(results[-1], flush=True)
    from istanbul.shaders.engine import Device
    adapter = Device(None).info.name
    lines = [f"# A lone 1 KB request, layer by layer ({adapter}, {os.cpu_count()} CPUs)", "",
             f"p50 of {args.calls} calls each; `python dev/lone_request/service_latency_probe.py`.", "",
             "| where | GPU | step | p50 ms |", "|---|---|---|---:|"]
    lines += [f"| {w} | {g} | {step} | {ms:.3f} |" for w, g, step, ms in results]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "service_latency.md").write_text("\n".join(lines) + "\n")
    (args.out / "service_latency.json").write_text(json.dumps(
        {"adapter": adapter, "calls": args.calls,
         "rows": [dict(zip(("where", "gpu", "step", "p50_ms"), r)) for r in results]},
        indent=2) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
