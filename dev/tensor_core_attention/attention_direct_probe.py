"""Tensor-core attention forward with k and v read straight from memory (issue 21).

    ISTANBUL_BACKEND=dawn python dev/tensor_core_attention/attention_direct_probe.py --out DIR [--nsg 1,2,4]

The trainer's forward (05_attention_sgmat.wgsl, "staged") reads f32 q, k, v rows, rounds
them to f16 and stages each 64-key tile in workgroup memory (two barriers, the stores four
f16 at a time) before its subgroup-matrix products. Head-major q, k, v ([B, H, T, D], each
head's rows contiguous: what the trainer binds now) in f16 can instead be loaded by
subgroupMatrixLoad itself, 16 x 16 at a time, from storage: no staging, no f32 -> f16
rounding per tile. This probe's kernel does that for q, k and v (the scores and p still go
through workgroup memory for the softmax, as they must: a subgroup matrix's elements are not
addressable) with NSG subgroups (16 queries each) per workgroup, and times it against the
staged forward on f32 head-major rows at the 124M shape. Needs Dawn on a GPU with f16
subgroup matrices (the H200); T a multiple of 64 (the probe reads whole tiles).

Checks: both kernels against a float64 reference on f16-rounded inputs (small shape, GQA),
and the direct kernel against the staged one at the bench shape. Writes
DIR/attention_direct.{md,json}.
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

FILE = "attention_direct_probe.wgsl"
WGSL = r"""
const HD: u32 = {{HD}}u;
const DT: u32 = HD / 16u;
const NSG: u32 = {{NSG}}u;
const WG: u32 = 32u * NSG;
const BQ: u32 = 16u * NSG;        // queries per workgroup
const SP: u32 = 64u + 8u;         // f16 row stride of p
const LOG2E: f32 = 1.4426950408889634;
const LN2: f32 = 0.6931471805599453;
const MASKED: f32 = -1e30;

struct Params {
    batch: u32,
    seq: u32,
    heads: u32,
    kv_heads: u32,
    scale: f32,
    _p0: u32,
    _p1: u32,
    _p2: u32,
}

// --- KERNEL: attention_forward_direct ---
@group(0) @binding(0) var<storage, read> q16: array<f16>;
@group(0) @binding(1) var<storage, read> k16: array<f16>;
@group(0) @binding(2) var<storage, read> v16: array<f16>;
@group(0) @binding(3) var<storage, read_write> o_out: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> lse_out: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

var<workgroup> Ps: array<f16, BQ * SP>;
var<workgroup> Ss: array<f32, BQ * 64u>;

@compute @workgroup_size(WG)
fn attention_forward_direct(@builtin(workgroup_id) wg: vec3<u32>,
                            @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) lid: u32,
                            @builtin(subgroup_id) sg: u32,
                            @builtin(subgroup_invocation_id) lane: u32) {
    let bh = wg.x;
    let b = bh / p.heads;
    let h = bh % p.heads;
    let hk = h / (p.heads / p.kv_heads);
    let qt = nwg.y - 1u - wg.y;              // heaviest (last) query tile first
    let q0 = qt * BQ;
    let kbase = (b * p.kv_heads + hk) * p.seq * HD;
    var qa: array<subgroup_matrix_left<f16, 16, 16>, {{DT}}>;
    for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
        qa[d] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&q16, (bh * p.seq + q0 + 16u * sg) * HD + 16u * d, false, HD);
    }
    let qscale = p.scale * LOG2E;
    let r = 16u * sg + lane / 2u;            // this lane's row and half of it
    let half = lane % 2u;
    let qpos = q0 + r;
    var m = MASKED;
    var l = 0.0;
    var o: array<f32, {{HD}} / 2>;
    let last = (q0 + BQ - 1u) / 64u;
    for (var kt = 0u; kt <= last; kt++) {
        let k0 = kt * 64u;
        workgroupBarrier();                  // the previous tile's readers of Ss are done
        for (var j = 0u; j < 4u; j++) {   // @unroll
            var s = subgroup_matrix_result<f32, 16, 16>();
            for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                let kb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&k16, kbase + (k0 + 16u * j) * HD + 16u * d, true, HD);
                s = subgroupMatrixMultiplyAccumulate(qa[d], kb, s);
            }
            subgroupMatrixStore(&Ss, 16u * sg * 64u + 16u * j, s, false, 64u);
        }
        workgroupBarrier();
        var sv: array<f32, 32>;
        var mx = MASKED;
        for (var c = 0u; c < 32u; c++) {   // @unroll
            let col = 32u * half + ((c + lane) & 31u);
            let key = k0 + col;
            sv[c] = select(MASKED, qscale * Ss[r * 64u + col], key <= qpos);
            mx = max(mx, sv[c]);
        }
        mx = max(mx, subgroupShuffleXor(mx, 1u));
        let m_new = max(m, mx);
        let alpha = exp2(m - m_new);
        var sum = 0.0;
        for (var c = 0u; c < 32u; c++) {   // @unroll
            let pc = exp2(sv[c] - m_new);
            sum += pc;
            Ps[r * SP + 32u * half + ((c + lane) & 31u)] = f16(pc);
        }
        sum += subgroupShuffleXor(sum, 1u);
        l = l * alpha + sum;
        m = m_new;
        workgroupBarrier();
        var pa: array<subgroup_matrix_left<f16, 16, 16>, 4>;   // @let
        for (var ks = 0u; ks < 4u; ks++) {   // @unroll
            pa[ks] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Ps, 16u * sg * SP + 16u * ks, false, SP);
        }
        for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
            var acc = subgroup_matrix_result<f32, 16, 16>();
            for (var ks = 0u; ks < 4u; ks++) {   // @unroll
                let vb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&v16, kbase + (k0 + 16u * ks) * HD + 16u * d, false, HD);
                acc = subgroupMatrixMultiplyAccumulate(pa[ks], vb, acc);
            }
            subgroupMatrixStore(&Ss, 16u * sg * 64u + 16u * d, acc, false, 64u);
        }
        workgroupBarrier();
        for (var c = 0u; c < {{HD}}u / 2u; c++) {   // @unroll
            o[c] = alpha * o[c] + Ss[r * 64u + (HD / 2u) * half + ((c + lane) % (HD / 2u))];
        }
    }
    let inv = 1.0 / l;
    for (var c = 0u; c < {{HD}}u / 2u; c++) {   // @unroll
        Ss[r * 64u + (HD / 2u) * half + ((c + lane) % (HD / 2u))] = inv * o[c];
    }
    let base = (((b * p.seq + qpos) * p.heads + h) * HD) / 4u + (HD / 8u) * half;
    let s0 = r * 64u + (HD / 2u) * half;
    for (var c = 0u; c < {{HD}}u / 8u; c++) {   // @unroll
        o_out[base + c] = vec4<f32>(Ss[s0 + 4u * c], Ss[s0 + 4u * c + 1u], Ss[s0 + 4u * c + 2u], Ss[s0 + 4u * c + 3u]);
    }
    if (half == 0u) { lse_out[(b * p.heads + h) * p.seq + qpos] = (m + log2(l)) * LN2; }
}
"""


def reference(q, k, v, scale):
    """float64 causal attention: q [B, H, T, D], k/v [B, Hkv, T, D] -> o [B, T, H, D]."""
    B, H, T, D = q.shape
    group = H // k.shape[1]
    k = np.repeat(k.astype(np.float64), group, axis=1)
    v = np.repeat(v.astype(np.float64), group, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k) * scale
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    s -= s.max(-1, keepdims=True)
    w = np.exp(s)
    w /= w.sum(-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bqhd", w, v)


def run_case(dev, B, T, H, HKV, D, nsgs, rng, repeats, check_ref):
    q = rng.standard_normal((B, H, T, D)).astype(np.float16)
    k = rng.standard_normal((B, HKV, T, D)).astype(np.float16)
    v = rng.standard_normal((B, HKV, T, D)).astype(np.float16)
    scale = 1 / np.sqrt(D)
    q16, k16, v16 = dev.upload(q), dev.upload(k), dev.upload(v)
    q32, k32, v32 = (dev.upload(x.astype(np.float32)) for x in (q, k, v))
    o, lse = dev.empty((B, T, H, D)), dev.empty((B, H, T))
    hq, hkv = attention.head_major(T, H, D), attention.head_major(T, HKV, D)

    def staged(rec):
        attention.forward(rec, q32, k32, v32, o, lse, B, T, H, HKV, D, config="sgmat",
                          q_stride=hq, kv_stride=hkv)

    def direct(nsg):
        kern = dev.kernel(FILE, "attention_forward_direct", {}, {"HD": D, "DT": D // 16,
                                                                 "NSG": nsg})
        params = dev.params("IIIIfIII", B, T, H, HKV, float(scale), 0, 0, 0)
        return lambda rec: rec.dispatch(kern, [q16, k16, v16, o, lse, params],
                                        (B * H, T // (16 * nsg), 1), label=f"direct{nsg}")

    variants = {"staged": staged, **{f"direct_nsg{n}": direct(n) for n in nsgs}}
    ref = reference(q, k, v, scale) if check_ref else None
    out = {}
    base = None
    for name, enc in variants.items():
        with dev.record() as rec:
            enc(rec)
        got = dev.download(o).reshape(B, T, H, D).astype(np.float64)
        row = {}
        if ref is not None:
            err = got - ref
            row["max_abs_vs_ref"] = float(np.abs(err).max())
            row["cos_vs_ref"] = float((got * ref).sum() / np.sqrt((got ** 2).sum()
                                                                  * (ref ** 2).sum()))
        if name == "staged":
            base = got
        else:
            row["max_abs_vs_staged"] = float(np.abs(got - base).max())
        row["ms"] = dev.time_gpu(enc, repeats=repeats, min_warmup_s=1.0) * 1e3
        out[name] = row
        print(B, T, H, HKV, D, name, row, flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--nsg", default="1,2,4")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    nsgs = [int(x) for x in args.nsg.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="attention_direct_"))
    (tmp / FILE).write_text(WGSL, encoding="utf-8")
    find = source.find_file
    source.find_file = lambda name: tmp / FILE if name == FILE else find(name)
    dev = Device(None, robustness=False)
    print(dev, flush=True)
    rng = np.random.default_rng(0)
    results = {"check (1, 256, 4, 2, 64)": run_case(dev, 1, 256, 4, 2, 64, nsgs, rng, 3, True),
               "bench (8, 1024, 12, 12, 64)": run_case(dev, 8, 1024, 12, 12, 64, nsgs, rng,
                                                       args.repeats, False)}
    lines = [f"# Attention forward: k, v loaded by subgroupMatrixLoad from f16 head-major "
             f"storage vs the staged kernel ({dev.info.summary()}, robustness off)", "",
             "| shape (B, T, H, Hkv, D) | kernel | ms (GPU, median) | max abs vs f64 ref | "
             "cos vs ref | max abs vs staged |", "|---|---|---:|---:|---:|---:|"]
    for shape, rows in results.items():
        for name, row in rows.items():
            lines.append(f"| {shape} | {name} | {row['ms']:.3f} | "
                         f"{row.get('max_abs_vs_ref', float('nan')):.2e} | "
                         f"{row.get('cos_vs_ref', float('nan')):.6f} | "
                         f"{row.get('max_abs_vs_staged', float('nan')):.2e} |")
    (out / "attention_direct.md").write_text("\n".join(lines) + "\n")
    (out / "attention_direct.json").write_text(json.dumps(results, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
