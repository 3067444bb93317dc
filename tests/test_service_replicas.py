"""One client, several replicas: calls spread round robin over the ready servers, and when
one replica stops the calls go on to the others with the same ids, no error."""

from __future__ import annotations

import pytest

from .service_support import metric, start_server, tiny_encoding, tiny_vocab_path  # noqa: F401


def _tokenize_calls(server) -> float:
    return metric(server, "istanbul_tokenizer_requests_total", method="Tokenize", code="OK")


def test_round_robin_over_replicas_and_failover(tiny_encoding, device):
    from tokenizer_svc.service.client import TokenizerClient
    texts = [f"replica text {k} with some words, {k * 7}" for k in range(60)]
    want = [tiny_encoding.encode(t) for t in texts]
    a = start_server(tiny_encoding, device)
    b = start_server(tiny_encoding, device)
    try:
        target = "ipv4:" + ",".join(s.target.replace("localhost", "127.0.0.1")
                                    for s in (a, b))
        with TokenizerClient(target, timeout=30) as client:
            assert [client.encode(t) for t in texts[:40]] == want[:40]
            on_a, on_b = _tokenize_calls(a), _tokenize_calls(b)
            assert on_a + on_b == 40 and on_a >= 10 and on_b >= 10, (on_a, on_b)
            a.stop()
            assert [client.encode(t) for t in texts[40:]] == want[40:]
            assert _tokenize_calls(b) == on_b + 20
    finally:
        a.stop()
        b.stop()


def test_pick_first_keeps_one_replica(tiny_encoding, device):
    from tokenizer_svc.service.client import TokenizerClient
    a = start_server(tiny_encoding, device)
    b = start_server(tiny_encoding, device)
    try:
        target = "ipv4:" + ",".join(s.target.replace("localhost", "127.0.0.1")
                                    for s in (a, b))
        with TokenizerClient(target, timeout=30, load_balancing="pick_first") as client:
            for k in range(10):
                client.encode(f"text {k}")
        assert sorted([_tokenize_calls(a), _tokenize_calls(b)]) == [0, 10]
    finally:
        a.stop()
        b.stop()
    with pytest.raises(ValueError, match="round_robin"):
        TokenizerClient("127.0.0.1:1", load_balancing="random")
