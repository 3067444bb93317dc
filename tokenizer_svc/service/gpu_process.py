"""The GPU process of `istanbul serve --workers N`: one Encoding on the device for every worker.

One process owns the only device and batches across every worker's connections (`--gpu-process
shared`, the default for N > 1), instead of N processes time-slicing the GPU between N contexts.

What runs where. A worker keeps all per-request work: gRPC, parsing, limits, the special-
token refusal, its dynamic batcher, truncation, offsets, replies, and its long lane (on the
worker's own device, in budgeted steps: long documents never enter this process's calls).
Its batch path's two GPU calls, `encode_batch_flat` and `decode_bytes_batch`, come here as
gpu_wire's messages, sent by gpu_worker.RemoteEncoding; text with no special tokens allowed
(nearly every batch) travels as its UTF-8, encoded in the worker.

This process (`GpuHost`): ONE thread waits on every connection, reads a message from each
readable one and runs them as one round: the documents of all encode messages that allow the
same special tokens go into one Encoding call (up to `max_call_bytes` of input; a message is
never split), the ids of all decode messages into one call, and each message is answered
with its own slice (an encode's ids as raw bytes, not pickled). A worker keeps at most two
batches in flight (app.REMOTE_INFLIGHT: its next batch is waiting when a round ends), each on
a connection of its own that waits for its answer, so the workers' batchers are the
backpressure and a round holds at most two batches per worker. The round's UTF-8 encode call
is only submitted there (`Encoding._begin_utf8_batch_flat`) and answered in the thread's next
pass, after the next round's call is submitted (on a second encoder) or when nothing else
waits: the GPU runs while the thread answers and receives (`GpuHost(overlap=False)`: one call
per round, answered in it).

Failures: an invalid id fails only its own message (decode is retried message by message,
the answer carries the Encoding's own error). If this process dies, every waiting worker's
call fails with UNAVAILABLE (clients retry), the supervisor restarts it (`host_main`,
spawned by workers.run_workers), and each worker reconnects on its next call.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import socket
import threading
import time
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Listener, answer_challenge, deliver_challenge
from multiprocessing.reduction import ForkingPickler

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from . import gpu_wire
from .gpu_wire import ENCODES, io_timeout, send_frames

log = logging.getLogger("tokenizer_svc.service")


class HostMetrics:
    """The GPU process's own /metrics (the supervisor serves them under worker="gpu")."""

    def __init__(self):
        from .metrics import BYTE_BUCKETS, COUNT_BUCKETS, LATENCY_BUCKETS, EncoderMetrics
        self.registry = r = CollectorRegistry()
        self.call_seconds = Histogram(
            "istanbul_tokenizer_gpu_host_seconds", "one Encoding call of the GPU process "
            "(encode or decode)", ["kind"], buckets=LATENCY_BUCKETS, registry=r)
        self.messages = Histogram(
            "istanbul_tokenizer_gpu_host_messages", "worker batches answered per round of "
            "the GPU process", buckets=COUNT_BUCKETS, registry=r)
        self.call_bytes = Histogram(
            "istanbul_tokenizer_gpu_host_bytes", "input bytes per encode call of the GPU "
            "process", buckets=BYTE_BUCKETS, registry=r)
        self.connections = Gauge("istanbul_tokenizer_gpu_host_connections",
                                 "workers connected to the GPU process", registry=r)
        # where the one thread's wall time goes (do rounds wait for messages, or messages
        # for the thread?) and the CPU it uses: wait (for a readable connection), spin (the
        # clock keeper's), receive (reading and unpickling messages), round (run_round: the
        # Encoding calls, in call_seconds, and the answers), answer (sending them)
        self.thread_seconds = Counter(
            "istanbul_tokenizer_gpu_host_thread_seconds", "wall time of the GPU process's "
            "thread by phase (wait, spin, receive, round, answer: part of round)", ["phase"],
            registry=r)
        self.thread_cpu_seconds = Counter(
            "istanbul_tokenizer_gpu_host_thread_cpu_seconds", "CPU time of the GPU process's "
            "thread", registry=r)
        self.phase = {name: self.thread_seconds.labels(name)
                      for name in ("wait", "spin", "receive", "round", "answer")}
        self.encoder = EncoderMetrics(r, "istanbul_tokenizer_gpu_host_encoder")
        self._http = None

    def serve_http(self, host: str, port: int, tokens: tuple = ()) -> int:
        from ..exposure import serve_metrics
        self._http = serve_metrics(self.registry, host, port, tokens)
        return self._http.server_port


def _describe(call: list) -> str:
    return f"encode call of {sum(len(m.body[0]) for m in call)} documents"


@dataclass
class _Message:
    conn: object
    kind: str
    body: tuple


class GpuHost:
    """Answers the workers' messages with one Encoding (see the module doc).

    One thread (`serve_forever`) does everything: it waits until connections are readable,
    reads one message from each, runs the round, answers: no hand-off between threads on a
    request's way (a lone request pays two process wake-ups, not four). With `overlap` (the
    default) a round's UTF-8 encode call is submitted and answered in the next pass, once
    the next round's call is submitted or nothing else waits: the GPU works while the
    thread answers and receives."""

    def __init__(self, encoding, *, max_call_bytes: int, metrics: HostMetrics | None = None,
                 keeper=None, overlap: bool = True):
        self.encoding = encoding
        self.max_call_bytes = max_call_bytes
        self.keeper = keeper            # clock_keeper.ClockKeeper (--gpu-keep-clock) or None
        # overlap: a round's UTF-8 encode call is begun (submitted) and answered in the next
        # pass of the loop, after the next round's call is begun or when nothing else waits:
        # its GPU time runs under the answers and receives around it (Encoding.
        # _begin_utf8_batch_flat). overlap=False answers each call in its own round.
        self.overlap = bool(overlap)
        self._pending = None            # (messages, begun call, host seconds) to answer
        self.metrics = metrics or HostMetrics()
        self._conns: list = []
        self._new: list = []            # accepted, not yet watched (attach -> serve_forever)
        self._new_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._closed = False   # serve_forever has ended: attach closes what it is given
        self.rounds = 0

    def attach(self, conn) -> None:
        """Watch `conn` (a worker's accepted connection) from the next round on."""
        with self._new_lock:
            if not self._closed:
                self._new.append(conn)
                conn = None
        if conn is not None:   # the loop has ended: no one would ever answer it
            conn.close()
            return
        self._wake()

    def stop(self) -> None:
        """`serve_forever` returns after the round in progress."""
        self._stopping = True
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def serve_forever(self) -> None:
        phase, clock = self.metrics.phase, time.perf_counter
        cpu = time.thread_time()
        # one epoll set for the thread's life (multiprocessing.connection.wait builds a new
        # selector and registers every connection on each call: ~50 us with 25 connections
        # on the dev CPU, at every round and between the clock keeper's spins)
        watched = selectors.DefaultSelector()
        watched.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._stopping:
                timeout = 0.0 if self._pending is not None else \
                    self.keeper.wait_timeout() if self.keeper is not None else None
                start = clock()
                readable = [key.fileobj for key, _ in watched.select(timeout)]
                received = clock()
                phase["wait"].inc(received - start)
                if not readable and self._pending is not None:   # nothing new: answer it
                    self._settle()
                    phase["round"].inc(clock() - received)
                    continue
                if not readable:   # nothing to encode while the clock is held: one spin
                    self.keeper.spin()
                    phase["spin"].inc(clock() - received)
                    continue
                messages = []
                for conn in readable:
                    if conn is self._wake_r:
                        self._wake_r.recv(4096)
                        with self._new_lock:
                            for new in self._new:
                                watched.register(new, selectors.EVENT_READ)
                            self._conns += self._new
                            self.metrics.connections.set(len(self._conns))
                            self._new.clear()
                        continue
                    try:
                        message = conn.recv()
                    except (EOFError, OSError):   # the worker went away
                        watched.unregister(conn)  # before its descriptor can be reused
                        self._conns.remove(conn)
                        self.metrics.connections.set(len(self._conns))
                        conn.close()
                        continue
                    messages.append(_Message(conn, message[0], message[1:]))
                start = clock()
                phase["receive"].inc(start - received)
                if messages:
                    if self.keeper is not None:
                        self.keeper.used()
                    self._round(messages)
                    phase["round"].inc(clock() - start)
                now = time.thread_time()
                self.metrics.thread_cpu_seconds.inc(now - cpu)
                cpu = now
        finally:
            try:
                self._settle()   # a begun call's messages are answered before the end
            finally:
                self._stop_watching(watched)

    def _stop_watching(self, watched) -> None:
        """Close every connection: the attached but not yet watched ones too (a worker
        waiting on one would otherwise wait for ever: no reply, its socket still open)."""
        with self._new_lock:
            self._closed = True
            pending, self._new = self._new, []
        watched.close()
        for conn in self._conns + pending:
            conn.close()
        self._wake_r.close()
        self._wake_w.close()

    def run_round(self, messages: list) -> None:
        """Answer every message: one Encoding call per run of encode messages that share
        their allowed special tokens (up to max_call_bytes), one for all decode messages."""
        self._round(messages)
        self._settle()

    def _round(self, messages: list) -> None:
        """run_round, except that the last UTF-8 encode call begun may wait in _pending for
        the next pass of the loop (overlap)."""
        self.rounds += 1
        self.metrics.messages.observe(len(messages))
        groups: dict = {}
        decodes = []
        for m in messages:
            if m.kind in ENCODES:
                groups.setdefault(m.body[1], []).append(m)
            elif m.kind == "decode":
                decodes.append(m)
            else:
                self._answer(m, ("failed", f"unknown message kind {m.kind!r}"))
        for allowed, group in groups.items():
            for call in self._calls(group):
                if self.overlap and hasattr(self.encoding, "_begin_utf8_batch_flat") and \
                        all(m.kind == "encode_utf8" for m in call):
                    self._begin(call)
                else:   # encodes with special tokens run whole, on the encoder a begun
                    self._settle()   # call would hold
                    self._encode(call, allowed)
        if decodes:
            self._decode(decodes)

    def _begin(self, call: list) -> None:
        """Submit the call's encode; answer the call begun before it (its GPU work ran while
        this thread did other things), and keep this one for the next pass."""
        start = time.perf_counter()
        try:
            begun = self.encoding._begin_utf8_batch_flat([doc for m in call for doc in m.body[0]])
        except Exception as exc:
            self._fail(call, _describe(call), exc)
            return
        previous, self._pending = self._pending, (call, begun, time.perf_counter() - start)
        if previous is not None:
            self._finish(*previous)

    def _settle(self) -> None:
        """Answer the begun call, if there is one."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._finish(*pending)

    def _finish(self, call: list, begun, host_s: float) -> None:
        from .metrics import last_encoder_profile
        start = time.perf_counter()
        try:
            ids, offsets = begun.finish()
        except Exception as exc:
            self._fail(call, _describe(call), exc)
            return
        # the call's own host time: its submit and its finish, not the work between them
        self.metrics.call_seconds.labels("encode").observe(host_s + time.perf_counter() - start)
        encoder = begun.encoder
        self.metrics.encoder.observe(encoder.last_profile if encoder is not None
                                     else last_encoder_profile(self.encoding))
        self._answer_call(call, np.asarray(ids, np.uint32), offsets)

    def _calls(self, group: list):
        """Consecutive runs of messages of at most max_call_bytes (at least one message)."""
        run, size = [], 0
        for m in group:
            nbytes = m.body[2]
            if run and size + nbytes > self.max_call_bytes:
                yield run
                run, size = [], 0
            run.append(m)
            size += nbytes
        if run:
            yield run

    def _encode(self, call: list, allowed) -> None:
        from .metrics import last_encoder_profile
        start = time.perf_counter()
        try:
            if all(m.kind == "encode_utf8" for m in call):
                ids, offsets = self.encoding._encode_utf8_batch_flat(
                    [doc for m in call for doc in m.body[0]])
            else:   # documents as they are among them (rare): the UTF-8 ones decoded
                ids, offsets = self.encoding.encode_batch_flat([doc for m in call for doc in (
                    m.body[0] if m.kind == "encode" else [d.decode() for d in m.body[0]])],
                    allowed_special=allowed, disallowed_special=())
            ids = np.asarray(ids, np.uint32)
        except Exception as exc:
            self._fail(call, _describe(call), exc)
            return
        self.metrics.call_seconds.labels("encode").observe(time.perf_counter() - start)
        self.metrics.encoder.observe(last_encoder_profile(self.encoding))
        self._answer_call(call, ids, offsets)

    def _answer_call(self, call: list, ids, offsets) -> None:
        """Each message of an encode call answered with its own slice of the call's ids."""
        self.metrics.call_bytes.observe(sum(m.body[2] for m in call))
        n = 0
        for m in call:
            k = len(m.body[0])
            lo, hi = int(offsets[n]), int(offsets[n + k])
            self._answer_ids(m, ids[lo:hi], offsets[n:n + k + 1] - lo)
            n += k

    def _decode(self, decodes: list) -> None:
        seqs = [seq for m in decodes for seq in m.body[0]]
        start = time.perf_counter()
        try:
            out = self.encoding.decode_bytes_batch(seqs)
        except ValueError:   # an invalid id somewhere: each message alone finds the guilty
            for m in decodes:
                self._decode_one(m)
            return
        except Exception as exc:
            self._fail(decodes, f"decode call of {len(seqs)} sequences", exc)
            return
        self.metrics.call_seconds.labels("decode").observe(time.perf_counter() - start)
        n = 0
        for m in decodes:
            k = len(m.body[0])
            self._answer(m, ("ok", out[n:n + k]))
            n += k

    def _decode_one(self, m: _Message) -> None:
        try:
            out = self.encoding.decode_bytes_batch(m.body[0])
        except ValueError as exc:   # InvalidTokenError: its message and details travel back
            self._answer(m, ("invalid_token", str(exc), getattr(exc, "token", ""),
                             getattr(exc, "position", ""), getattr(exc, "document", "")))
            return
        except Exception as exc:
            self._answer(m, ("failed", f"{type(exc).__name__}: {exc}"))
            return
        self._answer(m, ("ok", out))

    def _fail(self, messages: list, what: str, exc: Exception) -> None:
        """An Encoding call raised (device lost, a bug): every message in it fails."""
        log.exception("GPU process: %s failed", what)
        for m in messages:
            self._answer(m, ("failed", f"{type(exc).__name__}: {exc}"))

    def _answer_ids(self, m: _Message, ids, offsets) -> None:
        """An encode message's answer: its offsets, then its ids as raw bytes written from
        the call's array (gpu_wire.receive_reply reads them). Pickled, the ids were copied twice on
        this thread first (3.2 MB a round of 9 x 3 x 64 KB), and an ndarray's pickling cost
        more than the small offsets' list does (dev/service_throughput/README.md)."""
        self._answer(m, ("ok_ids", offsets.tolist()), ids)

    def _answer(self, m: _Message, reply: tuple, ids=None) -> None:
        """Send `reply` (then `ids` as raw bytes, when given); the time counts as answering."""
        start = time.perf_counter()
        bodies = [ForkingPickler.dumps(reply)]
        if ids is not None:
            bodies.append(np.ascontiguousarray(ids))   # a view as it is, in practice
        try:
            send_frames(m.conn.fileno(), bodies)
        except OSError:   # the worker went away (killed, restarting): nobody to answer
            pass
        self.metrics.phase["answer"].inc(time.perf_counter() - start)


# ---- the process --------------------------------------------------------------------------

def admit(host: GpuHost, conn, authkey: bytes) -> None:
    """The GPU process's side of a worker's handshake on `conn` (accepted without one), then
    hand it to `host`. Bounded as the worker's side is (gpu_worker.RemoteEncoding._open): a
    peer that connects and stalls or breaks off costs at most gpu_wire.HANDSHAKE_TIMEOUT_S and
    this connection, never another worker's."""
    try:
        io_timeout(conn.fileno(), gpu_wire.HANDSHAKE_TIMEOUT_S)
        deliver_challenge(conn, authkey)
        answer_challenge(conn, authkey)
        io_timeout(conn.fileno(), 0.0)
    except (OSError, EOFError, AuthenticationError) as exc:
        conn.close()
        log.warning("GPU process: a connection failed its handshake", extra={"data": {
            "error": f"{type(exc).__name__}: {exc}"}})
        return
    host.attach(conn)


def accept_workers(listener: Listener, host: GpuHost, authkey: bytes) -> None:
    """Accept workers' connections until `listener` is closed, each one's handshake on a
    thread of its own (admit): the accept loop never waits on a peer. `listener` is made
    without an authkey (its accept would do the handshake on this thread, unbounded)."""
    while True:
        try:
            conn = listener.accept()
        except OSError as exc:
            if getattr(listener, "_listener", None) is None:   # closed
                return
            log.warning("GPU process: accepting a connection failed", extra={"data": {
                "error": str(exc)}})
            time.sleep(0.05)   # e.g. out of descriptors: do not spin
            continue
        threading.Thread(target=admit, args=(host, conn, authkey), name="gpu-handshake",
                         daemon=True).start()


class _Stop(Exception):
    pass


SERVING_THREAD_FAILED = 70   # the GPU process's exit status when its one thread failed


def serve_or_exit(host: GpuHost, exit=os._exit) -> None:
    """`host.serve_forever()`, and if its thread fails (a bug: the Encoding calls' own
    errors are answered, not raised), the whole process exits: the workers' connections close,
    their calls fail with UNAVAILABLE and are retried, and the supervisor starts a new GPU
    process. A dead thread in a living process would answer nobody, for ever."""
    try:
        host.serve_forever()
    except BaseException:
        log.exception("GPU process: its serving thread failed; exiting so that it restarts")
        exit(SERVING_THREAD_FAILED)


def host_main(config, vocab: str, adapter, address: str, authkey: bytes, log_format: str,
              verbose: bool, status, label: str = "gpu") -> None:
    """A GPU process (spawned by workers.run_workers): load, listen, serve until SIGTERM;
    `label` names it in the supervisor's reports ("gpu", or "gpu0".. of several)."""
    import sys
    from istanbul_errors import UserFacingError
    from .child import become_child
    from .logs import setup_logging
    become_child(f"istanbul-{label}")
    setup_logging(log_format, logging.DEBUG if verbose else logging.INFO)
    log.info("GPU process starting", extra={"data": {"pid": os.getpid(), "label": label}})
    try:
        from istanbul.shaders.engine import Device
        from ..encoding import get_encoding
        from ..gpu_backend import ROBUSTNESS
        start = time.perf_counter()
        device = Device(adapter, robustness=ROBUSTNESS)
        encoding = get_encoding(vocab, device=device)
        keeper = None
        if config.gpu_keep_clock_s > 0:
            from .clock_keeper import ClockKeeper
            keeper = ClockKeeper(device, config.gpu_keep_clock_s)
    except (UserFacingError, Exception) as exc:
        print(f"istanbul serve: GPU process: error: could not load vocabulary {vocab!r} on "
              f"the GPU: {exc}", file=sys.stderr)
        raise SystemExit(1)
    host = GpuHost(encoding, max_call_bytes=config.batching.max_bytes, keeper=keeper)
    metrics_port = None
    if config.metrics_port is not None:
        metrics_port = host.metrics.serve_http(
            "127.0.0.1", 0, config.auth_tokens if config.metrics_auth else ())
    if os.path.exists(address):   # left by a GPU process that died: this one replaces it
        os.unlink(address)
    listener = Listener(address, family="AF_UNIX", backlog=128)   # handshakes: admit
    gpu = threading.Thread(target=serve_or_exit, args=(host,), name="gpu", daemon=True)
    gpu.start()

    def on_signal(signum, frame):
        raise _Stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    log.info("GPU process serving", extra={"data": {
        "vocabulary": encoding.name, "load_seconds": round(time.perf_counter() - start, 3)}})
    status.put(("ready", label, None, metrics_port))
    try:
        accept_workers(listener, host, authkey)
    except _Stop:
        pass
    finally:
        listener.close()
        host.stop()
        gpu.join(config.stall_timeout_s)
    log.info("GPU process stopped", extra={"data": {"rounds": host.rounds}})
    raise SystemExit(0)
