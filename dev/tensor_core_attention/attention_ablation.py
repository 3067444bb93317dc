"""Where the tensor-core attention's time goes: the trainer's kernels with parts taken out
(issues 21, 49).

    ISTANBUL_BACKEND=dawn python dev/tensor_core_attention/attention_ablation.py --out DIR [--repeats 10]
        [--layout head-major|fused] [--before DIR]

Needs Dawn on a GPU with f16 -> f32 subgroup matrices (the H200). At the 124M step's shape
(B 8, T 1024, H 12, D 64; q, k, v head-major [B, H, T, D] as the trainer keeps them, or
`--layout fused`: in the projection's fused qkv rows; o and do in token rows), robustness
off, it times the kernels the trainer runs (the staged forward of 05_attention_sgmat.wgsl,
the sgmat2 dQ and dK/dV of 05_attention_sgmat2.wgsl) as shipped and in copies of both files
with one part removed:

    base        as shipped
    fwd_pv_in_regs  the forward's per-tile o update without its read of the p @ v product
                from Ss and the barrier before it (multiplies and stores stay): the most
                that keeping o in subgroup matrices could save of that f32 round trip
    no_mma      every subgroupMatrixMultiplyAccumulate replaced by its accumulator (the
                matrix loads that fed it go too)
    no_exp      exp2 replaced by its argument (the softmax's special-function work)
    no_barrier  every workgroupBarrier() removed
    no_global   the tiles' global loads (q, k, v, do rows in the tile loops) replaced by loads
                of 8 cached addresses
    contiguous  (--layout fused) the same loads from rows laid out [B, H, T, D] (each head's
                rows contiguous, what an f32 copy in that layout would read)
    f16_in      the shipped files given f16 q, k, v (the trainer's f16 head-major copies;
                the backward's prep writes do16): what the f16_loads ablation of session
                19 estimated (dev/RESULTS.md), now real and checked by the ladder; the
                tiles' f16 rows read as their bits (vec2<u32>)
    before      (--before DIR) the two files as found in DIR: an earlier version, timed in
                the same rounds
    qdown       the shipped files with dK/dV's query tiles visited from the last down
                (ops.SGMAT2_QORDER "down"; outputs right, the ladder checks them)
    f16_in_wide_base, f16_in_wide_w4, f16_in_wide_w8, f16_in_wide_w4x2
                f16_in with the backward's dQ and dK/dV width set (ops.SGMAT2_WIDE_DEFAULT,
                what backward() runs when nothing is pinned or tuned; f16_in itself runs
                the shipped default, "w8"): the 64-row kernels, the wide ones' 64-row form,
                128 rows as 8 subgroups x 16, or 4 subgroups x 32 (outputs right, the
                ladder checks them)

The ablated kernels compute wrong results; only their times mean anything. Writes
DIR/attention_ablation.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from istanbul.shaders import source  # noqa: E402
from istanbul.shaders.engine import Device  # noqa: E402
from istanbul.shaders.kernels.attention import ops as attention  # noqa: E402

B, T, H, HKV, D = 8, 1024, 12, 12, 64
FILES = (attention.FILE_SGMAT, attention.FILE_SGMAT2)
MMA = re.compile(r"(\w+(?:\[[^\]]+\])?) = subgroupMatrixMultiplyAccumulate\([^;]*\);")
GLOBAL = re.compile(r"(?:narrow\(|vec4<f16>\(widen\()(k_in|v_in|q_in|do_in)\[[^;]*\);")
ROW_LOAD = re.compile(r"(k_in|v_in|q_in|do_in)\[(?:kv_row|q_row|o_row)\(b, ([^,]+), [^\]]*?\) "
                      r"\+ i % H4\]")


def ablate(name: str, text: str) -> str:
    if name == "base":
        return text
    if name == "no_mma":
        return MMA.sub(lambda m: f"{m.group(1)} = {m.group(1)};", text)
    if name == "no_exp":
        return text.replace("exp2(", "(")
    if name == "no_barrier":
        return text.replace("workgroupBarrier();", "")
    if name == "no_global":
        # the binding stays in use (an unused one leaves the pipeline's layout), read at 8
        # addresses that stay in cache
        return GLOBAL.sub(lambda m: f"narrow({m.group(1)}[lid & 7u]);", text)
    if name == "fwd_pv_in_regs":
        # the forward's per-tile o update reads nothing of the p @ v product in Ss, and the
        # barrier before that read goes (the product's multiplies and stores stay: the
        # stores are visible to the workgroup, so none is optimised away): what keeping o
        # in subgroup matrices could save of the f32 round trip at most
        read = ("        workgroupBarrier();\n"
                "        // o[c] is column (HD / 2) half + (c + lane) % (HD / 2), read rotated as sv above\n"
                "        for (var c = 0u; c < {{HD}}u / 2u; c++) {   // @unroll\n"
                "            o[c] = alpha * o[c] + Ss[r * 64u + (HD / 2u) * half + ((c + lane) % (HD / 2u))];\n")
        return text.replace(read, read.split("\n", 1)[1].replace(
            " + Ss[r * 64u + (HD / 2u) * half + ((c + lane) % (HD / 2u))]", ""))
    if name == "contiguous":
        # the same bytes per tile, as if each (batch, head) had its rows of HD contiguous
        # ([B, H, T, D]) instead of every head row at the fused qkv rows' stride
        return ROW_LOAD.sub(lambda m: f"{m.group(1)}[(wg.x * p.seq + ({m.group(2)})) * H4 + i % H4]",
                            text)
    raise ValueError(name)


VARIANTS = ("base", "no_mma", "no_exp", "no_barrier", "no_global", "fwd_pv_in_regs",
            "contiguous", "f16_in",
            "before", "qdown", "f16_in_wide_base", "f16_in_wide_w4",
            "f16_in_wide_w8", "f16_in_wide_w4x2")
# variants that set ops.py knobs, not the text: (module, attribute, value) each
KNOBS = {"qdown": ((attention, "SGMAT2_QORDER", "down"),),
         **{f"f16_in_wide_{w}": ((attention, "SGMAT2_WIDE_DEFAULT", w),)
            for w in ("base", "w4", "w8", "w4x2")}}
AS_SHIPPED = {"f16_in"}                         # variants of the inputs, not the text
ONE_FILE = {"fwd_pv_in_regs"}                   # variants of the forward's file alone


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="base,no_mma,no_exp,no_barrier,no_global,f16_in")
    ap.add_argument("--layout", choices=("head-major", "fused"), default="head-major")
    ap.add_argument("--before", help="a folder with earlier versions of the two files (the "
                    "`before` variant, added when given)")
    args = ap.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if args.before and "before" not in variants:
        variants.append("before")
    if "base" not in variants or set(variants) - set(VARIANTS):
        raise SystemExit(f"--variants: base and any of {', '.join(VARIANTS)}")
    if "before" in variants and not args.before:
        raise SystemExit("the `before` variant needs --before DIR")
    if "contiguous" in variants and args.layout != "fused":
        raise SystemExit("the `contiguous` variant is a --layout fused experiment")
    if any(v.startswith("f16_in") for v in variants) and args.layout != "head-major":
        raise SystemExit("the `f16_in` variant is a --layout head-major experiment")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="attention_ablation_"))
    originals = {f: source.find_file(f) for f in FILES}
    for v in variants:
        (tmp / v).mkdir()
        for f, path in originals.items():
            text = path.read_text(encoding="utf-8")
            if v == "before":
                (tmp / v / f).write_text((Path(args.before) / f).read_text(encoding="utf-8"),
                                         encoding="utf-8")
                continue
            if v in KNOBS or v in AS_SHIPPED:
                (tmp / v / f).write_text(text, encoding="utf-8")
                continue
            body = ablate(v, text)
            if v != "base" and body == text and v not in ONE_FILE:
                raise SystemExit(f"variant {v} changed nothing in {f}")
            (tmp / v / f).write_text(body, encoding="utf-8")
    current = {"variant": "base"}
    find = source.find_file
    source.find_file = lambda name: (tmp / current["variant"] / name if name in originals
                                     else find(name))
    dev = Device(None, robustness=False)
    print(dev, flush=True)
    rng = np.random.default_rng(0)
    do = dev.upload(rng.standard_normal((B, T, H, D), dtype=np.float32))
    o, lse = dev.empty((B, T, H, D)), dev.empty((B, H, T))
    if args.layout == "fused":
        width = (H + 2 * HKV) * D
        qkv = dev.upload(rng.standard_normal((B * T, width), dtype=np.float32))
        q, k, v = (qkv.elements(o, B * T * width - o) for o in (0, H * D, (H + HKV) * D))
        strides = {"q_stride": width, "kv_stride": width}
        grads = dev.zeros((B * T, width))
        dq, dk, dv = (grads.elements(o_, B * T * width - o_) for o_ in (0, H * D, (H + HKV) * D))
    else:   # the trainer's: head-major q, k, v and their gradients
        q = dev.upload(rng.standard_normal((B, H, T, D), dtype=np.float32))
        k, v = (dev.upload(rng.standard_normal((B, HKV, T, D), dtype=np.float32))
                for _ in range(2))
        strides = {"q_stride": attention.head_major(T, H, D),
                   "kv_stride": attention.head_major(T, HKV, D)}
        dq, dk, dv = dev.zeros((B, H, T, D)), dev.zeros((B, HKV, T, D)), dev.zeros((B, HKV, T, D))
    inputs = {"f32": (q, k, v)}
    if any(v.startswith("f16_in") for v in variants):
        inputs["f16"] = tuple(dev.upload(dev.download(x), dtype=np.float16) for x in (q, k, v))

    def step(rec):
        qkv = inputs["f16" if current["variant"].startswith("f16_in") else "f32"]
        attention.forward(rec, *qkv, o, lse, B, T, H, HKV, D, config="sgmat", **strides)
        attention.backward(rec, *qkv, o, do, lse, dq, dk, dv, B, T, H, HKV, D,
                           tensor_cores=True, **strides)

    kernels = {}
    defaults = {(module, attr): getattr(module, attr)
                for knobs in KNOBS.values() for module, attr, _ in knobs}

    def use(name):   # the variant's source files and module knobs
        current["variant"] = name
        for (module, attr), value in defaults.items():
            setattr(module, attr, value)
        for module, attr, value in KNOBS.get(name, ()):
            setattr(module, attr, value)

    for name in list(variants):   # compile every variant first (each its own kernels)
        use(name)
        dev._kernels.clear()
        source.load_file.cache_clear()
        try:
            with dev.record() as rec:
                step(rec)
            dev.sync()
        except Exception as exc:   # one variant that does not build leaves the others timed
            print(f"variant {name} dropped: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
            variants.remove(name)
            continue
        kernels[name] = dict(dev._kernels)
    samples = {name: [] for name in variants}
    for _ in range(args.rounds):   # interleaved rounds: clock drift hits every variant alike
        for name in variants:
            use(name)
            dev._kernels.clear()
            dev._kernels.update(kernels[name])
            for _ in range(3):
                with dev.record() as rec:
                    step(rec)
            dev.sync()
            for _ in range(args.repeats):
                with dev.record(timing=True) as rec:
                    step(rec)
                acc = {}
                for label, s in rec.gpu_times:
                    acc[label] = acc.get(label, 0.0) + s * 1e3
                samples[name].append(acc)
    result = {name: {lab: float(np.median([r[lab] for r in runs])) for lab in runs[0]}
              for name, runs in samples.items()}
    labels = list(dict.fromkeys(lab for r in result.values() for lab in r if "sgmat" in lab))
    lines = [f"# Tensor-core attention ablation (B {B}, T {T}, H {H}, D {D}, {args.layout}; "
             f"{dev.info.summary()}, robustness off)", "",
             "ms per layer call (GPU timestamps, median); ablated kernels compute wrong "
             "results, only their times mean anything.", "",
             "| kernel | " + " | ".join(variants) + " |", "|---|" + "---:|" * len(variants)]
    for lab in labels:
        lines.append(f"| {lab} | " + " | ".join(f"{result[n].get(lab, float('nan')):.3f}"
                                                 for n in variants) + " |")
    (out / "attention_ablation.md").write_text("\n".join(lines) + "\n")
    (out / "attention_ablation.json").write_text(json.dumps(result, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
