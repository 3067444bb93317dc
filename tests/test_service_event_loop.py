"""The server's event loop (`istanbul serve --event-loop`, tokenizer_svc/service/event_loop.py):
which loop each choice gives, a clear error when uvloop is asked for and missing, and the
whole server (batching, streams, deadlines, drain) on both loops."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from istanbul_errors import UserFacingError
from tokenizer_svc.service.client import ServiceError, TokenizerClient
from tokenizer_svc.service.rpc import tokenizer_pb2 as pb
from tokenizer_svc.service import event_loop
from tests.service_support import (TEXTS, metric, start_server, stub_for, tiny_encoding,  # noqa: F401
                                   tiny_vocab_path)

uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed (a dependency on "
                                              "Linux and macOS: pip install uvloop)")


def test_auto_takes_uvloop_when_installed_else_asyncio(monkeypatch):
    assert event_loop.resolve("auto") == "uvloop"
    assert isinstance(event_loop.new_loop("auto"), uvloop.Loop)
    monkeypatch.setattr(event_loop, "_uvloop", lambda: None)
    assert event_loop.resolve("auto") == "asyncio"
    loop = event_loop.new_loop("auto")
    try:
        assert not isinstance(loop, uvloop.Loop)
        assert event_loop.name_of(loop) == "asyncio"
    finally:
        loop.close()


def test_uvloop_asked_for_but_missing_or_an_unknown_loop_is_a_clear_error(monkeypatch):
    with pytest.raises(UserFacingError, match="unknown event loop 'trio'"):
        event_loop.resolve("trio")
    monkeypatch.setattr(event_loop, "_uvloop", lambda: None)
    with pytest.raises(UserFacingError, match="uvloop is not installed"):
        event_loop.resolve("uvloop")


def test_run_gives_the_coroutines_result_on_the_chosen_loop():
    async def which():
        await asyncio.sleep(0)
        return event_loop.name_of(asyncio.get_running_loop())
    assert event_loop.run(which(), "uvloop") == "uvloop"
    assert event_loop.run(which(), "asyncio") == "asyncio"


@pytest.mark.parametrize("choice", ["uvloop", "asyncio"])
def test_the_server_on_either_loop(choice, tiny_encoding, device):
    """Batched unary calls from many threads, a stream and a deadline that passes in the
    batch window; then a drain with requests held in the batcher: the same answers on both
    loops."""
    expected = lambda texts: [list(tiny_encoding.encode(t)) for t in texts]  # noqa: E731
    texts = [f"{TEXTS[k % len(TEXTS)]} #{k}" for k in range(48)]
    with start_server(tiny_encoding, device, event_loop=choice,
                      batching=_window(0.05)) as server:
        assert event_loop.name_of(server.loop) == choice
        channel, stub = stub_for(server.target)
        with ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(lambda t: stub.Tokenize(pb.TokenizeRequest(text=t),
                                                            timeout=60), texts))
        assert [list(r.ids) for r in replies] == expected(texts)
        stream = stub.TokenizeStream(iter([pb.TokenizeRequest(text=t) for t in TEXTS]),
                                     timeout=60)
        assert [list(r.ids) for r in stream] == expected(TEXTS)
        with pytest.raises(grpc.RpcError) as info:   # shorter than the batch window
            stub.Tokenize(pb.TokenizeRequest(text="late"), timeout=0.001)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        channel.close()

    server = start_server(tiny_encoding, device, event_loop=choice, batching=_window(2.0))
    try:
        channel, stub = stub_for(server.target)
        held = [stub.Tokenize.future(pb.TokenizeRequest(text=t), timeout=60)
                for t in texts[:8]]
        deadline = time.monotonic() + 30
        while metric(server, "istanbul_tokenizer_inflight_requests") < 8:
            assert time.monotonic() < deadline, "the requests never reached the server"
            time.sleep(0.01)
        server.stop(grace_s=30)   # drain: what is in flight is answered
        assert [list(f.result().ids) for f in held] == expected(texts[:8])
        channel.close()
        with TokenizerClient(server.target, retries=0, timeout=5) as late, \
                pytest.raises(ServiceError) as refused:
            late.encode("after the drain")
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop()


def _window(seconds: float):
    """Batches that always wait out `seconds` (no eager closing)."""
    from tokenizer_svc.service.config import BatchingConfig
    return BatchingConfig(window_s=seconds, eager=False)
