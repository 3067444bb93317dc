"""A lone client's request through one server process, timed step by step inside the server.

    python dev/lone_request/service_trace.py --out dev/lone_request/results/service_trace/h200 [--vocab V] [--calls N]

Runs `TokenizerServer` (the class `istanbul serve` runs) in this process on loopback, with
timers wrapped around its steps, and a lone sync client in another process sending the same
1 KB Tokenize request N times (ids packed). Per request (p50 over the calls, ms):
  grpc in         client send -> the servicer's Tokenize starts (transport, interceptors)
  to batcher      Tokenize starts -> DynamicBatcher.submit (parsing, limits, checks)
  batch forms     submit -> the batch starts running (the collector task, eager close)
  to GPU thread   the batch starts -> the batch function runs on the GPU thread
  encode          Encoding.encode_batch_flat on the GPU thread
  batch rest      the batch function minus the encode (refusal checks, results)
  back to loop    the batch function returns -> the servicer resumes
  reply           the servicer resumes -> Tokenize returns (the response message)
  grpc out        Tokenize returns -> the client has the reply
Writes OUT/service_trace.md and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.service import default_vocab  # noqa: E402

CLIENT = r"""
import sys, time, grpc
from tokenizer_svc.rpc import tokenizer_pb2 as pb, tokenizer_pb2_grpc as pb_grpc
target, n, doc = sys.argv[1], int(sys.argv[2]), open(sys.argv[3]).read()
stub = pb_grpc.TokenizerStub(grpc.insecure_channel(target))
req = pb.TokenizeRequest(text=doc, format=pb.ID_FORMAT_PACKED)
for _ in range(30):
    stub.Tokenize(req, timeout=60)
out = []
for _ in range(n):
    t0 = time.time_ns()
    stub.Tokenize(req, timeout=60)
    out.append((t0, time.time_ns()))
print(" ".join(f"{a},{b}" for a, b in out))
"""

STEPS = ("grpc in", "to batcher", "batch forms", "to GPU thread", "encode", "batch rest",
         "back to loop", "reply", "grpc out")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--vocab", default=default_vocab())
    ap.add_argument("--calls", type=int, default=300)
    args = ap.parse_args()
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.server import app as app_mod, batcher as batcher_mod, servicer as sv
    from tokenizer_svc.server.config import ServerConfig
    from istanbul.shaders.engine import Device
    device = Device(None)
    enc = get_encoding(args.vocab, device=device)
    marks: list = []   # (label, time_ns) of the request in flight (one at a time)

    def mark(label):
        marks.append((label, time.time_ns()))

    real_tokenize = sv.TokenizerServicer._tokenize_one

    async def tokenize_one(self, *a, **k):
        mark("enter")
        try:
            return await real_tokenize(self, *a, **k)
        finally:
            mark("exit")
    sv.TokenizerServicer._tokenize_one = tokenize_one
    real_submit = batcher_mod.DynamicBatcher.submit

    async def submit(self, *a, **k):
        mark("submit")
        result = await real_submit(self, *a, **k)
        mark("resumed")
        return result
    batcher_mod.DynamicBatcher.submit = submit
    real_run = batcher_mod.DynamicBatcher._run

    async def run(self, taken):
        mark("run")
        return await real_run(self, taken)
    batcher_mod.DynamicBatcher._run = run
    real_timed = app_mod.TokenizerServer._timed_batch

    def timed(self, jobs):
        mark("batch start")
        try:
            return real_timed(self, jobs)
        finally:
            mark("batch end")
    app_mod.TokenizerServer._timed_batch = timed
    real_encode = type(enc).encode_batch_flat

    def encode(self, *a, **k):
        mark("encode start")
        try:
            return real_encode(self, *a, **k)
        finally:
            mark("encode end")
    type(enc).encode_batch_flat = encode

    doc_file = args.out / "doc.txt"
    args.out.mkdir(parents=True, exist_ok=True)
    doc_file.write_text((REPO / "tokenizer_svc" / "server" / "batcher.py").read_text()[:1024])

    async def serve():
        cfg = ServerConfig(port=0)
        server = app_mod.TokenizerServer(cfg, encoding=enc, device=device)
        port = await server.start()
        await server.ready.wait()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, f"127.0.0.1:{port}", str(args.calls), str(doc_file),
            stdout=asyncio.subprocess.PIPE, cwd=REPO)
        out, _ = await proc.communicate()
        await server.drain(1.0)
        return out.decode()
    client = asyncio.run(serve())
    sends = [tuple(map(int, pair.split(","))) for pair in client.split()]
    # split the marks into requests at each "enter"; the last len(sends) are measured
    requests, cur = [], None
    for label, t in marks:
        if label == "enter":
            cur = {}
            requests.append(cur)
        if cur is not None:
            cur.setdefault(label, t)
    requests = requests[-len(sends):]
    per_step: dict = {s: [] for s in STEPS + ("server total", "client total")}
    for (t0, t1), r in zip(sends, requests):
        d = lambda a, b: (r[b] - r[a]) / 1e6  # noqa: E731
        per_step["grpc in"].append((r["enter"] - t0) / 1e6)
        per_step["to batcher"].append(d("enter", "submit"))
        per_step["batch forms"].append(d("submit", "run"))
        per_step["to GPU thread"].append(d("run", "batch start"))
        per_step["encode"].append(d("encode start", "encode end"))
        per_step["batch rest"].append(d("batch start", "batch end") - d("encode start",
                                                                      "encode end"))
        per_step["back to loop"].append(d("batch end", "resumed"))
        per_step["reply"].append(d("resumed", "exit"))
        per_step["grpc out"].append((t1 - r["exit"]) / 1e6)
        per_step["server total"].append(d("enter", "exit"))
        per_step["client total"].append((t1 - t0) / 1e6)
    rows = {k: statistics.median(v[len(v) // 10:]) for k, v in per_step.items()}
    lines = [f"# A lone 1 KB Tokenize inside one server process ({device.info.name})", "",
             f"p50 ms of {len(sends)} calls; `python dev/lone_request/service_trace.py`. The steps' medians "
             "need not add up to the total's.", "", "| step | p50 ms |", "|---|---:|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in rows.items()]
    (args.out / "service_trace.md").write_text("\n".join(lines) + "\n")
    (args.out / "service_trace.json").write_text(json.dumps(
        {"adapter": device.info.name, "calls": len(sends), "p50_ms": rows}, indent=2) + "\n")
    doc_file.unlink()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
