"""Dynamic batching under concurrency: many clients, coalescing, deadlines, cancellation."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tokenizer_svc.service.client import TokenizerClient
from tokenizer_svc.service.rpc import tokenizer_pb2 as pb
from tokenizer_svc.service import BatchingConfig, Limits
from tests.service_support import (TEXTS, metric, reason_of, start_server, stub_for,  # noqa: F401
                                   tiny_encoding, tiny_vocab_path)


def _together(n: int, work):
    """Run work(k) for k < n on n threads released at the same moment; results in order."""
    barrier = threading.Barrier(n)

    def run(k):
        barrier.wait()
        return work(k)
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


def test_64_concurrent_clients_get_their_own_results(tiny_encoding, device):
    with start_server(tiny_encoding, device,
                      batching=BatchingConfig(window_s=0.05)) as server:
        def one_client(k):
            with TokenizerClient(server.target, timeout=120) as c:
                texts = [f"client {k}: {TEXTS[(k + j) % len(TEXTS)]}" for j in range(3)]
                ids = [c.encode(t) for t in texts]
                return texts, ids, c.decode(ids[0])

        results = _together(64, one_client)
        for texts, ids, decoded in results:
            assert ids == [list(tiny_encoding.encode(t)) for t in texts]
            assert decoded == texts[0]
        batches = metric(server, "istanbul_tokenizer_batch_requests_count")
        requests = metric(server, "istanbul_tokenizer_batch_requests_sum")
        assert requests == 64 * 4
        assert batches < requests / 4, f"{requests} requests in {batches} batches: no coalescing"
        assert metric(server, "istanbul_tokenizer_requests_total", method="Tokenize",
                      code="OK") == 64 * 3


@pytest.mark.parametrize("enabled", [True, False])
def test_batching_on_coalesces_and_off_does_not(tiny_encoding, device, enabled):
    config = BatchingConfig(enabled=enabled, window_s=0.5, eager=False)
    with start_server(tiny_encoding, device, batching=config) as server:
        channel, stub = stub_for(server.target)
        replies = _together(16, lambda k: stub.Tokenize(pb.TokenizeRequest(text=f"doc {k}"),
                                                        timeout=60))
        assert [list(r.ids) for r in replies] == \
            [list(tiny_encoding.encode(f"doc {k}")) for k in range(16)]
        runs = server.server.batcher.batches_run
        if enabled:
            assert runs <= 3, f"16 simultaneous requests took {runs} GPU calls"
        else:
            assert runs == 16
        channel.close()


def test_batch_limits_split_batches(tiny_encoding, device):
    config = BatchingConfig(window_s=0.5, max_items=4, eager=False)
    with start_server(tiny_encoding, device, batching=config) as server:
        channel, stub = stub_for(server.target)
        _together(12, lambda k: stub.Tokenize(pb.TokenizeRequest(text=f"doc {k}"), timeout=60))
        assert server.server.batcher.batches_run >= 3
        # No batch ever held more than 4 documents.
        assert metric(server, "istanbul_tokenizer_batch_documents_bucket", le="4.0") == \
            metric(server, "istanbul_tokenizer_batch_documents_count")
        channel.close()


@pytest.fixture
def slow_window(tiny_encoding, device):
    """A server whose batches wait 1 s for company: time to expire or cancel requests."""
    with start_server(tiny_encoding, device,
                      batching=BatchingConfig(window_s=1.0, eager=False)) as server:
        channel, stub = stub_for(server.target)
        yield server, stub
        channel.close()


def test_deadline_exceeded_request_leaves_the_batch(slow_window, tiny_encoding):
    server, stub = slow_window
    survivor = stub.Tokenize.future(pb.TokenizeRequest(text="survivor"), timeout=60)
    with pytest.raises(grpc.RpcError) as info:
        stub.Tokenize(pb.TokenizeRequest(text="too late"), timeout=0.2)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert list(survivor.result().ids) == list(tiny_encoding.encode("survivor"))
    assert metric(server, "istanbul_tokenizer_dropped_total", reason="deadline") == 1
    assert metric(server, "istanbul_tokenizer_batch_documents_sum") == 1  # only the survivor ran
    assert metric(server, "istanbul_tokenizer_requests_total", method="Tokenize",
                  code="DEADLINE_EXCEEDED") == 1


def test_cancelled_request_leaves_the_batch(slow_window, tiny_encoding):
    server, stub = slow_window
    doomed = stub.Tokenize.future(pb.TokenizeRequest(text="cancel me"), timeout=60)
    survivor = stub.Tokenize.future(pb.TokenizeRequest(text="survivor"), timeout=60)
    time.sleep(0.2)
    assert doomed.cancel()
    assert list(survivor.result().ids) == list(tiny_encoding.encode("survivor"))
    deadline = time.monotonic() + 10
    while metric(server, "istanbul_tokenizer_dropped_total", reason="cancelled") < 1:
        assert time.monotonic() < deadline, "the cancelled request was not dropped"
        time.sleep(0.02)
    assert metric(server, "istanbul_tokenizer_batch_documents_sum") == 1
    assert doomed.cancelled()


def test_full_queue_is_resource_exhausted_and_the_client_retries(tiny_encoding, device):
    with start_server(tiny_encoding, device, batching=BatchingConfig(window_s=1.0, eager=False),
                      limits=Limits(max_queued_bytes=1000)) as server:
        channel, stub = stub_for(server.target)
        first = stub.Tokenize.future(pb.TokenizeRequest(text="a" * 800), timeout=60)
        time.sleep(0.2)
        with pytest.raises(grpc.RpcError) as info:
            stub.Tokenize(pb.TokenizeRequest(text="b" * 400), timeout=60)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason_of(info.value) == "limit:max_queued_bytes"
        assert "max_queued_bytes" in info.value.details()
        second = stub.Tokenize.future(pb.TokenizeRequest(text="c" * 100), timeout=60)
        with TokenizerClient(server.target, backoff_s=0.2) as client:  # retried until room
            assert client.encode("b" * 400) == list(tiny_encoding.encode("b" * 400))
        assert list(first.result().ids) == list(tiny_encoding.encode("a" * 800))
        assert list(second.result().ids) == list(tiny_encoding.encode("c" * 100))
        channel.close()


@pytest.mark.parametrize("eager", [True, False])
def test_eager_closing_spares_a_lone_request_the_window(tiny_encoding, device, eager):
    with start_server(tiny_encoding, device,
                      batching=BatchingConfig(window_s=1.0, eager=eager)) as server:
        channel, stub = stub_for(server.target)
        stub.Tokenize(pb.TokenizeRequest(text="warm"), timeout=60)
        start = time.perf_counter()
        reply = stub.Tokenize(pb.TokenizeRequest(text="alone"), timeout=60)
        seconds = time.perf_counter() - start
        assert list(reply.ids) == list(tiny_encoding.encode("alone"))
        if eager:
            assert seconds < 0.5, f"a lone request waited {seconds:.3f} s"
        else:
            assert seconds >= 1.0
        # A request that fails validation withdraws and does not hold a batch open.
        with pytest.raises(grpc.RpcError):
            stub.Tokenize(pb.TokenizeRequest(), timeout=60)
        assert server.server.batcher._announced == 0
        channel.close()
