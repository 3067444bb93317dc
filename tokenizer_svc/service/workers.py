"""`istanbul serve --workers N`: N server processes on one port (SO_REUSEPORT), one supervisor.

Why processes: a request costs the server Python work on top of the GPU call (HTTP/2 and
protobuf handling in grpc's event loop, UTF-8 checks, batch bookkeeping, building the
reply), and one Python process runs that on one core: its event loop saturates while its
GPU thread is mostly idle (dev/service_throughput/README.md). So the request
handling is replicated: each worker is a whole `TokenizerServer` (asyncio grpc server,
dynamic batcher, long lane, health, reflection, drain) with its own GPU device on the same
adapter, and exactly one batcher per device. The kernel spreads new connections over the
workers' listening sockets (SO_REUSEPORT); a connection and its streams stay with one
worker, so ordering, deadlines, cancellation and backpressure (`--max-queued-bytes`, per
worker) work as in a single process. What this gives up: requests of different workers
never share a GPU call (each worker batches its own connections; with several clients per
worker batches still form), and each worker holds its own device buffers. A single GPU
process fed by front-end processes through shared memory would batch across all
connections, but its one Python thread would again split and pack every reply; not built
without a measurement (bench/service.py) that it pays.

The supervisor (this module, the `istanbul serve` process itself):

- checks that the port can be bound, then holds it with a socket that is bound with
  SO_REUSEPORT but never listens (so `--port 0` gets one port for all workers and nobody
  else takes it while workers restart);
- with `--gpu-process shared`, starts the GPU process (`--gpu-processes G`: G of them, each
  a device of its own, worker k batching through process k mod G) before the workers;
- starts the workers (spawned processes in their own process group: a Ctrl-C reaches only
  the supervisor, which forwards one SIGTERM), writes `--port-file` once all are SERVING
  (until then a connection may reach a worker that still loads: NOT_SERVING, UNAVAILABLE);
- serves `--metrics-port` itself: every worker's metrics (each on a loopback port of its
  own) under one endpoint, with a `worker` label;
- forwards SIGTERM/SIGINT to every worker (each drains as a single server does) and exits
  with the worst worker exit code;
- restarts a worker that dies on its own (the others keep serving meanwhile: the kernel
  sends new connections only to listening sockets), at once if it had been serving, else
  after 1 s, 2 s; a worker that dies MAX_START_FAILURES times in a row before serving (a
  broken adapter, say) stops the group with exit 1.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from .config import ServerConfig
from .ports import check_free, port_error

log = logging.getLogger("tokenizer_svc.service")


def _worker_main(index: int, config: ServerConfig, vocab: str, adapter, gpu_host,
                 log_format: str, verbose: bool, status) -> None:
    """One worker: a whole TokenizerServer in this (spawned) process (process.serve); with
    `gpu_host` (address, key) its batches run in the group's GPU process (gpu_process.py)."""
    from .child import become_child
    become_child(f"istanbul-w{index}")
    import sys
    from istanbul_errors import UserFacingError
    from . import event_loop
    from .process import serve
    from .logs import setup_logging
    setup_logging(log_format, logging.DEBUG if verbose else logging.INFO)
    log.info("worker starting", extra={"data": {"worker": index, "pid": os.getpid()}})

    def on_listening(state: str, port: int, metrics_port: int | None) -> None:
        status.put((state, index, port, metrics_port))

    try:
        code = event_loop.run(serve(config, vocab, adapter, None, on_listening=on_listening,
                                    gpu_host=gpu_host), config.event_loop)
    except UserFacingError as exc:
        print(f"istanbul serve: worker {index}: error: {exc}", file=sys.stderr)
        code = 1
    raise SystemExit(code)


def _reserve(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT that never listens: it fixes the port
    (port 0: the kernel picks one) for the workers, which bind it too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise port_error("gRPC port", "--port", host, port, exc) from None
    return sock


class WorkerMetrics:
    """A prometheus Collector: every worker's /metrics, each sample labelled worker="k"
    (and the GPU process's, worker="gpu")."""

    def __init__(self, ports: list, token: str | None, labels: list | None = None):
        self.ports, self.token = ports, token
        self.labels = labels or [str(k) for k in range(len(ports))]

    def collect(self):
        from prometheus_client.core import Metric
        from prometheus_client.parser import text_string_to_metric_families
        families: dict = {}
        up = Metric("istanbul_tokenizer_worker_up", "1 for each worker whose metrics answered",
                    "gauge")
        for k, port in zip(self.labels, self.ports):
            if port is None:   # (re)starting
                up.add_sample("istanbul_tokenizer_worker_up", {"worker": k}, 0)
                continue
            request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
            if self.token:
                request.add_header("Authorization", f"Bearer {self.token}")
            try:
                with urllib.request.urlopen(request, timeout=5) as reply:
                    text = reply.read().decode("utf-8")
            except OSError:
                up.add_sample("istanbul_tokenizer_worker_up", {"worker": k}, 0)
                continue
            up.add_sample("istanbul_tokenizer_worker_up", {"worker": k}, 1)
            for family in text_string_to_metric_families(text):
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation,
                                                            family.type)
                for s in family.samples:
                    merged.add_sample(s.name, {**s.labels, "worker": k}, s.value,
                                      s.timestamp)
        yield up
        yield from families.values()


GPU_PROCESS_CHOICES = ("shared", "per-worker")


def gpu_processes_problem(count: int, workers: int, gpu_process: str) -> str | None:
    """What is wrong with `--gpu-processes count` beside these options (None: nothing)."""
    if count == 1 or (workers >= 2 and gpu_process == "shared" and 1 <= count <= workers):
        return None
    return (f"--gpu-processes {count}: from 1 to --workers ({workers}), with --workers N >= 2 "
            "and --gpu-process shared")


def run_workers(config: ServerConfig, vocab: str, adapter, port_file: Path | None,
                workers: int, log_format: str = "json", verbose: bool = False,
                gpu_process: str = "shared", gpu_processes: int = 1) -> int:
    """Run `workers` server processes on config's port until SIGTERM/SIGINT; exit code.

    `gpu_process`: "shared" (GPU processes batch for the workers, gpu_process.py) or
    "per-worker" (each worker owns a device and batches its own connections).
    `gpu_processes` (shared): how many GPU processes, each with its own device on the
    adapter; worker k sends its batches to process k mod `gpu_processes` (one process's
    one Python thread is what the workers wait for at large requests)."""
    from istanbul_errors import UserFacingError
    from ..vocab import load_vocabulary
    if gpu_process not in GPU_PROCESS_CHOICES:
        raise UserFacingError(f"--gpu-process must be one of {', '.join(GPU_PROCESS_CHOICES)}, "
                              f"got {gpu_process!r}")
    problem = gpu_processes_problem(gpu_processes, workers, gpu_process)
    if problem:
        raise UserFacingError(problem)
    try:   # once here, so a bad --vocab is one error instead of one per worker
        load_vocabulary(vocab)
    except ValueError as exc:
        raise UserFacingError(f"could not load vocabulary {vocab!r}: {exc}") from None
    check_free("gRPC port", "--port", config.host, config.port)
    if config.metrics_port is not None:
        check_free("metrics port", "--metrics-port", config.metrics_host, config.metrics_port)
    holder = _reserve(config.host, config.port)
    port = holder.getsockname()[1]
    worker_config = replace(config, port=port, reuse_port=True,
                            metrics_port=0 if config.metrics_port is not None else None,
                            metrics_host="127.0.0.1")
    socket_dir = None
    gpu_hosts = []
    if gpu_process == "shared":   # a private directory: only this user reaches the sockets
        socket_dir = tempfile.mkdtemp(prefix="istanbul-serve-")
        from .gpu_wire import SOCKET_NAME
        gpu_hosts = [(os.path.join(socket_dir, f"{j}-{SOCKET_NAME}" if j else SOCKET_NAME),
                      os.urandom(32)) for j in range(gpu_processes)]
    group = _Group(workers, worker_config, vocab, adapter, log_format, verbose, gpu_hosts)
    stopping: list = []

    def on_signal(signum, frame):
        if stopping:       # a second signal: stop now, as a single server does
            group.signal_all(signal.SIGKILL, host=True)
            os._exit(1)
        stopping.append(signum)
        log.info("signal", extra={"data": {"signal": signal.Signals(signum).name,
                                           "workers": workers}})
        group.signal_all(signal.SIGTERM)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    metrics_server, announced = None, False
    try:
        group.start_all()
        while not stopping and not group.failed:
            group.step()
            if group.all_ready_once and not announced:
                if config.metrics_port is not None:
                    from prometheus_client import CollectorRegistry
                    from ..exposure import serve_metrics
                    registry = CollectorRegistry()
                    token = config.auth_tokens[0] if config.metrics_auth else None
                    registry.register(WorkerMetrics(group.metrics_ports, token, group.labels))
                    metrics_server = serve_metrics(
                        registry, config.metrics_host, config.metrics_port,
                        config.auth_tokens if config.metrics_auth else ())
                if port_file is not None:
                    tmp = port_file.with_name(port_file.name + ".tmp")
                    tmp.write_text(f"{port}\n")
                    tmp.replace(port_file)
                log.info("workers serving", extra={"data": {
                    "address": f"{config.host}:{port}", "workers": workers,
                    "gpu_process": gpu_process, "gpu_processes": len(gpu_hosts),
                    "metrics_port": metrics_server.server_port if metrics_server else None}})
                announced = True
        if group.failed:
            group.signal_all(signal.SIGTERM)
        codes = group.wait_all()
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
            metrics_server.server_close()
        holder.close()
        group.signal_all(signal.SIGKILL, host=True)   # nothing outlives the supervisor
        if socket_dir is not None:
            shutil.rmtree(socket_dir, ignore_errors=True)
        for s, handler in previous.items():
            signal.signal(s, handler)
    if group.failed:
        return 1
    return max(0, *(c if c >= 0 else 1 for c in codes))


MAX_START_FAILURES = 3   # a worker (or a GPU process) that dies this often before serving
GPU = "gpu"              # the GPU process's name in reports and metrics labels ("gpu0".. of
                         # several)


def gpu_labels(count: int) -> list:
    """The GPU processes' names: "gpu" for one (as before several existed), else "gpu0".."""
    return [GPU] if count == 1 else [f"{GPU}{j}" for j in range(count)]


class _Group:
    """The worker processes and the GPU processes: started, watched, restarted (module doc).

    Members are indexed 0..n-1 (workers) and n.. (the GPU processes, when shared); `labels`
    names them for the metrics ("0".., "gpu" or "gpu0".., gpu_labels). Worker k sends its
    batches to GPU process k mod their number."""

    def __init__(self, n: int, config: ServerConfig, vocab: str, adapter, log_format: str,
                 verbose: bool, gpu_hosts: list = ()):
        self.ctx = mp.get_context("spawn")
        self.status = self.ctx.Queue()
        self.n = n
        self.gpu_hosts = list(gpu_hosts)
        self.args = (config, vocab, adapter, log_format, verbose, self.status)
        members = n + len(self.gpu_hosts)
        self.labels = [str(k) for k in range(n)] + gpu_labels(len(self.gpu_hosts))
        self.procs: list = [None] * members
        self.metrics_ports: list = [None] * members  # read by WorkerMetrics (same list object)
        self.ready = [False] * members               # SERVING since its last start
        self.start_failures = [0] * members          # deaths before SERVING, in a row
        self.restart_at = [None] * members           # monotonic time of a pending restart
        self.all_ready_once = False
        self.failed = False

    def _name(self, k: int) -> str:
        return "GPU process" if k >= self.n else "worker"

    def start(self, k: int) -> None:
        self.ready[k] = False
        self.restart_at[k] = None
        config, vocab, adapter, log_format, verbose, status = self.args
        if k >= self.n:
            from .gpu_process import host_main
            address, key = self.gpu_hosts[k - self.n]
            proc = self.ctx.Process(target=host_main, name=f"tokenizer-{self.labels[k]}",
                                    args=(config, vocab, adapter, address, key, log_format,
                                          verbose, status, self.labels[k]))
        else:
            host = self.gpu_hosts[k % len(self.gpu_hosts)] if self.gpu_hosts else None
            proc = self.ctx.Process(target=_worker_main, name=f"tokenizer-worker-{k}",
                                    args=(k, config, vocab, adapter, host, log_format, verbose,
                                          status))
        self.procs[k] = proc
        proc.start()

    def start_all(self) -> None:
        for k in reversed(range(len(self.procs))):   # the GPU process first: it loads longest
            self.start(k)

    def signal_all(self, signum, host: bool = False) -> None:
        """Signal the workers (and with `host`, the GPU processes, which must outlive their
        drain: wait_all stops them once they exited)."""
        for k, p in enumerate(self.procs):
            if (k < self.n or host) and p is not None and p.pid and p.exitcode is None:
                _kill(p.pid, signum)

    def step(self) -> None:
        """One round: read the members' reports, restart the ones that died."""
        try:
            kind, k, _, metrics_port = self.status.get(timeout=0.1)
            k = self.labels.index(k) if isinstance(k, str) else k
            self.metrics_ports[k] = metrics_port
            if kind == "ready":
                self.ready[k] = True
                self.start_failures[k] = 0
                self.all_ready_once = self.all_ready_once or all(self.ready)
        except Exception:   # queue.Empty
            pass
        now = time.monotonic()
        for k, p in enumerate(self.procs):
            if p.exitcode is None:
                continue
            if self.restart_at[k] is None:
                if not self.ready[k]:
                    self.start_failures[k] += 1
                if self.start_failures[k] >= MAX_START_FAILURES:
                    log.error(f"{self._name(k)} failed to start; stopping the group",
                              extra={"data": {"worker": self.labels[k], "exit_code": p.exitcode,
                                              "attempts": self.start_failures[k]}})
                    self.failed = True
                    return
                delay = float(self.start_failures[k])   # 0 after serving, then 1 s, 2 s
                log.warning(f"{self._name(k)} exited; restarting it", extra={"data": {
                    "worker": self.labels[k], "exit_code": p.exitcode, "restart_in_s": delay}})
                self.metrics_ports[k] = None
                self.ready[k] = False
                self.restart_at[k] = now + delay
            if now >= self.restart_at[k]:
                self.start(k)

    def wait_all(self) -> list:
        """Exit codes once every member exited: the workers (signalled, or dead), then the GPU
        process, stopped once no worker can need it. A member still alive past its bound (a
        worker: the drain's grace + --stall-timeout, which a single server keeps; the GPU
        process: --stall-timeout) writes its threads' stacks to the log and is killed: the
        group's SIGTERM always ends, and says where it waited."""
        config = self.args[0]
        margin = STOP_MARGIN_S + config.stall_timeout_s
        self._reap(self.procs[:self.n],
                    time.monotonic() + config.drain_delay_s + config.shutdown_grace_s + margin)
        hosts = [p for p in self.procs[self.n:] if p is not None]
        for host in hosts:
            if host.exitcode is None:
                _kill(host.pid, signal.SIGTERM)
        self._reap(hosts, time.monotonic() + margin)
        return [p.exitcode for p in self.procs if p is not None]

    def _reap(self, procs: list, deadline: float) -> None:
        for p in procs:
            if p is None:
                continue
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:
                log.error(f"{p.name} did not stop in time; its threads' stacks follow, then it "
                          "is killed", extra={"data": {"pid": p.pid}})
                _kill(p.pid, signal.SIGUSR1)   # child.dump_stacks_on_sigusr1
                p.join(STACK_DUMP_S)
                _kill(p.pid, signal.SIGKILL)
                p.join()


STOP_MARGIN_S = 15.0   # beyond a member's own bound: its interpreter's exit, a loaded machine
STACK_DUMP_S = 2.0     # for a member's stacks to reach the log before it is killed


def _kill(pid: int, signum) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass
