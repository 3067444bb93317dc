"""One request must never stall the service: victim latency while attackers send long pieces.

    python bench/service_isolation.py [--out DIR] [--vocab PATH]

Starts the real server (`python -m tokenizer_svc`, its own GPU device), measures the latency
of a victim client sending a 3-word Tokenize in a closed loop, first alone and then while an
attacker sends, one after the other, each attack text (1 MiB of one letter run, 1 MiB of
spaces, 1 MiB of digits, 900 KB of CJK without spaces, 1 MiB of random bytes). Per phase it
reports the victim's p50/p99/max latency and request count, and per attack its own time and
whether its ids equal tiktoken's. Writes service_isolation.json and .md into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.results_dir import default_dir  # noqa: E402  (bench/results/<machine>/)
sys.path.insert(0, str(REPO / "bench"))

MiB = 1 << 20


def attacks() -> list[tuple[str, dict]]:
    return [("1 MiB letters", {"text": ("tokenizer" * (MiB // 9 + 1))[:MiB]}),
            ("1 MiB spaces", {"text": " " * MiB}),
            ("1 MiB digits", {"text": "7" * MiB}),
            ("900 KB CJK", {"text": "日本語" * 100_000}),
            ("1 MiB random bytes", {"data": random.Random(18).randbytes(MiB)})]


def _stats(latencies: list[float]) -> dict:
    if not latencies:
        return {"count": 0}
    a = np.array(latencies) * 1e3
    return {"count": int(a.size), "p50_ms": float(np.percentile(a, 50)),
            "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max())}


def main(argv=None) -> int:
    from service import default_vocab   # bench/service.py
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, type=Path,
                   help="output directory for service_isolation.json / .md "
                        "(default bench/results/<machine>/)")
    p.add_argument("--vocab", default=default_vocab())
    p.add_argument("--adapter", default=None)
    p.add_argument("--baseline-s", type=float, default=5.0, help="victim alone (seconds)")
    args = p.parse_args(argv)
    import grpc
    from tokenizer_svc.service.client import TokenizerClient
    from tokenizer_svc.service.rpc import tokenizer_pb2 as pb, tokenizer_pb2_grpc
    from tokenizer_svc.vocab import load_vocabulary
    import tiktoken
    vocab = load_vocabulary(args.vocab)
    tik = tiktoken.Encoding(vocab.name, pat_str=vocab.pattern, mergeable_ranks=vocab.ranks,
                            special_tokens=vocab.special_tokens)
    port_file = Path(tempfile.mkdtemp()) / "port"
    cmd = [sys.executable, "-m", "tokenizer_svc", "--vocab", args.vocab, "--host", "127.0.0.1",
           "--port", "0", "--port-file", str(port_file), "--log-format", "text"]
    if args.adapter is not None:
        cmd += ["--adapter", args.adapter]
    # keep the parent's PYTHONPATH: packages may be installed there (pip install --target)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    server = subprocess.Popen(cmd, cwd=REPO, env=env)
    report = {"machine": platform.node(), "vocab": vocab.name, "phases": [], "attacks": []}
    try:
        while not port_file.exists():
            if server.poll() is not None:
                raise SystemExit("the server exited")
            time.sleep(0.1)
        target = f"127.0.0.1:{port_file.read_text().strip()}"
        with TokenizerClient(target) as client:
            client.wait_ready(600)
            report["adapter"] = client.info().adapter.name
        victim_ch = grpc.insecure_channel(target)
        attack_ch = grpc.insecure_channel(target, options=[
            ("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)])
        victim = tokenizer_pb2_grpc.TokenizerStub(victim_ch)
        attacker = tokenizer_pb2_grpc.TokenizerStub(attack_ch)
        small = pb.TokenizeRequest(text="three small words")

        def run_victim(stop: threading.Event, out: list) -> None:
            while not stop.is_set():
                start = time.perf_counter()
                victim.Tokenize(small, timeout=600)
                out.append(time.perf_counter() - start)

        for _ in range(20):
            victim.Tokenize(small, timeout=600)
        alone, stop = [], threading.Event()
        thread = threading.Thread(target=run_victim, args=(stop, alone))
        thread.start()
        time.sleep(args.baseline_s)
        stop.set()
        thread.join()
        report["phases"].append({"phase": "victim alone", **_stats(alone)})
        during, stop = [], threading.Event()
        thread = threading.Thread(target=run_victim, args=(stop, during))
        thread.start()
        for name, fields in attacks():
            start = time.perf_counter()
            reply = attacker.Tokenize(pb.TokenizeRequest(**fields), timeout=1200)
            seconds = time.perf_counter() - start
            want = tik.encode_ordinary(fields["text"]) if "text" in fields else \
                tik._encode_bytes(fields["data"])
            report["attacks"].append({"attack": name, "seconds": seconds,
                                      "tokens": len(reply.ids),
                                      "exact": list(reply.ids) == want})
            print(f"{name}: {seconds:.2f} s, exact={report['attacks'][-1]['exact']}", flush=True)
        stop.set()
        thread.join()
        report["phases"].append({"phase": "victim during attacks", **_stats(during)})
        victim_ch.close()
        attack_ch.close()
    finally:
        server.terminate()
        server.wait(120)
    args.out = args.out or default_dir(args.adapter)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "service_isolation.json").write_text(json.dumps(report, indent=2))
    lines = [f"# Service isolation ({report.get('adapter')}, {report['vocab']})", "",
             "| phase | requests | p50 ms | p99 ms | max ms |", "|---|---:|---:|---:|---:|"]
    for ph in report["phases"]:
        lines.append(f"| {ph['phase']} | {ph['count']} | {ph.get('p50_ms', 0):.2f} | "
                     f"{ph.get('p99_ms', 0):.2f} | {ph.get('max_ms', 0):.2f} |")
    lines += ["", "| attack | seconds | tokens | exact |", "|---|---:|---:|---|"]
    for a in report["attacks"]:
        lines.append(f"| {a['attack']} | {a['seconds']:.2f} | {a['tokens']} | {a['exact']} |")
    (args.out / "service_isolation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
