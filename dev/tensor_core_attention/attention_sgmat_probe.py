"""The 124M step's attention (B 8, T 1024, H 12, D 64, q/k/v in the fused qkv rows) on each
kernel family, GPU timestamps per dispatch, in one device session (issue 21).

    ISTANBUL_BACKEND=dawn python dev/tensor_core_attention/attention_sgmat_probe.py --out DIR [--repeats 10]

Families: "tiled" (the f32 forward and backward, 05_attention_tiled.wgsl), "staged"
(05_attention_sgmat.wgsl: the first tensor-core forward/dQ/dK/dV), "model" (what the trainer
runs without robustness: the staged forward and the sgmat2 backward), "v2" (the f32 tiled
forward, then 05_attention_sgmat2.wgsl's backward: bank-spread score reads, fewer barriers)
with its default tiles and with small tiles ("v2-small": 16-key dQ, 16-query dK/dV tiles;
"v2-bk16": 16-key dQ tiles only). (05_attention_sgmat2.wgsl's own forward, timed and
diagnosed here in round 4, is retired: wrong on the H100 and the H200.) Robustness off, as
the trainer runs (PROBE_ROBUSTNESS=on for Dawn's bounds checks). Families are timed in
interleaved rounds.
Each family's outputs are compared with the f32 tiled kernels' (cosine, max abs error).
Writes DIR/attention_sgmat.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from istanbul.shaders.engine import Device  # noqa: E402
from istanbul.shaders.kernels.attention import ops as attention  # noqa: E402

B, T, H, HKV, D = 8, 1024, 12, 12, 64
SMALL = {"BK": 16, "BQ2": 16}


def per_kernel(dev, encode, repeats):
    """{label: median ms over repeats} and the median total, one timed recording per repeat."""
    for _ in range(3):
        with dev.record() as rec:
            encode(rec)
    dev.sync()
    runs = []
    for _ in range(repeats):
        with dev.record(timing=True) as rec:
            encode(rec)
        acc = {}
        for label, s in rec.gpu_times:
            acc[label] = acc.get(label, 0.0) + s * 1e3
        runs.append(acc)
    labels = list(runs[0])
    out = {lab: float(np.median([r[lab] for r in runs])) for lab in labels}
    out["total"] = float(np.median([sum(r.values()) for r in runs]))
    return out


def compare(a, b):
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    cos = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-300))
    return {"cos": cos, "max_abs": float(np.max(np.abs(a - b))),
            "max_ref": float(np.max(np.abs(b)))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--families", default="tiled,staged,v2,v2-small,v2-bk16")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dev = Device(robustness=os.environ.get("PROBE_ROBUSTNESS") == "on")
    print(dev.info.name, dev.backend.name, "robustness", dev.robustness, flush=True)
    rng = np.random.default_rng(0)
    width = (H + 2 * HKV) * D
    qkv = dev.upload(rng.standard_normal((B * T, width), dtype=np.float32))
    q, k, v = (qkv.elements(o, B * T * width - o) for o in (0, H * D, (H + HKV) * D))
    do = dev.upload(rng.standard_normal((B, T, H, D), dtype=np.float32))
    strides = {"q_stride": width, "kv_stride": width}
    o, lse = dev.empty((B, T, H, D)), dev.empty((B, H, T))
    grads = dev.zeros((B * T, width))
    dq, dk, dv = (grads.elements(o_, B * T * width - o_) for o_ in (0, H * D, (H + HKV) * D))

    def run(fwd_kw, bwd_kw):
        def fwd(rec):
            attention.forward(rec, q, k, v, o, lse, B, T, H, HKV, D, **strides, **fwd_kw)

        def bwd(rec):
            attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H, HKV, D,
                               **strides, **bwd_kw)
        return fwd, bwd

    families = {
        "tiled": ({}, {}),
        "staged": ({"config": "sgmat"}, {"tensor_cores": "staged"}),
        # what the trainer runs without robustness: the staged forward, the sgmat2 backward
        "model": ({"config": "sgmat"}, {"tensor_cores": True}),
        "v2": ({}, {"tensor_cores": "sgmat2-backward"}),
        "v2-small": ({}, {"tensor_cores": "sgmat2-backward", "sgmat_tiles": SMALL}),
        "v2-bk16": ({}, {"tensor_cores": "sgmat2-backward", "sgmat_tiles": {"BK": 16}}),
    }
    fams = args.families.split(",")
    results, outputs, rounds = {}, {}, {}
    for name in fams:
        fwd, bwd = run(*families[name])
        try:
            with dev.record() as rec:
                fwd(rec)
            outs = {"o": dev.download(o), "lse": dev.download(lse)}
            with dev.record() as rec:
                bwd(rec)
            g = dev.download(grads).reshape(B * T, width)
            outs.update(dq=g[:, :H * D].copy(), dk=g[:, H * D:(H + HKV) * D].copy(),
                        dv=g[:, (H + HKV) * D:].copy())
            outputs[name] = outs
        except Exception as exc:   # one family failing must not hide the others
            print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:2000]}", flush=True)
            results[name] = {"error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
            continue
        results[name] = {}
        if name != "tiled" and "tiled" in outputs:
            results[name]["vs_tiled"] = {key: compare(val, outputs["tiled"][key])
                                         for key, val in outs.items()}
        rounds[name] = (fwd, bwd)
    # interleaved rounds: drift of the GPU's clocks hits every family alike
    samples = {name: {"forward": [], "backward": []} for name in rounds}
    for _ in range(args.rounds):
        for name, (fwd, bwd) in rounds.items():
            samples[name]["forward"].append(per_kernel(dev, fwd, args.repeats))
            samples[name]["backward"].append(per_kernel(dev, bwd, args.repeats))
    for name, passes in samples.items():
        for pass_, runs in passes.items():
            if runs:
                results[name][pass_] = {lab: float(np.median([r[lab] for r in runs]))
                                        for lab in runs[0]}
                results[name][pass_ + "_rounds_total"] = [r["total"] for r in runs]
        print(name, json.dumps(results[name]), flush=True)
    lines = [f"# Attention at the 124M step's shape (B {B}, T {T}, H {H}, D {D}), "
             f"{dev.info.name}, {dev.backend.name}, robustness {dev.robustness}", "",
             "GPU timestamps, median of the repeats, ms per call (x12 for a step).", "",
             "| family | pass | kernel | ms |", "|---|---|---|---:|"]
    for name, res in results.items():
        for pass_ in ("forward", "backward"):
            for label, ms in res.get(pass_, {}).items():
                lines.append(f"| {name} | {pass_} | {label} | {ms:.3f} |")
    lines += ["", "| family | output | cosine vs f32 tiled | max abs error | max abs ref |",
              "|---|---|---:|---:|---:|"]
    for name, res in results.items():
        for key, c in res.get("vs_tiled", {}).items():
            lines.append(f"| {name} | {key} | {c['cos']:.7f} | {c['max_abs']:.3g} | "
                         f"{c['max_ref']:.3g} |")
    (args.out / "attention_sgmat.md").write_text("\n".join(lines) + "\n")
    (args.out / "attention_sgmat.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
