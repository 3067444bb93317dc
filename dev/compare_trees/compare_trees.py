#!/usr/bin/env python
"""Old tree vs new tree: the 124M training step's matmul and attention kernels, timed in one
device session (issue 15: the expanded kernels must stay within 3% of the generated ones).

    python dev/compare_trees/compare_trees.py OLD_TREE NEW_TREE [--out DIR] [--rounds 2] [--kernels-bench]

Each round times every product of the 124M step (forward, dX and dW of each Linear at
8 x 1024 tokens, the tied LM head) and the attention forward and backward (B 8, T 1024,
H 12, D 64), in each tree in turn (old, new, old, new, ...: drift of the GPU's clocks hits
both alike), through the ops' public API with no configuration pinned, i.e. with the
configuration each tree's own op picks (its tuned cache, else its default). The table gives
the median over rounds per tree and new / old. `--kernels-bench` also runs
`istanbul kernels bench` for the matmul and attention cases whose names both trees share.
A tree is a checkout (e.g. `git worktree add /tmp/old 02206db`); the step timing and the
`istanbul kernels` runs use this file's `--step` / `--kernels` modes with that tree first on the
import path, and that tree's kernel house by its own import name (`house()`).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

D, HIDDEN = 768, 2048


def products(tokens: int = 8192, vocab: int = 50304):
    """(name, layout, M, N, K): every product of a 124M step at `tokens` tokens."""
    return (
        ("qkv fwd", "nt", tokens, 3 * D, D), ("qkv dX", "nn", tokens, D, 3 * D),
        ("qkv dW", "tn", 3 * D, D, tokens),
        ("attn-out fwd", "nt", tokens, D, D), ("attn-out dX", "nn", tokens, D, D),
        ("attn-out dW", "tn", D, D, tokens),
        ("gate|up fwd", "nt", tokens, 2 * HIDDEN, D),
        ("gate|up dX", "nn", tokens, D, 2 * HIDDEN), ("gate|up dW", "tn", 2 * HIDDEN, D, tokens),
        ("down fwd", "nt", tokens, D, HIDDEN), ("down dX", "nn", tokens, HIDDEN, D),
        ("down dW", "tn", D, HIDDEN, tokens),
        ("head fwd", "nt", tokens, vocab, D), ("head dX", "nn", tokens, D, vocab),
        ("head dW", "tn", vocab, D, tokens),
    )


ATTENTION = (8, 1024, 12, 12, 64)
SHARED_CASES = ("matmul_nt", "matmul_nn", "matmul_tn", "matmul_tn_accumulate",
                "matmul_nn_accumulate", "matmul_nt_residual", "linear_backward",
                "attention_forward", "attention_backward")


def house() -> str:
    """The kernel house's import name in this process's tree (the working directory):
    `istanbul.shaders`, or the top-level name `shaders` in a tree from before issue 15 gave it
    that name. Only a house inside the tree counts (not an editable install's elsewhere)."""
    spec = importlib.util.find_spec("istanbul.shaders")
    if spec and spec.origin and Path(spec.origin).resolve().is_relative_to(Path.cwd().resolve()):
        return "istanbul.shaders"
    return "shaders"


def kernels_cli(argv: list[str]) -> int:
    """`istanbul kernels ARGV` through the house's CLI alone (the top CLI also imports the
    services, which an old tree may lack)."""
    cli = importlib.import_module(f"{house()}.cli")
    parser = argparse.ArgumentParser(prog="istanbul")
    cli.register(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def step_timings(repeats: int, smoke: bool = False) -> dict:
    """{name: {"us", "kernel"}} for this process's tree."""
    import numpy as np

    name = house()
    Device = importlib.import_module(f"{name}.engine").Device
    try:                                    # the kernel house (after 02206db)
        attention = importlib.import_module(f"{name}.kernels.attention.ops")
        linear = importlib.import_module(f"{name}.kernels.matmul.ops")
    except ModuleNotFoundError:             # a tree from before it
        attention = importlib.import_module(f"{name}.ops.attention")
        linear = importlib.import_module(f"{name}.ops.linear")
    dev = Device()
    rng = np.random.default_rng(0)
    out = {"_device": dev.info.name}

    def timed(encode):
        return dev.time_gpu(encode, repeats=repeats, warmup=2,
                            min_warmup_s=0.0 if smoke else 0.5) * 1e6

    for name, layout, M, N, K in products(*((256, 1024) if smoke else ())):
        a_shape = (K, M) if layout == "tn" else (M, K)
        b_shape = (N, K) if layout == "nt" else (K, N)
        a = dev.upload(rng.standard_normal(a_shape, dtype=np.float32))
        b = dev.upload(0.02 * rng.standard_normal(b_shape, dtype=np.float32))
        c = dev.zeros((M, N))
        plan = linear.plan(dev, layout, M, N, K, operands=(a, b, c))

        def encode(rec, a=a, b=b, c=c, layout=layout, M=M, N=N, K=K):
            linear.matmul(rec, a, b, c, M, N, K, layout=layout, accumulate=layout == "tn")
        us = timed(encode)
        out[name] = {"us": us, "kernel": str(plan), "tflops": 2.0 * M * N * K / us / 1e6}
        print(f"{name:<14} {us:9.1f} us {out[name]['tflops']:6.2f} TFLOP/s  {plan}", flush=True)
        for buf in (a, b, c):
            buf.destroy()
    B, T, H, Hkv, Dh = (1, 128, 2, 2, 64) if smoke else ATTENTION
    q, k, v, do = (dev.upload(rng.standard_normal((B, T, h, Dh), dtype=np.float32))
                   for h in (H, Hkv, Hkv, H))
    o, lse = dev.empty((B, T, H, Dh)), dev.empty((B, H, T))
    dq, dk, dv = dev.empty((B, T, H, Dh)), dev.empty((B, T, Hkv, Dh)), dev.empty((B, T, Hkv, Dh))
    picked = {kern: attention.choose_config(dev, kern, T, Dh) for kern in ("forward", "dq", "dkv")}
    fwd = timed(lambda rec: attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, Dh))
    bwd = timed(lambda rec: attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv,
                                               B, T, H, Hkv, Dh))
    out["attention fwd"] = {"us": fwd, "kernel": str(picked["forward"])}
    out["attention bwd"] = {"us": bwd, "kernel": f"dq {picked['dq']} dkv {picked['dkv']}"}
    print(f"attention fwd {fwd:9.1f} us  {picked['forward']}\n"
          f"attention bwd {bwd:9.1f} us  dq {picked['dq']} dkv {picked['dkv']}", flush=True)
    return out


def _run_tree(tree: Path, args: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tree)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.run([sys.executable] + args, cwd=tree, env=env, text=True,
                          capture_output=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="*", type=Path, metavar="TREE", help="OLD_TREE NEW_TREE")
    ap.add_argument("--out", type=Path, help="write table.md (and the check / bench JSON) here")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--kernels-bench", action="store_true",
                    help="also run `istanbul kernels bench` on the cases both trees share")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (a check of this "
                    "script on software Vulkan, not a measurement)")
    ap.add_argument("--check", action="store_true", help="first run `istanbul kernels check` "
                    "for the matmul, attention and decode families in the new tree")
    ap.add_argument("--step", type=Path, metavar="JSON", help=argparse.SUPPRESS)
    ap.add_argument("--kernels", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.kernels is not None:    # inside one tree's process: `istanbul kernels ...`
        return kernels_cli(["kernels", *args.kernels])
    if args.step:   # inside one tree's process
        args.step.write_text(json.dumps(step_timings(args.repeats, args.smoke), indent=1))
        return 0
    if len(args.trees) != 2:
        ap.error("give OLD_TREE NEW_TREE")
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="compare_trees_"))
    out_dir.mkdir(parents=True, exist_ok=True)
    step_dir = Path(tempfile.mkdtemp(prefix="compare_trees_steps_"))
    labels = ("old", "new")
    runs = {label: [] for label in labels}
    for r in range(args.rounds):
        for label, tree in zip(labels, args.trees):
            path = step_dir / f"step_{label}_{r}.json"
            proc = _run_tree(tree.resolve(), [str(Path(__file__).resolve()), "--step", str(path),
                                              "--repeats", str(args.repeats)]
                             + (["--smoke"] if args.smoke else []))
            print(f"# round {r} {label} ({tree}):\n{proc.stdout}{proc.stderr[-2000:]}",
                  flush=True)
            if proc.returncode:
                return proc.returncode
            runs[label].append(json.loads(path.read_text()))
    names = [n for n in runs["old"][0] if not n.startswith("_")]
    lines = [f"# 124M step kernels, old vs new ({runs['new'][0]['_device']}, median of "
             f"{args.rounds} rounds)", "",
             "| product | old us | new us | new/old | old kernel | new kernel |",
             "|---|---:|---:|---:|---|---|"]
    worst = 0.0
    tot = {label: 0.0 for label in labels}
    for n in names:
        med = {label: statistics.median(r[n]["us"] for r in runs[label]) for label in labels}
        ratio = med["new"] / med["old"]
        worst = max(worst, ratio)
        for label in labels:
            tot[label] += med[label]
        lines.append(f"| {n} | {med['old']:.1f} | {med['new']:.1f} | {ratio:.3f} | "
                     f"{runs['old'][0][n]['kernel']} | {runs['new'][0][n]['kernel']} |")
    lines += [f"| **sum** | {tot['old']:.1f} | {tot['new']:.1f} | "
              f"{tot['new'] / tot['old']:.3f} | | |", "",
              f"worst new/old: {worst:.3f} ({'within' if worst <= 1.03 else 'OUTSIDE'} 3%)"]
    table = "\n".join(lines) + "\n"
    (out_dir / "table.md").write_text(table)
    print(table, flush=True)
    if args.check:
        proc = _run_tree(args.trees[1].resolve(), [
            str(Path(__file__).resolve()), "--kernels", "check", "--json",
            str(out_dir / "check_new.json"),
            "--kernel", "matmul", "--kernel", "linear_backward", "--kernel", "attention", "--kernel", "decode"])
        print(f"# kernels check, new tree:\n{proc.stdout[-8000:]}{proc.stderr[-2000:]}",
              flush=True)
    if args.kernels_bench:
        for label, tree in zip(labels, args.trees):
            path = out_dir / f"kernels_bench_{label}.json"
            cmd = [str(Path(__file__).resolve()), "--kernels", "bench", "--json", str(path)]
            for case in SHARED_CASES:
                cmd += ["--kernel", case]
            proc = _run_tree(tree.resolve(), cmd)
            print(f"# kernels bench {label}:\n{proc.stdout[-6000:]}{proc.stderr[-2000:]}")
    return 0 if worst <= 1.03 or math.isnan(worst) else 1


if __name__ == "__main__":
    sys.exit(main())
