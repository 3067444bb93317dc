"""Compare `istanbul kernels bench` of two source trees on the same GPU, in one session.

    python dev/compare_bench.py OLD_TREE NEW_TREE --out DIR [--kernel linear --kernel attention]
                                [--rounds 2] [--repeats 10] [--tolerance 0.03]

A refactor that should not change any kernel (the kernel-house layout, a renamed module)
must keep their timings: this runs each tree's bench alternately (`--rounds` times each, so
a warm or cold GPU does not favour one tree), keeps each kernel's best time per tree, and
prints old us, new us and new/old. Exits 1 when a kernel is slower than `--tolerance`
(default 3%) or missing from one tree. Each run's JSON and log stay in DIR. A tree is a
checkout root (e.g. `git archive 02206db | tar -x -C /tmp/old`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def bench(tree: Path, kernels: list[str], repeats: int, out: Path) -> dict[str, float]:
    cmd = [sys.executable, "-m", "istanbul", "kernels", "bench", "--repeats", str(repeats),
           "--json", str(out.with_suffix(".json"))]
    for k in kernels:
        cmd += ["--kernel", k]
    env = dict(os.environ, PYTHONPATH=str(tree))
    with open(out.with_suffix(".log"), "w", encoding="utf-8") as log:
        proc = subprocess.run(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: kernels bench failed (exit {proc.returncode}); see "
                         f"{out.with_suffix('.log')}")
    rows = json.loads(out.with_suffix(".json").read_text())["kernels"]
    return {r["kernel"]: float(r["us"]) for r in rows if "us" in r}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path, help="the tree before the change")
    ap.add_argument("new", type=Path, help="the tree after the change")
    ap.add_argument("--out", type=Path, required=True, help="directory for the runs' files")
    ap.add_argument("--kernel", action="append", default=None,
                    help="kernel name, family or prefix (repeatable; default linear, attention)")
    ap.add_argument("--rounds", type=int, default=2, help="bench runs per tree, alternating")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per kernel per bench")
    ap.add_argument("--tolerance", type=float, default=0.03, help="allowed slowdown (0.03: 3%%)")
    args = ap.parse_args(argv)
    kernels = args.kernel or ["linear", "attention"]
    for tree in (args.old, args.new):
        if not (tree / "shaders" / "__init__.py").is_file():
            ap.error(f"{tree} is not a checkout root (no shaders/__init__.py)")
    args.out.mkdir(parents=True, exist_ok=True)
    best: dict[str, dict[str, float]] = {"old": {}, "new": {}}
    for i in range(args.rounds):
        for tag, tree in (("old", args.old), ("new", args.new)):
            times = bench(tree.resolve(), kernels, args.repeats, args.out / f"{tag}_{i}")
            for name, us in times.items():
                best[tag][name] = min(us, best[tag].get(name, us))
            print(f"# round {i + 1} {tag}: {len(times)} kernels", flush=True)
    names = sorted(set(best["old"]) | set(best["new"]))
    lines = ["| kernel | old us | new us | new/old |", "|---|---:|---:|---:|"]
    bad = []
    for name in names:
        old, new = best["old"].get(name), best["new"].get(name)
        if old is None or new is None:
            bad.append(f"{name}: only in the {'new' if old is None else 'old'} tree")
            lines.append(f"| {name} | {old or '-'} | {new or '-'} | - |")
            continue
        ratio = new / old
        if ratio > 1 + args.tolerance:
            bad.append(f"{name}: {ratio:.3f}x")
        lines.append(f"| {name} | {old:.1f} | {new:.1f} | {ratio:.3f} |")
    table = "\n".join(lines) + "\n"
    (args.out / "compare.md").write_text(table, encoding="utf-8")
    print(table)
    if bad:
        print(f"# {len(bad)} kernel(s) outside {args.tolerance:.0%}: " + "; ".join(bad))
        return 1
    print(f"# all {len(names)} kernels within {args.tolerance:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
