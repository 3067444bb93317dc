"""Where a lone client's 1 KB Tokenize goes, moment by moment, across the client, the worker
and the shared GPU process (issue 20's p50 <= 1.5 ms target), beside the host's gRPC floor.

    python dev/lone_request/lone_trace.py --out DIR [--vocab V] [--workers 12] [--calls 2000]
                             [--variants base] [--rounds 1] [--no-floor]

Starts the server as bench/service.py's best configuration does (`istanbul serve --workers N
--gpu-process shared --gpu-keep-clock 2 --event-loop uvloop`) with dev/lone_request/lone_trace_hook first
on PYTHONPATH: its sitecustomize marks moments in every server process with
time.perf_counter_ns() (one monotonic clock for the host). One client on uvloop (as the
bench's) sends the bench's 1 KB texts one after another, packed ids, every reply checked
against tiktoken. Each request's moments are the marks that fall between its send and its
reply; per request:

  grpc in        client send -> the servicer's Tokenize runs (HTTP/2, interceptors, parse)
  worker in      -> RemoteEncoding.call_async (checks, batcher, the message built)
  to host        -> the GPU process's select returns (the write, the wake-up; a clock
                    keeper spin in progress delays it: `in spin` counts those requests)
  host receive   -> GpuHost._round (read, unpickle)
  submit         -> the encode call submitted (Encoding.begin_utf8_batch_flat)
  host between   -> the begun call's finish starts (the loop's next pass)
  GPU wait       -> the ids are in host memory (map wait and copy)
  answer         -> the answer is written
  to worker      -> call_async returns in the worker (wake-up, read, unpickle)
  worker out     -> Tokenize returns (results, the response message)
  grpc out       -> the client has the reply

`floor`: the same client against a bare grpc.aio server on uvloop whose Tokenize returns a
precomputed reply of the same size (no interceptors, no batcher, no GPU): what gRPC in
Python costs on this host. `--variants` runs the server once per variant, each an
environment given as NAME (see VARIANTS); `--rounds` alternates them. Writes DIR/
lone_trace.md and .json. A measurement, not a product path.
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
sys.path.insert(0, str(REPO))

from bench.service import (KEEP_CLOCK, Server, _reference, default_vocab,  # noqa: E402
                           sized_cells)

HOOK = REPO / "dev" / "lone_trace_hook"

# name -> environment the server runs with
VARIANTS = {
    "base": {},
    "overlap-off": {"ISTANBUL_GPU_OVERLAP": "0"},
    "wgpu": {"ISTANBUL_BACKEND": "wgpu"},   # wgpu-native (auto takes Dawn where it can)
    "dawn": {"ISTANBUL_BACKEND": "dawn"},
    # dev/lone_request/lone_trace_hook's patches, the code before session 25: the clock keeper waiting for
    # each spin, and the staging map waited for without polling first
    "keeper-blocking": {"ISTANBUL_LONE_TRACE_KEEPER": "blocking"},
    "map-block": {"ISTANBUL_LONE_TRACE_MAP": "block"},
    "before": {"ISTANBUL_LONE_TRACE_KEEPER": "blocking", "ISTANBUL_LONE_TRACE_MAP": "block"},
}

SEGMENTS = (  # (label, from mark, to mark)
    ("grpc in", "C0", "W0_servicer_in"),
    ("worker in", "W0_servicer_in", "W1_call_out"),
    ("to host", "W1_call_out", "G0_readable"),
    ("host receive", "G0_readable", "G1_round"),
    ("submit", "G1_round", "G2_submitted"),
    ("host between", "G2_submitted", "G3_finish"),
    ("GPU wait", "G3_finish", "G4_ids_ready"),
    ("answer", "G4_ids_ready", "G5_answered"),
    ("to worker", "G5_answered", "W2_call_back"),
    ("worker out", "W2_call_back", "W3_servicer_out"),
    ("grpc out", "W3_servicer_out", "C1"),
)


async def _client(target: str, texts: list, expected: list, calls: int, warmup: int) -> list:
    """(send ns, reply ns) of each measured call, one call at a time."""
    import grpc
    from tokenizer_svc.rpc import tokenizer_pb2 as pb, tokenizer_pb2_grpc as pb_grpc
    channel = grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
    await channel.channel_ready()
    stub = pb_grpc.TokenizerStub(channel)
    requests = [pb.TokenizeRequest(text=t, format=pb.ID_FORMAT_PACKED) for t in texts]
    times, clock = [], time.perf_counter_ns
    for n in range(warmup + calls):
        i = n % len(requests)
        sent = clock()
        reply = await stub.Tokenize(requests[i], timeout=30)
        done = clock()
        if reply.ids_packed != expected[i]:
            raise SystemExit(f"reply {n} differs from tiktoken's ids")
        if n >= warmup:
            times.append((sent, done))
    await channel.close()
    return times


def run_client(target, texts, expected, calls, warmup) -> list:
    import uvloop
    return uvloop.run(_client(target, texts, expected, calls, warmup))


def _floor_server(port_file: str, reply_bytes: bytes) -> None:
    """A bare grpc.aio server on uvloop answering Tokenize with a fixed reply."""
    import grpc
    import uvloop
    from tokenizer_svc.rpc import tokenizer_pb2 as pb, tokenizer_pb2_grpc as pb_grpc

    class Bare(pb_grpc.TokenizerServicer):
        async def Tokenize(self, request, context):
            return pb.TokenizeResponse(ids_packed=reply_bytes, token_count=len(reply_bytes) // 4)

    async def serve():
        server = grpc.aio.server()
        pb_grpc.add_TokenizerServicer_to_server(Bare(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        Path(port_file).write_text(str(port))
        await server.wait_for_termination()

    uvloop.run(serve())


def floor(texts, expected, calls, warmup) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        proc = mp.get_context("spawn").Process(target=_floor_server,
                                               args=(port_file, expected[0]), daemon=True)
        proc.start()
        try:
            while not os.path.exists(port_file) or not Path(port_file).read_text():
                time.sleep(0.05)
            target = f"127.0.0.1:{Path(port_file).read_text()}"
            same = [expected[0]] * len(texts)
            times = run_client(target, texts, same, calls, warmup)
        finally:
            proc.terminate()
            proc.join(10)
    total = [(b - a) / 1e6 for a, b in times]
    return {"p50_ms": statistics.median(total), "mean_ms": statistics.fmean(total)}


def _read_marks(directory: Path) -> list:
    marks = []
    for f in directory.glob("*.txt"):
        for line in f.read_text().splitlines():
            name, t = line.split()
            marks.append((int(t), name))
    marks.sort()
    return marks


def analyse(times: list, marks: list) -> dict:
    """Per segment p50 / mean ms over the requests that have all their marks."""
    import bisect
    stamps = [t for t, _ in marks]
    per, in_spin, spin_wait = {label: [] for label, _, _ in SEGMENTS}, 0, []
    total, complete = [], 0
    for sent, done in times:
        lo, hi = bisect.bisect_left(stamps, sent), bisect.bisect_right(stamps, done)
        first = {"C0": sent, "C1": done}
        spins = []
        for t, name in marks[lo:hi]:
            first.setdefault(name, t)
            if name == "S0_spin":
                spins.append([t, None])
            elif name == "S1_spun" and spins and spins[-1][1] is None:
                spins[-1][1] = t
        # a spin that began before the send is not in the window: look back for it
        k = lo - 1
        while k >= 0 and marks[k][1] not in ("S0_spin", "S1_spun"):
            k -= 1
        if k >= 0 and marks[k][1] == "S0_spin":
            end = next((t for t, name in marks[lo:hi] if name == "S1_spun"), None)
            spins.insert(0, [marks[k][0], end])
        if not all(a in first and b in first for _, a, b in SEGMENTS):
            continue
        complete += 1
        total.append((done - sent) / 1e6)
        for label, a, b in SEGMENTS:
            per[label].append((first[b] - first[a]) / 1e6)
        out = first["W1_call_out"]
        for s0, s1 in spins:
            if s1 is not None and s0 <= out < s1:
                in_spin += 1
                spin_wait.append((s1 - out) / 1e6)
                break
    if not complete:
        return {"complete": 0}
    return {
        "complete": complete, "requests": len(times),
        "total_p50_ms": statistics.median(total), "total_mean_ms": statistics.fmean(total),
        "segments": {label: {"p50_ms": statistics.median(v), "mean_ms": statistics.fmean(v)}
                     for label, v in per.items()},
        "in_spin": in_spin, "spin_wait_mean_ms": statistics.fmean(spin_wait) if spin_wait
        else 0.0,
    }


def trace_variant(name: str, args, texts, expected, workdir: Path) -> dict:
    run_dir = workdir / f"{name}-{time.monotonic_ns()}"   # its own port file too
    marks_dir = run_dir / "marks"
    marks_dir.mkdir(parents=True)
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "ISTANBUL_LONE_TRACE",
                                             *VARIANTS[name])}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOK), str(REPO),
                                                             saved["PYTHONPATH"]]))
    os.environ["ISTANBUL_LONE_TRACE"] = str(marks_dir)
    os.environ.update(VARIANTS[name])
    try:
        server = Server(args.vocab, None, args.workers, KEEP_CLOCK, 2.0, run_dir, args.out,
                        "uvloop")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        times = run_client(server.target, texts, expected, args.calls, args.warmup)
        time.sleep(0.5)
    finally:
        server.stop()
    result = analyse(times, _read_marks(marks_dir))
    result["variant"] = name
    return result


def markdown(report: dict) -> str:
    lines = ["# A lone 1 KB Tokenize, moment by moment", "",
             f"`{report['command']}`; {report['host']}. p50 / mean ms over the requests whose "
             "every mark was found (`complete`); segments are consecutive, so their means add "
             "up to the total's mean.", ""]
    runs = report["runs"]
    head = "| segment | " + " | ".join(f"{r['variant']} (round {r['round']})" for r in runs)
    lines += [head + " |", "|---|" + "---:|" * len(runs)]
    for label, _, _ in SEGMENTS:
        cells = [f"{r['segments'][label]['p50_ms']:.3f} / {r['segments'][label]['mean_ms']:.3f}"
                 if r.get("complete") else "-" for r in runs]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(
        f"**{r['total_p50_ms']:.3f}** / {r['total_mean_ms']:.3f}" if r.get("complete") else "-"
        for r in runs) + " |")
    lines.append("| complete / requests | " + " | ".join(
        f"{r.get('complete', 0)} / {r.get('requests', '-')}" for r in runs) + " |")
    lines.append("| sent during a spin (mean wait ms) | " + " | ".join(
        f"{r.get('in_spin', 0)} ({r.get('spin_wait_mean_ms', 0):.3f})" for r in runs) + " |")
    if report.get("floor"):
        f = report["floor"]
        lines += ["", f"gRPC floor (bare grpc.aio server on uvloop, the same client and reply "
                  f"size): p50 {f['p50_ms']:.3f} ms, mean {f['mean_ms']:.3f} ms."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--vocab", default=default_vocab())
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--variants", default="base", help=f"comma-separated: {', '.join(VARIANTS)}")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True)
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",")]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    reference = _reference(args.vocab)
    cell = sized_cells([1024], reference.encode_ordinary)["1024"]
    texts, expected = cell[0], cell[2]
    report = {"command": "python dev/lone_request/lone_trace.py " + " ".join(argv or sys.argv[1:]),
              "host": f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}", "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in variants:
                result = trace_variant(name, args, texts, expected, Path(tmp))
                result["round"] = r + 1
                report["runs"].append(result)
                print(json.dumps(result), flush=True)
    if args.floor:
        report["floor"] = floor(texts, expected, args.calls, args.warmup)
        print(json.dumps({"floor": report["floor"]}), flush=True)
    (args.out / "lone_trace.json").write_text(json.dumps(report, indent=1))
    (args.out / "lone_trace.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
