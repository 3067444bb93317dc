"""A worker's side of the hop to the group's GPU process: `RemoteEncoding` sends a batch's
Encoding call there (gpu_wire's messages) and waits for the answer.

Used by `istanbul serve --workers N` with the shared GPU process (gpu_process.py): the
worker's BatchRunner (work.py) calls `encode_flat_async` / `decode_bytes_batch_async` on its
event loop; everything else the batch needs (the vocabulary, per-token tables, special
tokens, offsets, HF post-processing) is the worker's own Encoding. A GPU process that is
gone or restarting fails the call with UNAVAILABLE (clients retry).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import weakref
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from multiprocessing.reduction import ForkingPickler

import grpc

from . import gpu_wire
from .errors import NOT_READY, RequestRejected
from .gpu_wire import encode_message, frame, io_timeout, receive_reply, receive_reply_async

log = logging.getLogger("tokenizer_svc.service")

CONNECT_RETRY_S = 0.05

class RemoteInvalidToken(ValueError):
    """An invalid id in a decode message, with the host Encoding's message and details (the
    attributes BatchRunner reads from the Encoding's InvalidTokenError)."""

    def __init__(self, message: str, token, position, document):
        super().__init__(message)
        self.token, self.position, self.document = token, position, document


class HostCallFailed(RuntimeError):
    """The GPU process's Encoding call raised (a device loss, a bug): the batch fails."""


def _unavailable(why: str) -> RequestRejected:
    return RequestRejected(grpc.StatusCode.UNAVAILABLE, NOT_READY,
                           f"the server's GPU process {why}; retry")


class RemoteEncoding:
    """A worker's Encoding for the batch path: `encode_batch_flat` and `decode_bytes_batch`
    run in the group's GPU process; every other attribute (vocabulary, per-token tables,
    special tokens, offsets, HF post-processing) is the worker's own Encoding, `local`.
    Concurrent calls (a worker keeps two batches in flight) each use a connection of their
    own from a small pool. `reachable` is False from a failed call until a call or `probe`
    connects again (the worker's health says NOT_SERVING meanwhile: app.py's watchdog).

    The worker's batches call `call_async` (`encode_flat_async`, `decode_bytes_batch_async`)
    on its event loop: the message goes out and the answer comes in as the loop's own socket
    I/O, with no thread between the loop and the GPU process (less CPU and a shorter round
    trip than a thread and a blocking connection: dev/service_throughput/README.md). Those
    connections belong to that loop (a
    pool of their own); the blocking methods keep theirs for any other caller."""

    def __init__(self, local, address: str, authkey: bytes):
        self.local = local
        self._address, self._authkey = address, authkey
        self._idle: list = []          # open connections not in use
        # per event loop, its (reader, writer) streams not in use (a stream is its loop's)
        self._idle_async: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.reachable = True

    def __getattr__(self, name):
        if name == "local":   # not yet set (unpickling, __init__ not run)
            raise AttributeError(name)
        return getattr(self.local, name)

    def _open(self):
        """An authenticated connection. The handshake is bounded: a GPU process that accepted
        but does not answer (stopped, stuck) or breaks off fails it as a ConnectionError
        (an OSError, as a refused connect is), never a thread blocked for ever (a worker
        cannot exit while its executor's thread waits)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            io_timeout(sock.fileno(), gpu_wire.HANDSHAKE_TIMEOUT_S)
            sock.connect(self._address)
            conn = Connection(sock.detach())
        finally:
            sock.close()
        try:
            answer_challenge(conn, self._authkey)
            deliver_challenge(conn, self._authkey)
            io_timeout(conn.fileno(), 0.0)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, (EOFError, AuthenticationError, OSError)):
                raise ConnectionError(f"the GPU process at {self._address} did not complete "
                                      f"the handshake: {type(exc).__name__}: {exc}") from None
            raise
        return conn

    def _reached(self, ok: bool, error: str = "") -> None:
        if ok != self.reachable:
            self.reachable = ok
            if ok:
                log.info("GPU process reachable again", extra={"data": {
                    "address": self._address}})
            else:
                log.warning("GPU process unreachable", extra={"data": {
                    "address": self._address, "error": error}})

    def probe(self) -> bool:
        """Connect once more if the last call failed; whether the GPU process answers."""
        if self.reachable:
            return True
        try:
            conn = self._open()
        except OSError:
            return False
        with self._lock:
            self._idle.append(conn)
        self._reached(True)
        return True

    def connect(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the GPU process to accept (it listens once loaded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                conn = self._open()
                break
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if time.monotonic() >= deadline:
                    raise ConnectionError(f"the GPU process at {self._address} did not "
                                          f"accept within {timeout_s:.0f} s: {exc}") from None
                time.sleep(CONNECT_RETRY_S)
        with self._lock:
            self._idle.append(conn)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()
        self._close_async()

    def _close_async(self) -> None:
        """Close the pooled streams of every loop still open (a closed loop's go with it)."""
        pools, self._idle_async = list(self._idle_async.items()), weakref.WeakKeyDictionary()
        for loop, idle in pools:
            for _, writer in idle:
                if not loop.is_closed():
                    writer.close()

    def encode_batch_flat(self, docs, *, allowed_special=frozenset(), disallowed_special=()):
        if disallowed_special:   # the service checks refusals per job before the call
            raise ValueError("RemoteEncoding encodes with disallowed_special=() only")
        return self._call(encode_message(list(docs), allowed_special))

    def decode_bytes_batch(self, batch):
        return self._call(("decode", list(batch)))

    async def encode_flat_async(self, docs, allowed_special=frozenset()):
        """`encode_batch_flat(docs, allowed_special=..., disallowed_special=())` from the
        worker's event loop."""
        return await self.call_async(encode_message(list(docs), allowed_special))

    async def decode_bytes_batch_async(self, batch):
        return await self.call_async(("decode", list(batch)))

    async def _open_async(self):
        """A new connection as a stream of the running loop: the authentication handshake
        runs on a thread (a GPU process that does not accept must not stall the loop)."""
        conn = await asyncio.get_running_loop().run_in_executor(None, self._open)
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM,
                                 fileno=os.dup(conn.fileno()))
        finally:
            conn.close()
        try:
            return await asyncio.open_unix_connection(sock=sock)
        except BaseException:
            sock.close()
            raise

    async def call_async(self, message):
        """`_call` on the running event loop (same retry and failure rules)."""
        idle = self._idle_async.setdefault(asyncio.get_running_loop(), [])
        for attempt in (0, 1):
            stream = idle.pop() if idle else None
            fresh = stream is None
            if fresh:
                try:
                    stream = await self._open_async()
                except OSError as exc:
                    self._reached(False, str(exc))
                    raise _unavailable("is restarting") from None
            reader, writer = stream
            try:
                writer.write(frame(ForkingPickler.dumps(message)))
                reply = await receive_reply_async(reader)
            except (EOFError, OSError) as exc:   # IncompleteReadError is an EOFError
                writer.close()
                if fresh or attempt:
                    self._reached(False, f"{type(exc).__name__}: {exc}")
                    raise _unavailable("stopped while answering") from None
                for _, stale in idle:
                    stale.close()
                idle.clear()
                continue
            except BaseException:   # cancelled mid-call: the stream's state is unknown
                writer.close()
                raise
            idle.append(stream)
            self._reached(True)
            break
        return self._result(reply)

    def _call(self, message):
        # A pooled connection to a GPU process that died since it was last used fails at
        # once: then every pooled one is stale, and the message goes once more over a new
        # connection (encode and decode are pure).
        for attempt in (0, 1):
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            fresh = conn is None
            if fresh:
                try:
                    conn = self._open()
                except OSError as exc:
                    self._reached(False, str(exc))
                    raise _unavailable("is restarting") from None
            try:
                conn.send(message)
                reply = receive_reply(conn)
            except (EOFError, OSError) as exc:
                conn.close()
                if fresh or attempt:
                    self._reached(False, f"{type(exc).__name__}: {exc}")
                    raise _unavailable("stopped while answering") from None
                self.close()
                continue
            with self._lock:
                self._idle.append(conn)
            self._reached(True)
            break
        return self._result(reply)

    @staticmethod
    def _result(reply: tuple):
        kind = reply[0]
        if kind == "ok":
            return reply[1]
        if kind == "invalid_token":
            raise RemoteInvalidToken(*reply[1:])
        raise HostCallFailed(f"GPU process: {reply[1]}")
