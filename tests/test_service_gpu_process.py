"""The shared GPU process (tokenizer_svc/service/gpu_process.py, gpu_worker.py, gpu_wire.py) with a real Encoding on this
machine's device: one round answers every waiting worker message with one Encoding call per
allowed-special set, splits calls between messages (never inside one), fails only the
message with an invalid id (with the Encoding's own words), and `RemoteEncoding` gives the
ids a local Encoding gives, over a real Unix socket, before and after the process it talks
to went away. Text travels as its UTF-8 unless it cannot (special tokens allowed, a lone
surrogate, raw bytes); a round mixing both forms still answers each message with exactly
its own documents' ids."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from multiprocessing import Pipe
from multiprocessing.connection import Client, Listener

import grpc
import numpy as np
import pytest

from tokenizer_svc.service.errors import RequestRejected
from tokenizer_svc.gpu_backend import FinishedCall
from tokenizer_svc.service.gpu_process import SERVING_THREAD_FAILED, GpuHost, _Message, serve_or_exit
from tokenizer_svc.service.gpu_wire import encode_message, receive_reply
from tokenizer_svc.service.gpu_worker import RemoteEncoding, RemoteInvalidToken
from tokenizer_svc.service.limits import utf8_len
from tests.service_support import TEXTS, tiny_encoding, tiny_vocab_path  # noqa: F401

SPECIAL = "<|endoftext|>"


class Counting:
    """The real Encoding, counting its encode calls (documents per call; `utf8_calls` those
    given as UTF-8) and decode calls."""

    def __init__(self, encoding):
        self.encoding, self.encode_calls, self.utf8_calls, self.decode_calls = \
            encoding, [], [], 0

    def encode_batch_flat(self, docs, **kw):
        self.encode_calls.append(len(docs))
        return self.encoding.encode_batch_flat(docs, **kw)

    def _encode_utf8_batch_flat(self, docs):
        self.encode_calls.append(len(docs))
        self.utf8_calls.append(len(docs))
        return self.encoding._encode_utf8_batch_flat(docs)

    def _begin_utf8_batch_flat(self, docs):
        self.encode_calls.append(len(docs))
        self.utf8_calls.append(len(docs))
        return self.encoding._begin_utf8_batch_flat(docs)

    def decode_bytes_batch(self, seqs):
        self.decode_calls += 1
        return self.encoding.decode_bytes_batch(seqs)


def _worker_messages(bodies: list) -> tuple[list, list]:
    """(host-side _Messages, worker-side ends) for message tuples sent over real pipes."""
    messages, ends = [], []
    for body in bodies:
        host_end, worker_end = Pipe()
        worker_end.send(body)
        got = host_end.recv()
        messages.append(_Message(host_end, got[0], got[1:]))
        ends.append(worker_end)
    return messages, ends


def _expected(encoding, docs, allowed=frozenset()):
    return [list(encoding.encode(d, allowed_special=set(allowed))) for d in docs]


def _split(conn):
    """One encode answer read from `conn`, as each document's ids."""
    reply = receive_reply(conn)
    assert reply[0] == "ok", reply
    ids, offsets = reply[1]
    return [ids[offsets[n]:offsets[n + 1]].tolist() for n in range(len(offsets) - 1)]


def test_one_round_is_one_call_per_allowed_set(tiny_encoding):
    counting = Counting(tiny_encoding)
    host = GpuHost(counting, max_call_bytes=1 << 20)
    a, b = TEXTS[:3], TEXTS[3:5]
    special = [f"one {SPECIAL} two", "plain"]
    bodies = [("encode", a, frozenset(), sum(len(t.encode()) for t in a)),
              ("encode", b, frozenset(), sum(len(t.encode()) for t in b)),
              ("encode", special, frozenset({SPECIAL}), 30)]
    messages, ends = _worker_messages(bodies)
    host.run_round(messages)
    assert sorted(counting.encode_calls) == [2, 5]   # a+b together, the special set alone
    assert _split(ends[0]) == _expected(tiny_encoding, a)
    assert _split(ends[1]) == _expected(tiny_encoding, b)
    got = _split(ends[2])
    assert got == _expected(tiny_encoding, special, {SPECIAL})
    assert tiny_encoding.encode_single_token(SPECIAL) in got[0]


@pytest.mark.parametrize("step", [1, 5, 4096, None])
def test_answers_are_whole_frames_even_when_the_socket_takes_them_in_pieces(
        tiny_encoding, monkeypatch, step):
    """An answer goes out as its frames in one writev (gpu_wire.send_frames); a write that takes only
    part of them (`step` bytes at a time here; None: all at once) goes on where it stopped, so
    the worker reads the same offsets and ids as ever, empty ids included."""
    import os
    from tokenizer_svc.service import gpu_wire
    real = os.writev

    def partial(fd, buffers):
        if step is None:
            return real(fd, buffers)
        first = next(b for b in buffers if len(b))   # at most `step` bytes of it
        return real(fd, [first[:step]])

    monkeypatch.setattr(gpu_wire.os, "writev", partial)
    host = GpuHost(tiny_encoding, max_call_bytes=1 << 20)
    # the answers wait in the sockets until the round ends, and every tiny write is a
    # buffer of its own there: a long answer only with writes that are not tiny
    docs = [TEXTS[0], ""] + ([TEXTS[1] * 40] if step is None or step >= 4096 else [])
    messages, ends = _worker_messages([("encode", [d], frozenset(), utf8_len(d)) for d in docs])
    host.run_round(messages)
    for m in messages:   # a worker that reads past what was written gets EOF, not a wait
        m.conn.close()
    for end, doc in zip(ends, docs):
        assert _split(end) == _expected(tiny_encoding, [doc])
        with pytest.raises(EOFError):   # and nothing more came
            end.recv_bytes()


def test_calls_split_between_messages_never_inside_one(tiny_encoding):
    counting = Counting(tiny_encoding)
    host = GpuHost(counting, max_call_bytes=100)
    big = ["x" * 80, "y" * 80]           # one message over the limit: still one call
    small = ["hello there"]
    messages, ends = _worker_messages([("encode", big, frozenset(), 160),
                                       ("encode", small, frozenset(), 11),
                                       ("encode", small, frozenset(), 11)])
    host.run_round(messages)
    assert counting.encode_calls == [2, 2]   # [big], then both small ones together
    assert _split(ends[0]) == _expected(tiny_encoding, big)
    assert _split(ends[1]) == _split(ends[2]) == _expected(tiny_encoding, small)


def test_text_travels_as_utf8_only_when_it_can(tiny_encoding):
    """encode_message: text with no special tokens allowed goes as its UTF-8; text with a
    lone surrogate (repaired by the Encoding as tiktoken does), raw bytes and text with
    special tokens allowed go as they are. Its byte count is the same either way."""
    plain = TEXTS + ["İ" * 40]
    kind, utf8, allowed, nbytes = encode_message(plain, frozenset())
    assert (kind, utf8, allowed) == ("encode_utf8", [t.encode() for t in plain], frozenset())
    assert nbytes == sum(map(utf8_len, plain))
    for docs, allowed in (([TEXTS[1], "lone \ud800 surrogate"], frozenset()),
                          ([TEXTS[1], b"raw \xff bytes"], frozenset()),
                          ([f"one {SPECIAL}", TEXTS[1]], frozenset({SPECIAL}))):
        assert encode_message(docs, allowed) == \
            ("encode", docs, allowed, sum(map(utf8_len, docs)))
    assert encode_message([], frozenset()) == ("encode_utf8", [], frozenset(), 0)


def _local(encoding, docs, allowed=frozenset()):
    """Each document's ids from the local Encoding (text, bytes or mixed)."""
    ids, offsets = encoding.encode_batch_flat(docs, allowed_special=allowed,
                                              disallowed_special=())
    return [ids[offsets[n]:offsets[n + 1]].tolist() for n in range(len(docs))]


def test_utf8_and_plain_messages_in_one_round_each_get_their_own_ids(tiny_encoding):
    """UTF-8 messages of 0, 1 and several documents share one call (given as UTF-8); with a
    message of documents as they are (a lone surrogate, raw invalid UTF-8) in the same
    allowed set they share one call in which the UTF-8 ones are text again; every message
    gets exactly its own documents' ids, in order, none lost."""
    counting = Counting(tiny_encoding)
    host = GpuHost(counting, max_call_bytes=1 << 20)
    batches = [TEXTS[:3], [], ["", TEXTS[7]], TEXTS[3:9], [TEXTS[2]]]
    special = encode_message([f"x {SPECIAL} y"], frozenset({SPECIAL}))
    messages, ends = _worker_messages([encode_message(b, frozenset()) for b in batches] +
                                      [special])
    assert [m.kind for m in messages] == ["encode_utf8"] * 5 + ["encode"]
    host.run_round(messages)
    assert counting.utf8_calls == [sum(map(len, batches))] and sorted(counting.encode_calls) \
        == [1, sum(map(len, batches))]
    for end, docs in zip(ends, batches):
        assert _split(end) == _local(tiny_encoding, docs)
    assert _split(ends[-1]) == _local(tiny_encoding, [f"x {SPECIAL} y"], {SPECIAL})

    counting.encode_calls.clear()
    counting.utf8_calls.clear()
    odd = ["a \ud83d lone high, a pair \ud83d\ude00 joined", b"raw \xff\xfe end", TEXTS[4]]
    batches = [TEXTS[:2], odd, TEXTS[9:12]]
    messages, ends = _worker_messages([encode_message(b, frozenset()) for b in batches])
    assert [m.kind for m in messages] == ["encode_utf8", "encode", "encode_utf8"]
    host.run_round(messages)
    assert counting.encode_calls == [8] and counting.utf8_calls == []
    for end, docs in zip(ends, batches):
        assert _split(end) == _local(tiny_encoding, docs)


def test_utf8_calls_split_between_messages_never_inside_one(tiny_encoding):
    counting = Counting(tiny_encoding)
    host = GpuHost(counting, max_call_bytes=100)
    big, small = ["x" * 80, "ÿ" * 40], ["hello there"]   # 160 bytes: over the limit, alone
    messages, ends = _worker_messages([encode_message(big, frozenset()),
                                       encode_message(small, frozenset()),
                                       encode_message(small, frozenset())])
    assert messages[0].body[2] == 160
    host.run_round(messages)
    assert counting.utf8_calls == [2, 2]   # [big], then both small ones together
    assert _split(ends[0]) == _local(tiny_encoding, big)
    assert _split(ends[1]) == _split(ends[2]) == _local(tiny_encoding, small)


def test_encode_utf8_batch_flat_is_encode_batch_flat_of_the_text(tiny_encoding,
                                                                 tiny_vocab_path, tmp_path):
    """Encoding._encode_utf8_batch_flat gives encode_batch_flat's ids and offsets of the text
    on the GPU path, on the CPU reference (no packed path) and for a tokenizer.json with a
    normalizer (which needs the text back)."""
    import json
    from tests.test_tokenizer_hf import hf_file
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.vocab import load_vocabulary
    path = hf_file(tmp_path, merge_syntax="string")
    spec = json.loads(path.read_text(encoding="utf-8"))
    spec["normalizer"] = {"type": "Lowercase"}
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    lowered = get_encoding(load_vocabulary(path), device=tiny_encoding.backend.device)
    texts = TEXTS + ["MiXeD CaSe İSTANBUL", "", "x" * 5000]
    for encoding in (tiny_encoding, get_encoding(str(tiny_vocab_path), device="cpu"), lowered):
        ids, offsets = encoding._encode_utf8_batch_flat([t.encode() for t in texts])
        want_ids, want_offsets = encoding.encode_batch_flat(texts)
        assert ids.dtype == np.uint32 and offsets.dtype == np.int64
        assert np.array_equal(ids, want_ids) and np.array_equal(offsets, want_offsets)
    assert lowered._encode_utf8_batch_flat([b"ABC"])[0].tolist() == lowered.encode("abc")
    assert tiny_encoding._encode_utf8_batch_flat([])[1].tolist() == [0]


def test_an_invalid_id_fails_only_its_own_decode_message(tiny_encoding):
    counting = Counting(tiny_encoding)
    host = GpuHost(counting, max_call_bytes=1 << 20)
    good = [np.asarray(tiny_encoding.encode(t), np.uint32) for t in TEXTS[:2]]
    bad = [good[0], np.array([1, 10**6], np.uint32)]
    messages, ends = _worker_messages([("decode", good), ("decode", bad), ("decode", [])])
    host.run_round(messages)
    assert ends[0].recv() == ("ok", [t.encode() for t in TEXTS[:2]])
    kind, message, token, position, document = ends[1].recv()
    with pytest.raises(ValueError) as local:
        tiny_encoding.decode_bytes_batch(bad)
    assert (kind, message) == ("invalid_token", str(local.value))
    assert (token, position, document) == (10**6, 1, 1)
    assert ends[2].recv() == ("ok", [])
    assert counting.decode_calls == 1 + 3    # all together, then each message alone


@pytest.fixture
def served(tiny_encoding, tmp_path):
    """A GpuHost serving on a real Unix socket (its loop on a thread), and its address."""
    address, key = str(tmp_path / "gpu.sock"), os.urandom(16)
    listener = Listener(address, family="AF_UNIX", authkey=key)
    host = GpuHost(Counting(tiny_encoding), max_call_bytes=1 << 20)
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                host.attach(listener.accept())
            except OSError:
                return
    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    yield host, address, key, listener
    stop.set()
    host.stop()
    listener.close()


def test_messages_waiting_together_are_one_round(served, tiny_encoding):
    host, address, key, _ = served
    clients = [Client(address, family="AF_UNIX", authkey=key) for _ in range(2)]
    deadline = time.monotonic() + 30
    while len(host._new) < 2:        # both accepted before the loop starts
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for k, c in enumerate(clients):
        c.send(("encode", [TEXTS[k]], frozenset(), len(TEXTS[k].encode())))
    loop = threading.Thread(target=host.serve_forever, daemon=True)
    loop.start()
    for k, c in enumerate(clients):
        assert _split(c) == _expected(tiny_encoding, [TEXTS[k]])
    assert host.rounds == 1 and host.encoding.encode_calls == [2]
    for c in clients:
        c.close()


def test_the_thread_reports_where_its_time_goes(served, tiny_encoding):
    """The GPU process's thread counts its wall time by phase (waiting for messages,
    receiving them, running rounds, answering within them) and its CPU time: what says
    whether rounds wait for messages or messages for the thread."""
    host, address, key, _ = served

    def sample(name, **labels):
        return host.metrics.registry.get_sample_value(
            f"istanbul_tokenizer_gpu_host_{name}", labels) or 0.0

    phases = ("wait", "spin", "receive", "round", "answer")
    seconds = {p: sample("thread_seconds_total", phase=p) for p in phases}
    loop = threading.Thread(target=host.serve_forever, daemon=True)
    loop.start()
    client = Client(address, family="AF_UNIX", authkey=key)
    time.sleep(0.2)                 # the thread waits for it meanwhile
    for text in TEXTS[:3]:
        client.send(("encode", [text], frozenset(), len(text.encode())))
        assert _split(client) == _expected(tiny_encoding, [text])
    client.close()
    got = {p: sample("thread_seconds_total", phase=p) - seconds[p] for p in phases}
    assert got["wait"] >= 0.15 and got["spin"] == 0.0          # no clock keeper here
    assert got["receive"] > 0 and got["round"] > 0 and got["answer"] > 0
    assert got["answer"] < got["round"]                         # answers are part of rounds
    assert sample("seconds_sum", kind="encode") <= got["round"]   # so are the Encoding calls
    assert sample("thread_cpu_seconds_total") > 0


def test_a_failing_serving_thread_ends_the_process_for_a_restart(tiny_encoding):
    """A bug outside the guarded Encoding call (here: offsets that do not fit the documents)
    kills the one serving thread; the process must then exit (the supervisor restarts it)
    instead of living on with nobody answering."""
    class WrongOffsets(Counting):
        def _encode_utf8_batch_flat(self, docs):
            ids, _ = super()._encode_utf8_batch_flat(docs)
            return ids, np.array([0], np.int64)          # one offset for any document count

        def _begin_utf8_batch_flat(self, docs):           # the overlapping loop's path
            return FinishedCall(self._encode_utf8_batch_flat(docs))

    host = GpuHost(WrongOffsets(tiny_encoding), max_call_bytes=1 << 20)
    host_end, worker_end = Pipe()
    host.attach(host_end)
    exits = []
    loop = threading.Thread(target=serve_or_exit, args=(host,),
                            kwargs={"exit": exits.append}, daemon=True)
    loop.start()
    worker_end.send(encode_message([TEXTS[0]], frozenset()))
    loop.join(30)
    assert not loop.is_alive() and exits == [SERVING_THREAD_FAILED]
    with pytest.raises(EOFError):        # the worker hears of it: its connection closed
        worker_end.recv()


def test_remote_encoding_matches_the_local_one_and_says_when_the_host_is_gone(
        served, tiny_encoding):
    host, address, key, listener = served
    loop = threading.Thread(target=host.serve_forever, daemon=True)
    loop.start()
    remote = RemoteEncoding(tiny_encoding, address, key)
    remote.connect(30)
    ids, offsets = remote.encode_batch_flat(TEXTS, allowed_special=frozenset(),
                                            disallowed_special=())
    local_ids, local_offsets = tiny_encoding.encode_batch_flat(TEXTS, allowed_special=set(),
                                                               disallowed_special=())
    assert np.array_equal(ids, local_ids) and np.array_equal(offsets, local_offsets)
    assert (ids.dtype, offsets.dtype, ids.flags.writeable) == (np.uint32, np.int64, True)
    for docs, allowed in ((["lone \ud800", *TEXTS[:3]], frozenset()),      # as they are
                          ([b"raw \xff", TEXTS[2]], frozenset()),
                          ([f"a {SPECIAL} b", TEXTS[3]], frozenset({SPECIAL})),
                          ([], frozenset()), ([""], frozenset())):
        ids, offsets = remote.encode_batch_flat(docs, allowed_special=allowed)
        want_ids, want_offsets = tiny_encoding.encode_batch_flat(
            docs, allowed_special=allowed, disallowed_special=())
        assert np.array_equal(ids, want_ids) and np.array_equal(offsets, want_offsets), docs
    assert remote.decode_bytes_batch([local_ids]) == [b"".join(t.encode() for t in TEXTS)]
    with pytest.raises(RemoteInvalidToken) as bad:
        remote.decode_bytes_batch([np.array([10**6], np.uint32)])
    assert bad.value.token == 10**6 and "not in vocabulary" in str(bad.value)
    assert remote.n_vocab == tiny_encoding.n_vocab      # the rest is the worker's own
    with pytest.raises(ValueError, match="disallowed_special"):
        remote.encode_batch_flat(["x"], disallowed_special="all")
    host.stop()                                           # the GPU process goes away
    loop.join(30)
    listener.close()
    with pytest.raises(RequestRejected) as gone:
        remote.encode_batch_flat(["hello"])
    assert gone.value.code == grpc.StatusCode.UNAVAILABLE
    assert "GPU process" in gone.value.message and "retry" in gone.value.message
    with pytest.raises(RequestRejected, match="restarting"):
        remote.encode_batch_flat(["hello"])             # nobody listening: fails fast


def test_connect_names_the_socket_when_nobody_listens(tiny_encoding, tmp_path):
    remote = RemoteEncoding(tiny_encoding, str(tmp_path / "absent.sock"), b"k")
    with pytest.raises(ConnectionError, match="absent.sock"):
        remote.connect(0.2)


@pytest.mark.parametrize("peer", ["silent", "hangs_up", "wrong_key"])
def test_a_handshake_that_does_not_complete_fails_as_unreachable_in_bounded_time(
        tiny_encoding, tmp_path, monkeypatch, peer):
    """A GPU process that accepted but never answers (stopped, stuck), breaks off, or holds
    another key: connecting fails as an OSError within the handshake bound, so the worker's
    calls fail UNAVAILABLE and its probe says False, with no thread blocked for ever (a worker
    cannot exit while one waits)."""
    import socket
    from tokenizer_svc.service import gpu_wire
    monkeypatch.setattr(gpu_wire, "HANDSHAKE_TIMEOUT_S", 0.5)
    address = str(tmp_path / "gpu.sock")
    if peer == "wrong_key":
        listener = Listener(address, family="AF_UNIX", authkey=b"other")

        def serve():
            try:
                listener.accept()
            except Exception:   # the handshake fails on this side too
                pass
        threading.Thread(target=serve, daemon=True).start()
    else:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(8)
        if peer == "hangs_up":
            def serve():
                while True:
                    try:
                        conn, _ = listener.accept()
                    except OSError:
                        return
                    conn.close()
            threading.Thread(target=serve, daemon=True).start()
    remote = RemoteEncoding(tiny_encoding, address, b"key")
    try:
        start = time.monotonic()
        with pytest.raises(ConnectionError, match="handshake"):
            remote._open()
        with pytest.raises(RequestRejected, match="GPU process") as refused:
            remote.encode_batch_flat(["hello"])
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        assert not remote.reachable and not remote.probe()

        async def on_the_loop():
            with pytest.raises(RequestRejected, match="GPU process"):
                await remote.encode_flat_async(["hello"])
        asyncio.run(on_the_loop())
        assert time.monotonic() - start < 4 * 0.5 + 3   # four bounded handshakes, no more
    finally:
        remote.close()
        listener.close()


def test_a_stalled_or_wrong_peer_does_not_stop_the_gpu_process_accepting(
        tiny_encoding, tmp_path, monkeypatch):
    """The GPU process's accept loop (accept_workers) hands each handshake to a thread of its
    own, bounded by HANDSHAKE_TIMEOUT_S: a peer that connects and says nothing, or holds
    another key, neither delays a worker connecting beside it nor stays connected."""
    import socket
    from multiprocessing import AuthenticationError
    from tokenizer_svc.service import gpu_process, gpu_wire
    monkeypatch.setattr(gpu_wire, "HANDSHAKE_TIMEOUT_S", 3.0)
    address, key = str(tmp_path / "gpu.sock"), os.urandom(16)
    listener = Listener(address, family="AF_UNIX")
    host = GpuHost(Counting(tiny_encoding), max_call_bytes=1 << 20)
    threading.Thread(target=gpu_process.accept_workers, args=(listener, host, key),
                     daemon=True).start()
    loop = threading.Thread(target=host.serve_forever, daemon=True)
    loop.start()
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(address)
    with pytest.raises(AuthenticationError):
        Client(address, family="AF_UNIX", authkey=b"another key")
    remote = RemoteEncoding(tiny_encoding, address, key)
    try:
        start = time.monotonic()
        ids, offsets = remote.encode_batch_flat([TEXTS[0], TEXTS[1]])
        assert time.monotonic() - start < 2.0    # not after the silent peer's 3 s
        assert [ids[offsets[n]:offsets[n + 1]].tolist() for n in range(2)] == \
            _expected(tiny_encoding, TEXTS[:2])
        silent.settimeout(10)
        received = b""
        while chunk := silent.recv(4096):   # the challenge, then the close at the bound
            received += chunk
        assert received and time.monotonic() - start < 3.0 + 3
        assert len(host._conns) + len(host._new) == 1   # only the worker stays
    finally:
        remote.close()
        silent.close()
        host.stop()
        listener.close()
        loop.join(10)


def test_a_failing_encoding_call_fails_each_of_its_messages(tiny_encoding):
    class Broken(Counting):
        def encode_batch_flat(self, docs, **kw):
            raise RuntimeError("device lost")
    host = GpuHost(Broken(tiny_encoding), max_call_bytes=1 << 20)
    messages, ends = _worker_messages([("encode", ["a"], frozenset(), 1),
                                       ("encode", ["b"], frozenset(), 1),
                                       ("decode", [np.array([1], np.uint32)])])
    host.run_round(messages)
    assert receive_reply(ends[0]) == receive_reply(ends[1]) == \
        ("failed", "RuntimeError: device lost")
    assert ends[2].recv() == ("ok", [tiny_encoding.decode_single_token_bytes(1)])


def test_reachable_turns_false_on_a_failed_call_and_back_on_a_probe(served, tiny_encoding):
    host, address, key, listener = served
    loop = threading.Thread(target=host.serve_forever, daemon=True)
    loop.start()
    remote = RemoteEncoding(tiny_encoding, address, key)
    remote.connect(30)
    assert remote.reachable and remote.probe()
    host.stop()
    loop.join(30)
    listener.close()
    with pytest.raises(RequestRejected):
        remote.encode_batch_flat(["hello"])
    assert not remote.reachable and not remote.probe()   # nobody listens yet
    again = Listener(address, family="AF_UNIX", authkey=key)   # "restarted"
    second = GpuHost(tiny_encoding, max_call_bytes=1 << 20)
    accepted = threading.Thread(target=lambda: second.attach(again.accept()), daemon=True)
    accepted.start()
    assert remote.probe() and remote.reachable
    accepted.join(30)
    serving = threading.Thread(target=second.serve_forever, daemon=True)
    serving.start()
    ids, _ = remote.encode_batch_flat(["hello"])
    assert ids.tolist() == tiny_encoding.encode("hello")
    second.stop()
    again.close()


def test_the_clock_keeper_spins_only_while_holding(tiny_encoding):
    """ClockKeeper (--gpu-keep-clock): no spin and a blocking wait before any request or with
    a hold of 0; after `used()` a zero wait and real kernels, a new one only once the last has
    finished (never more than one queued, never waited for), until the hold runs out."""
    from tokenizer_svc.service.clock_keeper import ClockKeeper
    device = tiny_encoding.backend.device
    off = ClockKeeper(device, 0.0)
    off.used()
    off.spin()
    assert off.wait_timeout() is None and off.spins == 0
    keeper = ClockKeeper(device, 30.0, spin_s=1e-6)
    assert keeper.wait_timeout() is None          # nothing arrived yet
    keeper.used()
    assert keeper.wait_timeout() == 0.0
    deadline = time.monotonic() + 60
    while keeper.spins < 3:
        keeper.spin()
        assert time.monotonic() < deadline
    assert np.isfinite(device.download(keeper.out, np.float32)).all()   # the kernel ran
    finished = keeper._spin_done
    keeper._spin_done = lambda: False               # the last spin still running
    for _ in range(3):
        keeper.spin()
    assert keeper.spins == 3                        # nothing more queued behind it
    keeper._spin_done = finished
    while not finished():
        assert time.monotonic() < deadline
    keeper.spin()
    assert keeper.spins == 4                        # finished: the next one goes
    keeper.last_use -= 60.0                         # the hold ran out
    while not keeper._spin_done():
        assert time.monotonic() < deadline
    keeper.spin()
    assert keeper.spins == 4 and keeper.wait_timeout() is None
    with pytest.raises(ValueError, match=">= 0"):
        ClockKeeper(device, -1.0)


def test_a_host_keeping_the_clock_spins_between_rounds_and_answers_exactly(
        tiny_encoding, tmp_path):
    """With a keeper the GPU process spins while no message waits (after the first request)
    and still answers every message with the local Encoding's ids."""
    from tokenizer_svc.service.clock_keeper import ClockKeeper
    keeper = ClockKeeper(tiny_encoding.backend.device, 30.0, spin_s=1e-6)
    host = GpuHost(tiny_encoding, max_call_bytes=1 << 20, keeper=keeper)
    host_end, worker_end = Pipe()
    host.attach(host_end)
    loop = threading.Thread(target=host.serve_forever, daemon=True)
    loop.start()
    try:
        for k in range(3):
            worker_end.send(("encode", [TEXTS[k]], frozenset(), len(TEXTS[k].encode())))
            assert _split(worker_end) == _expected(tiny_encoding, [TEXTS[k]])
            deadline = time.monotonic() + 30
            spun = keeper.spins
            while keeper.spins < spun + 2:       # it spins while idle
                assert time.monotonic() < deadline
                time.sleep(0.01)
    finally:
        host.stop()
        loop.join(30)
    assert host.rounds == 3


@pytest.mark.parametrize("argv, message", [
    (["--gpu-keep-clock", "5"], "needs the shared GPU process"),
    (["--gpu-keep-clock", "5", "--workers", "2", "--gpu-process", "per-worker"],
     "needs the shared GPU process"),
    (["--gpu-keep-clock", "-1", "--workers", "2"], ">= 0 seconds"),
])
def test_keep_clock_flag_errors_are_clear(argv, message):
    """`istanbul serve --gpu-keep-clock` is refused with one line where no GPU process would
    hold the clock, and for negative holds; accepted with the shared GPU process."""
    import argparse
    from istanbul.errors import UserFacingError
    from tokenizer_svc.service.cli import config_from_args, register
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    with pytest.raises(UserFacingError, match=message):
        config_from_args(parser.parse_args(["serve", "--vocab", "v.tiktoken", *argv]))
    ok = config_from_args(parser.parse_args(["serve", "--vocab", "v.tiktoken", "--workers", "2",
                                             "--gpu-keep-clock", "2.5"]))
    assert ok.gpu_keep_clock_s == 2.5


def test_the_host_overlaps_by_default():
    """A round's encode call runs on the GPU while the thread answers and receives unless
    GpuHost(overlap=False)."""
    assert GpuHost(object(), max_call_bytes=1).overlap is True
    assert GpuHost(object(), max_call_bytes=1, overlap=False).overlap is False


def test_a_connection_attached_as_the_host_stops_is_closed_not_left_waiting(tiny_encoding):
    """A worker's connection accepted while the host stops (attached after its loop ended,
    or before the loop watched it) is closed: the worker sees EOF instead of waiting for
    ever for a reply (a CI run hung 900 s in the reachability test on that race)."""
    host = GpuHost(Counting(tiny_encoding), max_call_bytes=1 << 20)
    watched, worker_side = Pipe()
    host.attach(watched)          # attached, never watched: the loop stops at once
    host.stop()
    loop = threading.Thread(target=host.serve_forever, daemon=True)
    loop.start()
    loop.join(30)
    assert not loop.is_alive()
    late, late_worker = Pipe()
    host.attach(late)             # after the loop ended
    for conn in (worker_side, late_worker):
        assert conn.poll(5)
        with pytest.raises(EOFError):
            conn.recv()


# ---- a worker's batches on its event loop (RemoteEncoding.call_async, BatchRunner.run_async)

def _pooled(remote) -> int:
    """Idle streams of the running loop in `remote`'s pool."""
    return len(remote._idle_async.get(asyncio.get_running_loop(), []))


def _serve_in_thread(host):
    loop = threading.Thread(target=host.serve_forever, daemon=True)
    loop.start()
    return loop


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_the_loops_calls_answer_as_the_blocking_ones_and_recover_like_them(
        served, tiny_encoding, loop_kind):
    """Same ids for every message form, several calls at once on connections of their own,
    an invalid id's own error, a call cancelled mid-way (its connection is dropped, the next
    call is exact), and the GPU process gone (UNAVAILABLE, not reachable) then back."""
    from tokenizer_svc.service import event_loop
    host, address, key, listener = served
    thread = _serve_in_thread(host)
    remote = RemoteEncoding(tiny_encoding, address, key)
    forms = ((TEXTS, frozenset()), (["lone \ud800", *TEXTS[:3]], frozenset()),
             ([b"raw \xff", TEXTS[2]], frozenset()),
             ([f"a {SPECIAL} b", TEXTS[3]], frozenset({SPECIAL})), ([], frozenset()),
             ([""], frozenset()))

    async def before_the_restart():
        for docs, allowed in forms:
            ids, offsets = await remote.encode_flat_async(docs, allowed)
            want_ids, want_offsets = tiny_encoding.encode_batch_flat(
                docs, allowed_special=allowed, disallowed_special=())
            assert np.array_equal(ids, want_ids) and np.array_equal(offsets, want_offsets)
            assert (ids.dtype, offsets.dtype) == (np.uint32, np.int64)
        many = await asyncio.gather(*(remote.encode_flat_async([t]) for t in TEXTS))
        assert [ids.tolist() for ids, _ in many] == [tiny_encoding.encode(t) for t in TEXTS]
        assert 1 < _pooled(remote) <= len(TEXTS)
        ids, _ = await remote.encode_flat_async(TEXTS)
        assert await remote.decode_bytes_batch_async([ids]) == [
            b"".join(t.encode() for t in TEXTS)]
        with pytest.raises(RemoteInvalidToken) as bad:
            await remote.decode_bytes_batch_async([np.array([10**6], np.uint32)])
        assert bad.value.token == 10**6 and "not in vocabulary" in str(bad.value)
        pooled = _pooled(remote)
        cut = asyncio.ensure_future(remote.encode_flat_async(["a" * 20000]))
        await asyncio.sleep(0)          # it has written its message and waits
        cut.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cut
        assert _pooled(remote) == pooled - 1    # that stream is closed, not pooled
        ids, _ = await remote.encode_flat_async(["after a cancel"])
        assert ids.tolist() == tiny_encoding.encode("after a cancel")
        host.stop()                                      # the GPU process goes away
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 30)
        listener.close()
        with pytest.raises(RequestRejected) as gone:
            await remote.encode_flat_async(["hello"])
        assert gone.value.code == grpc.StatusCode.UNAVAILABLE and "retry" in gone.value.message
        assert not remote.reachable
        with pytest.raises(RequestRejected, match="restarting"):
            await remote.encode_flat_async(["hello"])   # nobody listening: fails fast

    async def after_the_restart():
        ids, _ = await remote.encode_flat_async(["hello again"])
        assert ids.tolist() == tiny_encoding.encode("hello again") and remote.reachable

    event_loop.run(before_the_restart(), loop_kind)
    again = Listener(address, family="AF_UNIX", authkey=key)   # "restarted"
    second = GpuHost(tiny_encoding, max_call_bytes=1 << 20)
    accepted = threading.Thread(target=lambda: second.attach(again.accept()), daemon=True)
    accepted.start()
    serving = _serve_in_thread(second)
    try:
        event_loop.run(after_the_restart(), loop_kind)
    finally:
        second.stop()
        serving.join(30)
        again.close()


def test_each_loop_has_streams_of_its_own_and_close_survives_closed_loops(served,
                                                                          tiny_encoding):
    """A RemoteEncoding used from one loop after another (a test's, a restarted worker's)
    never hands a stream of a closed loop to another loop, and close() after the loops
    closed does not raise."""
    from tokenizer_svc.service import event_loop
    host, address, key, _ = served
    _serve_in_thread(host)
    remote = RemoteEncoding(tiny_encoding, address, key)

    async def encode(text):
        ids, _ = await remote.encode_flat_async([text])
        return ids.tolist(), _pooled(remote)

    for choice in ("asyncio", "uvloop", "asyncio"):
        assert event_loop.run(encode(choice), choice) == (tiny_encoding.encode(choice), 1)
    remote.close()
    assert not remote._idle_async


def test_a_batch_on_the_loop_gives_what_it_gives_on_a_thread(served, tiny_encoding):
    """BatchRunner.run_async and BatchRunner(jobs): the same steps, so the same results for
    encodes with offsets and truncation, a refusal, decodes and a decode with an invalid id
    (only its own job fails)."""
    from tokenizer_svc.service import event_loop
    from tokenizer_svc.service.work import BatchRunner, DecodeJob, EncodeJob, SpecialRule
    host, address, key, _ = served
    _serve_in_thread(host)
    remote = RemoteEncoding(tiny_encoding, address, key)
    runner = BatchRunner(remote)
    none = SpecialRule(frozenset(), frozenset())
    refuse = SpecialRule(frozenset(), frozenset({SPECIAL}))
    good = np.asarray(tiny_encoding.encode(TEXTS[2]), np.uint32)
    jobs = [EncodeJob(TEXTS[:4], none, offsets="char"),
            EncodeJob([TEXTS[2]], none, offsets="byte", max_tokens=3, keep_end=True),
            EncodeJob([f"x {SPECIAL}"], refuse),
            DecodeJob([good]), DecodeJob([np.array([10**6], np.uint32)]),
            EncodeJob([b"raw \xff"], none, max_tokens=1)]

    def flat(results):
        out = []
        for r in results:
            if isinstance(r, Exception):
                out.append((type(r).__name__, getattr(r, "code", None), str(r)))
            elif r and hasattr(r[0], "ids"):
                out.append([(d.ids.tolist(), d.token_count, None if d.offsets is None else
                             (d.offsets.tolist(), d.ends.tolist())) for d in r])
            else:
                out.append(r)
        return out

    on_thread = flat(runner(jobs))
    on_loop = flat(event_loop.run(runner.run_async(jobs), "auto"))
    assert on_loop == on_thread
    assert on_loop[0][0][0] == tiny_encoding.encode(TEXTS[0])
    assert on_loop[1][0][0] == tiny_encoding.encode(TEXTS[2])[-3:]
    assert on_loop[2][1] == grpc.StatusCode.INVALID_ARGUMENT
    assert on_loop[3] == [tiny_encoding.decode_bytes(good.tolist())]
    assert on_loop[4][1] == grpc.StatusCode.INVALID_ARGUMENT


def test_a_worker_whose_gpu_process_hangs_says_not_serving_and_still_drains(tiny_encoding,
                                                                           device, tmp_path):
    """The GPU process accepts and never answers: the worker's batch waits on its loop,
    health goes NOT_SERVING after --stall-timeout, and a drain ends within the grace period
    plus the stall timeout (the waiting batch is cancelled, its stream closed: nothing is
    left behind), the caller hearing an error rather than waiting for ever."""
    from tokenizer_svc.service.rpc import tokenizer_pb2 as pb
    from tests.service_support import metric, start_server, stub_for
    address, key = str(tmp_path / "gpu.sock"), os.urandom(16)
    listener = Listener(address, family="AF_UNIX", authkey=key)
    held = []                            # accepted, never read: a hung GPU process

    def accept():
        while True:
            try:
                held.append(listener.accept())
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    remote = RemoteEncoding(tiny_encoding, address, key)
    remote.connect(30)
    server = start_server(remote, device, stall_timeout_s=1.0, shutdown_grace_s=0.5)
    try:
        channel, stub = stub_for(server.target)
        waiting = stub.Tokenize.future(pb.TokenizeRequest(text="never answered"), timeout=60)
        deadline = time.monotonic() + 30
        while not server.server.stalled:
            assert time.monotonic() < deadline, "health never said the batch stalled"
            time.sleep(0.05)
        assert metric(server, "istanbul_tokenizer_ready") == 0
        start = time.monotonic()
        server.stop(grace_s=0.5)
        assert time.monotonic() - start < 10
        assert server.server.stuck_workers == []
        with pytest.raises(grpc.RpcError):
            waiting.result(timeout=30)
        channel.close()
    finally:
        server.stop()
        listener.close()
        for conn in held:
            conn.close()


def test_a_begun_call_is_answered_once_the_next_is_submitted(tiny_encoding):
    """Overlap: a round's UTF-8 call is submitted and left for the next pass; the next
    round's call is submitted (on the twin encoder) before it is answered; with nothing
    more, it is answered alone. Each message gets exactly its own ids."""
    host = GpuHost(Counting(tiny_encoding), max_call_bytes=1 << 20, overlap=True)
    first, second = TEXTS[:4], TEXTS[4:9]
    m1, e1 = _worker_messages([encode_message(first, frozenset())])
    m2, e2 = _worker_messages([encode_message(second, frozenset())])
    host._round(m1)
    assert host._pending is not None and not e1[0].poll(0.05)   # submitted, not answered
    held = host._pending[1].encoder
    host._round(m2)
    assert _split(e1[0]) == _expected(tiny_encoding, first)
    assert host._pending[1].encoder is not held                 # the twin took the second
    assert not e2[0].poll(0.05)
    host._settle()
    assert _split(e2[0]) == _expected(tiny_encoding, second)
    assert host._pending is None and host.encoding.utf8_calls == [4, 5]


def test_special_token_calls_wait_for_the_begun_call_first(tiny_encoding):
    """A call with special tokens runs whole on the primary encoder, which a begun call may
    hold: the begun call is answered first (no deadlock), then it runs."""
    host = GpuHost(Counting(tiny_encoding), max_call_bytes=1 << 20, overlap=True)
    special = [f"one {SPECIAL} two"]
    m1, e1 = _worker_messages([encode_message(TEXTS[:2], frozenset())])
    host._round(m1)
    m2, e2 = _worker_messages([("encode", special, frozenset({SPECIAL}), 20)])
    host._round(m2)
    assert _split(e1[0]) == _expected(tiny_encoding, TEXTS[:2])
    assert _split(e2[0]) == _expected(tiny_encoding, special, {SPECIAL})
    assert host._pending is None


@pytest.mark.parametrize("where", ["begin", "finish"])
def test_a_begun_call_that_fails_fails_its_messages_and_the_host_goes_on(tiny_encoding,
                                                                         where):
    class Failing(Counting):
        def _begin_utf8_batch_flat(self, docs):
            if where == "begin":
                raise RuntimeError("device lost")
            call = self.encoding._begin_utf8_batch_flat(docs)

            class Broken:
                encoder = call.encoder

                def finish(self):
                    call.cancel()
                    raise RuntimeError("device lost")
            return Broken()
    host = GpuHost(Failing(tiny_encoding), max_call_bytes=1 << 20, overlap=True)
    messages, ends = _worker_messages([encode_message(["a"], frozenset()),
                                       encode_message(["b", "c"], frozenset())])
    host.run_round(messages)
    assert receive_reply(ends[0]) == receive_reply(ends[1]) == \
        ("failed", "RuntimeError: device lost")
    host.encoding.__class__ = Counting               # the device is back
    again, more = _worker_messages([encode_message(["after"], frozenset())])
    host.run_round(again)
    assert _split(more[0]) == _expected(tiny_encoding, ["after"])


@pytest.mark.parametrize("overlap", [True, False])
def test_many_workers_through_the_loop_each_get_their_own_ids(served, tiny_encoding, overlap):
    """Eight connections sending UTF-8 encode messages as fast as they are answered (rounds
    of several messages, calls in flight back to back with overlap): every reply exact."""
    host, address, key, _ = served
    host.overlap = overlap
    loop = threading.Thread(target=host.serve_forever, daemon=True)
    loop.start()
    errors = []

    def worker(k):
        try:
            with Client(address, family="AF_UNIX", authkey=key) as conn:
                for r in range(12):
                    docs = [TEXTS[(k + r + j) % len(TEXTS)] for j in range(1 + (k + r) % 4)]
                    conn.send(encode_message(docs, frozenset()))
                    assert _split(conn) == _expected(tiny_encoding, docs), (k, r)
        except Exception as exc:   # reported below, with the worker's index
            errors.append((k, repr(exc)))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert sum(host.encoding.utf8_calls) == sum(1 + (k + r) % 4 for k in range(8)
                                                for r in range(12))


def test_each_side_of_the_gpu_hop_imports_only_the_wire_between_them():
    """The served path reads top-down: the batch (work) knows no GPU process, the worker's
    side (gpu_worker) and the GPU process (gpu_process) share only the messages (gpu_wire),
    and the wire knows neither side."""
    from tests.test_import_graph import import_graph
    graph = import_graph()
    s = "tokenizer_svc.service."
    sides = {s + "work", s + "gpu_worker", s + "gpu_process", s + "gpu_wire"}
    assert not graph[s + "work"] & sides
    assert graph[s + "gpu_worker"] & sides == {s + "gpu_wire"}
    assert graph[s + "gpu_process"] & sides == {s + "gpu_wire"}
    assert not graph[s + "gpu_wire"] & sides
