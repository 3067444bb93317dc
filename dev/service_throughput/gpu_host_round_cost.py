"""What one round of the shared GPU process costs its one thread outside the GPU, on this CPU.

    python dev/service_throughput/gpu_host_round_cost.py [--messages 9] [--docs 3] [--sizes 65536,1024,100]
                                      [--rounds 200] [--forms str,utf8] [--code DIR]
                                      [--out FILE.json]

`istanbul serve --workers N --gpu-process shared` sends every worker batch to one thread of
one process (tokenizer_svc/server/gpu_host.py), which receives a message from each waiting
connection, runs one Encoding call and answers each message with its slice. Here this
process plays that thread and a spawned one plays the workers, over real
multiprocessing.connection Listener/Client pairs on a Unix socket (one connection per
message, as a worker keeps one per batch in flight). A round is --messages messages of
--docs documents of about S bytes each, cut from real text (bench/service.py's corpus: the
Python standard library's sources). The host thread runs the product's own code:
`conn.recv()` per message, then `GpuHost.run_round` with a real Encoding whose device call
is taken out (`GpuBackend.encode_packed` replaced: the text is written into a reused array
as the encoder writes it into its upload buffer between device calls, and ids computed
beforehand by the real encoder are returned). CPU time (time.thread_time) per round of:

- worker send: building, pickling and sending the N messages (the workers' side);
- host receive: waiting for and receiving + unpickling the N messages;
- host prep: the round's bookkeeping and what the Encoding does before its device call;
- host text write: the encoder's copy of the text into its upload buffer (on the host
  thread, between device calls: inside the measured "encode call", outside the GPU);
- host reply: the call's metrics, slicing and sending the N replies (ids and offsets:
  pickled, or since 2026-12-04 the ids as raw bytes);
- worker receive: receiving the replies into arrays (as RemoteEncoding does).

--forms picks how the worker sends its documents: `str` (the documents as Python str, what
every worker sent before 2026-12-04; the GPU process still takes it for text with special
tokens allowed) and `utf8` (their UTF-8, `gpu_host.encode_message`; absent in code older
than that, then skipped). --code DIR measures another checkout's product code (e.g. a
`git archive` of an older commit). Before each form's timed rounds, one round checks that
the bytes handed to the encoder are the documents' UTF-8. This is a measurement, not a
product path; no GPU is needed (the Encoding loads on whatever device this machine has,
lavapipe will do).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PHASES = ("worker_send", "host_receive", "host_prep", "host_text_write", "host_reply",
          "worker_receive")   # [1:5] are the host thread's


def _code_path(code: Path) -> None:
    """Product imports from `code`, bench/service.py from this checkout (which puts this
    checkout first on the path when imported: hence first)."""
    sys.path.insert(0, str(REPO / "bench"))
    import service  # noqa: F401
    sys.path.insert(0, str(code.resolve()))


def _build(form: str):
    """The worker's message for one encode call of `docs`, as code of `form` builds it."""
    from tokenizer_svc.server import gpu_host
    from tokenizer_svc.server.work import utf8_len
    if form == "str":   # RemoteEncoding.encode_batch_flat's message before 2026-12-04
        return lambda docs: ("encode", list(docs), frozenset(), sum(map(utf8_len, docs)))
    return lambda docs: gpu_host.encode_message(list(docs), frozenset())


def _worker(code: str, address: str, authkey: bytes, sets: list, first: tuple, form: str,
            rounds: int, ctl) -> None:
    """The workers' side: per round, every message sent, then every reply received (in the
    first round, checked against `first`, the ids and offsets of the whole call)."""
    _code_path(Path(code))
    import numpy as np
    import tokenizer_svc
    if Path(tokenizer_svc.__file__).parents[1] != Path(code).resolve():
        raise RuntimeError(f"the worker imported {tokenizer_svc.__file__}, not {code}'s")
    from multiprocessing.connection import Client
    from tokenizer_svc.server import gpu_host
    build = _build(form)
    receive = getattr(gpu_host, "receive_reply", None) or (lambda conn: conn.recv())
    conns = [Client(address, family="AF_UNIX", authkey=authkey) for _ in sets[0]]
    for k, conn in enumerate(conns):
        conn.send(k)   # which message of a set this connection carries
    times = []
    for r in range(rounds):
        messages = sets[r % len(sets)]
        t0 = time.thread_time()
        for conn, docs in zip(conns, messages):
            conn.send(build(docs))
        t1 = time.thread_time()
        replies = [receive(conn) for conn in conns]   # RemoteEncoding._call's part
        t2 = time.thread_time()
        if r == 0:
            n = 0
            for reply, docs in zip(replies, messages):
                if reply[0] != "ok":
                    raise RuntimeError(f"the host answered {reply!r:.200}")
                ids, offsets = reply[1]
                lo, hi = first[1][n], first[1][n + len(docs)]
                if not (np.array_equal(ids, first[0][lo:hi])
                        and np.array_equal(offsets, first[1][n:n + len(docs) + 1] - lo)):
                    raise AssertionError("a reply is not its message's slice of the ids")
                n += len(docs)
        times.append((t1 - t0, t2 - t1))
    ctl.send(times)
    for conn in conns:
        conn.close()


class NoGpu:
    """`GpuBackend.encode_packed` without the device: the text written into a reused array
    (PackedRange.write_into, what the encoder does per pipeline chunk), the ids of the
    current round returned. Records the thread's CPU time at entry and exit."""

    def __init__(self):
        self.answer = None      # (ids, offsets, expected bytes and starts or None): this round
        self.buf = None
        self.entered = self.left = 0.0

    def __call__(self, data, starts, out=None):
        import numpy as np
        from tokenizer_svc.packed_text import PackedRange, PackedText
        self.entered = time.thread_time()
        size = len(data)
        if self.buf is None or self.buf.size < size:
            self.buf = np.empty(size, np.uint8)
        if isinstance(data, PackedText):
            PackedRange(data, 0, size).write_into(self.buf)
        else:
            self.buf[:size] = np.frombuffer(data, np.uint8)
        ids, offsets, want = self.answer
        if want is not None and (self.buf[:size].tobytes() != want[0]
                                 or not np.array_equal(starts, want[1])):
            raise AssertionError("the encoder was handed other bytes than the documents' UTF-8")
        self.left = time.thread_time()
        return ids, offsets


def run_cell(enc, stub: NoGpu, code: Path, sets: list, answers: list, form: str,
             rounds: int, warmup: int) -> list:
    """Per timed round, the CPU seconds of each phase (PHASES order) and the round's wall."""
    from multiprocessing.connection import Listener, wait
    from tokenizer_svc.server.gpu_host import GpuHost, _Message
    host = GpuHost(enc, max_call_bytes=16 << 20)
    total = warmup + rounds + 1
    with tempfile.TemporaryDirectory() as tmp:
        address, authkey = os.path.join(tmp, "gpu.sock"), os.urandom(16)
        listener = Listener(address, family="AF_UNIX", authkey=authkey, backlog=128)
        ctx = mp.get_context("spawn")
        ctl, child_ctl = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(str(code), address, authkey, sets,
                                                 answers[0][:2], form, total, child_ctl),
                           daemon=True)
        proc.start()
        conns = [listener.accept() for _ in sets[0]]
        index = {id(c): c.recv() for c in conns}
        rows = []
        for r in range(total):
            ids, offsets, want = answers[r % len(answers)]
            stub.answer = (ids, offsets, want if r == 0 else None)
            wall, c0 = time.perf_counter(), time.thread_time()
            messages, pending = [], list(conns)
            while pending:   # serve_forever's receive, until every message of the round
                for conn in wait(pending):
                    message = conn.recv()
                    messages.append(_Message(conn, message[0], message[1:]))
                    pending.remove(conn)
            messages.sort(key=lambda m: index[id(m.conn)])   # the answers' order
            c1 = time.thread_time()
            stub.entered = stub.left = None
            host.run_round(messages)
            c2 = time.thread_time()
            if stub.entered is None:
                raise RuntimeError("the round never reached the encoder (a failed call?)")
            if r > warmup:   # round 0 checks, then warm-up
                rows.append([0.0, c1 - c0, stub.entered - c1, stub.left - stub.entered,
                             c2 - stub.left, 0.0, time.perf_counter() - wall])
        worker = ctl.recv()
        proc.join(30)
        listener.close()
    for row, (send, receive) in zip(rows, worker[warmup + 1:]):
        row[0], row[5] = send, receive
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=9, help="worker batches per round")
    p.add_argument("--docs", type=int, default=3, help="documents per message")
    p.add_argument("--sizes", default="65536,1024,100", help="bytes per document")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--sets", type=int, default=4, help="distinct rounds of text, in turn")
    p.add_argument("--forms", default="str,utf8", help="message forms (see the doc)")
    p.add_argument("--code", type=Path, default=REPO, help="the checkout whose code runs")
    p.add_argument("--vocab", default=None, help="default: gpt2 as bench/service.py finds it")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = p.parse_args(argv)
    _code_path(args.code)
    import numpy as np
    from service import default_vocab, load_corpus, make_texts   # bench/service.py
    from tokenizer_svc.encoding import get_encoding
    from tokenizer_svc.server import gpu_host
    forms = [f for f in args.forms.split(",")
             if f == "str" or hasattr(gpu_host, "encode_message")]
    enc = get_encoding(args.vocab or default_vocab())
    corpus = load_corpus([])
    per_round = args.messages * args.docs
    cells = []
    for size in map(int, args.sizes.split(",")):
        texts = make_texts(corpus, size, per_round * args.sets, seed=size)
        sets, answers = [], []
        for s in range(args.sets):
            docs = texts[s * per_round:(s + 1) * per_round]
            sets.append([docs[m * args.docs:(m + 1) * args.docs] for m in range(args.messages)])
            ids, offsets = enc.encode_batch_flat(docs)   # the real encoder, once
            utf8 = [d.encode() for d in docs]
            starts = np.concatenate([[0], np.cumsum(list(map(len, utf8)))])
            answers.append((ids, offsets, (b"".join(utf8), starts)))
        mb = len(answers[0][2][0]) / 1e6
        cells.append((size, sets, answers, mb))
    stub = NoGpu()
    enc.backend.encode_packed = stub   # the device call taken out (this instance only)
    rows = []
    import tokenizer_svc
    print(f"code {Path(tokenizer_svc.__file__).parents[1]}, {args.messages} messages x "
          f"{args.docs} documents per round, {args.rounds} rounds; CPU us per round "
          f"(medians), host = its thread's four phases")
    head = ("| doc bytes | form | MB/round | " + " | ".join(PHASES) +
            " | host total | host us/MB | round wall ms |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for size, sets, answers, mb in cells:
        for form in forms:
            timed = run_cell(enc, stub, args.code, sets, answers, form, args.rounds,
                             args.warmup)
            med = [statistics.median(r[i] for r in timed) * 1e6 for i in range(7)]
            host = statistics.median(sum(r[1:5]) for r in timed) * 1e6
            row = {"doc_bytes": size, "form": form, "mb_per_round": mb,
                   **{f"{ph}_us": med[i] for i, ph in enumerate(PHASES)},
                   "host_total_us": host, "host_us_per_mb": host / mb,
                   "round_wall_ms": med[6] / 1e3}
            rows.append(row)
            print(f"| {size} | {form} | {mb:.3f} | " + " | ".join(f"{v:.0f}" for v in med[:6])
                  + f" | {host:.0f} | {host / mb:.0f} | {med[6] / 1e3:.2f} |", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "code": str(args.code), "messages": args.messages, "docs": args.docs,
            "rounds": args.rounds, "cpus": os.cpu_count(), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
