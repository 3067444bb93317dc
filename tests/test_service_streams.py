"""A stream's tasks end with its RPC: whenever a client cancels a stream (while its replies
wait for the client, while the server waits for its requests, mid-batch, after a bad
request), no task of it is left pending and nothing reaches asyncio's exception handler or
the log at ERROR ("Task was destroyed but it is pending!"). Real servers on loopback, real
GPU encoding (lavapipe in CI).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import random
import threading
import time

import grpc
import pytest

from tests.service_support import (TEXTS, start_server, stub_for, tiny_encoding,  # noqa: F401
                                   tiny_vocab_path)
from tokenizer_svc.service.rpc import tokenizer_pb2 as pb
from tokenizer_svc.service import Limits


class LoopErrors:
    """What the server's event loop reports to its exception handler, and asyncio's ERROR
    log records (the default handler's way of reporting the same)."""

    def __init__(self, server, caplog):
        self.reported: list = []
        self.caplog = caplog
        caplog.set_level(logging.ERROR, logger="asyncio")
        server.loop.call_soon_threadsafe(
            server.loop.set_exception_handler,
            lambda loop, context: self.reported.append(
                f"{context.get('message')}: {context.get('task') or context.get('exception')}"))

    def all(self) -> list:
        return self.reported + [r.getMessage() for r in self.caplog.records
                                if r.name == "asyncio" and r.levelno >= logging.ERROR]


def _stream_tasks(server) -> list:
    """The server's tasks that run a stream's own code (its reader and request tasks)."""
    async def names():
        return [repr(t) for t in asyncio.all_tasks()
                if "_pipelined" in t.get_coro().__qualname__]
    return server.run(names(), 30)


def _stream_tasks_left(server, timeout: float = 5) -> list:
    """The stream tasks still pending `timeout` seconds on (none: at once)."""
    deadline = time.monotonic() + timeout
    while (left := _stream_tasks(server)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _collected(server) -> None:
    """A garbage collection on the server's loop thread and here: a task left pending
    and unreachable is destroyed now, and says so."""
    server.run(asyncio.sleep(0), 30)
    server.loop.call_soon_threadsafe(gc.collect)
    gc.collect()
    server.run(asyncio.sleep(0.1), 30)


@pytest.mark.timeout(300)
def test_a_stream_cancelled_while_its_replies_wait_for_the_client_leaves_nothing(
        tiny_encoding, device, caplog):
    """The client stops reading (its replies fill the connection's window, so grpc waits
    to write one) and cancels: grpc drops the stream's generator where it yielded, and the
    reader waits for room in the full queue of requests in progress."""
    server = start_server(tiny_encoding, device, limits=Limits(max_stream_inflight=2))
    errors = LoopErrors(server, caplog)
    channel, stub = stub_for(server.target)
    text = "hello world " * 20000   # replies of ~1 MB with token texts
    left: list = []
    try:
        for _ in range(3):
            more = threading.Event()

            def requests():
                for k in range(8):
                    yield pb.TokenizeRequest(text=f"{k} {text}", token_texts=True)
                more.wait(30)

            stream = stub.TokenizeStream(requests(), timeout=60)
            next(stream)
            time.sleep(1.0)   # the window fills, grpc waits to write, the queue fills
            stream.cancel()
            more.set()
            left += _stream_tasks_left(server)
        _collected(server)   # a task left pending is destroyed here, and says so
    finally:
        channel.close()
        server.stop()
    assert not left and not errors.all(), \
        f"tasks of cancelled streams left pending: {left}; reported: {errors.all()}"


@pytest.mark.timeout(300)
def test_streams_cancelled_at_random_points_leave_nothing(tiny_encoding, device, caplog):
    """Cancels at seeded random points: before, while and after replies flow, while the
    server waits for the client's next request, with bad requests among good ones."""
    rng = random.Random(20261206)
    server = start_server(tiny_encoding, device, limits=Limits(max_stream_inflight=3))
    errors = LoopErrors(server, caplog)
    channel, stub = stub_for(server.target)
    left: list = []

    def request():
        roll = rng.random()
        if roll < 0.1:
            return pb.TokenizeRequest()   # no input: the stream ends INVALID_ARGUMENT
        if roll < 0.15:
            return pb.TokenizeRequest(text="<|endoftext|>")   # disallowed special token
        return pb.TokenizeRequest(text=rng.choice(TEXTS) * rng.randint(1, 400),
                                  token_texts=rng.random() < 0.5)

    def one(seed: int) -> None:
        local = random.Random(seed)
        reqs = [request() for _ in range(local.randint(1, 24))]
        hold = threading.Event()

        def requests():
            yield from reqs
            if local.random() < 0.6:
                hold.wait(10)   # the client keeps its side open: the server waits on it
        stream = stub.TokenizeStream(requests(), timeout=60)
        timer = threading.Timer(local.random() * 0.3, stream.cancel)
        timer.start()
        try:
            for k, _ in enumerate(stream):
                if k >= local.randint(0, len(reqs)):
                    time.sleep(local.random() * 0.05)
                    stream.cancel()
                    break
        except grpc.RpcError:
            pass
        finally:
            timer.cancel()
            hold.set()

    try:
        for group in range(5):
            clients = [threading.Thread(target=one, args=(rng.random(),)) for _ in range(8)]
            for t in clients:
                t.start()
            for t in clients:
                t.join(120)
            left += _stream_tasks_left(server)
            _collected(server)
    finally:
        channel.close()
        server.stop()
    assert not left and not errors.all(), \
        f"tasks of cancelled streams left pending: {left}; reported: {errors.all()}"
