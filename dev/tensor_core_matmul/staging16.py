"""Issue 49, deliver item 2 (first part): the tensor-core matmuls with 16-byte staging, on the
real device. Are they exact, how fast are they at the 124M step's products, and which of the
configurations the freed staging budget allows wins?

    ISTANBUL_BACKEND=dawn .venv/bin/python dev/tensor_core_matmul/staging16.py \
        --out dev/tensor_core_matmul/results/h100/staging16.json [--budget-s 200] [--quick]

Needs Dawn on a GPU with f16 -> f32 subgroup matrices (H100, H200); robustness off, as the
trainer runs. For each product of one 124M training step (8 x 1024 tokens; the Linear shapes
of trainer_svc/model/tuning_shapes.py through shaders/autotune.linear_shapes: N, K among 768,
2304 (fused qkv), 2048 (ffn), 4096 (gate|up), 50304 (the LM head), in the nt (forward), nn
(dX) and tn (dW +=) layouts, with the trainer's operand types: the f16 weight mirror as B of
nt / nn, f32 B for tn) it

1. checks the configuration the trainer would run (the shipped tuned entry, else the
   default) against numpy on a sample of output rows: both operands rounded to f16, f64
   products; a row fails where |got - want| > 2e-4 * (|A16| @ |B16|) + 1e-6 anywhere (f32
   accumulation over K stays far inside that, a wrong tile or a lost slice does not);
2. times it and a small sweep of configurations with GPU timestamps (shaders/autotune
   .time_candidates, as `istanbul kernels tune` does): tile arrangements 16 subgroups of 2x4 /
   4x2 / 2x2 tiles, 4 subgroups of 4x4, 16 of 4x4 where the device's workgroup memory holds
   them, slices of BK 32 and 64, one stage (-b1) and two, at each configuration's default
   K split (a configuration the device cannot run is listed with its reason, not timed);
   each sweep winner is checked like the trainer's configuration.

Prints one table (TFLOP/s of the trainer's configuration, of the best swept one, and which)
and writes everything (every time, every check) to --out as JSON. About 2-3 minutes on an
H100: --budget-s bounds the sweep's timing (products past it time only the trainer's
configuration); --quick sweeps BK 32 one-stage only.

The kernel before this change cannot run here (the template is replaced): its numbers are in
dev/tensor_core_matmul/README.md (session 24's H100 tuned file, 97.5-188.3 TFLOP/s per
product); run the old tree's `istanbul kernels tune` / this folder's sgmat_sweep.py beside it
for a same-call comparison (dev/compare_trees/).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from istanbul.shaders import autotune  # noqa: E402
from istanbul.shaders.engine import Device  # noqa: E402
from istanbul.shaders.kernels.matmul import ops as linear  # noqa: E402

# (sgr, sgc, ti, tj): 16 subgroups of 2x4 (the shipped default), 4x2, 2x2; 4 subgroups of
# 4x4; 16 subgroups of 4x4 (256 x 256, fits only where workgroup memory allows)
TILES = ((4, 4, 2, 4), (4, 4, 4, 2), (4, 4, 2, 2), (2, 2, 4, 4), (4, 2, 4, 4), (2, 4, 4, 4),
         (4, 4, 4, 4))
SLICES = (32, 64)
SAMPLE_ROWS = 8


def step_dims(tokens: int | None = None) -> dict:
    """The 124M preset's Linear dimensions from the trainer (its modules are being moved: if
    they cannot be imported, the same numbers written out)."""
    try:
        from trainer_svc.model.tuning_shapes import model_dims
        return model_dims("124m", tokens)
    except ImportError:
        return dict(d=768, kv=768, ffn=2048, vocab=50304, tokens=tokens or 8 * 1024,
                    fused_qkv=True)


def products(tokens: int | None = None, smoke: bool = False) -> list[dict]:
    """The 124M step's matmuls as the trainer runs them (`smoke`: the same products of a tiny
    model, for a CPU run of this script with emulated subgroup matrices)."""
    dims = (dict(d=64, kv=64, ffn=48, vocab=200, tokens=96, fused_qkv=True) if smoke
            else step_dims(tokens))
    d, ffn, vocab = dims["d"], dims["ffn"], dims["vocab"]
    names = {(d, d): "wo", (d, ffn): "w_down", (d + 2 * dims["kv"], d): "qkv",
             (2 * ffn, d): "w13 (gate|up)", (vocab, d): "head"}
    out = []
    for layout, M, N, K, mode in autotune.linear_shapes(**dims):
        fwd = {"nt": (N, K), "nn": (K, N), "tn": (M, N)}[layout]   # the weight's [out, in]
        what = {"nt": "forward", "nn": "dX", "tn": "dW"}[layout]
        out.append(dict(layout=layout, M=M, N=N, K=K, mode=mode,
                        b16=layout in ("nt", "nn"),   # the f16 weight mirror; dW's B in f32
                        name=f"{names.get(fwd, fwd)} {what} {M}x{N}x{K}"))
    return out


def sweep_configs(device, layout: str, M: int, N: int, K: int, quick: bool):
    """[(config string or None, reason it cannot run or '')] of the sweep at one product."""
    out = []
    for sgr, sgc, ti, tj in TILES:
        for bk in (32,) if quick else SLICES:
            for single in (True,) if quick else (True, False):
                cfg = linear.SgmatConfig(sgr, sgc, ti, tj, bk, 8, single=single)
                if cfg.bm > 2 * M or cfg.bn > 2 * N:
                    continue
                problems = cfg.problems(device, layout)
                if problems:
                    out.append((str(cfg), "; ".join(problems)))
                    continue
                cfg = cfg.with_splits(linear.default_splits(device, cfg, M, N, K))
                out.append((str(cfg), ""))
    return out


def operands(device, p, rng):
    layout, M, N, K = p["layout"], p["M"], p["N"], p["K"]
    a_shape = (K, M) if layout == "tn" else (M, K)
    b_shape = (N, K) if layout == "nt" else (K, N)
    a = rng.standard_normal(a_shape, dtype=np.float32)
    b = (0.05 * rng.standard_normal(b_shape, dtype=np.float32))
    if p["b16"]:
        b = b.astype(np.float16)
    return a, b


def check(device, p, a, b, bufs, config: str, rows) -> dict:
    """Run `config` once into a zeroed C and compare the sampled rows with numpy
    (autotune.check_matmul: both operands rounded to f16 as the kernel stages them)."""
    layout, M, N, K = p["layout"], p["M"], p["N"], p["K"]
    a_buf, b_buf, out = bufs

    def encode(rec):
        linear.matmul(rec, a_buf, b_buf, out, M, N, K, layout=layout,
                      accumulate=p["mode"] == "accumulate", config=config)
    return autotune.check_matmul(device, encode, a, b, out, layout, M, N, f16_operands=True,
                                 rows=rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--budget-s", type=float, default=120.0,
                    help="seconds of sweep timing in all (default 120)")
    ap.add_argument("--quick", action="store_true", help="sweep BK 32, one stage only")
    ap.add_argument("--tokens", type=int, default=None, help="M (default 8 x 1024)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny shapes; runs on emulated subgroup matrices too (a CPU check of "
                         "this script: ISTANBUL_EMULATE_SUBGROUP_MATRIX=1)")
    args = ap.parse_args(argv)

    start = time.perf_counter()
    device = Device(None, robustness=False)
    if device.backend.name != "dawn" or not linear.has_tensor_cores(device) \
            or (getattr(device, "emulated_features", ()) and not args.smoke):
        print(f"error: {device.name} ({device.backend.name}) has no real f16 subgroup matrices; "
              "run with ISTANBUL_BACKEND=dawn on an H100/H200", file=sys.stderr)
        return 2
    print(f"# {device.name}, {device.backend.name}, robustness {device.robustness}", flush=True)
    rng = np.random.default_rng(49)
    rows_out, failures = [], 0
    sweep_left = args.budget_s
    for p in products(args.tokens, args.smoke):
        layout, M, N, K = p["layout"], p["M"], p["N"], p["K"]
        flops = 2.0 * M * N * K
        a, b = operands(device, p, rng)
        bufs = (device.upload(a), device.upload(b), device.zeros((M, N), np.float32))
        rows = np.sort(rng.choice(M, size=min(SAMPLE_ROWS, M), replace=False))
        rows[-1] = M - 1   # the last row: ragged tiles' edge where M is not a tile multiple
        trainer = str(linear.choose_sgmat_config(device, layout,
                                                 np.float16 if p["b16"] else np.float32,
                                                 M, N, K))
        row = dict(p, flops=flops, trainer_config=trainer, checks={}, times_us={},
                   refused={})
        try:
            row["checks"][trainer] = check(device, p, a, b, bufs, trainer, rows)
        except Exception as exc:   # a kernel that does not compile or run is a failure
            row["checks"][trainer] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sweep = []
        for cfg, why in sweep_configs(device, layout, M, N, K, args.quick):
            if why:
                row["refused"][cfg] = why
            elif cfg != trainer:
                sweep.append(cfg)
        t0 = time.perf_counter()
        candidates = [trainer] + (sweep if sweep_left > 0 else [])

        def encode_for(text):
            def encode(rec):
                linear.matmul(rec, bufs[0], bufs[1], bufs[2], M, N, K, layout=layout,
                              accumulate=p["mode"] == "accumulate", config=text)
            return encode

        guess_s = flops / 2e14
        repeats = int(min(10, max(3, 0.05 / guess_s)))
        times = autotune.time_candidates(device, candidates, encode_for, repeats=repeats,
                                         warmup=1, budget_s=max(sweep_left, 1.0))
        sweep_left -= time.perf_counter() - t0
        row["times_us"] = {c: (round(t * 1e6, 2) if math.isfinite(t) else None)
                           for c, t in times.items()}
        timed = {c: t for c, t in times.items() if math.isfinite(t)}
        best = min(timed, key=timed.get) if timed else None
        if best is not None and best not in row["checks"]:
            try:
                row["checks"][best] = check(device, p, a, b, bufs, best, rows)
            except Exception as exc:
                row["checks"][best] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        row["best_config"] = best
        for key, cfg in (("trainer_tflops", trainer), ("best_tflops", best)):
            t = timed.get(cfg)
            row[key] = round(flops / t / 1e12, 1) if t else None
        bad = [c for c, r in row["checks"].items() if not r["ok"]]
        failures += len(bad)
        row["failed_checks"] = bad
        for buf in bufs:
            buf.destroy()
        rows_out.append(row)
        print(f"{row['name']:<32} {trainer:<28} {str(row['trainer_tflops']):>7}   "
              f"{best or '-':<28} {str(row['best_tflops']):>7}   "
              f"{'FAIL ' + ', '.join(bad) if bad else 'exact'}", flush=True)

    total = {k: sum(r["times_us"][r[c]] for r in rows_out
                    if r[c] and r["times_us"].get(r[c]))
             for k, c in (("trainer_us", "trainer_config"), ("best_us", "best_config"))}
    flops = sum(r["flops"] for r in rows_out)
    print("\n| product | trainer's config | TFLOP/s | best swept | TFLOP/s | check |")
    print("|---|---|---:|---|---:|---|")
    for r in rows_out:
        print(f"| {r['name']} | {r['trainer_config']} | {r['trainer_tflops']} | "
              f"{r['best_config']} | {r['best_tflops']} | "
              f"{'FAIL' if r['failed_checks'] else 'exact'} |")
    for k, us in total.items():
        print(f"# sum of the products, {k[:-3]}: {us / 1e3:.2f} ms "
              f"({flops / (us * 1e-6) / 1e12:.1f} TFLOP/s)" if us else f"# {k}: n/a")
    result = {"device": device.name, "backend": device.backend.name,
              "robustness": device.robustness, "tiles": TILES, "slices": SLICES,
              "quick": args.quick, "budget_s": args.budget_s,
              "seconds": round(time.perf_counter() - start, 1), "failed_checks": failures,
              "sum_us": total, "products": rows_out}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"# {failures} failed check(s); {time.perf_counter() - start:.0f} s; wrote {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
