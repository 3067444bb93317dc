"""The GPU acceptance run: what a new user does from the README, with default flags, each step
checked (exit status and a sane output), timed, and written to
bench/results/<machine>/acceptance.{md,json}.

    python bench/acceptance.py                        # every step
    python bench/acceptance.py --steps demo,train     # some; the others' last results stay,
                                                      # each with the tree it ran on
    python bench/acceptance.py --list

Run it on the GPU machine whenever a change touches GPU-facing code or defaults, and commit
its result. Every step runs the real `istanbul` command (`python -m istanbul`) in its own
process, as the README shows it; only paths and a few sizes that a user picks (the corpus,
the number of steps) are given. The known vocabularies come from $ISTANBUL_VOCAB_DIR.
A step whose command fails, times out or prints something wrong is FAIL, and the run exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.results_dir import machine_name  # noqa: E402  (bench/results/<machine>/)

CLI = [sys.executable, "-m", "istanbul"]
VOCABS = ("gpt2", "cl100k_base", "o200k_base")
SAMPLE = ("Hello, world! The quick brown fox jumps over the lazy dog 1234567890.\n"
          "  def main(argv):\n\treturn argv[1:] if argv else None  # comment\n"
          "Grüße aus İstanbul — 你好，世界。こんにちは。Привет, мир! مرحبا بالعالم 🙂🚀\n"
          "'s 've 're 'll 'd 'm 't\r\n\r\n   \n" + "a" * 300 + " " * 40 + "9" * 50 + "\n")


class StepFailed(Exception):
    pass


@dataclass
class Result:
    step: str
    command: str
    ok: bool = False
    seconds: float = 0.0
    summary: str = ""
    details: dict = field(default_factory=dict)
    commit: str = ""   # the tree the step ran on (a report may keep steps of earlier runs)
    date: str = ""


class Run:
    """Runs `istanbul` commands in a work folder, logging each to logs/NAME.log."""

    def __init__(self, work: Path):
        self.work = work
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, PYTHONUNBUFFERED="1",
                        XDG_RUNTIME_DIR=os.environ.get("XDG_RUNTIME_DIR", "/tmp"))
        self.commands: list[str] = []

    def istanbul(self, name: str, *argv, timeout: float, stdin: str | None = None,
                 stderr: bool = True) -> str:
        """`istanbul ARGV`; its stdout, and its stderr after it unless `stderr` is false (both
        in logs/NAME.log). Fails the step on a non-zero exit or a timeout."""
        argv = [str(a) for a in argv]
        self.commands.append("istanbul " + " ".join(argv))
        log = self.logs / f"{name}.log"
        try:
            done = subprocess.run(CLI + argv, cwd=self.work, env=self.env,
                                  input=None if stdin is None else stdin.encode(),
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            log.write_bytes((exc.stdout or b"") + b"\n" + (exc.stderr or b""))
            raise StepFailed(f"`istanbul {argv[0]}` ran past {timeout:.0f} s") from None
        # bytes, decoded without newline translation: "\r\n" must come back as it went in
        out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        log.write_text(out + "\n--- stderr ---\n" + err)
        if done.returncode != 0:
            tail = (err.strip() or out.strip()).splitlines()[-3:]
            raise StepFailed(f"`istanbul {argv[0]}` exit {done.returncode}: "
                             + " | ".join(tail))
        return out + (err if stderr else "")

    def start_server(self, name: str, *argv) -> tuple[subprocess.Popen, str]:
        """`istanbul serve ARGV` on a free loopback port, healthy; (process, target)."""
        port_file = self.work / f"{name}.port"
        port_file.unlink(missing_ok=True)
        argv = ["serve", *map(str, argv), "--port", "0", "--port-file", str(port_file)]
        self.commands.append("istanbul " + " ".join(argv))
        proc = subprocess.Popen(CLI + argv, cwd=self.work, env=self.env,
                                stdout=open(self.logs / f"{name}.log", "w"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 300
        while True:
            text = port_file.read_text().strip() if port_file.exists() else ""
            if text and subprocess.run(CLI + ["health", f"127.0.0.1:{text}"], env=self.env,
                                       capture_output=True).returncode == 0:
                return proc, f"127.0.0.1:{text}"
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                raise StepFailed(f"`istanbul serve` never became healthy (log "
                                 f"{self.logs / (name + '.log')})")
            time.sleep(0.3)


def stop(proc: subprocess.Popen, grace: float = 60) -> int:
    """SIGTERM (the service drains), then wait; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return -9
    return proc.returncode


def stdlib_files(megabytes: float) -> list[Path]:
    from istanbul.demo import stdlib_sources
    return stdlib_sources(megabytes)


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise StepFailed(message)


# ---- the steps ---------------------------------------------------------------------------

def step_devices(run: Run, res: Result, args) -> None:
    out = run.istanbul("devices", "devices", timeout=120)
    first = out.strip().splitlines()[0]
    res.details["adapter"] = first
    expect(args.allow_software or "CPU" not in first.split("(")[1 if "(" in first else 0],
           f"the first adapter is software Vulkan: {first}")
    res.summary = first


def step_demo(run: Run, res: Result, args) -> None:
    out_dir = run.work / "demo"
    out = run.istanbul("demo", "demo", "--out", out_dir, timeout=args.timeout)
    expect("Done in" in out, "no 'Done in' line")
    png = out_dir / "loss_curve.png"
    expect(png.is_file() and png.read_bytes().startswith(b"\x89PNG"), f"no plot {png}")
    sample = (out_dir / "sample.txt").read_text()
    expect(sample.startswith("def main(") and len(sample) > 20, f"odd sample {sample[:80]!r}")
    loss = re.search(r"loss ([\d.]+) -> ([\d.]+) over (\d+) steps", out)
    expect(loss is not None, "no loss line")
    first, last = float(loss[1]), float(loss[2])
    expect(last < first - 1.0, f"the loss did not fall: {first} -> {last}")
    header = out.splitlines()[1].strip()
    minutes = re.search(r"Done in ([\d.]+) min", out)[1]
    res.details.update(header=header, loss_first=first, loss_last=last, minutes=float(minutes),
                       sample=sample[:200])
    res.summary = f"{header}; loss {first:.2f} -> {last:.2f}; plot and sample written"


def _kernels_check(run: Run, res: Result, args, *backend) -> None:
    name = "kernels-check" + ("-" + backend[-1] if backend else "")
    out = run.istanbul(name, "kernels", "check", *backend, timeout=args.timeout)
    last = [line for line in out.splitlines() if line.startswith("# ")][-1]
    m = re.search(r"(\d+) kernel\(s\), (\d+) failed", last)
    expect(m is not None and m[2] == "0", f"ladder: {last}")
    device = next((line for line in out.splitlines() if "device" in line.lower()), "")
    res.details.update(kernels=int(m[1]), failed=int(m[2]), device=device.strip("# "))
    res.summary = last.strip("# ")


def step_kernels_check(run, res, args):
    _kernels_check(run, res, args)


def step_kernels_check_wgpu(run, res, args):
    _kernels_check(run, res, args, "--backend", "wgpu")


def step_encode_decode(run: Run, res: Result, args) -> None:
    try:
        import tiktoken
    except ImportError:
        tiktoken = None
    sample = SAMPLE * 20
    for vocab in VOCABS:
        ids = json.loads(run.istanbul(f"encode-{vocab}", "encode", "--vocab", vocab,
                                      timeout=300, stdin=sample, stderr=False))
        back = run.istanbul(f"decode-{vocab}", "decode", "--vocab", vocab, timeout=300,
                            stdin=json.dumps(ids), stderr=False)
        expect(back.rstrip("\n") == sample.rstrip("\n"), f"{vocab}: decode(encode(x)) != x")
        if tiktoken is not None:
            expect(ids == _tiktoken(vocab).encode(sample), f"{vocab}: ids differ from tiktoken")
        res.details[vocab] = len(ids)
    res.summary = ("round trips exact on " + ", ".join(VOCABS)
                   + ("; ids equal to tiktoken's" if tiktoken else "; tiktoken not installed"))


def _tiktoken(vocab: str):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tokenizer_svc.patterns import PATTERNS
    path = Path(os.environ.get("ISTANBUL_VOCAB_DIR", ".")) / f"{vocab}.tiktoken"
    pattern = {"gpt2": "gpt2", "cl100k_base": "cl100k", "o200k_base": "o200k"}[vocab]
    return tiktoken.Encoding(vocab, pat_str=PATTERNS[pattern], special_tokens={},
                             mergeable_ranks=load_tiktoken_bpe(str(path)))


def step_serve(run: Run, res: Result, args) -> None:
    """`istanbul serve` with defaults, the Python client, a TEI client call, health, drain."""
    import grpc
    from tokenizer_svc.service.client import TokenizerClient
    from tokenizer_svc.service.rpc import tei_pb2, tei_pb2_grpc
    proc, target = run.start_server("serve", "--vocab", "cl100k_base")
    try:
        client = TokenizerClient(target)
        docs = [SAMPLE * k for k in (1, 3, 40)]
        ids = client.encode_batch(docs)
        for doc, got in zip(docs, ids):
            expect(client.decode(got) == doc, "client: decode(encode(x)) != x")
        try:
            ref = _tiktoken("cl100k_base")
        except ImportError:      # (no tiktoken: the round trip is the check)
            ref = None
        if ref is not None:
            expect(ids == [ref.encode(d) for d in docs], "client: ids differ from tiktoken")
        channel = grpc.insecure_channel(target)
        reply = tei_pb2_grpc.TokenizeStub(channel).Tokenize(
            tei_pb2.EncodeRequest(inputs=docs[0], add_special_tokens=True), timeout=60)
        expect([t.id for t in reply.tokens] == ids[0], "TEI Tokenize: ids differ")
        channel.close()
        info = client.info()
        client.close()
    finally:
        code = stop(proc)
    log = (run.logs / "serve.log").read_text()
    layout = re.search(r"serving with ([^\"]+)", log)
    expect(code == 0, f"serve exited {code} after SIGTERM")
    res.details.update(layout=layout[1] if layout else None, adapter=info.adapter.name,
                       vocabulary=info.vocabulary_name)
    res.summary = (f"defaults: {layout[1] if layout else '?'}; client and TEI ids exact; "
                   "drained, exit 0")


def step_vocab_train(run: Run, res: Result, args) -> None:
    files = stdlib_files(args.size["vocab_mb"])
    out = run.work / "vocab" / "acc.tiktoken"
    out.parent.mkdir(exist_ok=True)
    size = args.size["vocab_ids"]
    run.istanbul("vocab-train", "vocab", "train", *files, "--size", size, "--pattern",
                        "o200k", "--special", "<|endoftext|>", "-o", out,
                        timeout=args.timeout)
    ranks = out.read_text().splitlines()
    expect(len(ranks) == size - 1, f"{len(ranks)} ranks, expected {size - 1}")
    sample = files[0].read_text(encoding="utf-8")[:20000]
    ours = json.loads(run.istanbul("vocab-encode", "encode", "--vocab", out, timeout=300,
                                   stdin=sample, stderr=False))
    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
        from tokenizer_svc.patterns import PATTERNS
        ref = tiktoken.Encoding("acc", pat_str=PATTERNS["o200k"], special_tokens={},
                                mergeable_ranks=load_tiktoken_bpe(str(out)))
        expect(ref.encode(sample) == ours, "tiktoken reads the trained vocabulary differently")
        agree = "; tiktoken loads it and gives the same ids"
    except ImportError:
        agree = ""
    mb = sum(f.stat().st_size for f in files) / 2**20
    res.details.update(corpus_mb=round(mb, 1), merges=size - 257)
    res.summary = f"{size} ids from {mb:.1f} MB{agree}"


def step_pipeline(run: Run, res: Result, args) -> None:
    """prepare (through the service) -> submit -> trainer -> generate -> export --hf."""
    files = stdlib_files(args.size["pipeline_mb"])
    data = ["--data-dir", run.work / "redis"]
    proc, target = run.start_server("pipeline-serve", "--vocab", "gpt2")
    try:
        run.istanbul("prepare", "prepare", *files, "--tokenizer", target, "--dataset", "acc",
                     "--replace", "--vocab", "gpt2", *data, timeout=600)
    finally:
        stop(proc)
    model = args.size["pipeline_model"]
    job = run.istanbul("submit", "submit", "--dataset", "acc", "--model", model, "--steps",
                       args.size["pipeline_steps"], "--batch", 8, "--checkpoint-every", 100,
                       *data, timeout=120, stderr=False).strip().splitlines()[-1]
    ck = run.work / "checkpoints"
    log = run.istanbul("trainer", "trainer", "--checkpoints", ck, "--exit-when-idle", *data,
                       timeout=args.timeout)
    status = json.loads(run.istanbul("status", "status", job, "--json", *data, timeout=60,
                                     stderr=False))
    expect(status.get("state") == "done", f"job {job}: state {status.get('state')!r}")
    precision = re.search(rf"model {model}, (\w+) precision", log)
    sample = run.istanbul("generate", "generate", "--checkpoint", ck / job / "latest",
                          "--prompt", "def main(", "--max-tokens", 40, "--seed", 1, timeout=300)
    expect(sample.startswith("def main("), f"odd sample {sample[:80]!r}")
    run.istanbul("export", "export", ck / job / "latest", "--hf", run.work / "hf", timeout=300)
    expect((run.work / "hf" / "config.json").is_file(), "export wrote no config.json")
    res.details.update(job=job, precision=precision[1] if precision else None,
                       sample=sample[:120])
    res.summary = (f"job {job} done ({precision[1] if precision else '?'} precision); "
                   "generated; exported to a Hugging Face folder")


def step_train(run: Run, res: Result, args) -> None:
    """`istanbul train` with default flags on the 124M preset: the precision auto picks and
    the tokens/s it prints."""
    files = stdlib_files(args.size["train_mb"])
    model, steps = args.size["train_model"], args.size["train_steps"]
    seq = {"124m": 1024, "tiny": 128}[model]
    out = run.istanbul("train", "train", "--text", *files, "--vocab", "gpt2", "--model", model,
                       "--seq", seq, "--steps", steps, "--log-every", 10, timeout=args.timeout)
    head = next(line for line in out.splitlines() if line.startswith(f"model {model}"))
    rates = [float(x.replace(",", "")) for x in re.findall(r"tok/s=([\d,.]+)", out)]
    expect(bool(rates), "no tok/s printed")
    res.details.update(header=head, tokens_per_s=rates[-1], rates=rates)
    res.summary = f"{head}; {rates[-1]:,.0f} tokens/s at step {steps}"


# What the steps size (a user's choices, not flags' defaults): on the GPU, and in a dry run.
SIZES = {"vocab_mb": 8, "vocab_ids": 4096, "pipeline_mb": 4, "pipeline_model": "small",
         "pipeline_steps": 200, "train_mb": 16, "train_model": "124m", "train_steps": 40}
DRY_RUN = {"vocab_mb": 0.3, "vocab_ids": 512, "pipeline_mb": 0.3, "pipeline_model": "tiny",
           "pipeline_steps": 6, "train_mb": 0.3, "train_model": "tiny", "train_steps": 10}

STEPS = {"devices": step_devices, "demo": step_demo, "kernels-check": step_kernels_check,
         "kernels-check-wgpu": step_kernels_check_wgpu, "encode-decode": step_encode_decode,
         "serve": step_serve, "vocab-train": step_vocab_train, "pipeline": step_pipeline,
         "train": step_train}


# ---- report ------------------------------------------------------------------------------

def write_report(path: Path, results: dict, meta: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(
        {"meta": meta, "steps": list(results.values())}, indent=1) + "\n")
    trees = list(dict.fromkeys(r.get("commit") or meta["commit"] for r in results.values()))
    where = (f"tree {trees[0]}; {meta['date']}" if len(trees) == 1 else
             f"steps of {len(trees)} runs (trees in the table; the latest {meta['commit']}, "
             f"{meta['date']})")
    lines = [f"# GPU acceptance run: {meta['machine']}", "",
             f"{meta['adapter']}; {meta['cores']} cores; {where}. `python bench/acceptance.py` "
             f"({len(results)} steps: what a new user runs from the README, default flags; "
             "logs beside the run).", ""]
    if len(trees) == 1:
        lines += ["| step | result | seconds | what it checked |", "|---|---|---:|---|"]
    else:
        lines += ["| step | tree | result | seconds | what it checked |", "|---|---|---|---:|---|"]
    for r in results.values():
        tree = "" if len(trees) == 1 else \
            f" {str(r.get('commit') or meta['commit'])[:10]} ({r.get('date') or meta['date']}) |"
        lines.append(f"| {r['step']} |{tree} {'ok' if r['ok'] else '**FAIL**'} | "
                     f"{r['seconds']:.0f} | {r['summary'].replace('|', '/')} |")
    lines += ["", "Commands (runs of file arguments shortened; the JSON has them whole):", ""]
    for r in results.values():
        lines.append(f"- {r['step']}: `{shorten_paths(r['command'])}`")
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")


def shorten_paths(command: str, keep: int = 2) -> str:
    """A command with each run of more than `keep` + 1 consecutive path arguments written as
    its first `keep` and a count ("a.py b.py ... (+396 files)")."""
    out, run = [], []
    for word in command.split(" ") + [""]:
        if word.startswith("/") and not word.startswith("//"):
            run.append(word)
            continue
        if len(run) > keep + 1:
            out += run[:keep] + [f"... (+{len(run) - keep} files)"]
        else:
            out += run
        run = []
        out.append(word)
    return " ".join(out[:-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", default=",".join(STEPS), help="comma-separated steps to run")
    p.add_argument("--list", action="store_true", help="list the steps and exit")
    p.add_argument("--work", type=Path, default=None, help="work folder (default: a temp dir)")
    p.add_argument("--results", type=Path, default=None,
                   help="report folder (default bench/results/<machine>/)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per long step")
    p.add_argument("--commit", default=None,
                   help="the tree's commit for the report, where the copy has no .git (the GPU "
                        "machine); default: git rev-parse HEAD")
    p.add_argument("--allow-software", action="store_true",
                   help="a dry run of the script itself on software Vulkan: smaller sizes")
    args = p.parse_args(argv)
    args.size = DRY_RUN if args.allow_software else SIZES
    if args.list:
        print("\n".join(STEPS))
        return 0
    chosen = [s for s in args.steps.split(",") if s]
    unknown = [s for s in chosen if s not in STEPS]
    if unknown:
        p.error(f"unknown step(s) {unknown}; --list shows them")
    work = args.work or Path(tempfile.mkdtemp(prefix="istanbul-acceptance-"))
    run = Run(work.resolve())
    adapter = subprocess.run(CLI + ["devices"], capture_output=True, text=True,
                             env=run.env).stdout.strip().splitlines()[:1] or ["(none)"]
    machine = machine_name(adapter[0])
    report = (args.results or REPO / "bench" / "results" / machine) / "acceptance"
    old = {}
    if report.with_suffix(".json").exists():
        kept = json.loads(report.with_suffix(".json").read_text())
        for r in kept["steps"]:   # reports from before per-step trees: the run's tree
            r.setdefault("commit", kept["meta"].get("commit", "?"))
            r.setdefault("date", kept["meta"].get("date", "?"))
            old[r["step"]] = r
    commit = args.commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                           capture_output=True, text=True).stdout.strip() or "?"
    results = {name: old[name] for name in STEPS if name in old and name not in chosen}
    failed = 0
    for name in chosen:
        res = Result(name, "", commit=commit, date=time.strftime("%Y-%m-%d"))
        run.commands.clear()
        started = time.monotonic()
        print(f"== {name}", flush=True)
        try:
            STEPS[name](run, res, args)
            res.ok = True
        except StepFailed as exc:
            res.summary = str(exc)
        except Exception as exc:     # the report says what broke; the run goes on
            res.summary = f"{type(exc).__name__}: {exc}"
        res.seconds = time.monotonic() - started
        res.command = "; ".join(dict.fromkeys(c.split(" --data-dir")[0] for c in run.commands))
        failed += not res.ok
        print(f"   {'ok' if res.ok else 'FAIL'} {res.seconds:.0f} s: {res.summary}", flush=True)
        results[name] = asdict(res)
        results = {n: results[n] for n in STEPS if n in results}
        write_report(report, results, {
            "machine": machine, "adapter": adapter[0], "cores": os.cpu_count(),
            "commit": commit,
            "date": time.strftime("%Y-%m-%d"), "python": sysconfig.get_python_version()})
    print(f"{len(chosen) - failed} passed, {failed} failed: {report.with_suffix('.md')}; "
          f"logs in {run.logs}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
