"""`istanbul serve --workers 2`: two real server processes on one port (SO_REUSEPORT) under a
supervisor, with the shared GPU process (the default) or a device per worker: connections
reach both workers, replies are exact, /metrics shows every member, SIGTERM drains every
worker and then stops the GPU process (exit 0), a killed worker or GPU process is restarted
and the group serves again, and members that cannot start stop the group (exit 1); with
--gpu-processes 2 each worker batches through its own GPU process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest

from tokenizer_svc.service.client import TokenizerClient
from tokenizer_svc.service.rpc import tei_pb2, tei_pb2_grpc, tokenizer_pb2 as pb, tokenizer_pb2_grpc
from tests.service_support import (TEXTS, free_port, serve_subprocess, tiny_encoding,  # noqa: F401
                                   tiny_vocab_path)


def _drained(proc):
    """`proc` with its stderr read on a thread as it comes (a full pipe would block the
    group's logging, and so its requests: a test that provokes many error lines otherwise
    hangs the server it tests); `_log(proc)` returns what it wrote so far."""
    proc.log_chunks = []

    def read():
        for line in proc.stderr:
            proc.log_chunks.append(line)
    proc.log_reader = threading.Thread(target=read, daemon=True)
    proc.log_reader.start()
    return proc


def _log(proc) -> str:
    if proc.poll() is not None:
        proc.log_reader.join(30)
    return "".join(proc.log_chunks)


def _start(vocab, tmp_path, *extra):
    """(supervisor process, target, metrics port) once the group serves."""
    port_file, metrics_port = tmp_path / "port", free_port()
    proc = _drained(serve_subprocess("--vocab", str(vocab), "--workers", "2", "--port", "0",
                                     "--port-file", str(port_file), "--metrics-port",
                                     str(metrics_port), *extra))
    deadline = time.monotonic() + 180
    while not port_file.exists():
        if proc.poll() is not None:
            pytest.fail(f"serve --workers exited with {proc.returncode}: {_log(proc)}")
        assert time.monotonic() < deadline, "no port file"
        time.sleep(0.05)
    target = f"127.0.0.1:{port_file.read_text().strip()}"
    with TokenizerClient(target) as client:
        client.wait_ready(120)
    return proc, target, metrics_port


def _per_worker(page: str, name: str) -> dict:
    out: dict = {}
    for labels, value in re.findall(rf"^{name}\{{(.*)\}} (\S+)$", page, re.M):
        worker = re.search(r'worker="([^"]+)"', labels).group(1)
        out[worker] = out.get(worker, 0.0) + float(value)
    return out


def _children(pid: int) -> dict:
    """The live members of supervisor `pid` by process name (istanbul-w0, ..., istanbul-gpu)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                name = open(f"/proc/{entry}/comm").read().strip()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z" and name.startswith("istanbul-"):
                found[name] = int(entry)
    return found


def _terminated(proc, timeout: float = 180) -> int:
    """SIGTERM the supervisor; its exit code, or a failure with what the group logged, the
    stacks of every member still alive included (the supervisor kills a member that overstays
    its bound, at most 90 s here, after the same dump: `timeout` is beyond that)."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        alive = _children(proc.pid)
        for pid in [proc.pid, *alive.values()]:
            os.kill(pid, signal.SIGUSR1)   # child.dump_stacks_on_sigusr1
        time.sleep(3)
        pytest.fail(f"the group did not stop within {timeout:.0f} s of SIGTERM; members alive: "
                    f"{alive}; log:\n{''.join(proc.log_chunks)}")

MEMBERS = {"shared": {"istanbul-w0", "istanbul-w1", "istanbul-gpu"},
           "per-worker": {"istanbul-w0", "istanbul-w1"}}
LABELS = {"shared": {"0": 1.0, "1": 1.0, "gpu": 1.0}, "per-worker": {"0": 1.0, "1": 1.0}}


@pytest.mark.parametrize("layout", ["shared", "per-worker"])
def test_two_workers_share_the_port_and_drain_on_sigterm(tiny_vocab_path, tiny_encoding,
                                                         tmp_path, layout):
    proc, target, metrics_port = _start(tiny_vocab_path, tmp_path, "--gpu-process", layout)
    try:
        members = _children(proc.pid)
        assert set(members) == MEMBERS[layout]
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
        assert _per_worker(page, "istanbul_tokenizer_worker_up") == LABELS[layout]
        rounds = _per_worker(page, "istanbul_tokenizer_gpu_host_messages_count")
        if layout == "shared":   # every batch of both workers went through the GPU process
            batches = _per_worker(page, "istanbul_tokenizer_batch_requests_count")
            assert rounds["gpu"] > 0
            assert _per_worker(page, "istanbul_tokenizer_gpu_host_messages_sum")["gpu"] == \
                sum(batches.values())
            # the GPU process's encoder did the encoding; the workers' own devices did not
            assert _per_worker(page, "istanbul_tokenizer_gpu_host_encoder_calls_total")["gpu"] > 0
            assert not any(_per_worker(page, "istanbul_tokenizer_encoder_calls_total").values())
        else:
            assert rounds == {}
            assert sum(_per_worker(page, "istanbul_tokenizer_encoder_calls_total").values()) > 0
        for channel in channels:
            channel.close()
        assert _terminated(proc) == 0
        assert not [pid for pid in members.values() if os.path.exists(f"/proc/{pid}")
                    and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
        if layout == "shared":
            assert "GPU process stopped" in _log(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_worker_is_restarted_and_serves_again(tiny_vocab_path, tiny_encoding,
                                                       tmp_path):
    proc, target, metrics_port = _start(tiny_vocab_path, tmp_path)
    try:
        first = _children(proc.pid)
        assert set(first) == MEMBERS["shared"]
        os.kill(first["istanbul-w0"], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while True:   # a new worker process, every member's metrics answering again
            now = _children(proc.pid)
            page = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                          timeout=30).read().decode()
            if set(now) == MEMBERS["shared"] and now["istanbul-w0"] != first["istanbul-w0"] \
                    and _per_worker(page, "istanbul_tokenizer_worker_up") == LABELS["shared"]:
                break
            assert proc.poll() is None, _log(proc)
            assert time.monotonic() < deadline, "the killed worker was not restarted"
            time.sleep(0.2)
        with TokenizerClient(target) as client:
            client.wait_ready(120)
            for text in TEXTS[:4]:
                assert client.encode(text) == list(tiny_encoding.encode(text))
        assert _terminated(proc) == 0
        assert "worker exited; restarting it" in _log(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_workers_that_cannot_start_stop_the_group(tiny_vocab_path, tmp_path):
    proc = _drained(serve_subprocess("--vocab", str(tiny_vocab_path), "--workers", "2",
                                     "--gpu-processes", "1", "--gpu-keep-clock", "0",
                                     "--port", "0", "--adapter", "no-such-adapter"))
    try:
        assert proc.wait(180) == 1
        assert re.search("(worker|GPU process) failed to start; stopping the group",
                         _log(proc))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_gpu_process_is_restarted_and_requests_fail_clearly_meanwhile(
        tiny_vocab_path, tiny_encoding, tmp_path):
    proc, target, _ = _start(tiny_vocab_path, tmp_path)
    try:
        first = _children(proc.pid)
        os.kill(first["istanbul-gpu"], signal.SIGKILL)
        channel = grpc.insecure_channel(target)   # closed before SIGTERM, as in the other tests
        stub = tokenizer_pb2_grpc.TokenizerStub(channel)
        deadline, refused, text = time.monotonic() + 120, 0, TEXTS[0]
        while True:   # each reply exact, or UNAVAILABLE naming the GPU process; then exact
            try:
                reply = stub.Tokenize(pb.TokenizeRequest(text=text), timeout=60)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                assert "GPU process" in exc.details() and "retry" in exc.details()
                refused += 1
            else:
                assert list(reply.ids) == list(tiny_encoding.encode(text))
                now = _children(proc.pid)
                if now.get("istanbul-gpu") not in (None, first["istanbul-gpu"]):
                    break
            assert time.monotonic() < deadline, "the GPU process was not restarted"
            time.sleep(0.05)
        channel.close()
        for k in range(8):   # both workers reconnected (connections spread over them)
            channel = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool",
                                                              1)])
            reply = tokenizer_pb2_grpc.TokenizerStub(channel).Tokenize(
                pb.TokenizeRequest(text=f"{text} {k}"), timeout=60)
            assert list(reply.ids) == list(tiny_encoding.encode(f"{text} {k}"))
            channel.close()
        assert _terminated(proc) == 0
        log = _log(proc)
        assert "GPU process exited; restarting it" in log
        if refused:   # the worker said so, and its health was NOT_SERVING until it reconnected
            assert "GPU process unreachable" in log and "GPU process reachable again" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_two_gpu_processes_each_serve_their_workers_and_one_killed_comes_back(
        tiny_vocab_path, tiny_encoding, tmp_path):
    """--gpu-processes 2: worker k batches through GPU process k mod 2 (gpu0, gpu1), both
    encode, replies exact; a killed GPU process is restarted while the other keeps serving,
    and the group drains and stops them both on SIGTERM."""
    proc, target, metrics_port = _start(tiny_vocab_path, tmp_path, "--gpu-processes", "2")
    try:
        first = _children(proc.pid)
        assert set(first) == {"istanbul-w0", "istanbul-w1", "istanbul-gpu0", "istanbul-gpu1"}

        def requests(tag: str) -> None:
            for k in range(16):   # separate connections: spread over both workers
                channel = grpc.insecure_channel(
                    target, options=[("grpc.use_local_subchannel_pool", 1)])
                stub = tokenizer_pb2_grpc.TokenizerStub(channel)
                for text in TEXTS[:3]:
                    doc = f"{text} {tag}{k}"
                    reply = stub.Tokenize(pb.TokenizeRequest(text=doc), timeout=60)
                    assert list(reply.ids) == list(tiny_encoding.encode(doc))
                channel.close()

        def page() -> str:
            return urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                          timeout=30).read().decode()

        requests("a")
        text = page()
        assert _per_worker(text, "istanbul_tokenizer_worker_up") == \
            {"0": 1.0, "1": 1.0, "gpu0": 1.0, "gpu1": 1.0}
        served = _per_worker(text, "istanbul_tokenizer_requests_total")
        assert all(served.get(w, 0) > 0 for w in ("0", "1")), served
        # each worker's batches went to its own GPU process: both encoded, and together
        # they received every batch
        messages = _per_worker(text, "istanbul_tokenizer_gpu_host_messages_sum")
        batches = _per_worker(text, "istanbul_tokenizer_batch_requests_count")
        assert messages.get("gpu0", 0) > 0 and messages.get("gpu1", 0) > 0, messages
        assert messages["gpu0"] == batches["0"] and messages["gpu1"] == batches["1"]
        os.kill(first["istanbul-gpu1"], signal.SIGKILL)
        deadline = time.monotonic() + 120
        while True:   # gpu1 back (a new process), every member's metrics answering again
            now = _children(proc.pid)
            if now.get("istanbul-gpu1") not in (None, first["istanbul-gpu1"]) and \
                    _per_worker(page(), "istanbul_tokenizer_worker_up").get("gpu1") == 1.0:
                break
            assert proc.poll() is None, _log(proc)
            assert time.monotonic() < deadline, "the killed GPU process was not restarted"
            time.sleep(0.2)
        assert now["istanbul-gpu0"] == first["istanbul-gpu0"]   # the other one kept serving
        with TokenizerClient(target) as client:
            client.wait_ready(120)
        deadline = time.monotonic() + 120
        while True:   # both workers serve again (worker 1 reconnects to the new gpu1)
            try:
                requests("b")
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE and "GPU process" in \
                    exc.details(), exc
                assert time.monotonic() < deadline, "worker 1 did not reach the new gpu1"
                time.sleep(0.2)
        assert _terminated(proc) == 0
        log = _log(proc)
        assert "GPU process exited; restarting it" in log
        assert log.count("GPU process stopped") == 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("args, why", [
    (("--workers", "2", "--gpu-processes", "3"), "from 1 to --workers (2)"),
    (("--workers", "2", "--gpu-process", "per-worker", "--gpu-processes", "2"),
     "--gpu-process shared"),
    (("--gpu-processes", "2",), "--workers N >= 2"),
])
def test_gpu_processes_out_of_range_are_one_clear_error(tiny_vocab_path, args, why):
    proc = serve_subprocess("--vocab", str(tiny_vocab_path), "--port", "0", *args)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    lines = [line for line in err.splitlines() if "error" in line]
    assert len(lines) == 1 and "--gpu-processes" in lines[0] and why in lines[0], err


def test_shared_gpu_process_keeps_auth_metrics_auth_and_the_stall_watchdog(
        tiny_vocab_path, tiny_encoding, tmp_path):
    """The shared layout keeps what a single server does: bearer tokens on every RPC, /metrics
    only with a token (the GPU process's series included), and a worker whose batch waits on
    a GPU process that makes no progress turns NOT_SERVING after --stall-timeout, SERVING
    again (and answers) once it runs on."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    tokens = tmp_path / "tokens"
    tokens.write_text("s3cret\n")
    proc, target, metrics_port = _start(tiny_vocab_path, tmp_path, "--auth-token-file",
                                        str(tokens), "--metrics-auth", "--stall-timeout", "2")
    host = None
    try:
        auth = (("authorization", "Bearer s3cret"),)
        channel = grpc.insecure_channel(target)
        stub = tokenizer_pb2_grpc.TokenizerStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Tokenize(pb.TokenizeRequest(text="hello"), timeout=60)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = stub.Tokenize(pb.TokenizeRequest(text="hello"), timeout=60, metadata=auth)
        assert list(reply.ids) == list(tiny_encoding.encode("hello"))
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as no_token:
            urllib.request.urlopen(url, timeout=30)
        assert no_token.value.code == 401
        page = urllib.request.urlopen(urllib.request.Request(
            url, headers={"Authorization": "Bearer s3cret"}), timeout=30).read().decode()
        assert _per_worker(page, "istanbul_tokenizer_worker_up") == LABELS["shared"]
        assert _per_worker(page, "istanbul_tokenizer_gpu_host_encoder_calls_total")["gpu"] > 0

        health = health_pb2_grpc.HealthStub(channel)

        def status():
            return health.Check(health_pb2.HealthCheckRequest(service=""), timeout=30,
                                metadata=auth).status
        assert status() == health_pb2.HealthCheckResponse.SERVING
        host = _children(proc.pid)["istanbul-gpu"]
        os.kill(host, signal.SIGSTOP)
        waiting = stub.Tokenize.future(pb.TokenizeRequest(text="stalled text"), timeout=120,
                                       metadata=auth)
        deadline = time.monotonic() + 60
        while status() != health_pb2.HealthCheckResponse.NOT_SERVING:
            assert time.monotonic() < deadline, "the stalled batch never turned NOT_SERVING"
            time.sleep(0.2)
        os.kill(host, signal.SIGCONT)
        host = None
        assert list(waiting.result(60).ids) == list(tiny_encoding.encode("stalled text"))
        deadline = time.monotonic() + 60
        while status() != health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline, "the worker never recovered"
            time.sleep(0.2)
        channel.close()
        assert _terminated(proc) == 0
        assert "GPU worker stalled" in _log(proc)
    finally:
        if host is not None:
            os.kill(host, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigusr1_dumps_stacks_and_a_member_that_does_not_stop_is_killed(
        tiny_vocab_path, tiny_encoding, tmp_path):
    """SIGUSR1 makes a member write its threads' stacks and serve on; a worker that cannot
    stop (here: SIGSTOPped) does not hold the group's SIGTERM for ever: past its bound
    (grace 1 s + stall timeout 1 s + 15 s) the supervisor logs it, kills it and exits 1."""
    proc, target, _ = _start(tiny_vocab_path, tmp_path, "--shutdown-grace", "1",
                             "--stall-timeout", "1")
    try:
        members = _children(proc.pid)
        os.kill(members["istanbul-w0"], signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while "Thread 0x" not in _log(proc):
            assert time.monotonic() < deadline, "no stacks after SIGUSR1"
            time.sleep(0.1)
        assert "serve" in _log(proc)   # a frame of the worker's own code
        with TokenizerClient(target) as client:   # still serving, exactly
            assert list(client.encode(TEXTS[0])) == list(tiny_encoding.encode(TEXTS[0]))
        assert _children(proc.pid) == members
        os.kill(members["istanbul-w1"], signal.SIGSTOP)
        start = time.monotonic()
        assert _terminated(proc, 120) == 1
        assert 17 <= time.monotonic() - start < 60
        assert "did not stop in time" in _log(proc)
        assert not [pid for pid in members.values() if os.path.exists(f"/proc/{pid}")
                    and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
