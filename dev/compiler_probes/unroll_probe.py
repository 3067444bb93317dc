"""Probe: how many loop iterations should the expanded kernels write out?

    python dev/compiler_probes/unroll_probe.py --unroll U --att-unroll D N [--only matmul|attention]
                                      [--out results.jsonl]

The expansion pass (shaders/wgsl_expand.py) writes the f32 matmuls' K-slice loop and the
attention kernels' loops over the head dimension and over a tile's keys/queries either as
plain loops (1) or in runs of U / D / N iterations written out (same sums, same order:
bit-identical results): template options (ops.linear.UNROLL_K, ops.attention.UNROLL_D /
UNROLL_N) that this probe sets for its own process, never for the product. It times the
committed-tuned configurations of the 124M model's hot kernels at their training shapes, so
that runs with different settings compare them on one GPU. One JSON line per run goes to
--out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from istanbul.shaders import autotune  # noqa: E402
from istanbul.shaders.engine import Device  # noqa: E402
from istanbul.shaders.kernels.attention import ops as attention  # noqa: E402
from istanbul.shaders.kernels.matmul import ops as linear  # noqa: E402

# (layout, M, N, K, config): the 124M step's matmul shapes at 8 x 1024 tokens
MATMULS = (("nt", 8192, 768, 768, "128x128x8-8x8-s1"),
           ("nt", 8192, 768, 768, "128x128x16-8x8-s1"),
           ("nt", 8192, 50304, 768, "128x128x8-8x8-s1"),
           ("nn", 8192, 768, 2048, "128x128x8-8x8-s1"),
           ("nn", 8192, 768, 2048, "128x128x16-8x8-s1"),
           ("tn", 768, 2048, 8192, "128x128x16-8x8-s4"),
           ("tn", 768, 2048, 8192, "128x128x8-8x8-s8"))
# (kernel, config) at B 8, T 1024, H 12, D 64
ATTENTION = (("forward", "64x32"), ("dq", "64x16"), ("dkv", "32x32"))


def _time(dev, encode) -> float:
    return dev.time_gpu(encode, repeats=5, warmup=1, min_warmup_s=0.0 if dev.info.is_software
                        else 0.5)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unroll", type=int, default=linear.UNROLL_K,
                    help=f"k-steps per written-out run of the f32 matmuls' slice loop "
                    f"(1: plain loop; the product: {linear.UNROLL_K})")
    ap.add_argument("--att-unroll", type=int, nargs=2, metavar=("D", "N"),
                    default=(attention.UNROLL_D, attention.UNROLL_N),
                    help="iterations per written-out run of the attention loops over head-dim "
                    "vec4s and over keys/queries (1: plain; the product: "
                    f"{attention.UNROLL_D} {attention.UNROLL_N})")
    ap.add_argument("--only", choices=("matmul", "attention"), help="time one family only")
    ap.add_argument("--out", type=Path, help="append one JSON line here")
    ap.add_argument("--adapter")
    args = ap.parse_args(argv)
    linear.UNROLL_K = args.unroll                                  # this process only
    attention.UNROLL_D, attention.UNROLL_N = args.att_unroll
    label = f"{args.unroll}/{args.att_unroll[0]}/{args.att_unroll[1]}"
    dev = Device(args.adapter)
    rng = np.random.default_rng(0)
    scale = 8 if dev.info.is_software else 1     # lavapipe: 1/8 of M (K for tn; vocab N)
    rows = {}
    print(f"# {dev.info.summary()}: unroll setting {label}")
    for layout, M, N, K, cfg in (() if args.only == "attention" else MATMULS):
        problems = linear.MatmulConfig.parse(cfg).problems(dev)
        if problems:
            print(f"{layout} {cfg}: skipped ({problems[0]})")
            continue
        if layout == "tn":
            K //= scale
        else:
            M //= scale
        if N > 8192:
            N //= scale
        a, b, out = autotune.matmul_operands(dev, layout, False, M, N, K, rng)

        def encode(rec, layout=layout, M=M, N=N, K=K, cfg=cfg):
            linear.matmul(rec, a, b, out, M, N, K, layout=layout, config=cfg)
        seconds = _time(dev, encode)
        name = f"{layout} {M}x{N}x{K} {cfg}"
        rows[name] = {"us": seconds * 1e6, "tflops": 2.0 * M * N * K / seconds / 1e12}
        print(f"{name:<40} {seconds * 1e6:10.1f} us {rows[name]['tflops']:7.2f} TFLOP/s",
              flush=True)
        for buf in (a, b, out):
            buf.destroy()
    B, T, H, D = (1, 256, 12, 64) if dev.info.is_software else (8, 1024, 12, 64)
    q, k, v, do = (dev.upload(rng.standard_normal((B, T, H, D), dtype=np.float32))
                   for _ in range(4))
    o, lse = dev.empty((B, T, H, D)), dev.empty((B, H, T))
    dq, dk, dv = (dev.empty((B, T, H, D)) for _ in range(3))
    with dev.record() as rec:
        attention.forward(rec, q, k, v, o, lse, B, T, H, H, D)
    for kernel, cfg in (() if args.only == "matmul" else ATTENTION):
        if attention.tiled_problems(dev, kernel, *attention.parse_config(cfg), D):
            print(f"attention {kernel} {cfg}: skipped (does not fit this device)")
            continue
        if kernel == "forward":
            def encode(rec, cfg=cfg):
                attention.forward(rec, q, k, v, o, lse, B, T, H, H, D, config=cfg)
        else:
            pins = {"config_dq": "64x16", "config_dkv": "32x32", "config_" + kernel: cfg}

            def encode(rec, pins=pins):
                attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H, H, D, **pins)
        seconds = _time(dev, encode)
        name = f"attention {kernel} {cfg}" + ("" if kernel == "forward" else " (+ rest of bwd)")
        rows[name] = {"us": seconds * 1e6}
        print(f"{name:<40} {seconds * 1e6:10.1f} us", flush=True)
    if args.out:
        with args.out.open("a") as f:
            f.write(json.dumps({"adapter": dev.info.name, "label": label,
                                "rows": rows}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
