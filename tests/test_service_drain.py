"""A drain never ends a unary call CANCELLED: a call that reached the server before the drain
is answered, one after it is answered or refused UNAVAILABLE (retryable).

grpc's stop() cancels the calls grpc's core holds that the event loop has not taken yet
(server/door.py); they queue there whenever the loop is busy. Each test makes that queue
for certain, with real servers: a loop held busy (in process), or the server's processes
stopped (SIGSTOP) while a burst arrives and SIGTERM waits for them, as a loaded server
meets a signal.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import pytest

from tokenizer_svc.service.client import TokenizerClient
from tokenizer_svc.service.rpc import tokenizer_pb2 as pb, tokenizer_pb2_grpc
from tests.service_support import (TEXTS, serve_subprocess, start_server, stub_for,  # noqa: F401
                                   tiny_encoding, tiny_vocab_path)
from tests.test_service_workers import _children, _drained, _log

BURST = 40


def _outcomes(texts, futures, encoding) -> dict:
    """Each reply's status by name; an OK reply must hold its text's exact ids."""
    seen: dict = {}
    for text, future in zip(texts, futures):
        try:
            reply = future.result()
        except grpc.RpcError as exc:
            code = exc.code().name
        else:
            code = "OK"
            assert list(reply.ids) == list(encoding.encode(text)), text
        seen[code] = seen.get(code, 0) + 1
    return seen


def test_calls_waiting_in_grpc_when_the_drain_starts_are_answered(tiny_encoding, device):
    server = start_server(tiny_encoding, device, shutdown_grace_s=20)
    channel, stub = stub_for(server.target)
    try:
        stub.Tokenize(pb.TokenizeRequest(text="connected"), timeout=60)
        busy = threading.Event()

        def hold():   # the loop busy (a large reply, a batch's bookkeeping) as calls arrive
            busy.set()
            time.sleep(1.0)
        server.loop.call_soon_threadsafe(hold)
        assert busy.wait(10)
        texts = [f"{TEXTS[k % len(TEXTS)]} waiting {k}" for k in range(BURST)]
        futures = [stub.Tokenize.future(pb.TokenizeRequest(text=t), timeout=60) for t in texts]
        time.sleep(0.3)   # they reach grpc; the loop takes them once it is free
        stopper = threading.Thread(target=server.stop, kwargs={"grace_s": 20})
        stopper.start()   # the drain starts before the loop has taken any
        seen = _outcomes(texts, futures, tiny_encoding)
        stopper.join(60)
    finally:
        channel.close()
        server.stop()
    # all arrived before the drain: all answered (before the fix: 1 OK, 39 CANCELLED)
    assert seen == {"OK": BURST}


def test_calls_that_keep_coming_during_a_drain_are_refused_unavailable(tiny_encoding, device):
    """Clients that keep sending during the drain (each stops at its first UNAVAILABLE): the
    door closes, their new calls are refused UNAVAILABLE, never CANCELLED."""
    server = start_server(tiny_encoding, device, shutdown_grace_s=8)
    channel, stub = stub_for(server.target)
    seen: dict = {}
    refusals: list = []
    lock = threading.Lock()
    go = threading.Event()

    def client(k):
        while True:
            text = f"{TEXTS[k % len(TEXTS)]} again {k}"
            try:
                reply = stub.Tokenize(pb.TokenizeRequest(text=text), timeout=60)
                assert list(reply.ids) == list(tiny_encoding.encode(text))
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
                refusals.append(exc.details())
            with lock:
                seen[code] = seen.get(code, 0) + 1
            go.set()
            if code != "OK":
                return
    try:
        stub.Tokenize(pb.TokenizeRequest(text="connected"), timeout=60)
        clients = [threading.Thread(target=client, args=(k,)) for k in range(8)]
        for t in clients:
            t.start()
        assert go.wait(30)
        time.sleep(0.3)
        started = time.monotonic()
        server.stop(grace_s=8)
        stopped = time.monotonic() - started
        for t in clients:
            t.join(60)
    finally:
        channel.close()
        server.stop()
    assert set(seen) == {"OK", "UNAVAILABLE"}, seen
    assert seen["UNAVAILABLE"] == 8 and all("shutting down" in d for d in refusals), refusals
    assert stopped < 8, stopped   # settling counts against the grace period


def _stopped(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, f"{pid} did not stop"
        time.sleep(0.01)


def _sigterm_pending(pid: int) -> bool:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("ShdPnd:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_during_a_burst_answers_every_call_or_refuses_it_unavailable(
        tiny_vocab_path, tiny_encoding, tmp_path, workers):
    """`istanbul serve` (one process, or two workers and the shared GPU process) gets SIGTERM
    while a burst of calls waits for it: every call is answered with its exact ids or refused
    UNAVAILABLE, none CANCELLED, and the server exits 0."""
    port_file = tmp_path / "port"
    proc = _drained(serve_subprocess("--vocab", str(tiny_vocab_path), "--port", "0",
                                     "--port-file", str(port_file), "--workers", str(workers),
                                     "--shutdown-grace", "20"))
    try:
        deadline = time.monotonic() + 180
        while not port_file.exists():
            assert proc.poll() is None, _log(proc)
            assert time.monotonic() < deadline, "no port file"
            time.sleep(0.05)
        target = f"127.0.0.1:{port_file.read_text().strip()}"
        with TokenizerClient(target) as client:   # one process writes the file as it listens
            client.wait_ready(120)
        # a connection per channel: with two workers the kernel spreads them over both
        channels = [grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(4)]
        stubs = [tokenizer_pb2_grpc.TokenizerStub(c) for c in channels]
        for stub in stubs:
            stub.Tokenize(pb.TokenizeRequest(text="connected"), timeout=120)
        servers = [proc.pid] if workers == 1 else \
            [pid for name, pid in _children(proc.pid).items() if name.startswith("istanbul-w")]
        assert len(servers) == workers
        for pid in servers:   # as busy as can be: the burst waits in the kernel, then in grpc
            _stopped(pid)
        texts = [f"{TEXTS[k % len(TEXTS)]} burst {k}" for k in range(BURST)]
        futures = [stubs[k % len(stubs)].Tokenize.future(pb.TokenizeRequest(text=t), timeout=120)
                   for k, t in enumerate(texts)]
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)   # a supervisor passes it on to its workers
        deadline = time.monotonic() + 10
        while not all(_sigterm_pending(pid) for pid in servers):
            assert time.monotonic() < deadline, "SIGTERM never reached the servers"
            time.sleep(0.01)
        for pid in servers:
            os.kill(pid, signal.SIGCONT)
        seen = _outcomes(texts, futures, tiny_encoding)
        for channel in channels:
            channel.close()
        assert proc.wait(120) == 0, _log(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "CANCELLED" not in seen and sum(seen.values()) == BURST, seen
    assert seen.get("OK", 0) > 0, seen
