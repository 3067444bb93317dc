"""`istanbul serve --workers 2`: two real server processes on one port (SO_REUSEPORT) under a
supervisor: connections reach both, replies are exact, /metrics shows both workers, SIGTERM
drains every worker (exit 0), a killed worker is restarted, and workers that cannot start
stop the group (exit 1)."""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request

import grpc
import pytest

from tokenizer_svc.client import TokenizerClient
from tokenizer_svc.rpc import tei_pb2, tei_pb2_grpc, tokenizer_pb2 as pb, tokenizer_pb2_grpc
from tests.service_support import (TEXTS, free_port, serve_subprocess, tiny_encoding,  # noqa: F401
                                   tiny_vocab_path)


def _start(vocab, tmp_path, *extra):
    port_file, metrics_port = tmp_path / "port", free_port()
    proc = serve_subprocess("--vocab", str(vocab), "--workers", "2", "--port", "0",
                            "--port-file", str(port_file), "--metrics-port", str(metrics_port),
                            *extra)
    deadline = time.monotonic() + 180
    while not port_file.exists():
        if proc.poll() is not None:
            pytest.fail(f"serve --workers exited with {proc.returncode}: {proc.stderr.read()}")
        assert time.monotonic() < deadline, "no port file"
        time.sleep(0.05)
    target = f"127.0.0.1:{port_file.read_text().strip()}"
    with TokenizerClient(target) as client:
        client.wait_ready(120)
    return proc, target, metrics_port


def _per_worker(page: str, name: str) -> dict:
    out: dict = {}
    for labels, value in re.findall(rf"^{name}\{{(.*)\}} (\S+)$", page, re.M):
        worker = re.search(r'worker="(\d+)"', labels).group(1)
        out[worker] = out.get(worker, 0.0) + float(value)
    return out


def _children(pid: int) -> list:
    """The worker processes of supervisor `pid` (multiprocessing's spawned children)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and b"spawn_main" in open(f"/proc/{entry}/cmdline",
                                                               "rb").read():
                found.append(int(entry))
    return found


def test_two_workers_share_the_port_and_drain_on_sigterm(tiny_vocab_path, tiny_encoding,
                                                         tmp_path):
    proc, target, metrics_port = _start(tiny_vocab_path, tmp_path)
    try:
        workers = _children(proc.pid)
        # separate connections (no shared subchannel): the kernel spreads them over workers
        channels = [grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
                    for _ in range(16)]
        for k, channel in enumerate(channels):
            stub = tokenizer_pb2_grpc.TokenizerStub(channel)
            for text in TEXTS[:6]:
                reply = stub.Tokenize(pb.TokenizeRequest(text=f"{text} {k}"), timeout=60)
                assert list(reply.ids) == list(tiny_encoding.encode(f"{text} {k}"))
        tei = tei_pb2_grpc.TokenizeStub(channels[0]).Tokenize(
            tei_pb2.EncodeRequest(inputs="hello world"), timeout=60)
        assert [t.id for t in tei.tokens] == list(tiny_encoding.encode("hello world"))
        page = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                      timeout=30).read().decode()
        served = _per_worker(page, "istanbul_tokenizer_requests_total")
        assert set(served) == {"0", "1"} and all(v > 0 for v in served.values()), served
        assert sum(served.values()) >= 16 * 6
        assert _per_worker(page, "istanbul_tokenizer_worker_up") == {"0": 1.0, "1": 1.0}
        for channel in channels:
            channel.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
        assert not [pid for pid in workers if os.path.exists(f"/proc/{pid}")
                    and open(f"/proc/{pid}/stat").read().split()[2] != "Z"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_worker_is_restarted_and_serves_again(tiny_vocab_path, tiny_encoding,
                                                       tmp_path):
    proc, target, metrics_port = _start(tiny_vocab_path, tmp_path)
    try:
        first = _children(proc.pid)
        assert len(first) == 2
        os.kill(first[0], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while True:   # a new worker process, both workers' metrics answering again
            now = _children(proc.pid)
            page = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                          timeout=30).read().decode()
            if len(now) == 2 and first[0] not in now and \
                    _per_worker(page, "istanbul_tokenizer_worker_up") == {"0": 1.0, "1": 1.0}:
                break
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the killed worker was not restarted"
            time.sleep(0.2)
        with TokenizerClient(target) as client:
            client.wait_ready(120)
            for text in TEXTS[:4]:
                assert client.encode(text) == list(tiny_encoding.encode(text))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
        assert "worker exited; restarting it" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_workers_that_cannot_start_stop_the_group(tiny_vocab_path, tmp_path):
    proc = serve_subprocess("--vocab", str(tiny_vocab_path), "--workers", "2", "--port", "0",
                            "--adapter", "no-such-adapter")
    try:
        assert proc.wait(180) == 1
        assert "worker failed to start; stopping the group" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
