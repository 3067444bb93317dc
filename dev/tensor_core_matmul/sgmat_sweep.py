"""Which tensor-core (subgroup-matrix) matmul configurations win at the 124M shapes, and are
they right?

    ISTANBUL_BACKEND=dawn python dev/tensor_core_matmul/sgmat_sweep.py --out dev/results/h200/sgmat [--budget-s 150]
        [--configs A,B,...] [--no-checks] [--tuned-out FILE]

Needs Dawn on a GPU with f16 -> f32 subgroup matrices (the H200). First a correctness battery
of 03_linear_sgmat.wgsl against numpy (every layout, f32 and f16 B, the three epilogues, alpha,
shapes that are not multiples of the tiles, split-K); then, for the products of one 124M
training step (8 x 1024 tokens), GPU-timestamp times of each configuration next to the f32
tiled kernel the same call would otherwise run, and of the tuned configuration in the
kernel before round 3 (2026-12-01) (every result tile through workgroup memory, one slice in flight),
with straight stores ("-d") and also with two slices in flight ("-a2-d"). Writes OUT/sgmat.md and
OUT/sgmat.json; --tuned-out FILE also writes the winners as a tuned-cache file (the format of
shaders/tuned/, for ISTANBUL_AUTOTUNE_DIR or to merge into the shipped file).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from istanbul.shaders.engine import Device  # noqa: E402
from istanbul.shaders.kernels.matmul import ops as linear  # noqa: E402
from istanbul.shaders.kernels.matmul import reference  # noqa: E402

# Round 3 (2026-12-01): each tile arrangement in the old kernel, with straight stores ("-d"),
# and with straight stores and two slices in flight ("-a2-d").
BASES = ["sg4x2-t4x4-k16-p8", "sg2x4-t4x4-k16-p8", "sg2x2-t4x4-k16-p8", "sg2x2-t4x4-k32-p8",
         "sg4x4-t2x2-k16-p8", "sg2x2-t2x4-k32-p8"]
CONFIGS = [f"{b}-s1{v}" for b in BASES for v in ("", "-d", "-a2-d")] + \
    ["sg4x2-t4x4-k16-p8-s1-a2", "sg1x1-t2x2-k16-p8-s1-a2-d"]


def jobs(tokens=8 * 1024, d=768, f=2048, vocab=50304):
    """(layout, b is f16, M, N, K, what) of one 124M step's products."""
    return [
        ("nt", True, tokens, 2 * f, d, "w13 forward"),
        ("nt", True, tokens, 3 * d, d, "qkv forward"),
        ("nt", True, tokens, d, d, "wo forward"),
        ("nt", True, tokens, d, f, "w_down forward"),
        ("nt", True, 2048, vocab, d, "head forward (chunk)"),
        ("nn", True, tokens, d, 2 * f, "w13 dX"),
        ("nn", True, tokens, f, d, "w_down dX"),
        ("nn", True, tokens, d, 3 * d, "qkv dX"),
        ("nn", True, 2048, d, vocab, "head dX (chunk)"),
        ("tn", False, 2 * f, d, tokens, "w13 dW"),
        ("tn", False, d, f, tokens, "w_down dW"),
        ("tn", False, 3 * d, d, tokens, "qkv dW"),
        ("tn", False, d, d, tokens, "wo dW"),
        ("tn", False, vocab, d, 2048, "head dW (chunk)"),
    ]


def operands(rng, layout, M, N, K):
    a_shape = (K, M) if layout == "tn" else (M, K)
    b_shape = (N, K) if layout == "nt" else (K, N)
    return (rng.standard_normal(a_shape).astype(np.float32),
            rng.standard_normal(b_shape).astype(np.float32))


def check_case(dev, rng, layout, w16, M, N, K, mode, alpha, config):
    a, b = operands(rng, layout, M, N, K)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    r = rng.standard_normal((M, N)).astype(np.float32)
    A, B = dev.upload(a), dev.upload(b.astype(np.float16) if w16 else b)
    C, R = dev.upload(c0), dev.upload(r)
    with dev.record() as rec:
        linear.matmul(rec, A, B, C, M, N, K, layout=layout, alpha=alpha, config=config,
                      accumulate=mode == "accumulate",
                      residual=R if mode == "residual" else None)
    got = dev.download(C).reshape(M, N).astype(np.float64)
    ref = reference.tensor_core_matmul(
        {"M": M, "N": N, "K": K, "alpha": alpha, "mode": mode, "a": a, "out": c0,
         "residual": r, "b": b.astype(np.float16) if w16 else b}, layout)["out"].astype(np.float64)
    scale = float(np.max(np.abs(ref))) or 1.0
    err = float(np.max(np.abs(got - ref)) / scale)
    cos = float(np.dot(got.ravel(), ref.ravel()) / (np.linalg.norm(got) * np.linalg.norm(ref)))
    return {"layout": layout, "w16": w16, "shape": [M, N, K], "mode": mode, "alpha": alpha,
            "config": str(config), "max_rel_err": err, "cos": cos, "ok": err < 2e-5 * max(1, K / 256)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--no-checks", action="store_true", help="skip the correctness battery")
    ap.add_argument("--tuned-out", help="write the winners as a tuned-cache file")
    ap.add_argument("--splits", default="auto",
                    help="split-K factors to time each configuration at (comma list; auto: "
                         "ops.default_splits' choice for the product)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = Device()
    print(dev, "tensor cores:", linear.has_tensor_cores(dev), flush=True)
    result = {"device": dev.info.summary(), "backend": dev.backend.name,
              "toggles": list(dev.backend.device_toggles), "robustness": dev.robustness,
              "checks": [], "times": []}
    rng = np.random.default_rng(0)
    configs = [c for c in args.configs.split(",") if c]
    cases = []
    for layout in ("nt", "nn", "tn"):
        for w16 in ((False, True) if layout != "tn" else (False,)):
            cases += [(layout, w16, 256, 256, 256, "store", 1.0),
                      (layout, w16, 100, 196, 48, "accumulate", 0.5),
                      (layout, w16, 300, 72, 520, "residual", 2.0),
                      # alpha 1: in-bounds workgroups store straight from the accumulators
                      (layout, w16, 512, 256, 96, "accumulate", 1.0),
                      (layout, w16, 300, 264, 160, "residual", 1.0)]
    for cfg in ([] if args.no_checks else configs):
        for case in cases:
            try:
                row = check_case(dev, rng, *case, cfg)
            except Exception as exc:  # a configuration that does not compile: say why
                row = {"config": cfg, "case": list(case), "error": f"{type(exc).__name__}: "
                       f"{str(exc)[:600]}"}
            result["checks"].append(row)
            if not row.get("ok"):
                print("CHECK", row, flush=True)
        # split-K on one case
    split_cases = [] if args.no_checks else [("tn", False, 512, 256, 4096, "accumulate", 1.0),
                                             ("nt", True, 512, 512, 2048, "residual", 1.0)]
    for case in split_cases:
        for cfg in {configs[0], configs[-1]}:
            row = check_case(dev, rng, *case, cfg.replace("-s1", "-s4"))
            result["checks"].append(row)
            print("split-K", row, flush=True)
    bad = [c for c in result["checks"] if not c.get("ok")]
    print(f"{len(result['checks'])} checks, {len(bad)} failed", flush=True)
    broken = {str(linear.SgmatConfig.parse(c["config"]).with_splits(1)) for c in bad}

    start = time.perf_counter()
    for layout, w16, M, N, K, what in jobs():
        a, b = operands(rng, layout, M, N, K)
        A, B = dev.upload(a), dev.upload(b.astype(np.float16) if w16 else b)
        C = dev.zeros((M, N))
        flops = 2.0 * M * N * K
        row = {"layout": layout, "w16": w16, "shape": [M, N, K], "what": what, "times": {}}
        try:
            t = dev.time_gpu(lambda rec: linear.matmul(rec, A, B, C, M, N, K, layout=layout))
            row["times"]["f32 tiled (default)"] = t
        except Exception as exc:
            row["times"]["f32 tiled (default)"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        tuned = linear.choose_sgmat_config(dev, layout, B.dtype, M, N, K)
        row["tuned"] = str(tuned)
        def time_config(c):
            """GPU time of `c` on this product into row["times"] (the error, if it fails)."""
            try:
                row["times"][str(c)] = dev.time_gpu(
                    lambda rec: linear.matmul(rec, A, B, C, M, N, K, layout=layout, config=c),
                    min_warmup_s=0.1)
            except Exception as exc:
                row["times"][str(c)] = f"{type(exc).__name__}: {str(exc)[:300]}"

        tries = [dataclasses.replace(tuned, direct=False, ahead=1),
                 dataclasses.replace(tuned, direct=True, ahead=1),
                 dataclasses.replace(tuned, direct=True, ahead=2)]
        for c in tries:
            if str(c.with_splits(1)) in broken or c.problems(dev, layout):
                continue
            time_config(c)
        row["old"] = str(tries[0])
        for cfg in configs:
            for split in args.splits.split(","):
                if time.perf_counter() - start > args.budget_s:
                    continue
                c = linear.SgmatConfig.parse(cfg)
                c = c.with_splits(linear.default_splits(dev, c, M, N, K) if split == "auto"
                                  else int(split))
                if str(c) in row["times"] or c.problems(dev, layout) or \
                        str(c.with_splits(1)) in broken or \
                        linear.split_k(c, K)[1] != c.splits:   # fewer slices than splits
                    continue
                time_config(c)
        row["tflops"] = {k: round(flops / v / 1e12, 1) for k, v in row["times"].items()
                         if isinstance(v, float)}
        sg = {k: v for k, v in row["tflops"].items() if k.startswith("sg")}
        row["best"] = max(sg, key=sg.get) if sg else None
        print(f"{layout}{'_w16' if w16 else ''} {M}x{N}x{K} {what}: f32 "
              f"{row['tflops'].get('f32 tiled (default)')} | old {sg.get(row['old'])} | best "
              f"{row['best']} {sg.get(row['best'])}", flush=True)
        result["times"].append(row)
        dev.sync()
        for buf in (A, B, C):
            buf.destroy()
    (out / "sgmat.json").write_text(json.dumps(result, indent=1))
    lines = [f"# Tensor-core matmuls at the 124M shapes ({result['device']}, backend "
             f"{result['backend']}, robustness {'on' if result['robustness'] else 'off'})", "",
             f"Checks: {len(result['checks'])}, failed: {len(bad)}"
             + (f" ({', '.join(sorted(broken))})" if broken else ""), "",
             "TFLOP/s (GPU timestamps, median of 10). old: the tuned configuration in the kernel "
             "before round 3 (2026-12-01); direct / -a2: the same tiles with straight stores (-d) / and "
             "two slices in flight (-a2-d); best: over every configuration timed.", "",
             "| product | shape | f32 tiled | old | direct | direct -a2 | best | config |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for row in result["times"]:
        tf = row["tflops"]
        old = linear.SgmatConfig.parse(row["old"])
        direct = str(dataclasses.replace(old, direct=True))
        ahead = str(dataclasses.replace(old, direct=True, ahead=2))
        lines.append(f"| {row['what']} ({row['layout']}) | {'x'.join(map(str, row['shape']))} | "
                     f"{tf.get('f32 tiled (default)', '-')} | {tf.get(row['old'], '-')} | "
                     f"{tf.get(direct, '-')} | {tf.get(ahead, '-')} | "
                     f"{tf.get(row['best'], '-')} | {row['best']} |")
    seconds, seen = {}, {}   # by tile arrangement and kernel variant, any split factor
    for row in result["times"]:
        for k, v in row["times"].items():
            if isinstance(v, float) and k.startswith("sg"):
                base = str(linear.SgmatConfig.parse(k).with_splits(1)).replace("-s1", "")
                seconds[base] = seconds.get(base, 0.0) + v
                seen[base] = seen.get(base, 0) + 1
    full = {k: v for k, v in seconds.items() if seen[k] == len(result["times"])}
    lines += ["", "Sum over all the products above, per configuration timed at every one of "
              "them (any split factor; ms): " + ", ".join(
                  f"{k} {v * 1e3:.2f}" for k, v in sorted(full.items(), key=lambda kv: kv[1]))]
    (out / "sgmat.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if args.tuned_out:
        write_tuned(dev, result, Path(args.tuned_out))


def write_tuned(dev, result, path: Path) -> None:
    """The winners in the tuned-cache format (entries matmul/<key>_sgmat/MxNxK)."""
    from istanbul.shaders import tuned_cache
    entries = {}
    for row in result["times"]:
        if not row.get("best"):
            continue
        key = linear.tuning_key(row["layout"], np.float16 if row["w16"] else np.float32,
                                False) + "_sgmat"
        cands = {k: round(v * 1e6, 2) for k, v in row["times"].items()
                 if isinstance(v, float) and k.startswith("sg")}
        M, N, K = row["shape"]
        entries[f"matmul/{key}/{M}x{N}x{K}"] = {
            "config": row["best"], "us": cands[row["best"]], "candidates": cands,
            "tflops": row["tflops"][row["best"]], "default": row["old"],
            "default_us": cands.get(row["old"]), "backend": dev.backend.name}
    info = dev.info
    data = {"adapter": info.name, "backend": info.backend, "webgpu": dev.backend.name,
            "adapter_key": tuned_cache.adapter_key(dev), "written": time.strftime("%Y-%m-%d"),
            "toggles": list(dev.backend.device_toggles), "entries": entries}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    print("tuned entries ->", path, flush=True)


if __name__ == "__main__":
    main()
