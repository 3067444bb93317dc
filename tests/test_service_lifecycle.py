"""Health transitions, graceful SIGTERM with requests in flight, retries and stream resume,
metrics on HTTP, JSON logs and the `serve` command line."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tokenizer_svc.service.client import ServiceError, TokenizerClient
from tokenizer_svc.service.rpc import tokenizer_pb2 as pb
from tokenizer_svc.service import BackgroundServer, ServerConfig
from tokenizer_svc.service import event_loop
from tests.service_support import (REPO, TEXTS, free_port, metric, reason_of,  # noqa: F401
                                   serve_subprocess, start_server, stub_for, tiny_encoding,
                                   tiny_vocab_path)

SERVICE = "istanbul.tokenizer.v1.Tokenizer"


def _health(channel, service=""):
    reply = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=10)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def test_health_not_serving_until_ready_and_while_draining(tiny_vocab_path, device):
    from tokenizer_svc.encoding import get_encoding
    gate = threading.Event()

    def load():  # the real Encoding, held back until the test lets it load
        assert gate.wait(60)
        return get_encoding(str(tiny_vocab_path), device=device), device

    server = BackgroundServer(ServerConfig(host="127.0.0.1", port=0, drain_delay_s=1.0),
                              load=load).start(wait_ready=False)
    channel, stub = stub_for(server.target)
    watched = []

    def watch():
        try:
            for reply in health_pb2_grpc.HealthStub(channel).Watch(
                    health_pb2.HealthCheckRequest(service=SERVICE), timeout=60):
                watched.append(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
        except grpc.RpcError:
            pass  # the server ends the watch when it stops
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert _health(channel) == "NOT_SERVING"
        assert _health(channel, SERVICE) == "NOT_SERVING"
        with pytest.raises(grpc.RpcError) as info:
            stub.Tokenize(pb.TokenizeRequest(text="early"), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert reason_of(info.value) == "not-ready" and "starting" in info.value.details()
        # A client that starts now retries UNAVAILABLE until the server is ready.
        with ThreadPoolExecutor(1) as pool, TokenizerClient(server.target) as client:
            early = pool.submit(client.encode, "early bird")
            time.sleep(0.3)
            gate.set()
            server.wait_ready(120)
            assert early.result(60) == list(get_encoding(str(tiny_vocab_path),
                                                         device=device).encode("early bird"))
        assert _health(channel) == "SERVING" and _health(channel, SERVICE) == "SERVING"
        with pytest.raises(grpc.RpcError) as info:
            _health(channel, "no.such.Service")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        # Draining: NOT_SERVING at once, requests still answered during the drain delay.
        stopper = threading.Thread(target=server.stop, kwargs={"grace_s": 5})
        drain_started = time.monotonic()
        stopper.start()
        time.sleep(0.3)
        assert _health(channel) == "NOT_SERVING"
        assert list(stub.Tokenize(pb.TokenizeRequest(text="late"), timeout=10).ids)
        stopper.join(30)
        # The open Watch stream ended with NOT_SERVING instead of holding the 5 s grace.
        assert time.monotonic() - drain_started < 4
    finally:
        gate.set()
        server.stop()
        watcher.join(30)
        channel.close()
    assert watched == ["NOT_SERVING", "SERVING", "NOT_SERVING"]


def _wait_for_file(path, proc, timeout=120.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"server exited early ({proc.returncode}): "
                                 f"{proc.stderr.read()}")
        assert time.monotonic() < deadline, "server did not write its port file"
        time.sleep(0.05)
    return path.read_text().strip()


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()


def _gauge(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_sigterm_finishes_requests_in_flight_then_exits_0(tiny_vocab_path, tiny_encoding,
                                                          tmp_path):
    port_file = tmp_path / "port"
    metrics_port = free_port()
    proc = serve_subprocess("--vocab", str(tiny_vocab_path), "--host", "127.0.0.1", "--port",
                            "0", "--port-file", str(port_file), "--metrics-port",
                            str(metrics_port), "--metrics-host", "127.0.0.1",
                            "--batch-window-ms", "3000", "--batch-always-wait",  # wide: all 33 must be in flight at once
                            "--shutdown-grace", "60")
    try:
        target = f"127.0.0.1:{_wait_for_file(port_file, proc)}"
        with TokenizerClient(target) as client:
            client.wait_ready(120)
        channel, stub = stub_for(target)
        texts = [f"{TEXTS[k % len(TEXTS)]} in flight {k}" for k in range(32)]
        futures = [stub.Tokenize.future(pb.TokenizeRequest(text=t), timeout=120) for t in texts]
        stream_docs = [f"stream {k} {TEXTS[k % len(TEXTS)]}" for k in range(20)]
        stream = stub.TokenizeStream(iter([pb.TokenizeRequest(text=d) for d in stream_docs]),
                                     timeout=120)
        deadline = time.monotonic() + 30
        while _gauge(_scrape(metrics_port), "istanbul_tokenizer_inflight_requests") < 33:
            assert time.monotonic() < deadline, "requests never reached the server"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        # Every request that was in flight is answered, correctly.
        for text, future in zip(texts, futures):
            assert list(future.result().ids) == list(tiny_encoding.encode(text))
        assert [list(r.ids) for r in stream] == [list(tiny_encoding.encode(d))
                                                for d in stream_docs]
        assert proc.wait(60) == 0
        channel.close()
        # Nobody is listening any more.
        with TokenizerClient(target, retries=0, timeout=5) as late, \
                pytest.raises(ServiceError) as info:
            late.encode("too late")
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = [json.loads(line) for line in proc.stderr.read().splitlines() if line.strip()]
    events = [entry["msg"] for entry in log]
    for event in ("listening", "serving", "signal", "draining", "stopped"):
        assert event in events, events
    serving = log[events.index("serving")]
    assert serving["vocabulary"] == "tiny" and serving["n_vocab"] == tiny_encoding.n_vocab
    assert serving["event_loop"] == event_loop.resolve("auto")   # uvloop where installed
    assert all({"ts", "level", "logger", "msg"} <= entry.keys() for entry in log)


def test_client_stream_resumes_on_a_restarted_server(tiny_encoding, device):
    port = free_port()
    first = start_server(tiny_encoding, device, port=port)
    docs = [f"resumable {k} {TEXTS[k % len(TEXTS)]}" for k in range(200)]
    second = None
    try:
        with TokenizerClient(f"127.0.0.1:{port}", timeout=60) as client:
            stream = client.tokenize_stream(iter(docs), window=8)
            got = [next(stream) for _ in range(50)]
            first.stop(grace_s=0)  # the stream's call dies with UNAVAILABLE
            second = start_server(tiny_encoding, device, port=port)
            got += list(stream)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert len(got) == len(docs)
    for doc, ids in zip(docs, got):
        assert ids.tolist() == list(tiny_encoding.encode(doc))


def test_metrics_endpoint_serves_the_service_metrics(tiny_encoding, device):
    with start_server(tiny_encoding, device, metrics_port=0, metrics_host="127.0.0.1") as server:
        with TokenizerClient(server.target) as client:
            client.encode("metrics please")
            client.encode_batch_flat(["a", "b", "c"])
            client.decode(client.encode("x"))
            with pytest.raises(ValueError):
                client.decode([10**6])
        # An aborted RPC's status reaches the client before the server has counted it.
        deadline = time.monotonic() + 10
        while 'errors_total{code="INVALID_ARGUMENT",method="Detokenize"} 1.0' not in \
                (text := _scrape(server.server.metrics_port)):
            assert time.monotonic() < deadline, text
            time.sleep(0.02)
    assert 'istanbul_tokenizer_requests_total{code="OK",method="Tokenize"} 2.0' in text
    assert 'istanbul_tokenizer_input_bytes_total{method="TokenizeBatch"} 3.0' in text
    for name in ("istanbul_tokenizer_request_seconds_bucket", "istanbul_tokenizer_gpu_seconds_count",
                 "istanbul_tokenizer_batch_documents_sum", "istanbul_tokenizer_batch_bytes_sum",
                 "istanbul_tokenizer_queue_wait_seconds_count", 'istanbul_tokenizer_tokens_total',
                 "istanbul_tokenizer_ready 1.0"):
        assert name in text, name


def _serve_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "istanbul", "serve", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_serve_refuses_bad_arguments_clearly(tmp_path):
    done = _serve_cli("--vocab", str(tmp_path / "missing.tiktoken"), "--host", "127.0.0.1",
                      "--port", "0", "--log-format", "text")
    assert done.returncode == 1
    assert "missing.tiktoken" in done.stderr and "could not load vocabulary" in done.stderr
    done = _serve_cli("--vocab", "gpt2", "--tls-cert", str(tmp_path / "c.pem"))
    assert done.returncode == 1 and "--tls-key" in done.stderr
    empty = tmp_path / "tokens"
    empty.write_text("# no tokens here\n\n")
    done = _serve_cli("--vocab", "gpt2", "--auth-token-file", str(empty))
    assert done.returncode == 1 and "holds no token" in done.stderr
    done = _serve_cli("--vocab", "gpt2", "--max-text-bytes", "lots")
    assert done.returncode == 2 and "not a size" in done.stderr
