"""Benchmark of the gRPC tokenizer service: throughput and latency under concurrent clients.

    python bench/service.py --out bench/results/service [--vocab PATH] [--adapter A]

For batching on and off, it starts the real server (`python -m tokenizer_svc`, its own GPU
device) and drives it with closed-loop clients (each sends Tokenize, waits for the reply,
sends the next) for every combination of 1, 16, 64 and 256 clients and 100 B, 1 KB and 64 KB
texts. Clients are asyncio tasks, each with its own gRPC connection, spread over several
processes (started once, reused by every cell) so that the load generator is not the
bottleneck. Per cell it reports requests/s (requests completed inside the window),
MB/s, tokens/s, latency p50/p95/p99 and, from the server's Prometheus metrics, the mean number
of requests per GPU call and the GPU thread's busy fraction. Writes service.json and
service.md into --out. Texts are cut from real text (--corpus files, default the Python
standard library's sources); a sample of replies is checked against tiktoken when it is
installed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_CLIENTS = (1, 16, 64, 256)
DEFAULT_SIZES = (100, 1024, 65536)


def default_vocab() -> str:
    for directory in (os.environ.get("ISTANBUL_VOCAB_DIR"), os.environ.get("ISTANBUL_SHARED_VOCAB"),
                      REPO.parent / "shared" / "vocab", REPO / "shared" / "vocab"):
        if directory and (Path(directory) / "gpt2.tiktoken").is_file():
            return str(Path(directory) / "gpt2.tiktoken")
    return "gpt2"  # a known name: load_vocabulary searches its usual places


def load_corpus(paths: list[str], limit: int = 16 << 20) -> bytes:
    files = [Path(p) for p in paths] if paths else \
        sorted(Path(os.__file__).parent.glob("*.py"))
    chunks, total = [], 0
    for path in files:
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= limit:
            break
    corpus = b"\n".join(chunks)
    if len(corpus) < max(DEFAULT_SIZES) * 2:
        raise SystemExit(f"corpus too small ({len(corpus)} bytes); give --corpus files")
    return corpus


def make_texts(corpus: bytes, size: int, count: int, seed: int) -> list[str]:
    """`count` texts of about `size` UTF-8 bytes cut from the corpus at random places."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        start = rng.randrange(0, len(corpus) - size)
        out.append(corpus[start:start + size].decode("utf-8", "ignore"))
    return out


# ---- the load generator (runs in worker processes) -----------------------------------------

def _worker(conn) -> None:
    """A load-generator process kept for the whole run: per cell it opens its clients'
    connections, reports ready, waits for the common start time, drives, and sends back
    its measurements (spawning processes per cell cost seconds of Python start-up each)."""
    texts_by_size: dict = {}
    while True:
        msg = conn.recv()
        if msg[0] == "texts":
            texts_by_size[msg[1]] = msg[2]
        elif msg[0] == "cell":
            _, target, n_clients, size, warmup, duration, seed = msg
            conn.send(asyncio.run(_drive(conn, target, n_clients, texts_by_size[size], warmup,
                                         duration, seed)))
        else:
            return


async def _drive(conn, target, n_clients, texts, warmup, duration, seed) -> dict:
    import grpc
    from tokenizer_svc.rpc import tokenizer_pb2 as pb, tokenizer_pb2_grpc as pb_grpc
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", -1),
               ("grpc.max_send_message_length", -1)]
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(n_clients)]
    requests = [pb.TokenizeRequest(text=t) for t in texts]
    sizes = [len(t.encode()) for t in texts]
    latencies, nbytes, tokens, errors, samples = [], 0, 0, {}, []
    await asyncio.gather(*(c.channel_ready() for c in channels))
    conn.send("ready")
    start_at = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    begin = time.perf_counter()
    measure_from, measure_to = begin + warmup, begin + warmup + duration

    async def client(k: int):
        nonlocal nbytes, tokens
        stub = pb_grpc.TokenizerStub(channels[k])
        rng = random.Random(seed * 100003 + k)
        while True:
            sent = time.perf_counter()
            if sent >= measure_to:
                return
            i = rng.randrange(len(requests))
            try:
                reply = await stub.Tokenize(requests[i], timeout=120)
            except grpc.aio.AioRpcError as exc:
                if measure_from <= time.perf_counter() <= measure_to:
                    errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                continue
            done = time.perf_counter()
            # a request counts when it completes inside the window (closed-loop throughput;
            # with latencies longer than the window, "sent inside it too" would count none)
            if measure_from <= done <= measure_to:
                latencies.append(done - sent)
                nbytes += sizes[i]
                tokens += len(reply.ids)
                if len(samples) < 4 and rng.random() < 0.01:
                    samples.append((i, list(reply.ids)))

    await asyncio.gather(*(client(k) for k in range(n_clients)))
    for channel in channels:
        await channel.close()
    return {"latencies": latencies, "bytes": nbytes, "tokens": tokens, "errors": errors,
            "samples": samples}


class LoadGenerator:
    """`processes` worker processes that drive the closed-loop clients of every cell."""

    def __init__(self, processes: int, texts: dict):
        ctx = mp.get_context("spawn")
        self.workers = []
        for _ in range(max(1, processes)):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child,), daemon=True)
            proc.start()
            self.workers.append((proc, parent))
        for _, conn in self.workers:
            for size, batch in texts.items():
                conn.send(("texts", size, batch))

    def run_cell(self, target: str, clients: int, size: int, warmup: float,
                 duration: float) -> dict:
        workers = self.workers[:max(1, min(len(self.workers), clients))]
        n = len(workers)
        shares = [clients // n + (1 if k < clients % n else 0) for k in range(n)]
        for k, ((_, conn), share) in enumerate(zip(workers, shares)):
            conn.send(("cell", target, share, size, warmup, duration, k))
        for _, conn in workers:   # every client connected: start together
            if conn.recv() != "ready":
                raise RuntimeError("load generator out of step")
        start_at = time.time() + 0.05
        for _, conn in workers:
            conn.send(start_at)
        results = [conn.recv() for _, conn in workers]
        return summarize(results, duration)

    def close(self) -> None:
        for proc, conn in self.workers:
            conn.send(("stop",))
            proc.join(10)


def summarize(results: list[dict], duration: float) -> dict:
    latencies = sorted(x for r in results for x in r["latencies"])
    errors: dict = {}
    for r in results:
        for code, n in r["errors"].items():
            errors[code] = errors.get(code, 0) + n

    def pct(q):
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3 \
            if latencies else None
    return {"requests": len(latencies), "requests_per_s": len(latencies) / duration,
            "mb_per_s": sum(r["bytes"] for r in results) / duration / 1e6,
            "tokens_per_s": sum(r["tokens"] for r in results) / duration,
            "p50_ms": pct(0.50), "p95_ms": pct(0.95), "p99_ms": pct(0.99),
            "mean_ms": sum(latencies) / len(latencies) * 1e3 if latencies else None,
            "errors": errors, "samples": [s for r in results for s in r["samples"]]}


# ---- the server ----------------------------------------------------------------------------

class Server:
    def __init__(self, vocab: str, adapter: str | None, batching: bool, window_ms: float,
                 workdir: Path, logdir: Path):
        self.port_file = workdir / f"port-{int(batching)}"
        self.metrics_port = _free_port()
        self.log = open(logdir / f"server-batching-{'on' if batching else 'off'}.log", "w")
        cmd = [sys.executable, "-m", "tokenizer_svc", "--vocab", vocab, "--host", "127.0.0.1",
               "--port", "0", "--port-file", str(self.port_file), "--metrics-port",
               str(self.metrics_port), "--metrics-host", "127.0.0.1",
               "--max-queued-bytes", "4GiB", "--batch-window-ms", str(window_ms)]
        if not batching:
            cmd.append("--no-batching")
        if adapter is not None:
            cmd += ["--adapter", adapter]
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=self.log)
        deadline = time.monotonic() + 300
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not start; see {self.log.name}")
            time.sleep(0.05)
        self.target = f"127.0.0.1:{self.port_file.read_text().strip()}"
        from tokenizer_svc.client import TokenizerClient
        self.client = TokenizerClient(self.target, timeout=300)
        self.client.wait_ready(300)

    def metrics(self) -> dict:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                      timeout=30).read().decode()
        values = {}
        for name in ("istanbul_tokenizer_batch_requests_sum", "istanbul_tokenizer_batch_requests_count",
                     "istanbul_tokenizer_batch_documents_sum", "istanbul_tokenizer_gpu_seconds_sum",
                     "istanbul_tokenizer_batch_seconds_sum"):
            found = re.search(rf"^{name} (\S+)$", text, re.M)
            values[name] = float(found.group(1)) if found else 0.0
        return values

    def stop(self) -> int:
        self.client.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        finally:
            self.log.close()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference(vocab_path: str):
    """tiktoken with the same ranks and pattern, to spot-check replies (None if unavailable)."""
    try:
        import tiktoken
        from tokenizer_svc.vocab import load_vocabulary
    except ImportError:
        return None
    try:
        v = load_vocabulary(vocab_path)
    except ValueError as exc:
        raise SystemExit(f"bench/service.py: {exc}") from None
    if v.merges is not None:
        return None
    return tiktoken.Encoding(v.name, pat_str=v.pattern, mergeable_ranks=v.ranks,
                             special_tokens=v.special_tokens)


# ---- report --------------------------------------------------------------------------------

def _fmt(value, digits=1):
    return "-" if value is None else f"{value:,.{digits}f}"


def markdown(report: dict) -> str:
    info = report["server"]
    lines = [
        "# Tokenizer service benchmark",
        "",
        *([] if report.get("complete", True) else
          ["**Partial**: the run was stopped before every cell was measured.", ""]),
        f"Server: `python -m tokenizer_svc` on **{info['adapter']}** ({info['adapter_type']}), "
        f"vocabulary **{info['vocabulary']}** (n_vocab {info['n_vocab']}); host "
        f"{report['host']['cpus']} CPUs, Python {report['host']['python']}. Closed-loop "
        f"clients over loopback, each with its own connection, in {report['config']['processes']}"
        f" load processes; {report['config']['duration_s']} s measured per cell after "
        f"{report['config']['warmup_s']} s warm-up. Batching on: window "
        f"{report['config']['window_ms']} ms. `req/batch`: mean Tokenize requests per GPU call; "
        "`GPU busy`: fraction of the cell's time the server's GPU thread spent in "
        "encode_batch_flat.",
        "",
        "| batching | clients | text | req/s | MB/s | tokens/s | p50 ms | p95 ms | p99 ms "
        "| req/batch | GPU busy | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in report["cells"]:
        size = cell["text_bytes"]
        label = f"{size // 1024} KB" if size >= 1024 else f"{size} B"
        lines.append(
            f"| {'on' if cell['batching'] else 'off'} | {cell['clients']} | {label} "
            f"| {_fmt(cell['requests_per_s'])} | {_fmt(cell['mb_per_s'], 2)} "
            f"| {_fmt(cell['tokens_per_s'], 0)} | {_fmt(cell['p50_ms'], 2)} "
            f"| {_fmt(cell['p95_ms'], 2)} | {_fmt(cell['p99_ms'], 2)} "
            f"| {_fmt(cell['requests_per_batch'], 1)} | {_fmt(cell['gpu_busy'], 2)} "
            f"| {sum(cell['errors'].values())} |")
    checked = report.get("verified_replies")
    lines += ["", f"Replies checked against tiktoken: {checked}." if checked is not None else
              "Replies not checked (tiktoken not installed).", ""]
    return "\n".join(lines)


def preflight() -> None:
    """Fail early, naming the packages the server needs that this Python lacks."""
    import importlib.util
    needed = {"grpc": "grpcio", "google.protobuf": "protobuf", "grpc_health": "grpcio-health-checking",
              "grpc_reflection": "grpcio-reflection", "prometheus_client": "prometheus-client",
              "wgpu": "wgpu", "regex": "regex", "numpy": "numpy"}
    missing = [pkg for module, pkg in needed.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise SystemExit(f"bench/service.py: missing packages: {', '.join(missing)} (install "
                         "them, e.g. from carried wheels)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="directory for service.json and "
                   "service.md")
    p.add_argument("--vocab", default=default_vocab(), help="vocabulary path or known name "
                   "(default: gpt2.tiktoken in $ISTANBUL_VOCAB_DIR, ../shared/vocab or "
                   "shared/vocab)")
    p.add_argument("--adapter", default=None, help="GPU adapter for the server")
    p.add_argument("--clients", default=",".join(map(str, DEFAULT_CLIENTS)),
                   help="comma-separated client counts (default 1,16,64,256)")
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                   help="comma-separated text sizes in bytes (default 100,1024,65536)")
    p.add_argument("--modes", default="on,off", help="batching modes to run (default on,off)")
    p.add_argument("--window-ms", type=float, default=2.0, help="batching window (default 2)")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per cell")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per cell")
    p.add_argument("--processes", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                   help="load-generator processes (default: half the CPUs, at most 8)")
    p.add_argument("--corpus", nargs="*", default=[], help="text files to cut texts from "
                   "(default: the Python standard library's sources)")
    args = p.parse_args(argv)
    preflight()
    clients = [int(x) for x in args.clients.split(",")]
    sizes = [int(x) for x in args.sizes.split(",")]
    modes = [m.strip() for m in args.modes.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus(args.corpus)
    texts = {size: make_texts(corpus, size, 64 if size >= 16384 else 256, seed=size)
             for size in sizes}
    reference = _reference(args.vocab)
    report = {"config": {"clients": clients, "sizes": sizes, "window_ms": args.window_ms,
                         "duration_s": args.duration, "warmup_s": args.warmup,
                         "processes": args.processes, "vocab": args.vocab},
              "host": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "platform": platform.platform()},
              "cells": []}
    verified = 0
    load = LoadGenerator(args.processes, texts)
    with tempfile.TemporaryDirectory() as tmp:
        for mode in modes:
            server = Server(args.vocab, args.adapter, mode == "on", args.window_ms, Path(tmp),
                            args.out)
            try:
                info = server.client.info()
                report["server"] = {"adapter": info.adapter.name, "adapter_type": info.adapter.type,
                                    "vocabulary": info.vocabulary_name, "n_vocab": info.n_vocab,
                                    "vocabulary_hash": info.vocabulary_hash}
                for size in sizes:  # warm-up: kernels compiled, buffers grown
                    server.client.encode_batch_flat(texts[size][:32])
                for size in sizes:
                    for n in clients:
                        before = server.metrics()
                        wall = time.perf_counter()
                        cell = load.run_cell(server.target, n, size, args.warmup,
                                             args.duration)
                        wall = time.perf_counter() - wall
                        after = server.metrics()
                        delta = {k: after[k] - before[k] for k in after}
                        batches = delta["istanbul_tokenizer_batch_requests_count"]
                        cell.update(batching=mode == "on", clients=n, text_bytes=size,
                                    requests_per_batch=(delta["istanbul_tokenizer_batch_requests_sum"]
                                                        / batches if batches else None),
                                    gpu_busy=delta["istanbul_tokenizer_gpu_seconds_sum"] / wall)
                        if reference is not None:
                            for i, ids in cell["samples"]:
                                if reference.encode_ordinary(texts[size][i]) != ids:
                                    raise SystemExit(f"reply differs from tiktoken (size {size}, "
                                                     f"text {i})")
                                verified += 1
                        del cell["samples"]
                        report["cells"].append(cell)
                        write_report(args.out, report, final=False)  # a time limit keeps what ran
                        print(f"batching {mode:3} clients {n:4} text {size:6} B: "
                              f"{cell['requests_per_s']:9.1f} req/s {cell['mb_per_s']:8.2f} MB/s "
                              f"p50 {_fmt(cell['p50_ms'], 2)} p99 {_fmt(cell['p99_ms'], 2)} ms "
                              f"req/batch {_fmt(cell['requests_per_batch'])}", flush=True)
            finally:
                code = server.stop()
                if code != 0:
                    print(f"warning: server exited with {code}", file=sys.stderr)
    load.close()
    report["verified_replies"] = verified if reference is not None else None
    write_report(args.out, report, final=True)
    print(f"wrote {args.out / 'service.json'} and {args.out / 'service.md'}")
    return 0


def write_report(out: Path, report: dict, final: bool) -> None:
    report["complete"] = final
    (out / "service.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "service.md").write_text(markdown(report))


if __name__ == "__main__":
    raise SystemExit(main())
