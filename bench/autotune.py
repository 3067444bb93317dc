"""Tune the tiled kernels at the model's shapes on this machine's GPU and keep the winners.

    python bench/autotune.py [--out DIR] [--preset 124m] [--wide]
                             [--key nt --key tn ...] [--budget-s 20] [--total-s 240]
                             [--no-attention | --no-matmul] [--adapter A]

Times every candidate configuration of each matmul kernel (nt, nn, tn, their f16-weight
variants and the packed-f16 forward) at every Linear shape of one training step, and every
tile shape of the tiled attention kernels (forward, dq, dkv), with GPU timestamps, and stores the fastest per (kernel, shape) in the adapter's cache
($ISTANBUL_AUTOTUNE_DIR or ~/.cache/istanbul/autotune/<adapter>.json), which the ops consult.
Writes OUT/autotune.md (winner, default and runner-up per shape), OUT/autotune.json and a
copy of the cache file: commit that copy as shaders/tuned/<adapter>.json so every checkout
on that GPU uses the tuned configurations, and the table and JSON as the latest result
(bench/results/<machine>/autotune.{md,json}, the default OUT, plus one row in
bench/results/HISTORY.md). Same as `istanbul kernels tune --out DIR`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.results_dir import RESULTS, machine_name  # noqa: E402
from istanbul.shaders.engine import Device  # noqa: E402
from trainer_svc.cli_tune import tune_preset  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, metavar="DIR",
                    help="output directory for autotune.json / .md "
                         "(default bench/results/<machine>/)")
    ap.add_argument("--preset", default="124m", help="model shapes: 124m, small or tiny")
    ap.add_argument("--tokens", type=int, default=None, help="tokens per step (B*T)")
    ap.add_argument("--key", action="append", metavar="KEY", help="matmul kernel key(s)")
    ap.add_argument("--wide", action="store_true", help="every configuration (slower)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="seconds of timing per shape before the rest are skipped")
    ap.add_argument("--total-s", type=float, default=None,
                    help="seconds for the whole run, shared fairly among the shapes")
    ap.add_argument("--no-save", action="store_true", help="leave the user cache alone")
    ap.add_argument("--no-attention", action="store_true", help="tune the matmuls only")
    ap.add_argument("--no-matmul", action="store_true", help="tune the attention kernels only")
    ap.add_argument("--adapter", default=None)
    args = ap.parse_args(argv)
    device = Device(args.adapter)
    args.out = args.out or str(RESULTS / machine_name(device.info.name))
    print(f"# autotune on {device.info.summary()}", flush=True)
    tune_preset(device, args.preset, args.tokens, attention=not args.no_attention,
                keys=args.key, wide=args.wide, budget_s=args.budget_s, out_dir=args.out,
                save=not args.no_save, total_s=args.total_s, matmul=not args.no_matmul)
    return 0


if __name__ == "__main__":
    sys.exit(main())
