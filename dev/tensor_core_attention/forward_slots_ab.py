"""Is a version of the tensor-core forward faster than an earlier one, and as exact? (issue 49;
written for the forward staged in 8-half slots, the branch forward-slots, against the scalar
f16 staging it would have replaced)

    ISTANBUL_BACKEND=dawn python dev/tensor_core_attention/forward_slots_ab.py \\
        --before OLD.wgsl --out DIR [--rounds 5] [--repeats 10]

`--before` is an earlier 05_attention_sgmat.wgsl (e.g. `git show 5784ca2:shaders/kernels/
attention/05_attention_sgmat.wgsl`); the shipped one is "new". At the 124M step's shape (B 8,
T 1024, H 12, D 64; q, k, v head-major in f16 as the trainer keeps them; robustness off), both
forwards run on the same inputs: their o and lse are compared with each other and, on
`--check-heads` (b, h) pairs, with a float64 numpy reference; then each is timed with GPU
timestamps in interleaved rounds (median ms per call). `--smoke` runs a small shape on
emulated subgroup matrices (a CPU check of the script). Writes DIR/forward_slots_ab.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from istanbul.shaders import source  # noqa: E402
from istanbul.shaders.engine import Device  # noqa: E402
from istanbul.shaders.kernels.attention import ops as attention  # noqa: E402


def reference(q, k, v, scale):
    """o, lse (natural log) of causal attention for one head: q [T, D], k, v [T, D] (f64)."""
    s = (q @ k.T) * scale
    s[np.triu_indices(len(q), 1)] = -np.inf
    mx = s.max(axis=1, keepdims=True)
    e = np.exp(s - mx)
    total = e.sum(axis=1, keepdims=True)
    return (e / total) @ v, (mx + np.log(total))[:, 0]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--check-heads", type=int, default=3)
    ap.add_argument("--smoke", action="store_true",
                    help="B 1, T 80, H 2, D 16 on emulated subgroup matrices")
    args = ap.parse_args(argv)
    B, T, H, D = (1, 80, 2, 16) if args.smoke else (8, 1024, 12, 64)
    tmp = Path(tempfile.mkdtemp(prefix="forward_slots_ab_"))
    name = attention.FILE_SGMAT
    for variant, text in (("old", args.before.read_text(encoding="utf-8")),
                          ("new", source.find_file(name).read_text(encoding="utf-8"))):
        (tmp / variant).mkdir()
        (tmp / variant / name).write_text(text, encoding="utf-8")
    current = {"variant": "new"}
    find = source.find_file
    source.find_file = lambda n: tmp / current["variant"] / n if n == name else find(n)
    dev = Device(None, robustness=False, emulate_subgroup_matrix=args.smoke)
    print(dev, flush=True)
    rng = np.random.default_rng(0)
    host = [rng.standard_normal((B, H, T, D), dtype=np.float32).astype(np.float16)
            for _ in range(3)]
    q, k, v = (dev.upload(x, dtype=np.float16) for x in host)
    strides = {"q_stride": attention.head_major(T, H, D), "kv_stride": attention.head_major(T, H, D)}
    o, lse = dev.empty((B, T, H, D)), dev.empty((B, H, T))
    scale = 1 / np.sqrt(D)

    def forward(rec):
        attention.forward(rec, q, k, v, o, lse, B, T, H, H, D, config="sgmat", **strides)

    kernels, outputs = {}, {}
    for variant in ("old", "new"):   # compile each, keep its kernels and its outputs
        current["variant"] = variant
        dev._kernels.clear()
        source.load_file.cache_clear()
        with dev.record() as rec:
            forward(rec)
        dev.sync()
        kernels[variant] = dict(dev._kernels)
        outputs[variant] = (dev.download(o).reshape(B, T, H, D), dev.download(lse).reshape(B, H, T))
    result = {"shape": {"B": B, "T": T, "H": H, "D": D}, "adapter": dev.info.summary(),
              "o_max_abs_new_vs_old": float(np.abs(outputs["new"][0] - outputs["old"][0]).max()),
              "lse_max_abs_new_vs_old": float(np.abs(outputs["new"][1] - outputs["old"][1]).max()),
              "reference": {}}
    picks = [(int(rng.integers(B)), int(rng.integers(H))) for _ in range(args.check_heads)]
    for variant in ("old", "new"):
        errs = []
        for b, h in picks:
            want_o, want_lse = reference(*(x[b, h].astype(np.float64) for x in host), scale)
            got_o, got_lse = outputs[variant][0][:, :, h][b], outputs[variant][1][b, h]
            errs.append((float(np.abs(got_o - want_o).max()),
                         float(np.abs(got_lse - want_lse).max())))
        result["reference"][variant] = {"o_max_abs": max(e[0] for e in errs),
                                        "lse_max_abs": max(e[1] for e in errs)}
    print(json.dumps(result), flush=True)
    samples = {"old": [], "new": []}
    for _ in range(args.rounds):   # interleaved rounds: clock drift hits both alike
        for variant in ("old", "new"):
            current["variant"] = variant
            dev._kernels.clear()
            dev._kernels.update(kernels[variant])
            for _ in range(3):
                with dev.record() as rec:
                    forward(rec)
            dev.sync()
            for _ in range(args.repeats):
                with dev.record(timing=True) as rec:
                    forward(rec)
                samples[variant].append(sum(s for label, s in rec.gpu_times
                                            if "sgmat" in label) * 1e3)
    flops = 4.0 * B * H * T * T * D / 2   # causal: half of q k^T and p v
    result["ms"] = {vname: float(np.median(x)) for vname, x in samples.items()}
    result["ms_range"] = {vname: [float(min(x)), float(max(x))] for vname, x in samples.items()}
    result["tflops"] = {vname: flops / (ms * 1e-3) / 1e12 for vname, ms in result["ms"].items()}
    lines = ["# Tensor-core forward: the tree's (new) vs --before (old)", "",
             f"{result['adapter']}; B {B}, T {T}, H {H}, D {D}, f16 head-major q, k, v, "
             f"robustness off; {args.rounds} interleaved rounds of {args.repeats} calls, "
             "GPU timestamps.", "",
             "| kernel | ms per call (median) | min-max | TFLOP/s (causal) | "
             "o max abs vs float64 | lse max abs |", "|---|---:|---:|---:|---:|---:|"]
    for vname in ("old", "new"):
        ref = result["reference"][vname]
        lo, hi = result["ms_range"][vname]
        lines.append(f"| {vname} | {result['ms'][vname]:.4f} | {lo:.4f}-{hi:.4f} | "
                     f"{result['tflops'][vname]:.1f} | {ref['o_max_abs']:.2e} | "
                     f"{ref['lse_max_abs']:.2e} |")
    lines += ["", f"new / old time: {result['ms']['new'] / result['ms']['old']:.3f}; "
              f"o new vs old max abs {result['o_max_abs_new_vs_old']:.2e}, lse "
              f"{result['lse_max_abs_new_vs_old']:.2e}"]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "forward_slots_ab.md").write_text("\n".join(lines) + "\n")
    (args.out / "forward_slots_ab.json").write_text(json.dumps(result, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
