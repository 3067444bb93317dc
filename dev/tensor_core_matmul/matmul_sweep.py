"""One short GPU run that says which tiled-kernel configurations win at the 124M shapes.

    python dev/tensor_core_matmul/matmul_sweep.py --out dev/results/h200/sweep [--budget-s 160] [--save]
                                 [--adapter A]

For representative shapes of one 124M training step (8 x 1024 tokens) it times, with GPU
timestamps, a wide set of configurations of the tiled matmuls (register blocks 8x8/8x4/4x8/
4x4, 64- to 256-wide tiles, slice depths 8/16/32, split-K 1..8, the packed-f16 kernel's
fold lengths) next to the general kernel, and every tile shape of
the tiled attention kernels; then writes OUT/sweep.md (per shape: the ranking with TFLOP/s,
the default's place) and OUT/sweep.json (every time). The whole run stops timing new
candidates once --budget-s seconds have passed (what was not timed is listed as such), so it
fits one short device session. --save also stores each shape's winner in the adapter's
autotune cache.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from istanbul.shaders import autotune, tuned_cache  # noqa: E402
from istanbul.shaders.engine import Device  # noqa: E402
from istanbul.shaders.kernels.matmul import ops as linear  # noqa: E402

ATTENTION_SHARE = 0.17


def matmul_jobs(tokens: int = 8 * 1024, d: int = 768, ffn2: int = 4096, vocab: int = 50304):
    """(kernel key, (M, N, K), candidate set, share of the budget), most important first."""
    return [
        ("nt", (tokens, ffn2, d), "wide", 0.13),        # gate|up forward
        ("tn", (d, d, tokens), "wide", 0.12),           # q/k/v/o dW: thin, split-K territory
        ("nn", (tokens, d, ffn2), "wide", 0.12),        # gate|up dX
        ("nt_h16", (tokens, ffn2, d), "folds", 0.10),   # packed-f16 forward
        ("nt", (tokens, d, d), "narrow", 0.06),         # q/k/v/o forward
        ("tn", (ffn2, d, tokens), "narrow", 0.06),      # gate|up dW
        ("nt_w16", (tokens, ffn2, d), "narrow", 0.05),
        ("nt", (tokens, vocab, d), "narrow", 0.08),     # head forward
        ("nn", (tokens, d, vocab), "narrow", 0.06),     # head dX
    ]


FULL = dict(jobs=matmul_jobs(), attention=dict(B=8, T=1024, H=12, Hkv=12, D=64))
# --small: the same code paths at shapes software Vulkan runs in seconds (a smoke test)
SMALL = dict(jobs=matmul_jobs(tokens=128, d=64, ffn2=128, vocab=256),
             attention=dict(B=1, T=64, H=2, Hkv=1, D=16))


def matmul_candidates(device, key, shape, kind) -> list[str]:
    M, N, K = shape
    if kind == "wide":
        cands = linear.candidate_configs(device, key, M, N, K, wide=True)
    elif kind == "folds":   # every FOLD of each candidate
        cands, seen = [], set()
        for cfg in linear.candidate_configs(device, key, M, N, K):
            for fold in linear.H16_FOLDS:
                c = dataclasses.replace(cfg, fold=fold)
                if str(c) not in seen and not c.problems(device, True):
                    seen.add(str(c))
                    cands.append(c)
    else:
        cands = linear.candidate_configs(device, key, M, N, K)
    default = linear.default_config(device, key, M, N, K)
    texts = [str(default)] + [str(c) for c in cands if str(c) != str(default)]
    return texts


def general_time(device, key, shape) -> float:
    """The general kernel (03_linear.wgsl) at its default tiles, for reference."""
    M, N, K = shape
    layout, b16 = key[:2], key.endswith(("w16", "h16"))
    rng = np.random.default_rng(1)
    a, b, out = autotune.matmul_operands(device, layout, b16, M, N, K, rng)
    tiles = linear.default_tiles(M, N, K)
    try:
        return device.time_gpu(lambda rec: linear.matmul(
            rec, a, b, out, M, N, K, layout=layout, f16_math=key.endswith("h16"), tiles=tiles),
            repeats=3, warmup=1)
    finally:
        for buf in (a, b, out):
            buf.destroy()


def time_matmul(device, key, shape, candidates, budget_s):
    M, N, K = shape
    layout = key[:2]
    b16 = key.endswith(("w16", "h16"))
    rng = np.random.default_rng(0)
    a, b, out = autotune.matmul_operands(device, layout, b16, M, N, K, rng)
    flops = 2.0 * M * N * K
    repeats = int(min(10, max(3, 0.05 / (flops / 1e13))))

    def encode_for(text):
        cfg = linear.MatmulConfig.parse(text)
        return lambda rec: linear.matmul(rec, a, b, out, M, N, K, layout=layout,
                                         f16_math=key.endswith("h16"),
                                         accumulate=layout == "tn", config=cfg)
    try:
        return autotune.time_candidates(device, candidates, encode_for, repeats=repeats,
                                        warmup=1, budget_s=budget_s)
    finally:
        for buf in (a, b, out):
            buf.destroy()


def ranking_lines(title, times, flops, default, extra=None) -> list[str]:
    lines = [f"### {title}", "", "| rank | config | us | TFLOP/s | vs best |", "|---:|---|---:|---:|---:|"]
    finite = sorted((t, c) for c, t in times.items() if math.isfinite(t))
    best = finite[0][0] if finite else math.nan
    for rank, (t, c) in enumerate(finite, 1):
        mark = " (default)" if c == default else ""
        if rank <= 12 or c == default:
            lines.append(f"| {rank} | {c}{mark} | {t * 1e6:.1f} | {flops / t / 1e12:.2f} | "
                         f"{t / best:.2f}x |")
    skipped = [c for c, t in times.items() if not math.isfinite(t)]
    if extra:
        lines.append(f"| - | {extra[0]} | {extra[1] * 1e6:.1f} | {flops / extra[1] / 1e12:.2f} | "
                     f"{extra[1] / best:.2f}x |")
    lines.append("")
    lines.append(f"{len(finite)} timed" + (f"; not timed or failed: {len(skipped)}"
                                           if skipped else "") + ".")
    lines.append("")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, metavar="DIR")
    ap.add_argument("--budget-s", type=float, default=160.0,
                    help="seconds of timing in total (default 160)")
    ap.add_argument("--save", action="store_true",
                    help="store each shape's winner in the adapter's autotune cache")
    ap.add_argument("--small", action="store_true",
                    help="tiny shapes (a smoke test of the script on software Vulkan)")
    ap.add_argument("--adapter", default=None)
    args = ap.parse_args(argv)
    setup = SMALL if args.small else FULL
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = Device(args.adapter)
    start = time.perf_counter()
    print(f"# matmul/attention sweep on {device.info.summary()}", flush=True)
    md = [f"# tiled-kernel sweep — {device.info.name} ({device.info.backend}, "
          f"{device.info.driver})", "",
          "Times with GPU timestamps (median). `vs best`: time relative to the fastest. "
          "The general-kernel row is 03_linear.wgsl at its default tiles.", ""]
    results, entries = [], {}
    matmul_budget = args.budget_s * (1.0 - ATTENTION_SHARE)   # the rest is attention's
    for key, shape, kind, share in setup["jobs"]:
        if "h16" in key and not device.has("shader-f16"):
            continue
        elapsed = time.perf_counter() - start
        if elapsed > matmul_budget:
            print(f"# budget spent: skipping matmul {key} {shape}")
            continue
        cands = matmul_candidates(device, key, shape, kind)
        budget = min(share * args.budget_s * 1.5, matmul_budget - elapsed)
        t0 = time.perf_counter()
        times = time_matmul(device, key, shape, cands, budget)
        general = None
        if time.perf_counter() - start < matmul_budget and kind != "folds":
            try:
                general = ("general kernel " + "x".join(map(str, linear.default_tiles(*shape))),
                           general_time(device, key, shape))
            except Exception as exc:  # the reference row is optional
                print(f"#   general kernel: {exc}")
        flops = 2.0 * shape[0] * shape[1] * shape[2]
        default = cands[0]
        finite = {c: t for c, t in times.items() if math.isfinite(t)}
        if finite:
            best = min(finite, key=finite.get)
            print(f"# matmul {key:<7} {tuned_cache.shape_key(shape):<18} best {best:<22} "
                  f"{flops / finite[best] / 1e12:6.2f} TFLOP/s; default {default} "
                  f"{flops / times[default] / 1e12 if math.isfinite(times.get(default, math.inf)) else 0:6.2f}; "
                  f"{len(finite)}/{len(cands)} timed in {time.perf_counter() - t0:.0f}s", flush=True)
            entries[f"matmul/{key}/{tuned_cache.shape_key(shape)}"] = autotune.entry_from_times(
                times, flops)
        md += ranking_lines(f"matmul {key} {tuned_cache.shape_key(shape)} ({kind})", times,
                            flops, default, general)
        results.append({"op": "matmul", "key": key, "shape": shape, "kind": kind,
                        "default": default,
                        "times_us": {c: (t * 1e6 if math.isfinite(t) else None)
                                     for c, t in times.items()},
                        "general_us": general[1] * 1e6 if general else None})

    a = setup["attention"]
    for i, kernel in enumerate(("forward", "dq", "dkv")):
        remaining = args.budget_s - (time.perf_counter() - start)
        if remaining <= 0:
            print(f"# budget spent: skipping attention {kernel}")
            continue
        t0 = time.perf_counter()
        entry = autotune.tune_attention(device, kernel, **a, budget_s=remaining / (3 - i))
        times = {c: (t / 1e6 if t is not None else math.inf)
                 for c, t in entry["candidates"].items()}
        flops = entry.get("tflops", 0) * 1e12 * entry["us"] / 1e6
        print(f"# attention {kernel:<7} best {entry['config']} {entry['us']:.1f} us "
              f"({entry.get('tflops', 0):.2f} TFLOP/s); default {entry['default']} "
              f"{entry.get('default_us', float('nan')):.1f} us; "
              f"{time.perf_counter() - t0:.0f}s", flush=True)
        entries[f"attention/{kernel}/{tuned_cache.shape_key((a['T'], a['D']))}"] = entry
        md += ranking_lines(f"attention {kernel} B{a['B']} T{a['T']} H{a['H']} D{a['D']} "
                            "(dq/dkv timed inside the whole backward)", times, flops,
                            entry["default"])
        results.append({"op": "attention", "key": kernel, "shape": [a["T"], a["D"]],
                        "default": entry["default"], "times_us": entry["candidates"]})

    total = time.perf_counter() - start
    md.append(f"Total {total:.0f} s.")
    (out / "sweep.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    payload = {"device": {"adapter": device.info.name, "backend": device.info.backend,
                          "driver": device.info.driver}, "seconds": total, "results": results}
    (out / "sweep.json").write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    if args.save and entries:
        path = tuned_cache.save(device, entries)
        print(f"# cache: {path}")
    print(f"# wrote {out / 'sweep.md'} and {out / 'sweep.json'} in {total:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
