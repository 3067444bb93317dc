"""Benchmark of the gRPC tokenizer service: throughput and latency under concurrent clients.

    python bench/service.py [--out DIR] [--vocab PATH] [--adapter A]
                            [--workers 1,6] [--clients 1,16,64,256] [--sizes 100,1024,65536,mixed]
                            [--formats packed,repeated] [--event-loops asyncio,uvloop]

For each server configuration in --workers (`istanbul serve --workers N`: N server processes
on one port, each with its own GPU device and batcher; default 1 and 3/8 of the CPUs),
it starts the real server and drives it with closed-loop clients (each sends Tokenize, waits
for the reply, sends the next) for every combination of --clients and --sizes; `mixed` draws
each request's text from 100 B (60%), 1 KB (30%) and 64 KB (10%). Clients are asyncio tasks,
each with its own gRPC connection, spread over load-generator processes (started once,
reused by every cell) so that the load generator is not the bottleneck. Requests ask for
packed ids (ID_FORMAT_PACKED; `--formats packed,repeated` also measures the repeated field
that older clients read) and EVERY reply is compared with tiktoken's ids for its text
(precomputed; a wrong reply counts as an error, `mismatch`). Per cell it reports requests/s
(requests completed inside the window), MB/s, tokens/s, latency p50/p95/p99, and from the
server: the mean number of requests per GPU call, the GPU threads' busy share (time inside
encode calls / wall time, summed over workers: above 1 with several devices busy at once),
the server's CPU use in cores (its processes' CPU seconds / wall time), and where a
request's time goes inside the server (means of its histograms: the RPC, the wait for a
batch, one GPU call; the client's mean minus the server's is gRPC and the loopback). Writes
service.json and service.md into --out; about 2.5 minutes at the defaults on a 16-core
machine. Texts are cut from real text (--corpus files, default the Python standard library's
sources). `--event-loops asyncio,uvloop` runs each server configuration once per event loop
(`istanbul serve --event-loop`), old and new in one run.
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
from bench.results_dir import default_dir  # noqa: E402  (bench/results/<machine>/)

DEFAULT_CLIENTS = (1, 16, 64, 256)
DEFAULT_SIZES = ("100", "1024", "65536", "mixed")
MIXED = ((100, 0.6), (1024, 0.3), (65536, 0.1))   # (text bytes, share of requests)
TARGETS = (  # (clients, text, metric, comparison, target, at least this; SPEC.md section 11)
    (64, "65536", "mb_per_s", ">=", 400.0, 150.0),
    (256, "100", "requests_per_s", ">=", 20000.0, 10000.0),
    (1, "1024", "p50_ms", "<=", 1.5, None),
)


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
    if len(corpus) < 65536 * 2:
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


def sized_cells(sizes, encode_ordinary, per_size: int = 64) -> dict:
    """Cells of the load generator for fixed text sizes (no `mixed`): per size, `per_size`
    texts cut from the default corpus and each text's expected ids (`encode_ordinary`) as
    packed little-endian bytes. For the dev scripts that drive one server with it."""
    import numpy as np
    corpus = load_corpus([])
    texts = {n: make_texts(corpus, n, per_size, seed=n) for n in sizes}
    expected = {n: [np.asarray(encode_ordinary(t), "<u4").tobytes() for t in batch]
                for n, batch in texts.items()}
    return {str(n): (*cell_texts(texts, str(n)), cell_texts(expected, str(n))[0])
            for n in sizes}


def cell_texts(texts: dict, size: str) -> tuple[list, list]:
    """(texts, weights) that a cell's clients draw from."""
    if size == "mixed":
        pool, weights = [], []
        for nbytes, share in MIXED:
            pool += texts[nbytes]
            weights += [share / len(texts[nbytes])] * len(texts[nbytes])
        return pool, weights
    return texts[int(size)], [1.0] * len(texts[int(size)])


# ---- the load generator (runs in worker processes) -----------------------------------------

def _worker(conn) -> None:
    """A load-generator process kept for the whole run: per cell it opens its clients'
    connections, reports ready, waits for the common start time, drives, and sends back
    its measurements (spawning processes per cell cost seconds of Python start-up each)."""
    cells: dict = {}
    while True:
        msg = conn.recv()
        if msg[0] == "texts":   # (size label, texts, weights, expected packed ids per text)
            cells[msg[1]] = msg[2:]
        elif msg[0] == "cell":
            _, target, n_clients, size, packed, warmup, duration, seed, loop = msg
            from tokenizer_svc.service.event_loop import run
            conn.send(run(_drive(conn, target, n_clients, *cells[size], packed, warmup,
                                 duration, seed), loop))
        else:
            return


async def _drive(conn, target, n_clients, texts, weights, expected, packed, warmup, duration,
                 seed) -> dict:
    import grpc
    from tokenizer_svc.service.rpc import tokenizer_pb2 as pb, tokenizer_pb2_grpc as pb_grpc
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.max_receive_message_length", -1),
               ("grpc.max_send_message_length", -1)]
    channels = [grpc.aio.insecure_channel(target, options=options) for _ in range(n_clients)]
    import numpy as np
    form = pb.ID_FORMAT_PACKED if packed else pb.ID_FORMAT_REPEATED
    requests = [pb.TokenizeRequest(text=t, format=form) for t in texts]
    sizes = [len(t.encode()) for t in texts]
    latencies, nbytes, tokens, errors, checked = [], 0, 0, {}, 0
    await asyncio.gather(*(c.channel_ready() for c in channels))
    conn.send("ready")
    start_at = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    await asyncio.sleep(max(0.0, start_at - time.time()))
    begin = time.perf_counter()
    measure_from, measure_to = begin + warmup, begin + warmup + duration

    async def client(k: int):
        nonlocal nbytes, tokens, checked
        stub = pb_grpc.TokenizerStub(channels[k])
        rng = random.Random(seed * 100003 + k)
        order = rng.choices(range(len(requests)), weights, k=4096)
        n = 0
        while True:
            sent = time.perf_counter()
            if sent >= measure_to:
                return
            i = order[n % len(order)]
            n += 1
            try:
                reply = await stub.Tokenize(requests[i], timeout=120)
            except grpc.aio.AioRpcError as exc:
                if measure_from <= time.perf_counter() <= measure_to:
                    errors[exc.code().name] = errors.get(exc.code().name, 0) + 1
                continue
            done = time.perf_counter()
            got = reply.ids_packed if packed else np.asarray(reply.ids, "<u4").tobytes()
            exact = got == expected[i]    # every reply, against tiktoken
            checked += 1
            # a request counts when it completes inside the window (closed-loop throughput;
            # with latencies longer than the window, "sent inside it too" would count none)
            if measure_from <= done <= measure_to:
                if not exact:
                    errors["mismatch"] = errors.get("mismatch", 0) + 1
                    continue
                latencies.append(done - sent)
                nbytes += sizes[i]
                tokens += len(got) // 4
            elif not exact:
                errors["mismatch (outside the window)"] = \
                    errors.get("mismatch (outside the window)", 0) + 1

    await asyncio.gather(*(client(k) for k in range(n_clients)))
    for channel in channels:
        await channel.close()
    return {"latencies": latencies, "bytes": nbytes, "tokens": tokens, "errors": errors,
            "checked": checked}


class LoadGenerator:
    """`processes` worker processes that drive the closed-loop clients of every cell."""

    def __init__(self, processes: int, cells: dict, event_loop: str = "asyncio"):
        self.event_loop = event_loop   # the clients' asyncio loop (event_loop.py's choices)
        ctx = mp.get_context("spawn")
        self.workers = []
        for _ in range(max(1, processes)):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child,), daemon=True)
            proc.start()
            self.workers.append((proc, parent))
        for _, conn in self.workers:
            for size, payload in cells.items():
                conn.send(("texts", size, *payload))

    def run_cell(self, target: str, clients: int, size: str, warmup: float,
                 duration: float, packed: bool = True) -> dict:
        workers = self.workers[:max(1, min(len(self.workers), clients))]
        n = len(workers)
        shares = [clients // n + (1 if k < clients % n else 0) for k in range(n)]
        for k, ((_, conn), share) in enumerate(zip(workers, shares)):
            conn.send(("cell", target, share, size, packed, warmup, duration, k,
                       self.event_loop))
        for _, conn in workers:   # every client connected: start together
            if conn.recv() != "ready":
                raise RuntimeError("load generator out of step")
        start_at = time.time() + 0.05
        for _, conn in workers:
            conn.send(start_at)
        cpu0, wall = self.cpu_seconds(), time.perf_counter()
        results = [conn.recv() for _, conn in workers]
        # the clients' cores (warm-up and measured window): beside the server's, whether
        # the host's CPUs were all busy (then the load generator shares the limit)
        cpu = (self.cpu_seconds() - cpu0) / (time.perf_counter() - wall)
        return summarize(results, duration) | {"client_cpu_cores": cpu}

    def cpu_seconds(self) -> float:
        return sum(_tree_cpu_seconds(proc.pid) for proc, _ in self.workers)

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
            "errors": errors, "checked": sum(r["checked"] for r in results)}


# ---- the server ----------------------------------------------------------------------------

METRICS = ("istanbul_tokenizer_batch_requests_sum", "istanbul_tokenizer_batch_requests_count",
           "istanbul_tokenizer_batch_documents_sum", "istanbul_tokenizer_gpu_seconds_sum",
           "istanbul_tokenizer_gpu_seconds_count", "istanbul_tokenizer_batch_seconds_sum",
           "istanbul_tokenizer_request_seconds_sum", "istanbul_tokenizer_request_seconds_count",
           "istanbul_tokenizer_queue_wait_seconds_sum",
           "istanbul_tokenizer_queue_wait_seconds_count",
           # the shared GPU process (--gpu-process shared): its calls and worker batches per round
           "istanbul_tokenizer_gpu_host_seconds_sum", "istanbul_tokenizer_gpu_host_seconds_count",
           "istanbul_tokenizer_gpu_host_messages_sum",
           "istanbul_tokenizer_gpu_host_messages_count",
           "istanbul_tokenizer_gpu_host_thread_cpu_seconds_total")
# the shared GPU process's one thread: wall seconds by phase (gpu_process.HostMetrics)
HOST_PHASES = ("wait", "spin", "receive", "round", "answer")
# the GPU encoder's host phases and slow paths (the device's owner: the GPU process or workers)
ENCODER_METRICS = {"upload": 'seconds_total{{phase="upload"', "readback": 'seconds_total{{phase="readback"',
                   "calls": 'calls_total{{path="all"', "slow": 'calls_total{{path="slow"'}


def _encoder_phases(delta: dict, owner: str) -> dict:
    """Per GPU encoder call of the cell: its upload and readback (map + wait) ms, and the
    chunks that took the slow path per call."""
    calls = delta[f"encoder_{owner}_calls"]
    if not calls:
        return {"encoder_upload_ms": None, "encoder_readback_ms": None,
                "slow_paths_per_call": None}
    return {"encoder_upload_ms": delta[f"encoder_{owner}_upload"] / calls * 1e3,
            "encoder_readback_ms": delta[f"encoder_{owner}_readback"] / calls * 1e3,
            "slow_paths_per_call": delta[f"encoder_{owner}_slow"] / calls}


def _mean_ms(delta: dict, name: str) -> float | None:
    """Mean of a histogram over a cell, in ms (from its _sum and _count deltas)."""
    count = delta[f"{name}_count"]
    return delta[f"{name}_sum"] / count * 1e3 if count else None


# layout `shared-keep-clock`: the shared GPU process with `--gpu-keep-clock KEEP_CLOCK_S`
KEEP_CLOCK, KEEP_CLOCK_S = "shared-keep-clock", 2.0
# a shared layout ending `-xG` (`shared-x2`, `shared-keep-clock-x2`): G GPU processes
# (`--gpu-processes G`); their counters are summed like the workers'
LAYOUT = re.compile(rf"^(shared|per-worker|{KEEP_CLOCK})(?:-x(\d+))?$")


# `--workers defaults`: the server started with no layout flag (`istanbul serve`'s defaults,
# sized to the machine); the table names the layout they resolved to
DEFAULTS = "defaults"


def resolved_layout(log: str) -> tuple[int, str]:
    """(workers, bench layout name) from a server log's "serving with ..." line."""
    m = re.search(r"serving with --workers (\d+) --gpu-processes (\d+) --gpu-keep-clock "
                  r"([\d.]+)", log)
    if not m:
        raise SystemExit("the server logged no 'serving with' line")
    workers, hosts, keep = int(m[1]), int(m[2]), float(m[3])
    if workers == 1:
        return 1, "own"
    name = KEEP_CLOCK if keep > 0 else "shared"
    return workers, name + (f"-x{hosts}" if hosts > 1 else "")


def parse_layout(layout: str) -> tuple[str, int]:
    """(`--gpu-process` layout, GPU processes) of a bench layout name; ValueError if bad."""
    m = LAYOUT.match(layout)
    if not m or (m.group(2) and (m.group(1) == "per-worker" or int(m.group(2)) < 1)):
        raise ValueError(f"{layout!r}: use shared, per-worker or {KEEP_CLOCK}, a shared one "
                         "optionally with -xG (G GPU processes)")
    return m.group(1), int(m.group(2) or 1)


class Server:
    def __init__(self, vocab: str, adapter: str | None, workers: int, gpu_process: str,
                 window_ms: float, workdir: Path, logdir: Path, event_loop: str = "auto"):
        self.workers = workers
        self.port_file = workdir / f"port-{workers}-{gpu_process}-{event_loop}"
        self.metrics_port = _free_port()
        self.log = open(logdir / f"server-workers-{workers}-{gpu_process}-{event_loop}.log",
                        "w")
        cmd = [sys.executable, "-m", "tokenizer_svc", "--vocab", vocab, "--host", "127.0.0.1",
               "--port", "0", "--port-file", str(self.port_file), "--metrics-port",
               str(self.metrics_port), "--metrics-host", "127.0.0.1", "--workers", str(workers),
               "--max-queued-bytes", "4GiB", "--batch-window-ms", str(window_ms),
               "--event-loop", event_loop]
        self.layout = gpu_process
        if workers != DEFAULTS:    # every layout flag given: `auto` would size them
            layout, hosts = parse_layout(gpu_process) if workers > 1 else ("own", 1)
            cmd += ["--gpu-processes", str(hosts), "--gpu-keep-clock",
                    str(KEEP_CLOCK_S if layout == KEEP_CLOCK else 0)]
            if workers > 1:
                cmd += ["--gpu-process", "shared" if layout == KEEP_CLOCK else layout]
        else:                      # `istanbul serve` as a user starts it: no layout flags
            cmd[cmd.index("--workers"):cmd.index("--workers") + 2] = []
        if adapter is not None:
            cmd += ["--adapter", adapter]
        # the parent's PYTHONPATH is kept: packages may be installed there (--target dirs)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stderr=self.log)
        deadline = time.monotonic() + 300
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not start; see {self.log.name}")
            time.sleep(0.05)
        self.target = f"127.0.0.1:{self.port_file.read_text().strip()}"
        if workers == DEFAULTS:
            self.workers, self.layout = resolved_layout(Path(self.log.name).read_text())
        from tokenizer_svc.service.client import TokenizerClient
        self.client = TokenizerClient(self.target, timeout=300)
        self.client.wait_ready(300)

    def metrics(self) -> dict:
        """The server's counters (summed over workers) and its CPU seconds so far."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                      timeout=30).read().decode()
        values = {name: sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$",
                                                         text, re.M))
                  for name in METRICS}
        def labelled(start: str) -> float:   # the samples whose line starts so, summed
            pattern = "^" + re.escape(start) + r"[^}]*\} (\S+)$"
            return sum(float(v) for v in re.findall(pattern, text, re.M))

        for owner, prefix in (("workers", "istanbul_tokenizer_encoder_"),
                              ("gpu_host", "istanbul_tokenizer_gpu_host_encoder_")):
            for key, tail in ENCODER_METRICS.items():
                values[f"encoder_{owner}_{key}"] = labelled(prefix + tail.replace("{{", "{"))
        for phase in HOST_PHASES:
            values[f"host_{phase}"] = labelled("istanbul_tokenizer_gpu_host_thread_seconds_total"
                                               f'{{phase="{phase}"')
        values["cpu_seconds"] = _tree_cpu_seconds(self.proc.pid)
        return values

    def stop(self) -> int:
        self.client.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        finally:
            self.log.close()


def _tree_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` and its descendants (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    tree, grew = {pid}, True
    while grew:
        grew = False
        for p, (parent, _) in stats.items():
            if parent in tree and p not in tree:
                tree.add(p)
                grew = True
    return sum(stats[p][1] for p in tree if p in stats)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reference(vocab_path: str):
    """tiktoken with the same ranks and pattern: every reply is checked against it."""
    try:
        import tiktoken
    except ImportError:
        raise SystemExit("bench/service.py checks every reply against tiktoken: install it "
                         "(pip install tiktoken)") from None
    from tokenizer_svc.vocab import load_vocabulary
    try:
        v = load_vocabulary(vocab_path)
    except ValueError as exc:
        raise SystemExit(f"bench/service.py: {exc}") from None
    if v.merges is not None:
        raise SystemExit(f"bench/service.py: {vocab_path} is a tokenizer.json; give a "
                         ".tiktoken vocabulary (replies are checked against tiktoken)")
    return tiktoken.Encoding(v.name, pat_str=v.pattern, mergeable_ranks=v.ranks,
                             special_tokens=v.special_tokens)


# ---- report --------------------------------------------------------------------------------

def _fmt(value, digits=1):
    return "-" if value is None else f"{value:,.{digits}f}"


def _label(size: str) -> str:
    if size == "mixed":
        return "mixed"
    n = int(size)
    return f"{n // 1024} KB" if n >= 1024 else f"{n} B"


def targets(report: dict) -> list[dict]:
    """Each SPEC target against the best server configuration's cell."""
    out = []
    for clients, size, metric, op, target, floor in TARGETS:
        cells = [c for c in report["cells"] if c["clients"] == clients and c["size"] == size
                 and c[metric] is not None]
        if not cells:
            continue
        best = (max if op == ">=" else min)(cells, key=lambda c: c[metric])
        value = best[metric]
        met = value >= target if op == ">=" else value <= target
        out.append({"clients": clients, "size": size, "metric": metric, "target": target,
                    "floor": floor, "value": value, "workers": best["workers"],
                    "gpu_process": best.get("gpu_process", "own"),
                    "event_loop": best.get("event_loop", "asyncio"), "met": met,
                    "floor_met": (value >= floor) if floor is not None else met})
    return out


def markdown(report: dict) -> str:
    info, cfg = report["server"], report["config"]
    lines = [
        "# Tokenizer service benchmark",
        "",
        *([] if report.get("complete", True) else
          ["**Partial**: the run was stopped before every cell was measured.", ""]),
        f"Server: `istanbul serve --workers N` on **{info['adapter']}** ({info['adapter_type']}), "
        f"vocabulary **{info['vocabulary']}** (n_vocab {info['n_vocab']}); host "
        f"{report['host']['cpus']} CPUs, Python {report['host']['python']}. Closed-loop "
        f"clients over loopback, each with its own connection, in {cfg['processes']} load "
        f"processes on the {cfg.get('client_loop', 'asyncio')} event loop; `client CPU`: the "
        "cores they used (with `server CPU`: whether the host's CPUs were all busy); "
        f"{cfg['duration_s']} s measured per cell after {cfg['warmup_s']} s "
        f"warm-up; batching window {cfg['window_ms']} ms. Requests ask for packed ids; every "
        "reply is compared with tiktoken's ids (a difference counts as an error). `mixed`: "
        "100 B / 1 KB / 64 KB texts in 60/30/10% of requests. `GPU`: who owns the device "
        "(`own`: the one server process; `shared`: one GPU process encodes every worker's "
        "batches, `--gpu-process shared`; `shared-keep-clock`: the same with "
        f"`--gpu-keep-clock {KEEP_CLOCK_S:g}`, the GPU kept busy between batches so its clock "
        "stays up; a shared layout ending `-xG`: G GPU processes, `--gpu-processes G`, each "
        "with a device of its own, worker k batching through process k mod G, their "
        "counters and thread shares summed; `per-worker`: each worker has a device of its "
        "own). `loop`: the server "
        "processes' event loop (`--event-loop`; asyncio in tables before 2026-12-05). "
        "`req/batch`: mean Tokenize requests per worker batch; `batches/call`: worker batches "
        "per call of the shared GPU process; `GPU busy`: time inside encode calls / wall time "
        "(the GPU process's calls when shared, else summed over the workers' devices); "
        "`server CPU`: cores the server's processes used. Server-side means (the server's own "
        "histograms): `server ms` an RPC from its arrival in the servicer to its reply, `queue "
        "ms` its wait for a batch, `GPU call ms` one encode call as the worker waits for it "
        "(with the shared GPU process: the round trip to it), `host call ms` one call inside "
        "the GPU process; the client's mean minus `server ms` is gRPC, HTTP/2 and the "
        "loopback.",
        "",
        "| workers | GPU | loop | clients | text | reply | req/s | MB/s | tokens/s | p50 ms "
        "| p95 ms | p99 ms | mean ms | server ms | queue ms | GPU call ms | host call ms "
        "| req/batch | batches/call | GPU busy | server CPU | client CPU | errors |",
        "|---:|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for cell in report["cells"]:
        lines.append(
            f"| {cell['workers']} | {cell.get('gpu_process', 'own')} "
            f"| {cell.get('event_loop', 'asyncio')} | {cell['clients']} "
            f"| {_label(cell['size'])} "
            f"| {cell.get('format', 'packed')} "
            f"| {_fmt(cell['requests_per_s'])} | {_fmt(cell['mb_per_s'], 2)} "
            f"| {_fmt(cell['tokens_per_s'], 0)} | {_fmt(cell['p50_ms'], 2)} "
            f"| {_fmt(cell['p95_ms'], 2)} | {_fmt(cell['p99_ms'], 2)} "
            f"| {_fmt(cell.get('mean_ms'), 2)} | {_fmt(cell.get('server_ms'), 2)} "
            f"| {_fmt(cell.get('queue_ms'), 2)} | {_fmt(cell.get('gpu_call_ms'), 2)} "
            f"| {_fmt(cell.get('host_call_ms'), 2)} "
            f"| {_fmt(cell['requests_per_batch'], 1)} | {_fmt(cell.get('batches_per_call'), 1)} "
            f"| {_fmt(cell['gpu_busy'], 2)} "
            f"| {_fmt(cell['server_cpu_cores'], 1)} | {_fmt(cell.get('client_cpu_cores'), 1)} "
            f"| {sum(cell['errors'].values())} |")
    lines += ["", "The GPU encoder per call, i.e. per pipeline chunk of up to 16 MB (the device owner's counters: the GPU process when "
              "shared, else the workers): `upload ms` writing the text, `readback ms` mapping the "
              "result (mostly waiting for the GPU), `slow` chunks on the slow path per call (their "
              "ids outgrew the staging guess, a long piece's seam failed, or software Vulkan's "
              "budgeted kernels resumed: more round trips). The shared GPU process's one thread, "
              "as shares of the cell's wall time: `wait` for a message, `spin` (the clock "
              "keeper's), `receive` reading them, `round` running rounds (Encoding calls and "
              "answers), of it `answer` sending the answers; `CPU` the thread's CPU time / wall "
              "time. A thread mostly in `wait` waits for the workers; one mostly in `round` is "
              "what the workers wait for.", "",
              "| workers | GPU | loop | clients | text | upload ms | readback ms | slow "
              "| wait | spin | receive | round | answer | CPU |",
              "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for cell in report["cells"]:
        thread = cell.get("host_thread") or {}
        lines.append(f"| {cell['workers']} | {cell.get('gpu_process', 'own')} "
                     f"| {cell.get('event_loop', 'asyncio')} | {cell['clients']} "
                     f"| {_label(cell['size'])} | {_fmt(cell.get('encoder_upload_ms'), 3)} "
                     f"| {_fmt(cell.get('encoder_readback_ms'), 3)} "
                     f"| {_fmt(cell.get('slow_paths_per_call'), 2)} "
                     + "".join(f"| {_fmt(thread.get(p), 2)} " for p in HOST_PHASES)
                     + f"| {_fmt(cell.get('host_thread_cpu'), 2)} |")
    ceiling = report.get("in_process")
    if ceiling:
        lines += ["", "Ceiling: the in-process encoder (`Encoding.encode_batch_flat`, the library "
                  "without the service) on each cell's texts, all of them in one call, on the "
                  "same device, in a process of its own after the servers stopped:", "",
                  "| text | texts per call | MB/s | texts/s |", "|---:|---:|---:|---:|"]
        for size, row in ceiling.items():
            lines.append(f"| {_label(size)} | {row['texts_per_call']} | "
                         f"{_fmt(row['mb_per_s'], 2)} | {_fmt(row['texts_per_s'])} |")
    dt = report.get("defaults_targets")
    if dt:
        lines += ["", "The defaults (`istanbul serve` with no layout flag) against issue 51's "
                  "floors and goals:", "", "| cell | measured | floor | goal | met |",
                  "|---|---:|---:|---:|---|"]
        for t in dt:
            unit = {"mb_per_s": " MB/s", "requests_per_s": " req/s"}.get(t["metric"], "x")
            goal = "-" if t["goal"] is None else f"{t['goal']:,g}{unit}"
            lines.append(f"| {t['cell']} {t['metric'].replace('_', ' ')} | "
                         f"{_fmt(t['value'], 2)} | {t['floor']:,g}{unit} | "
                         f"{goal} | "
                         f"{'goal' if t['goal_met'] else 'floor' if t['floor_met'] else 'no'} |")
    met = targets(report)
    if met:
        lines += ["", "Targets (SPEC.md section 11; the best configuration's cell):", "",
                  "| cell | target | measured | workers | GPU | loop | met |",
                  "|---|---:|---:|---:|---|---|---|"]
        for t in met:
            unit = {"mb_per_s": "MB/s", "requests_per_s": "req/s", "p50_ms": "ms p50"}[t["metric"]]
            op = ">=" if t["metric"] != "p50_ms" else "<="
            floor = f" (at least {t['floor']:,.0f})" if t["floor"] is not None else ""
            lines.append(f"| {t['clients']} x {_label(t['size'])} | {op} {t['target']:,.1f} "
                         f"{unit}{floor} | {_fmt(t['value'], 2)} | {t['workers']} "
                         f"| {t.get('gpu_process', 'own')} | {t.get('event_loop', 'asyncio')} "
                         f"| {'yes' if t['met'] else ('floor only' if t['floor_met'] else 'no')} |")
    lines += ["", f"Replies checked against tiktoken: {report.get('verified_replies', 0):,} "
              f"(every reply of every cell, warm-up included).", ""]
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
    cpus = os.cpu_count() or 2
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, type=Path, help="directory for service.json and "
                   "service.md (default bench/results/<machine>/)")
    p.add_argument("--vocab", default=default_vocab(), help="vocabulary path or known name "
                   "(default: gpt2.tiktoken in $ISTANBUL_VOCAB_DIR, ../shared/vocab or "
                   "shared/vocab)")
    p.add_argument("--adapter", default=None, help="GPU adapter for the server")
    p.add_argument("--workers", default=",".join([DEFAULTS, *map(str, sorted(
                       {1, max(2, cpus * 3 // 8)}))]),
                   help="comma-separated server configurations, `istanbul serve --workers N`; "
                        f"{DEFAULTS}: `istanbul serve` with no layout flag, as a user starts "
                        "it (default: defaults, 1 and 3/8 of the CPUs, 6 on 16)")
    p.add_argument("--gpu-process", default="shared,per-worker",
                   help="for configurations of more than one worker: `istanbul serve "
                        "--gpu-process` layouts to measure, comma-separated: shared, "
                        f"per-worker, {KEEP_CLOCK} (shared with --gpu-keep-clock "
                        f"{KEEP_CLOCK_S:g}); a shared one ending -xG runs G GPU processes "
                        "(--gpu-processes G; e.g. shared-keep-clock-x2) (default "
                        "shared,per-worker)")
    p.add_argument("--event-loops", default="auto",
                   help="the servers' event loops to measure, comma-separated: auto, uvloop, "
                        "asyncio (`istanbul serve --event-loop`; default auto); each is a "
                        "configuration of its own")
    p.add_argument("--client-loop", default="asyncio", choices=("asyncio", "uvloop", "auto"),
                   help="the load generator's event loop (default asyncio, as in every table "
                        "before 2026-12-05; uvloop: less client CPU beside the server's)")
    p.add_argument("--clients", default=",".join(map(str, DEFAULT_CLIENTS)),
                   help="comma-separated client counts (default 1,16,64,256)")
    p.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                   help="comma-separated text sizes in bytes, or `mixed` (default "
                        "100,1024,65536,mixed)")
    p.add_argument("--formats", default="packed",
                   help="reply formats to measure: packed (ids_packed bytes), repeated (the "
                        "repeated ids field, what old clients read), or both comma-separated "
                        "(default packed)")
    p.add_argument("--window-ms", type=float, default=2.0, help="batching window (default 2)")
    p.add_argument("--duration", type=float, default=2.0, help="measured seconds per cell "
                   "(default 2)")
    p.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds per cell "
                   "(default 0.5)")
    p.add_argument("--processes", type=int, default=max(1, min(8, cpus // 2)),
                   help="load-generator processes (default: half the CPUs, at most 8)")
    p.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                   help="skip the table's ceiling: the in-process encoder (the library, "
                        "`encode_batch_flat` of each cell's texts in one call) on the same "
                        "texts and device, in a process of its own after the servers")
    p.add_argument("--corpus", nargs="*", default=[], help="text files to cut texts from "
                   "(default: the Python standard library's sources)")
    args = p.parse_args(argv)
    preflight()
    workers_list = [x.strip() if x.strip() == DEFAULTS else int(x)
                    for x in args.workers.split(",")]
    layouts = [x.strip() for x in args.gpu_process.split(",")]
    for layout in layouts:
        try:
            parse_layout(layout)
        except ValueError as exc:
            raise SystemExit(f"--gpu-process: {exc}") from None
    from tokenizer_svc.service.event_loop import resolve as resolve_loop
    try:
        loops = [resolve_loop(x.strip()) for x in args.event_loops.split(",")]
    except Exception as exc:   # UserFacingError: unknown, or uvloop not installed
        raise SystemExit(f"--event-loops: {exc}") from None
    configs = [(w, layout, loop) for w in workers_list
               for layout in ([DEFAULTS] if w == DEFAULTS else layouts if w > 1 else ["own"])
               for loop in loops]
    formats = [f.strip() for f in args.formats.split(",")]
    if not set(formats) <= {"packed", "repeated"}:
        raise SystemExit(f"--formats: {args.formats!r}; use packed, repeated or both")
    clients = [int(x) for x in args.clients.split(",")]
    sizes = [x.strip() for x in args.sizes.split(",")]
    for size in sizes:
        if size != "mixed" and not size.isdigit():
            raise SystemExit(f"--sizes: {size!r} is neither a number of bytes nor `mixed`")
    args.out = args.out or default_dir(args.adapter)
    args.out.mkdir(parents=True, exist_ok=True)
    corpus = load_corpus(args.corpus)
    needed = {int(x) for x in sizes if x != "mixed"}
    if "mixed" in sizes:
        needed |= {n for n, _ in MIXED}
    texts = {n: make_texts(corpus, n, 64 if n >= 16384 else 256, seed=n) for n in needed}
    reference = _reference(args.vocab)
    import numpy as np
    expected = {n: [np.asarray(reference.encode_ordinary(t), "<u4").tobytes() for t in batch]
                for n, batch in texts.items()}
    cells = {}
    for size in sizes:
        pool, weights = cell_texts(texts, size)
        exp = cell_texts(expected, size)[0]
        cells[size] = (pool, weights, exp)
    report = {"config": {"workers": workers_list, "gpu_process": layouts, "event_loops": loops,
                         "clients": clients, "sizes": sizes,
                         "formats": formats,
                         "window_ms": args.window_ms, "duration_s": args.duration,
                         "warmup_s": args.warmup, "processes": args.processes,
                         "client_loop": resolve_loop(args.client_loop),
                         "vocab": args.vocab, "mixed": MIXED},
              "host": {"cpus": cpus, "python": platform.python_version(),
                       "platform": platform.platform()},
              "cells": []}
    verified = 0
    load = LoadGenerator(args.processes, cells, resolve_loop(args.client_loop))
    with tempfile.TemporaryDirectory() as tmp:
        for workers, layout, loop in configs:
            server = Server(args.vocab, args.adapter, workers, layout, args.window_ms,
                            Path(tmp), args.out, loop)
            if workers == DEFAULTS:      # the cells name what the defaults resolved to
                workers, layout = server.workers, f"{server.layout} (defaults)"
            try:
                info = server.client.info()
                report["server"] = {"adapter": info.adapter.name, "adapter_type": info.adapter.type,
                                    "vocabulary": info.vocabulary_name, "n_vocab": info.n_vocab,
                                    "vocabulary_hash": info.vocabulary_hash}
                for n in sorted(needed):  # warm-up: kernels compiled, buffers grown
                    server.client.encode_batch_flat(texts[n][:32])
                for size, n, form in ((size, n, form) for size in sizes for n in clients
                                      for form in formats):
                    before = server.metrics()
                    wall = time.perf_counter()
                    cell = load.run_cell(server.target, n, size, args.warmup,
                                         args.duration, packed=form == "packed")
                    wall = time.perf_counter() - wall
                    after = server.metrics()
                    delta = {k: after[k] - before[k] for k in after}
                    batches = delta["istanbul_tokenizer_batch_requests_count"]
                    rounds = delta["istanbul_tokenizer_gpu_host_messages_count"]
                    shared = parse_layout(server.layout)[0] in ("shared", KEEP_CLOCK) \
                        if server.layout != "own" else False
                    verified += cell.pop("checked")
                    cell.update(workers=workers, gpu_process=layout, event_loop=loop,
                                clients=n, size=size,
                                format=form,
                                requests_per_batch=(delta["istanbul_tokenizer_batch_requests_sum"]
                                                    / batches if batches else None),
                                batches_per_call=(delta["istanbul_tokenizer_gpu_host_messages_sum"]
                                                  / rounds if rounds else None),
                                gpu_busy=delta["istanbul_tokenizer_gpu_host_seconds_sum" if shared
                                               else "istanbul_tokenizer_gpu_seconds_sum"] / wall,
                                # where a request's time goes on the server side (means):
                                # the RPC inside the server, its wait for a batch, one GPU call
                                server_ms=_mean_ms(delta, "istanbul_tokenizer_request_seconds"),
                                queue_ms=_mean_ms(delta, "istanbul_tokenizer_queue_wait_seconds"),
                                gpu_call_ms=_mean_ms(delta, "istanbul_tokenizer_gpu_seconds"),
                                host_call_ms=(_mean_ms(delta, "istanbul_tokenizer_gpu_host_seconds")
                                              if shared else None),
                                **_encoder_phases(delta, "gpu_host" if shared else "workers"),
                                # the GPU process's thread: its wall time's shares, its CPU
                                host_thread={p: delta[f"host_{p}"] / wall for p in HOST_PHASES}
                                if shared else None,
                                host_thread_cpu=(delta["istanbul_tokenizer_gpu_host_thread_cpu"
                                                       "_seconds_total"] / wall
                                                 if shared else None),
                                server_cpu_cores=delta["cpu_seconds"] / wall)
                    report["cells"].append(cell)
                    report["verified_replies"] = verified
                    write_report(args.out, report, final=False)  # a time limit keeps what ran
                    print(f"workers {workers:2} {layout:>10} {loop:>7} clients {n:4} text "
                          f"{_label(size):>6} {form}: "
                          f"{cell['requests_per_s']:9.1f} req/s {cell['mb_per_s']:8.2f} MB/s "
                          f"p50 {_fmt(cell['p50_ms'], 2)} p99 {_fmt(cell['p99_ms'], 2)} ms "
                          f"req/batch {_fmt(cell['requests_per_batch'])} "
                          f"batches/call {_fmt(cell['batches_per_call'])} "
                          f"cpu {cell['server_cpu_cores']:.1f} + clients {cell['client_cpu_cores']:.1f} "
                          f"errors {sum(cell['errors'].values())}", flush=True)
            finally:
                code = server.stop()
                if code != 0:
                    print(f"warning: server exited with {code}", file=sys.stderr)
    load.close()
    report["verified_replies"] = verified
    if args.ceiling:
        pools = {size: cells[size][0] for size in sizes if size != "mixed"}
        report["in_process"] = in_process_ceiling(args.vocab, args.adapter, pools,
                                                  args.duration)
        for size, row in report["in_process"].items():
            print(f"in-process encoder, text {_label(size):>6}: {row['mb_per_s']:8.2f} MB/s "
                  f"{row['texts_per_s']:9.1f} texts/s", flush=True)
    report["targets"] = targets(report)
    report["defaults_targets"] = defaults_targets(report)
    write_report(args.out, report, final=True)
    print(f"wrote {args.out / 'service.json'} and {args.out / 'service.md'}")
    return 0


def _ceiling_child(conn, vocab: str, adapter, pools: dict, duration: float) -> None:
    """In a process of its own (its own device, none of the bench's state): the in-process
    encoder on each cell's texts, one `encode_batch_flat` of the whole pool per call."""
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    from istanbul.shaders.engine import default_device
    from tokenizer_svc.encoding import get_encoding
    enc = get_encoding(vocab, device=default_device(adapter))
    out = {}
    for size, pool in pools.items():
        raw = [t.encode() for t in pool]
        nbytes = sum(map(len, raw))
        until = time.perf_counter() + 1.0            # warm-up: kernels, buffers, the clock
        while time.perf_counter() < until:
            enc.encode_batch_flat(pool)
        calls, started = 0, time.perf_counter()
        while calls == 0 or time.perf_counter() - started < duration:
            enc.encode_batch_flat(pool)
            calls += 1
        seconds = time.perf_counter() - started
        out[size] = {"texts_per_call": len(pool), "calls": calls,
                     "mb_per_s": nbytes * calls / seconds / 1e6,
                     "texts_per_s": len(pool) * calls / seconds}
    conn.send(out)
    conn.close()


def in_process_ceiling(vocab: str, adapter, pools: dict, duration: float) -> dict:
    """The ceiling of the table: the same texts through the library in one process."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_ceiling_child, args=(child, vocab, adapter, pools, duration))
    proc.start()
    result = parent.recv()
    proc.join()
    return result


DEFAULT_TARGETS = (  # the defaults' cells (issue 51): (clients, text, metric, floor, goal)
    (64, "65536", "mb_per_s", 300.0, None),
    (256, "100", "requests_per_s", 15000.0, 40000.0),
)


def defaults_targets(report: dict) -> list[dict]:
    """The defaults' cells against their floors, and 64 x 64 KB against the in-process
    encoder on the same texts (floor 0.5x, goal 0.8x)."""
    cells = {(c["clients"], c["size"]): c for c in report["cells"]
             if "(defaults)" in str(c.get("gpu_process"))}
    out = []
    for clients, size, metric, floor, goal in DEFAULT_TARGETS:
        cell = cells.get((clients, size))
        if cell is not None and cell[metric] is not None:
            out.append({"cell": f"{clients} x {_label(size)}", "metric": metric,
                        "value": cell[metric], "floor": floor, "goal": goal,
                        "floor_met": cell[metric] >= floor,
                        "goal_met": goal is not None and cell[metric] >= goal})
    ceiling = (report.get("in_process") or {}).get("65536")
    cell = cells.get((64, "65536"))
    if ceiling and cell:
        ratio = cell["mb_per_s"] / ceiling["mb_per_s"]
        out.append({"cell": "64 x 64 KB", "metric": "share of in-process", "value": ratio,
                    "floor": 0.5, "goal": 0.8, "floor_met": ratio >= 0.5,
                    "goal_met": ratio >= 0.8})
    return out


def write_report(out: Path, report: dict, final: bool) -> None:
    report["complete"] = final
    (out / "service.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "service.md").write_text(markdown(report))


if __name__ == "__main__":
    raise SystemExit(main())
