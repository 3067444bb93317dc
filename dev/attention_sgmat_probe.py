"""The 124M step's attention (B 8, T 1024, H 12, D 64, q/k/v in the fused qkv rows) on each
kernel family, GPU timestamps per dispatch, in one device session (issue 21).

    ISTANBUL_BACKEND=dawn python dev/attention_sgmat_probe.py --out DIR [--repeats 10]

Families: "tiled" (the f32 forward and backward, 05_attention_tiled.wgsl), "staged"
(05_attention_sgmat.wgsl: the first tensor-core forward/dQ/dK/dV), "model" (what the trainer
runs without robustness: the staged forward and the sgmat2 backward), "v2"
(05_attention_sgmat2.wgsl: lazy rescaling, bank-spread score reads, fewer barriers) with its
default tiles, with small tiles ("v2-small": 32-key forward, 16-key dQ, 16-query dK/dV tiles;
"v2-bk16": 16-key dQ tiles only), and with RESCALE_AT 0 ("v2-rescale0":
a fold at every rise of a row's max). Robustness off, as the trainer runs
(PROBE_ROBUSTNESS=on for Dawn's bounds checks). Families are timed in interleaved rounds.
Each family's outputs are compared with the f32 tiled kernels' (cosine, max abs error).
Writes DIR/attention_sgmat.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from istanbul.shaders.engine import Device  # noqa: E402
from istanbul.shaders.kernels.attention import ops as attention  # noqa: E402

B, T, H, HKV, D = 8, 1024, 12, 12, 64
SMALL = {"BKF": 32, "BK": 16, "BQ2": 16}


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


def diag(dev):
    """v2 forward vs tiled at shapes between the ladder's and the step's."""
    rng = np.random.default_rng(1)
    for b, t, h, fused in ((1, 1024, 2, False), (1, 1024, 2, True), (1, 1024, 12, True),
                           (8, 1024, 1, True), (2, 256, 12, False), (8, 1024, 12, True)):
        width = 3 * h * D if fused else h * D
        if fused:
            qkv = dev.upload(rng.standard_normal((b * t, width), dtype=np.float32))
            q, k, v = (qkv.elements(o_, b * t * width - o_) for o_ in (0, h * D, 2 * h * D))
            st = {"q_stride": width, "kv_stride": width}
        else:
            q, k, v = (dev.upload(rng.standard_normal((b, t, h, D), dtype=np.float32))
                       for _ in range(3))
            st = {}
        got = {}
        for name, kw in (("tiled", {}), ("v2", {"tensor_cores": "sgmat2"}),
                         ("v2 again", {"tensor_cores": "sgmat2"})):
            o, lse = dev.zeros((b, t, h, D)), dev.zeros((b, h, t))
            with dev.record() as rec:
                attention.forward(rec, q, k, v, o, lse, b, t, h, h, D, **st, **kw)
            got[name] = (dev.download(o).reshape(b, t, h, D), dev.download(lse).reshape(b, h, t))
        ref_o, ref_l = got["tiled"]
        for name in ("v2", "v2 again"):
            go, gl = got[name]
            err = np.abs(go - ref_o).max(axis=-1)            # [b, t, h]
            bad = err > 1e-2
            where = np.argwhere(bad)
            print(f"diag B{b} T{t} H{h} fused={fused} {name}: o cos "
                  f"{compare(go, ref_o)['cos']:.6f} lse maxerr {np.abs(gl - ref_l).max():.3g} "
                  f"bad rows {bad.mean():.4f} first {where[:4].tolist()} "
                  f"by t%64 {np.bincount(where[:, 1] % 64, minlength=64)[:16].tolist() if len(where) else []}",
                  flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--families", default="tiled,staged,v2,v2-small,v2-bk16,v2-rescale0")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--diag", action="store_true", help="first compare the v2 forward with "
                    "the tiled one at several shapes (rows that disagree)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dev = Device(robustness=os.environ.get("PROBE_ROBUSTNESS") == "on")
    print(dev.info.name, dev.backend.name, "robustness", dev.robustness, flush=True)
    if args.diag:
        diag(dev)
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
        "v2": ({"tensor_cores": "sgmat2"}, {"tensor_cores": "sgmat2"}),
        "v2-small": ({"tensor_cores": "sgmat2", "sgmat_tiles": SMALL},
                     {"tensor_cores": "sgmat2", "sgmat_tiles": SMALL}),
        "v2-bk16": ({"tensor_cores": "sgmat2"},
                    {"tensor_cores": "sgmat2", "sgmat_tiles": {"BK": 16}}),
        "v2-rescale0": ({"tensor_cores": "sgmat2", "rescale_at": 0.0}, None),
    }
    fams = args.families.split(",")
    results, outputs, rounds = {}, {}, {}
    for name in fams:
        fwd_kw, bwd_kw = families[name]
        fwd, bwd = run(fwd_kw, bwd_kw if bwd_kw is not None else {"tensor_cores": "sgmat2"})
        try:
            with dev.record() as rec:
                fwd(rec)
            outs = {"o": dev.download(o), "lse": dev.download(lse)}
            if bwd_kw is not None:
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
        rounds[name] = (fwd, bwd if bwd_kw is not None else None)
    # interleaved rounds: drift of the GPU's clocks hits every family alike
    samples = {name: {"forward": [], "backward": []} for name in rounds}
    for _ in range(args.rounds):
        for name, (fwd, bwd) in rounds.items():
            samples[name]["forward"].append(per_kernel(dev, fwd, args.repeats))
            if bwd is not None:
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
