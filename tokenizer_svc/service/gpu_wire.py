"""The messages between a worker and the group's GPU process, and their framing.

A worker (gpu_worker.RemoteEncoding) sends one message per Encoding call over a Unix socket
(`SOCKET_NAME` in the group's folder), authenticated with the group's key (multiprocessing.
connection's challenge, each side bounded by `HANDSHAKE_TIMEOUT_S`); the GPU process
(gpu_process.GpuHost) answers each message once:

    worker -> GPU process: ("encode", docs, allowed_special, nbytes)
                         | ("encode_utf8", [text.encode() per document], frozenset(), nbytes)
                         | ("decode", seqs)
    GPU process -> worker: ("ok_ids", offsets as a list), then the ids' raw bytes (an encode's
                           answer) | ("ok", result)
                         | ("invalid_token", message, token, position, document)
                         | ("failed", message)

Framing is multiprocessing.connection's: a 4-byte big-endian signed length (-1: an 8-byte
length follows), then the bytes; messages and replies are ForkingPickler pickles, an encode's
ids are not pickled: they follow their offsets as one raw frame (`send_frames` writes both in
one system call, `receive_reply` / `receive_reply_async` read them straight into an array).
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from multiprocessing.reduction import ForkingPickler

import numpy as np

from .limits import utf8_len

SOCKET_NAME = "gpu.sock"
HANDSHAKE_TIMEOUT_S = 10.0   # connecting and authenticating to the GPU process, at most


def io_timeout(fd: int, seconds: float) -> None:
    """Bound each blocking connect/send/receive on socket `fd` (0: no bound) without making
    it non-blocking, as settimeout would (a Connection reads the descriptor itself)."""
    sock = socket.socket(fileno=fd)
    try:
        tv = struct.pack("ll", int(seconds), int(seconds % 1 * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    finally:
        sock.detach()


ENCODES = ("encode", "encode_utf8")


def encode_message(docs: list, allowed_special) -> tuple:
    """A worker's message for one encode call. Text with no special tokens allowed goes as
    its UTF-8 ("encode_utf8"): the host's one thread then neither decodes it while
    unpickling nor encodes it again for the GPU upload, and the workers, many processes,
    do the encoding (dev/service_throughput/README.md). Raw bytes, text in which special
    tokens are to be cut out, and text with a lone surrogate (which the Encoding repairs as
    tiktoken does) go as they are ("encode"). `nbytes` counts UTF-8 bytes either way."""
    if not allowed_special and all(isinstance(d, str) for d in docs):
        try:
            utf8 = [d.encode() for d in docs]
        except UnicodeEncodeError:   # a lone surrogate
            pass
        else:
            return ("encode_utf8", utf8, frozenset(), sum(map(len, utf8)))
    return ("encode", docs, allowed_special, sum(map(utf8_len, docs)))


def receive_reply(conn) -> tuple:
    """The host's answer to a worker's message; an encode message's as ("ok", (ids,
    offsets)), the arrays a local Encoding returns: its ids come after the offsets as raw
    bytes (gpu_process.GpuHost._answer_ids), read straight into their array."""
    reply = conn.recv()
    if reply[0] != "ok_ids":
        return reply
    offsets = np.array(reply[1], np.int64)
    ids = np.empty(int(offsets[-1]), np.uint32)
    conn.recv_bytes_into(ids)
    return ("ok", (ids, offsets))


# ---- framing, for writing several frames at once and reading on an event loop ----------

def _head(n: int) -> bytes:
    return struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)


def frame(body: bytes) -> bytes:
    return _head(len(body)) + body


def send_frames(fd: int, bodies: list) -> None:
    """Write `bodies` (bytes-like) as consecutive frames on blocking descriptor `fd` with one
    writev where it takes them all: what Connection.send then send_bytes write, in one
    system call instead of three (dev/lone_request/README.md)."""
    views = []
    for body in bodies:
        view = memoryview(body).cast("B")
        views += [memoryview(_head(view.nbytes)), view]
    while views:
        n = os.writev(fd, views)
        while views and n >= views[0].nbytes:   # a partial write: go on after it
            n -= views[0].nbytes
            views.pop(0)
        if views and n:
            views[0] = views[0][n:]


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    n, = struct.unpack("!i", await reader.readexactly(4))
    if n == -1:
        n, = struct.unpack("!Q", await reader.readexactly(8))
    return await reader.readexactly(n)


async def receive_reply_async(reader: asyncio.StreamReader) -> tuple:
    """`receive_reply` on an event loop's stream."""
    reply = ForkingPickler.loads(await _read_frame(reader))
    if reply[0] != "ok_ids":
        return reply
    offsets = np.array(reply[1], np.int64)
    ids = np.frombuffer(await _read_frame(reader), np.uint32)   # read-only: nobody writes ids
    if ids.size != offsets[-1]:
        raise EOFError(f"the GPU process answered {ids.size} ids for {offsets[-1]}")
    return ("ok", (ids, offsets))
