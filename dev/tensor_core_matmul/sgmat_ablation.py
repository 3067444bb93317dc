"""Where a tensor-core matmul's time goes: 03_linear_sgmat.wgsl with parts taken out (issues 21, 49).

    ISTANBUL_BACKEND=dawn python dev/tensor_core_matmul/sgmat_ablation.py --out DIR [--warm-s 1.0]
        [--a16] [--extra +a2,+g8-v16,sg4x2-t4x4-k16-p8-s1-a2] [--only base,no_global] [--check]

Needs Dawn on a GPU with f16 -> f32 subgroup matrices (an H100 or H200); `--check` runs the
variants small on any Dawn device, subgroup matrices emulated where it lacks them (lavapipe),
so a template change that breaks a patch shows on a CPU. Times, with GPU timestamps, the
shipped kernel and copies of its template with one part removed, at a few 124M-step products
and their tuned configurations:

    base            the kernel as shipped (16-byte staging: one vec4<u32> store per slot)
    no_global       the slices' global loads replaced by a constant (staging stores, matrix
                    loads, multiplies and barriers remain)
    no_stash        nothing staged: no global loads, no workgroup stores (matrix loads of stale
                    workgroup memory, multiplies and barriers remain)
    no_stash_nobar  no_stash without the slice loop's barriers
    stage_only      no matrix loads and no multiplies (global loads, staging stores and
                    barriers remain)
    few_frag_loads  every subgroup-matrix load of a k step at its first tile's offset (the
                    same A tile for every i, the same B tile for every j): the compiler may load
                    each once, so TI + TJ loads become 2 per k step while the multiplies stay

Each product runs its chosen configuration and those of --extra ("+a2": the chosen one with
two slices in flight; "+g8": with raster bands of 8 row blocks; "+v16": f16 operands read
16 bytes at a time; "+g8-v16": both); and, with --a16, every
variant again with A in f16 memory (the _a16 kernels: half A's bytes, no rounding while
staging), the same configuration.

The ablated kernels compute wrong products; only their times mean anything. The difference
to `base` bounds what removing a part could win. Writes DIR/sgmat_ablation.{md,json}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from istanbul.shaders import source  # noqa: E402
from istanbul.shaders.engine import Device  # noqa: E402
from istanbul.shaders.kernels.matmul import ops as linear  # noqa: E402

MMA = ("c[i * {{TJ}}u + j] = subgroupMatrixMultiplyAccumulate(a[i], b[j], "
       "c[i * {{TJ}}u + j]);")
LOOP_BARRIER = "                workgroupBarrier();\n            }\n        }\n    }\n"
SINGLE_BARRIER = "// @if SINGLE\n                    workgroupBarrier();\n// @endif\n"


def patches() -> dict[str, list[tuple[str, str]]]:
    """Variant name -> (old, new) text replacements of the template (each must match)."""
    fetch = "fn fetch_{x}(t: u32, lid: u32, {o}0: u32, k0: u32, k_end: u32) -> vec4<u32> {{\n"
    stash = "fn stash_{x}(t: u32, lid: u32, stage: u32, v: vec4<u32>) {{\n"
    return {
        "base": [],
        "no_global": [
            (fetch.format(x=x, o=o), fetch.format(x=x, o=o) +
             f"    if (k0 != 0xffffffffu) {{ return vec4<u32>(lid & {mask}u); }}\n")
            for x, o, mask in (("a", "m", 7), ("b", "n", 3))],
        "no_stash": [
            (stash.format(x=x), stash.format(x=x) + "    if (t != 0xffffffffu) { return; }\n")
            for x in "ab"],
        "stage_only": [(MMA, "c[i * {{TJ}}u + j] = c[i * {{TJ}}u + j];")],
        "few_frag_loads": [("a_at(stage, am + 16u * i, ks)", "a_at(stage, am, ks)"),
                           ("b_at(stage, ks, bn + 16u * j)", "b_at(stage, ks, bn)")],
    }


def variant_files(tmp: Path) -> dict[str, str]:
    """Write each variant's template next to the others; name -> file name."""
    text = source.find_file(linear.FILE_SGMAT).read_text(encoding="utf-8")
    variants = patches()
    variants["no_stash_nobar"] = variants["no_stash"] + [
        (LOOP_BARRIER, LOOP_BARRIER.replace("workgroupBarrier();", "// no barrier")),
        (SINGLE_BARRIER, "// @if SINGLE\n// @endif\n")]
    names = {}
    for name, reps in variants.items():
        body = text
        for old, new in reps:
            if old not in body:
                raise SystemExit(f"variant {name}: template text not found: {old[:60]!r}")
            body = body.replace(old, new)
        fname = f"03_linear_sgmat_{name}.wgsl"
        (tmp / fname).write_text(body, encoding="utf-8")
        names[name] = fname
    return names


def jobs(check: bool = False):
    """(layout, b is f16, M, N, K, what) of the products timed (--check: small ones)."""
    if check:
        return [("nt", True, 128, 128, 128, "check nt"), ("nn", True, 128, 128, 64, "check nn"),
                ("tn", False, 128, 64, 128, "check tn")]
    return [("nt", True, 8192, 4096, 768, "w13 forward"),
            ("nt", True, 8192, 768, 768, "wo forward"),
            ("nt", True, 8192, 50304, 768, "head forward"),
            ("nn", True, 8192, 2048, 768, "w_down dX"),
            ("nn", True, 8192, 768, 50304, "head dX"),
            ("tn", False, 4096, 768, 8192, "w13 dW"),
            ("tn", False, 768, 768, 8192, "wo dW")]


def with_suffix(cfg, suffix: str):
    """The chosen configuration with suffixes applied ("-" between them): "a2" (two slices
    in flight), "g8" (raster bands of 8 row blocks), "v16" (16-byte reads of f16 operands)."""
    for tok in suffix.split("-"):
        if tok == "v16":
            cfg = dataclasses.replace(cfg, load16=True)
        elif tok[:1] in ("a", "g") and tok[1:].isdigit():
            cfg = dataclasses.replace(cfg, **{{"a": "ahead", "g": "group"}[tok[0]]: int(tok[1:])})
        else:
            raise SystemExit(f"--extra +{suffix}: '+' entries are +aN, +gN, +v16 and their "
                             "combinations (+g8-v16)")
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--warm-s", type=float, default=1.0,
                    help="seconds of calls before each timing (the GPU's clock climbs)")
    ap.add_argument("--a16", action="store_true", help="also every variant with A in f16")
    ap.add_argument("--extra", default="sg4x2-t4x4-k16-p8-s1-a2",
                    help="configurations timed beside each product's chosen one (comma list; "
                         "'+a2': the chosen one with two slices in flight, '+g8': with raster "
                         "bands of 8 row blocks, '+v16': 16-byte f16 reads, '+g8-v16': both)")
    ap.add_argument("--only", default="", help="variants to run (comma list; default all)")
    ap.add_argument("--check", action="store_true",
                    help="small products at one configuration that fits 32 KiB, subgroup "
                         "matrices emulated where the device lacks them: every variant must "
                         "compile and run, and base must match numpy")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="sgmat_ablation_"))
    files = variant_files(tmp)
    if args.only:
        files = {k: v for k, v in files.items() if k in args.only.split(",")}
    find = source.find_file
    source.find_file = lambda name: tmp / name if name in files.values() else find(name)
    dev = Device(None, robustness=False,   # as the trainer's devices
                 emulate_subgroup_matrix=True if args.check else None)
    print(dev, "tensor cores:", linear.has_tensor_cores(dev), flush=True)
    rng = np.random.default_rng(0)
    rows, failures = [], []
    for layout, w16, M, N, K, what in jobs(args.check):
        a = rng.standard_normal((K, M) if layout == "tn" else (M, K)).astype(np.float32)
        b = rng.standard_normal((N, K) if layout == "nt" else (K, N)).astype(np.float32)
        A, B = dev.upload(a), dev.upload(b.astype(np.float16) if w16 else b)
        A16 = dev.upload(a.astype(np.float16)) if args.a16 else None
        C = dev.zeros((M, N))
        if args.check:
            cfgs = [linear.SgmatConfig.parse("sg2x2-t2x2-k32-p8-s1-b1")]
        else:
            cfg = linear.choose_sgmat_config(dev, layout, B.dtype, M, N, K)
            extra = [with_suffix(cfg, e[1:]) if e.startswith("+")
                     else linear.SgmatConfig.parse(e) for e in args.extra.split(",") if e]
            cfgs = [cfg]
            for c in extra:
                why = c.problems(dev, layout)
                if why:
                    print(f"{what}: {c} skipped: {'; '.join(why)}", flush=True)
                elif str(c) != str(cfg):
                    cfgs.append(c)
        for c in cfgs:
            row = {"what": what, "layout": layout, "shape": [M, N, K], "config": str(c),
                   "us": {}}
            for (name, fname), a_buf in [(f, A) for f in files.items()] + (
                    [((n + "_a16", f), A16) for n, f in files.items()] if args.a16 else []):
                plan = linear.plan(dev, layout, M, N, K, b_dtype=B.dtype,
                                   operands=[a_buf, B, C], config=c, a_dtype=a_buf.dtype)
                plan = linear.Plan(plan.path, fname, plan.kernel, plan.config)
                def enc(rec, plan=plan, a_buf=a_buf):
                    linear._record_tiled(rec, plan, a_buf, B, linear.dummy(dev), C, M, N, K,
                                         0, 1.0, K if layout != "tn" else M,
                                         K if layout == "nt" else N, N, False)
                try:
                    t = dev.time_gpu(enc, min_warmup_s=args.warm_s)
                    row["us"][name] = round(t * 1e6, 2)
                except Exception as exc:
                    row["us"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    failures.append(f"{what} {c} {name}: {row['us'][name]}")
                    continue
                if args.check and name.startswith("base"):
                    got = dev.download(C).reshape(M, N)
                    a16, b16 = (x.astype(np.float16).astype(np.float64) for x in (a, b))
                    want = (a16.T if layout == "tn" else a16) @ (b16.T if layout == "nt" else b16)
                    err = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30))
                    row["check_rel_err"] = err
                    if not err < 1e-3:
                        failures.append(f"{what} {c} {name}: relative error {err:.2e}")
            flops = 2.0 * M * N * K
            row["tflops_base"] = (round(flops / row["us"]["base"] / 1e6, 1)
                                  if isinstance(row["us"]["base"], float) else None)
            print(what, row, flush=True)
            rows.append(row)
        for buf in (A, B, C) + ((A16,) if A16 is not None else ()):
            buf.destroy()
    names = list(rows[0]["us"]) if rows else list(files)
    lines = [f"# Tensor-core matmul ablation ({dev.info.summary()}, robustness off)", "",
             "GPU us per call (median of 10 after the warm-up); ablated kernels compute wrong "
             "products, only their times mean anything.", "",
             "| product | shape | config | base TFLOP/s | " + " | ".join(names) + " |",
             "|---|---|---|---:|" + "---:|" * len(names)]
    for r in rows:
        lines.append(f"| {r['what']} ({r['layout']}) | {'x'.join(map(str, r['shape']))} | "
                     f"{r['config']} | {r['tflops_base']} | "
                     + " | ".join(str(r["us"].get(n)) for n in names) + " |")
    (out / "sgmat_ablation.md").write_text("\n".join(lines) + "\n")
    (out / "sgmat_ablation.json").write_text(json.dumps(
        {"device": dev.info.summary(), "when": time.strftime("%Y-%m-%d %H:%M"), "rows": rows},
        indent=1))
    print("\n".join(lines))
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
