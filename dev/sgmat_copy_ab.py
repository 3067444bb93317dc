"""Do the tensor-core matmuls run faster when their f16 operands are staged as 16 x 16 tiles by
subgroup-matrix loads and stores ("-m") than by vec4 loads and scalar f16 stores?

    ISTANBUL_BACKEND=dawn python dev/sgmat_copy_ab.py --out OUT [--rounds 2] [--no-checks]

Needs Dawn on a GPU with f16 -> f32 subgroup matrices. First a battery against numpy (every
layout with an f16 operand, f16 A and B, the three epilogues, alpha, ragged shapes beside
whole ones, split-K) of the tuned configurations with "-m"; then, at the products of one 124M
training step as the trainer runs them (the f16 weight mirror as B; the LM head's f16
dlogits as A of its dX and dW), GPU-timestamp times of the configuration the trainer picks
today and of the same with "-m", alternated `--rounds` times. Writes OUT/copy_ab.md,
OUT/copy_ab.json and OUT/cache/<adapter>.json: the shipped tuned file with "-m" on every
entry where it won in every round (for ISTANBUL_AUTOTUNE_DIR, to time the step with it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from istanbul.shaders import tuned_cache  # noqa: E402
from istanbul.shaders.engine import Device  # noqa: E402
from istanbul.shaders.kernels.matmul import ops as linear  # noqa: E402
from istanbul.shaders.kernels.matmul import reference  # noqa: E402


def jobs(tokens=8 * 1024, d=768, f=2048, vocab=50304):
    """(layout, A is f16, B is f16, M, N, K, what): one 124M step's products as trained."""
    return [
        ("nt", False, True, tokens, 2 * f, d, "w13 forward"),
        ("nt", False, True, tokens, 3 * d, d, "qkv forward"),
        ("nt", False, True, tokens, d, d, "wo forward"),
        ("nt", False, True, tokens, d, f, "w_down forward"),
        ("nt", False, True, 2048, vocab, d, "head forward (chunk)"),
        ("nn", False, True, tokens, d, 2 * f, "w13 dX"),
        ("nn", False, True, tokens, f, d, "w_down dX"),
        ("nn", False, True, tokens, d, 3 * d, "qkv dX"),
        ("nn", True, True, 2048, d, vocab, "head dX (chunk, f16 dlogits)"),
        ("tn", True, False, vocab, d, 2048, "head dW (chunk, f16 dlogits)"),
    ]


def check(dev, rng, layout, a16, b16, M, N, K, mode, alpha, config) -> dict:
    a_shape = (K, M) if layout == "tn" else (M, K)
    b_shape = (N, K) if layout == "nt" else (K, N)
    a = rng.standard_normal(a_shape).astype(np.float16 if a16 else np.float32)
    b = rng.standard_normal(b_shape).astype(np.float16 if b16 else np.float32)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    r = rng.standard_normal((M, N)).astype(np.float32)
    A, B, C, R = dev.upload(a), dev.upload(b), dev.upload(c0), dev.upload(r)
    with dev.record() as rec:
        linear.matmul(rec, A, B, C, M, N, K, layout=layout, alpha=alpha, config=config,
                      accumulate=mode == "accumulate",
                      residual=R if mode == "residual" else None)
    got = dev.download(C).reshape(M, N).astype(np.float64)
    ref = reference.tensor_core_matmul({"M": M, "N": N, "K": K, "alpha": alpha, "mode": mode,
                                        "a": a, "b": b, "out": c0, "residual": r},
                                       layout)["out"].astype(np.float64)
    for buf in (A, B, C, R):
        buf.destroy()
    err = float(np.max(np.abs(got - ref)) / (float(np.max(np.abs(ref))) or 1.0))
    cos = float(np.dot(got.ravel(), ref.ravel()) / (np.linalg.norm(got) * np.linalg.norm(ref)))
    return {"layout": layout, "a16": a16, "b16": b16, "shape": [M, N, K], "mode": mode,
            "alpha": alpha, "config": str(config), "max_rel_err": err, "cos": cos,
            "ok": err < 2e-5 * max(1, K / 256) and cos > 0.9999}


def battery(dev, rng) -> list[dict]:
    rows = []
    configs = ["sg4x4-t2x4-k32-p8-s1-b1-m", "sg4x4-t4x2-k32-p8-s1-b1-m",
               "sg2x2-t4x4-k32-p8-s1-b1-m", "sg4x4-t2x2-k32-p8-s1-b1-m",
               "sg4x4-t2x4-k32-p8-s3-b1-m", "sg2x2-t4x4-k32-p8-s1-a2-b1-m"]
    operands = [("nt", False, True), ("nn", False, True), ("tn", False, True),
                ("nt", True, True), ("nn", True, True), ("tn", True, False), ("nn", True, False)]
    shapes = [(256, 256, 256, "store", 1.0), (300, 264, 160, "residual", 1.0),
              (512, 512, 96, "accumulate", 1.0), (100, 196, 48, "accumulate", 0.5),
              (300, 520, 520, "residual", 2.0), (512, 256, 1000, "store", 1.0)]
    for cfg in configs:
        for layout, a16, b16 in operands:
            for M, N, K, mode, alpha in shapes:
                try:
                    row = check(dev, rng, layout, a16, b16, M, N, K, mode, alpha, cfg)
                except Exception as exc:   # a configuration that does not fit: say why
                    row = {"config": cfg, "case": [layout, a16, b16, M, N, K, mode],
                           "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
                rows.append(row)
                if not row.get("ok"):
                    print("CHECK", row, flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-checks", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = Device()
    print(dev, "tensor cores:", linear.has_tensor_cores(dev), flush=True)
    result = {"device": dev.info.summary(), "backend": dev.backend.name,
              "robustness": dev.robustness, "checks": [], "times": []}
    rng = np.random.default_rng(0)
    if not args.no_checks:
        result["checks"] = battery(dev, rng)
    bad = [c for c in result["checks"] if not c.get("ok")]
    print(f"{len(result['checks'])} checks, {len(bad)} failed", flush=True)
    for layout, a16, b16, M, N, K, what in jobs():
        a_shape = (K, M) if layout == "tn" else (M, K)
        b_shape = (N, K) if layout == "nt" else (K, N)
        A = dev.upload(rng.standard_normal(a_shape).astype(np.float16 if a16 else np.float32))
        B = dev.upload(rng.standard_normal(b_shape).astype(np.float16 if b16 else np.float32))
        C = dev.zeros((M, N))
        base = linear.choose_sgmat_config(dev, layout, B.dtype, M, N, K)
        copy = dataclasses.replace(base, tile_copy=True)
        row = {"layout": layout, "a16": a16, "b16": b16, "shape": [M, N, K], "what": what,
               "base": str(base), "copy": str(copy), "base_us": [], "copy_us": []}
        for _ in range(args.rounds):
            for name, cfg in (("base", base), ("copy", copy)):
                try:
                    t = dev.time_gpu(lambda rec: linear.matmul(
                        rec, A, B, C, M, N, K, layout=layout, config=cfg), min_warmup_s=0.1)
                    row[f"{name}_us"].append(round(t * 1e6, 1))
                except Exception as exc:
                    row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        flops = 2.0 * M * N * K
        row["base_tflops"] = [round(flops / t / 1e6, 1) for t in row["base_us"]]
        row["copy_tflops"] = [round(flops / t / 1e6, 1) for t in row["copy_us"]]
        row["copy_wins"] = bool(row["copy_us"]) and len(row["copy_us"]) == len(row["base_us"]) \
            and max(row["copy_us"]) < min(row["base_us"])
        print(f"{what}: {base} {row['base_us']} us | -m {row['copy_us']} us "
              f"({row['base_tflops']} -> {row['copy_tflops']} TFLOP/s)", flush=True)
        result["times"].append(row)
        dev.sync()
        for buf in (A, B, C):
            buf.destroy()
    (out / "copy_ab.json").write_text(json.dumps(result, indent=1))
    lines = [f"# f16 operands staged by subgroup-matrix tile copies ({result['device']}, backend "
             f"{result['backend']}, robustness {'on' if result['robustness'] else 'off'})", "",
             f"Checks: {len(result['checks'])}, failed: {len(bad)}", "",
             f"GPU us per call (median of 10), {args.rounds} rounds alternated; the trainer's "
             "configuration today, and the same with -m.", "",
             "| product | shape | config | today us | -m us | today TFLOP/s | -m TFLOP/s |",
             "|---|---|---|---:|---:|---:|---:|"]
    for row in result["times"]:
        lines.append(f"| {row['what']} ({row['layout']}) | {'x'.join(map(str, row['shape']))} | "
                     f"{row['base']} | {' / '.join(map(str, row['base_us']))} | "
                     f"{' / '.join(map(str, row['copy_us']))} | "
                     f"{' / '.join(map(str, row['base_tflops']))} | "
                     f"{' / '.join(map(str, row['copy_tflops']))} |")
    (out / "copy_ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    write_cache(dev, result, out / "cache")


def write_cache(dev, result, folder: Path) -> None:
    """The shipped tuned file with "-m" on the entries whose product it won in every round
    (entries are per key and shape: the head's f16-dlogits products share their keys)."""
    name = tuned_cache.adapter_key(dev) + ".json"
    shipped = tuned_cache.SHIPPED_DIR / name
    data = json.loads(shipped.read_text()) if shipped.exists() else {"entries": {}}
    changed = []
    for row in result["times"]:
        if not row["copy_wins"]:
            continue
        key = linear.tuning_key(row["layout"], np.float16 if row["b16"] and row["layout"] != "tn"
                                else np.float32, False) + "_sgmat"
        M, N, K = row["shape"]
        entry = f"matmul/{key}/{M}x{N}x{K}"
        data["entries"].setdefault(entry, {"config": row["base"]})
        data["entries"][entry]["config"] = row["copy"]
        changed.append(entry)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data, indent=1))
    print(f"{len(changed)} entries with -m -> {folder / name}: {changed}", flush=True)


if __name__ == "__main__":
    main()
