// 05_attention_sgmat2.wgsl — the backward of causal GQA attention on the tensor cores (Dawn's
// chromium_experimental_subgroup_matrix, f16 x f16 -> f32), second version: dQ and dK/dV as
// 05_attention_tiled.wgsl computes them (same layouts, same bindings, same outputs), after
// whichever forward wrote o and lse. ops.py's tensor_cores=True runs them (verified on the
// H200, round 5, and the H100), after 05_attention_sgmat.wgsl's forward without Dawn's
// robustness and the f32 tiled one with it. (This file's own forward, o in lazily rescaled
// subgroup-matrix accumulators, was wrong on the H200 and the H100, PSNR 9-25 dB against the
// reference, dev/tensor_core_attention/results/h200/sgmat/round5_sgmat2_variants.md; retired,
// git history has it.)
//
//   attention_backward_dq_sgmat2   dq = scale * sum_keys ds k,  ds = p * (do.v - dvec)
//   attention_backward_dkv_sgmat2  dk = scale * sum_queries ds q, dv = sum_queries p do, over
//                                  the H/Hkv query heads sharing the kv head (no atomics)
//   attention_backward_dq_sgmat2w  dQ over 16 QKR QNSG queries a workgroup, and
//   attention_backward_dkv_sgmat2w dK/dV over 16 KR NSG keys (128: 8 subgroups x 1 block of
//                                  16 rows or 4 x 2; ops.SGMAT2_WIDE_SHAPES), one f32 score
//                                  array each (their own comments say why); what the
//                                  trainer runs where they fit (ops.chosen_widths)
//
// Numerics: as 05_attention_sgmat.wgsl: q (pre-scaled by scale*log2(e): scores in base 2),
// k, v, do, p and ds are rounded to f16 where they enter a product; every product
// accumulates in f32.
//
// What changed from 05_attention_sgmat.wgsl (same staging: f32 rows -> f16 workgroup tiles):
// - Lanes read score rows of stride 4 mod 32 words in a bank-spread order (lane 2r + h reads
//   row r's columns of parity h, rows 8..15 two columns later): no bank conflicts, where the
//   old 64- and 32-float rows put all the lanes of a subgroup on one or two banks.
// - dQ computes s and do v^T of a tile together, dK/dV s^T and (v do^T)^T: 4 barriers a
//   tile instead of 6 and 5.
//
// Tiling: a workgroup is 4 subgroups of 32 (the base kernels); each subgroup owns 16 rows
// (queries for dq, keys for dkv). dq: 64 queries x BK keys per tile; dkv: 64 keys x BQ2
// queries. A template (shaders/wgsl_expand.py): HD (head dim, a multiple of 16, <= 64),
// DT = HD / 16, BK and BQ2 (16 or 32); ops.sgmat2_params makes them. Experiment knobs
// (issue 21; dev/tensor_core_attention/results/h200/sgmat/round4_sgmat2_review.md and
// round5_sgmat2_variants.md: the backward is right in every pad and order, robustness off and
// on):
//   SPAD     words added to the f32 score/result tiles' rows (SSQ, SSK): 4 (the default:
//            4 mod 32 words), 0 (05_attention_sgmat.wgsl's strides), 8, 16
//   SPREAD   lanes read score rows in the bank-spread order (the default); false: lane
//            (r, half) reads the contiguous half `half` of row r (05_attention_sgmat.wgsl's order)
//   SWIZZLE  (with SPREAD) every row r starts 2r columns later, not rows 8..15 two: no bank
//            conflicts at SPAD 0 (row strides of 0 mod 32 words)
//   KV_IN_P  dK/dV stages k and v in the array that later holds p^T and ds^T (KV is dead by
//            then): set by ops.sgmat2_params only where separate arrays would pass 48 KiB
//   Q_DESC   dK/dV visits its query tiles from the last down, not from the diagonal up (an L2
//            candidate, unmeasured on the H200; ops.SGMAT2_QORDER picks)
//
//   IN4, F16_BITS  how q, k, v and do are stored: vec4<f32> rows, or f16 (the trainer's f16
//            head-major copies: half the bytes of every tile load), F16_BITS, read as
//            their bits (vec2<u32>); q is widened and pre-scaled in f32, then
//            rounded again; k, v and do are the values the f32 path rounds to
//
// Bindings (group 0), as 05_attention_tiled.wgsl:
//   dq:       0 q, 1 k, 2 v, 3 do, 4 lse, 5 dvec, 6 dq (rw), 7 Params
//   dkv:      0 q, 1 k, 2 v, 3 do, 4 lse, 5 dvec, 6 dk (rw), 7 dv (rw), 8 Params
// Dispatch: dq (B*H, ceil(T / 64)), the last (heaviest) query tile first; dkv (B*Hkv,
// ceil(T / 64)), the first (heaviest) key tile first. 128 invocations (the wide kernels:
// (B*H, ceil(T / (16 QKR QNSG))) and (B*Hkv, ceil(T / (16 KR NSG))), 32 QNSG and 32 NSG
// invocations).

const HD: u32 = {{HD}}u;
const H4: u32 = HD / 4u;
const WG: u32 = 128u;
const LOG2E: f32 = 1.4426950408889634;
const LN2: f32 = 0.6931471805599453;
const SH: u32 = HD + 8u;                   // f16 row stride of staged head rows
const SPQ: u32 = max(HD, {{BK}}u) + 8u;    // dq: q, do rows, then ds rows
const SSQ: u32 = {{BK}}u + {{SPAD}}u;      // f32 row strides (SPAD 4: 4 mod 32 words)
const SPK: u32 = {{BQ2}}u + 8u;            // dkv: p^T, ds^T rows
const SSK: u32 = {{BQ2}}u + {{SPAD}}u;

struct Params {
    batch: u32,
    seq: u32,
    heads: u32,
    kv_heads: u32,
    sq: u32,      // token strides (elements) of q/dq, k/v/dk/dv, o/do
    skv: u32,
    so: u32,
    _pad: u32,
    scale: f32,
    hq: u32,      // head strides
    hkv: u32,
    ho: u32,
    bq: u32,      // batch strides
    bkv: u32,
    bo: u32,
    _pad1: u32,
}

// A row's 4 elements from q_in, k_in, v_in or do_in (IN4: vec4<f32>, or f16 in storage read
// as their bits, vec2<u32>: 8-byte loads; op_support.F16_READ_PARAMS) widened to f32 or as f16.
// @if F16_BITS
fn widen(x: vec2<u32>) -> vec4<f32> { return vec4<f32>(bitcast<vec4<f16>>(x)); }
fn narrow(x: vec2<u32>) -> vec4<f16> { return bitcast<vec4<f16>>(x); }
// @else
fn widen(x: {{IN4}}) -> vec4<f32> { return vec4<f32>(x); }
fn narrow(x: {{IN4}}) -> vec4<f16> { return vec4<f16>(x); }
// @endif

// vec4 indices of the first element of a head row
fn q_row(b: u32, t: u32, h: u32) -> u32 { return (b * p.bq + t * p.sq + h * p.hq) / 4u; }
fn kv_row(b: u32, t: u32, hk: u32) -> u32 { return (b * p.bkv + t * p.skv + hk * p.hkv) / 4u; }
fn o_row(b: u32, t: u32, h: u32) -> u32 { return (b * p.bo + t * p.so + h * p.ho) / 4u; }
fn stat_index(b: u32, h: u32, t: u32) -> u32 { return (b * p.heads + h) * p.seq + t; }

// --- KERNEL: attention_backward_dq_sgmat2 ---
@group(0) @binding(0) var<storage, read> q_in: array<{{IN4}}>;
@group(0) @binding(1) var<storage, read> k_in: array<{{IN4}}>;
@group(0) @binding(2) var<storage, read> v_in: array<{{IN4}}>;
@group(0) @binding(3) var<storage, read> do_in: array<{{IN4}}>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dvec_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> dq_out: array<vec4<f32>>;
@group(0) @binding(7) var<uniform> p: Params;

var<workgroup> QP: array<f16, 64u * SPQ>;      // q, then do (both loaded once), then ds
var<workgroup> Ks: array<f16, {{BK}}u * SH>;
var<workgroup> Vs: array<f16, {{BK}}u * SH>;
var<workgroup> Ss: array<f32, 64u * SSQ>;      // scores; at the end dq
var<workgroup> Sd: array<f32, 64u * SSQ>;      // do v^T

fn put4(at: u32, v: vec4<f32>, which: u32) {
    let h = vec4<f16>(v);
    if (which == 0u) {
        QP[at] = h.x; QP[at + 1u] = h.y; QP[at + 2u] = h.z; QP[at + 3u] = h.w;
    } else if (which == 1u) {
        Ks[at] = h.x; Ks[at + 1u] = h.y; Ks[at + 2u] = h.z; Ks[at + 3u] = h.w;
    } else {
        Vs[at] = h.x; Vs[at + 1u] = h.y; Vs[at + 2u] = h.z; Vs[at + 3u] = h.w;
    }
}

fn put4h(at: u32, h: vec4<f16>, which: u32) {
    if (which == 1u) {
        Ks[at] = h.x; Ks[at + 1u] = h.y; Ks[at + 2u] = h.z; Ks[at + 3u] = h.w;
    } else {
        Vs[at] = h.x; Vs[at + 1u] = h.y; Vs[at + 2u] = h.z; Vs[at + 3u] = h.w;
    }
}

@compute @workgroup_size(WG)
fn attention_backward_dq_sgmat2(@builtin(workgroup_id) wg: vec3<u32>,
                                @builtin(num_workgroups) nwg: vec3<u32>,
                                @builtin(local_invocation_index) lid: u32,
                                @builtin(subgroup_id) sg: u32,
                                @builtin(subgroup_invocation_id) lane: u32) {
    let bh = wg.x;
    let b = bh / p.heads;
    let h = bh % p.heads;
    let hk = h / (p.heads / p.kv_heads);
    let qt = nwg.y - 1u - wg.y;
    let q0 = qt * 64u;
    let qscale = p.scale * LOG2E;
    for (var i = lid; i < 64u * H4; i += WG) {
        let r = i / H4;
        var v = vec4<f32>();
        if (q0 + r < p.seq) { v = widen(q_in[q_row(b, q0 + r, h) + i % H4]) * qscale; }
        put4(r * SPQ + 4u * (i % H4), v, 0u);
    }
    workgroupBarrier();
    var qa: array<subgroup_matrix_left<f16, 16, 16>, {{DT}}>;
    for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
        qa[d] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&QP, 16u * sg * SPQ + 16u * d, false, SPQ);
    }
    workgroupBarrier();
    for (var i = lid; i < 64u * H4; i += WG) {
        let r = i / H4;
        var v = vec4<f32>();
        if (q0 + r < p.seq) { v = widen(do_in[o_row(b, q0 + r, h) + i % H4]); }
        put4(r * SPQ + 4u * (i % H4), v, 0u);
    }
    workgroupBarrier();
    var da: array<subgroup_matrix_left<f16, 16, 16>, {{DT}}>;
    for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
        da[d] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&QP, 16u * sg * SPQ + 16u * d, false, SPQ);
    }
    let r = lane / 2u;
    let half = lane % 2u;
// @if SPREAD
// @if SWIZZLE
    let rot = 2u * r;
// @else
    let rot = 2u * (r / 8u);
// @endif
// @endif
    let row = 16u * sg + r;
    let qpos = q0 + row;
    let srow = row * SSQ;
    var lse2 = 0.0;
    var dvec = 0.0;
    if (qpos < p.seq) {
        lse2 = lse_in[stat_index(b, h, qpos)] * LOG2E;
        dvec = dvec_in[stat_index(b, h, qpos)];
    }
    var dq: array<subgroup_matrix_result<f32, 16, 16>, {{DT}}>;
    let nkt = min((q0 + 64u + {{BK}}u - 1u) / {{BK}}u, (p.seq + {{BK}}u - 1u) / {{BK}}u);
    // Key tile kt + 1's k and v rows travel in registers while tile kt is multiplied (as the
    // forward of 05_attention_sgmat.wgsl): all of a tile's loads in flight at once
    var kr: array<vec4<f16>, ({{BK}} * {{HD}} / 4 + 127) / 128>;
    var vr: array<vec4<f16>, ({{BK}} * {{HD}} / 4 + 127) / 128>;
    for (var t = 0u; t < ({{BK}}u * {{HD}}u / 4u + 127u) / 128u; t++) {   // @unroll
        let i = lid + t * WG;
        if (i < {{BK}}u * H4 && i / H4 < p.seq) {
            kr[t] = narrow(k_in[kv_row(b, i / H4, hk) + i % H4]);
            vr[t] = narrow(v_in[kv_row(b, i / H4, hk) + i % H4]);
        }
    }
    for (var kt = 0u; kt < nkt; kt++) {
        let k0 = kt * {{BK}}u;
        workgroupBarrier();                  // the previous tile's products are done
        for (var t = 0u; t < ({{BK}}u * {{HD}}u / 4u + 127u) / 128u; t++) {   // @unroll
            let i = lid + t * WG;
            if (i < {{BK}}u * H4) {
                put4h((i / H4) * SH + 4u * (i % H4), kr[t], 1u);
                put4h((i / H4) * SH + 4u * (i % H4), vr[t], 2u);
            }
        }
        workgroupBarrier();
        if (kt + 1u < nkt) {
            for (var t = 0u; t < ({{BK}}u * {{HD}}u / 4u + 127u) / 128u; t++) {   // @unroll
                let i = lid + t * WG;
                let n = k0 + {{BK}}u + i / H4;
                kr[t] = vec4<f16>();
                vr[t] = vec4<f16>();
                if (i < {{BK}}u * H4 && n < p.seq) {
                    kr[t] = narrow(k_in[kv_row(b, n, hk) + i % H4]);
                    vr[t] = narrow(v_in[kv_row(b, n, hk) + i % H4]);
                }
            }
        }
        for (var j = 0u; j < {{BK}}u / 16u; j++) {   // @unroll
            var s = subgroup_matrix_result<f32, 16, 16>();
            var t = subgroup_matrix_result<f32, 16, 16>();
            for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                let kb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ks, 16u * j * SH + 16u * d, true, SH);
                s = subgroupMatrixMultiplyAccumulate(qa[d], kb, s);
                let vb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Vs, 16u * j * SH + 16u * d, true, SH);
                t = subgroupMatrixMultiplyAccumulate(da[d], vb, t);
            }
            subgroupMatrixStore(&Ss, 16u * sg * SSQ + 16u * j, s, false, SSQ);
            subgroupMatrixStore(&Sd, 16u * sg * SSQ + 16u * j, t, false, SSQ);
        }
        workgroupBarrier();
        for (var c = 0u; c < {{BK}}u / 2u; c++) {   // @unroll
// @if SPREAD
            let col = (2u * c + half + rot) % {{BK}}u;
// @else
            let col = {{BK}}u / 2u * half + c;
// @endif
            let key = k0 + col;
            let e = exp2(Ss[srow + col] - lse2);
            let pr = select(0.0, e, key <= qpos && key < p.seq && qpos < p.seq);
            QP[row * SPQ + col] = f16(pr * (Sd[srow + col] - dvec));
        }
        workgroupBarrier();
        for (var ks = 0u; ks < {{BK}}u / 16u; ks++) {   // @unroll
            let dsa = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&QP, 16u * sg * SPQ + 16u * ks, false, SPQ);
            for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                let kb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ks, 16u * ks * SH + 16u * d, false, SH);
                dq[d] = subgroupMatrixMultiplyAccumulate(dsa, kb, dq[d]);
            }
        }
    }
    for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
        workgroupBarrier();
        subgroupMatrixStore(&Ss, 16u * sg * SSQ, dq[d], false, SSQ);
        workgroupBarrier();
        if (qpos < p.seq) {   // lane (r, half): 8 of the 16 columns of this d tile
            let s = srow + 8u * half;
            let at = q_row(b, qpos, h) + 4u * d + 2u * half;
            dq_out[at] = p.scale * vec4<f32>(Ss[s], Ss[s + 1u], Ss[s + 2u], Ss[s + 3u]);
            dq_out[at + 1u] = p.scale * vec4<f32>(Ss[s + 4u], Ss[s + 5u], Ss[s + 6u], Ss[s + 7u]);
        }
    }
}

// --- KERNEL: attention_backward_dq_sgmat2w ---
// dQ over QW = 16 QKR QNSG queries a workgroup (attention_backward_dq_sgmat2: 64), as the wide
// dK/dV kernel: each staged key tile serves twice the queries, and s and do v^T take turns
// in one f32 array (p in the lanes' registers between them) to fit 48 KiB. Same bindings,
// numerics and outputs as the 64-query kernel. Dispatch (B*H, ceil(T / QW)), 32 NSG
// invocations, the last (heaviest) query tile first.
@group(0) @binding(0) var<storage, read> q_in: array<{{IN4}}>;
@group(0) @binding(1) var<storage, read> k_in: array<{{IN4}}>;
@group(0) @binding(2) var<storage, read> v_in: array<{{IN4}}>;
@group(0) @binding(3) var<storage, read> do_in: array<{{IN4}}>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dvec_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> dq_out: array<vec4<f32>>;
@group(0) @binding(7) var<uniform> p: Params;

const WGQ: u32 = 32u * {{QNSG}}u;
const QW: u32 = 16u * {{QKR}}u * {{QNSG}}u;          // queries per workgroup
var<workgroup> QP: array<f16, QW * SPQ>;      // q, then do (both loaded once), then ds
var<workgroup> Ks: array<f16, {{BK}}u * SH>;
var<workgroup> Vs: array<f16, {{BK}}u * SH>;
var<workgroup> Ss: array<f32, QW * SSQ>;      // scores, then do v^T; at the end dq

fn put4(at: u32, v: vec4<f32>) {
    let h = vec4<f16>(v);
    QP[at] = h.x; QP[at + 1u] = h.y; QP[at + 2u] = h.z; QP[at + 3u] = h.w;
}

fn put4h(at: u32, h: vec4<f16>, which: u32) {
    if (which == 1u) {
        Ks[at] = h.x; Ks[at + 1u] = h.y; Ks[at + 2u] = h.z; Ks[at + 3u] = h.w;
    } else {
        Vs[at] = h.x; Vs[at + 1u] = h.y; Vs[at + 2u] = h.z; Vs[at + 3u] = h.w;
    }
}

@compute @workgroup_size(WGQ)
fn attention_backward_dq_sgmat2w(@builtin(workgroup_id) wg: vec3<u32>,
                                 @builtin(num_workgroups) nwg: vec3<u32>,
                                 @builtin(local_invocation_index) lid: u32,
                                 @builtin(subgroup_id) sg: u32,
                                 @builtin(subgroup_invocation_id) lane: u32) {
    let bh = wg.x;
    let b = bh / p.heads;
    let h = bh % p.heads;
    let hk = h / (p.heads / p.kv_heads);
    let qt = nwg.y - 1u - wg.y;
    let q0 = qt * QW;
    let qscale = p.scale * LOG2E;
    for (var i = lid; i < QW * H4; i += WGQ) {
        let r = i / H4;
        var v = vec4<f32>();
        if (q0 + r < p.seq) { v = widen(q_in[q_row(b, q0 + r, h) + i % H4]) * qscale; }
        put4(r * SPQ + 4u * (i % H4), v);
    }
    workgroupBarrier();
    var qa: array<array<subgroup_matrix_left<f16, 16, 16>, {{DT}}>, {{QKR}}>;
    for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
        for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
            qa[rb][d] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&QP, 16u * ({{QKR}}u * sg + rb) * SPQ + 16u * d, false, SPQ);
        }
    }
    workgroupBarrier();
    for (var i = lid; i < QW * H4; i += WGQ) {
        let r = i / H4;
        var v = vec4<f32>();
        if (q0 + r < p.seq) { v = widen(do_in[o_row(b, q0 + r, h) + i % H4]); }
        put4(r * SPQ + 4u * (i % H4), v);
    }
    workgroupBarrier();
    var da: array<array<subgroup_matrix_left<f16, 16, 16>, {{DT}}>, {{QKR}}>;
    for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
        for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
            da[rb][d] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&QP, 16u * ({{QKR}}u * sg + rb) * SPQ + 16u * d, false, SPQ);
        }
    }
    // lane 2r + h: row r of each of the subgroup's row blocks, the key columns of parity h,
    // in the bank-spread order of the 64-query kernel
    let r = lane / 2u;
    let half = lane % 2u;
    let rot = 2u * (r / 8u);
    let row0 = 16u * {{QKR}}u * sg + r;     // the lane's row in block rb: row0 + 16 rb
    var lse2: array<f32, {{QKR}}>;
    var dvec: array<f32, {{QKR}}>;
    for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
        let qpos = q0 + row0 + 16u * rb;
        if (qpos < p.seq) {
            lse2[rb] = lse_in[stat_index(b, h, qpos)] * LOG2E;
            dvec[rb] = dvec_in[stat_index(b, h, qpos)];
        }
    }
    var dq: array<array<subgroup_matrix_result<f32, 16, 16>, {{DT}}>, {{QKR}}>;
    var pr: array<array<f32, {{BK}} / 2>, {{QKR}}>;
    let nkt = min((q0 + QW + {{BK}}u - 1u) / {{BK}}u, (p.seq + {{BK}}u - 1u) / {{BK}}u);
    // key tile kt + 1's k and v rows travel in registers while tile kt is multiplied
    var kr: array<vec4<f16>, ({{BK}} * {{HD}} / 4 + 32 * {{QNSG}} - 1) / (32 * {{QNSG}})>;
    var vr: array<vec4<f16>, ({{BK}} * {{HD}} / 4 + 32 * {{QNSG}} - 1) / (32 * {{QNSG}})>;
    for (var t = 0u; t < ({{BK}}u * {{HD}}u / 4u + 32u * {{QNSG}}u - 1u) / (32u * {{QNSG}}u); t++) {   // @unroll
        let i = lid + t * WGQ;
        if (i < {{BK}}u * H4 && i / H4 < p.seq) {
            kr[t] = narrow(k_in[kv_row(b, i / H4, hk) + i % H4]);
            vr[t] = narrow(v_in[kv_row(b, i / H4, hk) + i % H4]);
        }
    }
    for (var kt = 0u; kt < nkt; kt++) {
        let k0 = kt * {{BK}}u;
        workgroupBarrier();                  // the previous tile's products are done
        for (var t = 0u; t < ({{BK}}u * {{HD}}u / 4u + 32u * {{QNSG}}u - 1u) / (32u * {{QNSG}}u); t++) {   // @unroll
            let i = lid + t * WGQ;
            if (i < {{BK}}u * H4) {
                put4h((i / H4) * SH + 4u * (i % H4), kr[t], 1u);
                put4h((i / H4) * SH + 4u * (i % H4), vr[t], 2u);
            }
        }
        workgroupBarrier();
        if (kt + 1u < nkt) {
            for (var t = 0u; t < ({{BK}}u * {{HD}}u / 4u + 32u * {{QNSG}}u - 1u) / (32u * {{QNSG}}u); t++) {   // @unroll
                let i = lid + t * WGQ;
                let n = k0 + {{BK}}u + i / H4;
                kr[t] = vec4<f16>();
                vr[t] = vec4<f16>();
                if (i < {{BK}}u * H4 && n < p.seq) {
                    kr[t] = narrow(k_in[kv_row(b, n, hk) + i % H4]);
                    vr[t] = narrow(v_in[kv_row(b, n, hk) + i % H4]);
                }
            }
        }
        // s = q' k^T, each k matrix loaded once for the row blocks
        for (var j = 0u; j < {{BK}}u / 16u; j++) {   // @unroll
            var sacc: array<subgroup_matrix_result<f32, 16, 16>, {{QKR}}>;
            for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                let kb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ks, 16u * j * SH + 16u * d, true, SH);
                for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
                    sacc[rb] = subgroupMatrixMultiplyAccumulate(qa[rb][d], kb, sacc[rb]);
                }
            }
            for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
                subgroupMatrixStore(&Ss, 16u * ({{QKR}}u * sg + rb) * SSQ + 16u * j, sacc[rb], false, SSQ);
            }
        }
        workgroupBarrier();
        for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
            let qpos = q0 + row0 + 16u * rb;
            for (var c = 0u; c < {{BK}}u / 2u; c++) {   // @unroll
                let col = (2u * c + half + rot) % {{BK}}u;
                let key = k0 + col;
                let e = exp2(Ss[(row0 + 16u * rb) * SSQ + col] - lse2[rb]);
                pr[rb][c] = select(0.0, e, key <= qpos && key < p.seq && qpos < p.seq);
            }
        }
        workgroupBarrier();                  // s read: Ss takes do v^T
        for (var j = 0u; j < {{BK}}u / 16u; j++) {   // @unroll
            var tacc: array<subgroup_matrix_result<f32, 16, 16>, {{QKR}}>;
            for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                let vb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Vs, 16u * j * SH + 16u * d, true, SH);
                for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
                    tacc[rb] = subgroupMatrixMultiplyAccumulate(da[rb][d], vb, tacc[rb]);
                }
            }
            for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
                subgroupMatrixStore(&Ss, 16u * ({{QKR}}u * sg + rb) * SSQ + 16u * j, tacc[rb], false, SSQ);
            }
        }
        workgroupBarrier();
        for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
            for (var c = 0u; c < {{BK}}u / 2u; c++) {   // @unroll
                let col = (2u * c + half + rot) % {{BK}}u;
                QP[(row0 + 16u * rb) * SPQ + col] = f16(pr[rb][c] * (Ss[(row0 + 16u * rb) * SSQ + col] - dvec[rb]));
            }
        }
        workgroupBarrier();
        for (var ks = 0u; ks < {{BK}}u / 16u; ks++) {   // @unroll
            var dsa: array<subgroup_matrix_left<f16, 16, 16>, {{QKR}}>;
            for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
                dsa[rb] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&QP, 16u * ({{QKR}}u * sg + rb) * SPQ + 16u * ks, false, SPQ);
            }
            for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                let kb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ks, 16u * ks * SH + 16u * d, false, SH);
                for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
                    dq[rb][d] = subgroupMatrixMultiplyAccumulate(dsa[rb], kb, dq[rb][d]);
                }
            }
        }
    }
    for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
        workgroupBarrier();
        for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
            subgroupMatrixStore(&Ss, 16u * ({{QKR}}u * sg + rb) * SSQ, dq[rb][d], false, SSQ);
        }
        workgroupBarrier();
        for (var rb = 0u; rb < {{QKR}}u; rb++) {   // @unroll
            let qpos = q0 + row0 + 16u * rb;
            if (qpos < p.seq) {   // lane (r, half): 8 of the 16 columns of this d tile
                let s = (row0 + 16u * rb) * SSQ + 8u * half;
                let at = q_row(b, qpos, h) + 4u * d + 2u * half;
                dq_out[at] = p.scale * vec4<f32>(Ss[s], Ss[s + 1u], Ss[s + 2u], Ss[s + 3u]);
                dq_out[at + 1u] = p.scale * vec4<f32>(Ss[s + 4u], Ss[s + 5u], Ss[s + 6u], Ss[s + 7u]);
            }
        }
    }
}

// --- KERNEL: attention_backward_dkv_sgmat2 ---
@group(0) @binding(0) var<storage, read> q_in: array<{{IN4}}>;
@group(0) @binding(1) var<storage, read> k_in: array<{{IN4}}>;
@group(0) @binding(2) var<storage, read> v_in: array<{{IN4}}>;
@group(0) @binding(3) var<storage, read> do_in: array<{{IN4}}>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dvec_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> dk_out: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> dv_out: array<vec4<f32>>;
@group(0) @binding(8) var<uniform> p: Params;

// @if KV_IN_P
const DS0: u32 = 64u * SPK;                     // ds^T's place in KV (p^T's is 0)
var<workgroup> KV: array<f16, max(64u * SH, 2u * DS0)>;   // k, then v (loaded once); then p^T, ds^T
// @else
var<workgroup> KV: array<f16, 64u * SH>;        // k, then v of this tile (loaded once)
// @endif
var<workgroup> Qs: array<f16, {{BQ2}}u * SH>;   // the query tile, pre-scaled like the forward's
var<workgroup> Ds: array<f16, {{BQ2}}u * SH>;   // its do rows
// @if KV_IN_P
// @else
var<workgroup> Ps: array<f16, 64u * SPK>;       // p^T [key][query]
var<workgroup> DSs: array<f16, 64u * SPK>;      // ds^T
// @endif
var<workgroup> Ss: array<f32, 64u * SSK>;       // s^T; at the end dk
var<workgroup> Sd: array<f32, 64u * SSK>;       // (v do^T)^T; at the end dv
var<workgroup> stats: array<f32, 2u * {{BQ2}}u>;   // the query tile's lse (base 2), dvec

fn put4(at: u32, v: vec4<f32>, which: u32) {
    let h = vec4<f16>(v);
    if (which == 0u) {
        KV[at] = h.x; KV[at + 1u] = h.y; KV[at + 2u] = h.z; KV[at + 3u] = h.w;
    } else if (which == 1u) {
        Qs[at] = h.x; Qs[at + 1u] = h.y; Qs[at + 2u] = h.z; Qs[at + 3u] = h.w;
    } else {
        Ds[at] = h.x; Ds[at + 1u] = h.y; Ds[at + 2u] = h.z; Ds[at + 3u] = h.w;
    }
}

fn put4h(at: u32, h: vec4<f16>, which: u32) {
    if (which == 1u) {
        Qs[at] = h.x; Qs[at + 1u] = h.y; Qs[at + 2u] = h.z; Qs[at + 3u] = h.w;
    } else {
        Ds[at] = h.x; Ds[at + 1u] = h.y; Ds[at + 2u] = h.z; Ds[at + 3u] = h.w;
    }
}

@compute @workgroup_size(WG)
fn attention_backward_dkv_sgmat2(@builtin(workgroup_id) wg: vec3<u32>,
                                 @builtin(local_invocation_index) lid: u32,
                                 @builtin(subgroup_id) sg: u32,
                                 @builtin(subgroup_invocation_id) lane: u32) {
    let bhk = wg.x;
    let b = bhk / p.kv_heads;
    let hk = bhk % p.kv_heads;
    let group = p.heads / p.kv_heads;
    let k0 = wg.y * 64u;                    // heaviest (first) key tile first
    let qscale = p.scale * LOG2E;
    for (var i = lid; i < 64u * H4; i += WG) {
        let n = i / H4;
        var v = vec4<f32>();
        if (k0 + n < p.seq) { v = widen(k_in[kv_row(b, k0 + n, hk) + i % H4]); }
        put4(n * SH + 4u * (i % H4), v, 0u);
    }
    workgroupBarrier();
    var ka: array<subgroup_matrix_left<f16, 16, 16>, {{DT}}>;
    for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
        ka[d] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&KV, 16u * sg * SH + 16u * d, false, SH);
    }
    workgroupBarrier();
    for (var i = lid; i < 64u * H4; i += WG) {
        let n = i / H4;
        var v = vec4<f32>();
        if (k0 + n < p.seq) { v = widen(v_in[kv_row(b, k0 + n, hk) + i % H4]); }
        put4(n * SH + 4u * (i % H4), v, 0u);
    }
    workgroupBarrier();
    var va: array<subgroup_matrix_left<f16, 16, 16>, {{DT}}>;
    for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
        va[d] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&KV, 16u * sg * SH + 16u * d, false, SH);
    }
    let r = lane / 2u;                       // this lane's key row of the subgroup's 16
    let half = lane % 2u;                    // and the parity (or half) of its query columns
// @if SPREAD
// @if SWIZZLE
    let rot = 2u * r;
// @else
    let rot = 2u * (r / 8u);
// @endif
// @endif
    let row = 16u * sg + r;
    let kpos = k0 + row;
    let srow = row * SSK;
    var dk: array<subgroup_matrix_result<f32, 16, 16>, {{DT}}>;
    var dv: array<subgroup_matrix_result<f32, 16, 16>, {{DT}}>;
    let first = k0 / {{BQ2}}u;
    let tiles = (p.seq + {{BQ2}}u - 1u) / {{BQ2}}u;
    // The next query tile's q and do rows and statistics travel in registers while this tile
    // is multiplied (as the forward of 05_attention_sgmat.wgsl): all of a tile's loads in
    // flight at once. Tiles run in (g, qt) order: qt from the diagonal up, or with Q_DESC
    // from the last query tile down, so that every key tile of a head starts at the same q
    // and do rows and reads them at about the same time, from L2 (ascending, each key tile
    // starts at its own diagonal and reaches a row long after its neighbours read it). The
    // default's text is the one verified on the H200; Q_DESC only adds to it.
    var qr: array<vec4<f16>, ({{BQ2}} * {{HD}} / 4 + 127) / 128>;
    var dr: array<vec4<f16>, ({{BQ2}} * {{HD}} / 4 + 127) / 128>;
    var st = 0.0;   // lanes below 2 BQ2: the tile's lse (base 2) or dvec
    if (first < tiles) {   // the first tile, (0, first)
// @if Q_DESC
        let first = tiles - 1u;            // (0, tiles - 1): the last query tile
// @endif
        for (var t = 0u; t < ({{BQ2}}u * {{HD}}u / 4u + 127u) / 128u; t++) {   // @unroll
            let i = lid + t * WG;
            let n = first * {{BQ2}}u + i / H4;
            qr[t] = vec4<f16>();
            dr[t] = vec4<f16>();
            if (i < {{BQ2}}u * H4 && n < p.seq) {
                qr[t] = vec4<f16>(widen(q_in[q_row(b, n, hk * group) + i % H4]) * qscale);
                dr[t] = narrow(do_in[o_row(b, n, hk * group) + i % H4]);
            }
        }
        st = 0.0;
        if (lid < 2u * {{BQ2}}u && first * {{BQ2}}u + lid % {{BQ2}}u < p.seq) {
            if (lid < {{BQ2}}u) {
                st = lse_in[stat_index(b, hk * group, first * {{BQ2}}u + lid % {{BQ2}}u)] * LOG2E;
            } else {
                st = dvec_in[stat_index(b, hk * group, first * {{BQ2}}u + lid % {{BQ2}}u)];
            }
        }
    }
    for (var g = 0u; g < group; g++) {
        let h = hk * group + g;
// @if Q_DESC
        for (var n_done = 0u; first + n_done < tiles; n_done++) {
            let qt = tiles - 1u - n_done;
// @else
        for (var qt = first; qt < tiles; qt++) {
// @endif
            let q0 = qt * {{BQ2}}u;
            workgroupBarrier();              // the previous tile's products are done
            for (var t = 0u; t < ({{BQ2}}u * {{HD}}u / 4u + 127u) / 128u; t++) {   // @unroll
                let i = lid + t * WG;
                if (i < {{BQ2}}u * H4) {
                    put4h((i / H4) * SH + 4u * (i % H4), qr[t], 1u);
                    put4h((i / H4) * SH + 4u * (i % H4), dr[t], 2u);
                }
            }
            if (lid < 2u * {{BQ2}}u) {
                stats[lid] = st;
            }
            workgroupBarrier();
// @if Q_DESC
            var lq = qt - 1u;                // the next tile (lg, lq)
            var lg = g;
            if (qt == first) {
                lq = tiles - 1u;
                lg = g + 1u;
            }
// @else
            var lq = qt + 1u;                // the next tile (lg, lq)
            var lg = g;
            if (lq == tiles) {
                lq = first;
                lg = g + 1u;
            }
// @endif
            if (lg < group) {
                for (var t = 0u; t < ({{BQ2}}u * {{HD}}u / 4u + 127u) / 128u; t++) {   // @unroll
                    let i = lid + t * WG;
                    let n = lq * {{BQ2}}u + i / H4;
                    qr[t] = vec4<f16>();
                    dr[t] = vec4<f16>();
                    if (i < {{BQ2}}u * H4 && n < p.seq) {
                        qr[t] = vec4<f16>(widen(q_in[q_row(b, n, hk * group + lg) + i % H4]) * qscale);
                        dr[t] = narrow(do_in[o_row(b, n, hk * group + lg) + i % H4]);
                    }
                }
                st = 0.0;
                if (lid < 2u * {{BQ2}}u && lq * {{BQ2}}u + lid % {{BQ2}}u < p.seq) {
                    if (lid < {{BQ2}}u) {
                        st = lse_in[stat_index(b, hk * group + lg, lq * {{BQ2}}u + lid % {{BQ2}}u)] * LOG2E;
                    } else {
                        st = dvec_in[stat_index(b, hk * group + lg, lq * {{BQ2}}u + lid % {{BQ2}}u)];
                    }
                }
            }
            for (var j = 0u; j < {{BQ2}}u / 16u; j++) {   // @unroll
                var s = subgroup_matrix_result<f32, 16, 16>();
                var t = subgroup_matrix_result<f32, 16, 16>();
                for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                    let qb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Qs, 16u * j * SH + 16u * d, true, SH);
                    s = subgroupMatrixMultiplyAccumulate(ka[d], qb, s);
                    let db = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ds, 16u * j * SH + 16u * d, true, SH);
                    t = subgroupMatrixMultiplyAccumulate(va[d], db, t);
                }
                subgroupMatrixStore(&Ss, 16u * sg * SSK + 16u * j, s, false, SSK);
                subgroupMatrixStore(&Sd, 16u * sg * SSK + 16u * j, t, false, SSK);
            }
            workgroupBarrier();
            for (var c = 0u; c < {{BQ2}}u / 2u; c++) {   // @unroll
// @if SPREAD
                let col = (2u * c + half + rot) % {{BQ2}}u;
// @else
                let col = {{BQ2}}u / 2u * half + c;
// @endif
                let qi = q0 + col;
                let e = exp2(Ss[srow + col] - stats[col]);
                let pr = select(0.0, e, qi >= kpos && qi < p.seq && kpos < p.seq);
// @if KV_IN_P
                KV[row * SPK + col] = f16(pr);
                KV[DS0 + row * SPK + col] = f16(pr * (Sd[srow + col] - stats[{{BQ2}}u + col]));
// @else
                Ps[row * SPK + col] = f16(pr);
                DSs[row * SPK + col] = f16(pr * (Sd[srow + col] - stats[{{BQ2}}u + col]));
// @endif
            }
            workgroupBarrier();
            for (var ks = 0u; ks < {{BQ2}}u / 16u; ks++) {   // @unroll
// @if KV_IN_P
                let pl = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&KV, 16u * sg * SPK + 16u * ks, false, SPK);
                let dl = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&KV, DS0 + 16u * sg * SPK + 16u * ks, false, SPK);
// @else
                let pl = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Ps, 16u * sg * SPK + 16u * ks, false, SPK);
                let dl = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&DSs, 16u * sg * SPK + 16u * ks, false, SPK);
// @endif
                for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                    let db = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ds, 16u * ks * SH + 16u * d, false, SH);
                    dv[d] = subgroupMatrixMultiplyAccumulate(pl, db, dv[d]);
                    let qb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Qs, 16u * ks * SH + 16u * d, false, SH);
                    dk[d] = subgroupMatrixMultiplyAccumulate(dl, qb, dk[d]);
                }
            }
        }
    }
    // q was staged pre-scaled by scale*log2(e): dk = scale * sum ds q = LN2 * sum ds q'
    for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
        workgroupBarrier();
        subgroupMatrixStore(&Ss, 16u * sg * SSK, dk[d], false, SSK);
        subgroupMatrixStore(&Sd, 16u * sg * SSK, dv[d], false, SSK);
        workgroupBarrier();
        if (kpos < p.seq) {   // lane (r, half): 8 of the 16 columns of this d tile
            let s = srow + 8u * half;
            let at = kv_row(b, kpos, hk) + 4u * d + 2u * half;
            dk_out[at] = LN2 * vec4<f32>(Ss[s], Ss[s + 1u], Ss[s + 2u], Ss[s + 3u]);
            dk_out[at + 1u] = LN2 * vec4<f32>(Ss[s + 4u], Ss[s + 5u], Ss[s + 6u], Ss[s + 7u]);
            dv_out[at] = vec4<f32>(Sd[s], Sd[s + 1u], Sd[s + 2u], Sd[s + 3u]);
            dv_out[at + 1u] = vec4<f32>(Sd[s + 4u], Sd[s + 5u], Sd[s + 6u], Sd[s + 7u]);
        }
    }
}

// --- KERNEL: attention_backward_dkv_sgmat2w ---
// dK/dV over KW = 16 KR NSG keys per workgroup (attention_backward_dkv_sgmat2: 64): NSG
// subgroups of 32 invocations, each owning KR blocks of 16 key rows. A query tile (BQ2 rows
// of q and do, staged once) then serves twice the keys, so the global loads and staging
// stores per product halve; with KR = 2 a subgroup also multiplies each q and do matrix it
// loads into both its row blocks (half the matrix loads per product). To fit 48 KiB, s^T and
// (v do^T)^T take turns in one f32 array: the lanes keep p in registers between them (six
// barriers a tile instead of four). Same bindings, numerics and outputs as the 64-key kernel.
// Dispatch (B*Hkv, ceil(T / KW)), 32 NSG invocations.
@group(0) @binding(0) var<storage, read> q_in: array<{{IN4}}>;
@group(0) @binding(1) var<storage, read> k_in: array<{{IN4}}>;
@group(0) @binding(2) var<storage, read> v_in: array<{{IN4}}>;
@group(0) @binding(3) var<storage, read> do_in: array<{{IN4}}>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dvec_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> dk_out: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> dv_out: array<vec4<f32>>;
@group(0) @binding(8) var<uniform> p: Params;

const WGW: u32 = 32u * {{NSG}}u;
const KW: u32 = 16u * {{KR}}u * {{NSG}}u;           // keys per workgroup
const DSW: u32 = KW * SPK;                          // ds^T's place in PD (p^T's is 0)
var<workgroup> PD: array<f16, max(KW * SH, 2u * DSW)>;   // k, then v (loaded once); then p^T, ds^T
var<workgroup> Qs: array<f16, {{BQ2}}u * SH>;   // the query tile, pre-scaled like the forward's
var<workgroup> Ds: array<f16, {{BQ2}}u * SH>;   // its do rows
var<workgroup> Ss: array<f32, KW * SSK>;        // s^T, then (v do^T)^T; at the end dk, dv
var<workgroup> stats: array<f32, 2u * {{BQ2}}u>;   // the query tile's lse (base 2), dvec

fn put4k(at: u32, v: vec4<f32>) {
    let h = vec4<f16>(v);
    PD[at] = h.x; PD[at + 1u] = h.y; PD[at + 2u] = h.z; PD[at + 3u] = h.w;
}

fn put4q(at: u32, h: vec4<f16>, which: u32) {
    if (which == 1u) {
        Qs[at] = h.x; Qs[at + 1u] = h.y; Qs[at + 2u] = h.z; Qs[at + 3u] = h.w;
    } else {
        Ds[at] = h.x; Ds[at + 1u] = h.y; Ds[at + 2u] = h.z; Ds[at + 3u] = h.w;
    }
}

@compute @workgroup_size(WGW)
fn attention_backward_dkv_sgmat2w(@builtin(workgroup_id) wg: vec3<u32>,
                                  @builtin(local_invocation_index) lid: u32,
                                  @builtin(subgroup_id) sg: u32,
                                  @builtin(subgroup_invocation_id) lane: u32) {
    let bhk = wg.x;
    let b = bhk / p.kv_heads;
    let hk = bhk % p.kv_heads;
    let group = p.heads / p.kv_heads;
    let k0 = wg.y * KW;                     // heaviest (first) key tile first
    let qscale = p.scale * LOG2E;
    for (var i = lid; i < KW * H4; i += WGW) {
        let n = i / H4;
        var v = vec4<f32>();
        if (k0 + n < p.seq) { v = widen(k_in[kv_row(b, k0 + n, hk) + i % H4]); }
        put4k(n * SH + 4u * (i % H4), v);
    }
    workgroupBarrier();
    var ka: array<array<subgroup_matrix_left<f16, 16, 16>, {{DT}}>, {{KR}}>;
    for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
        for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
            ka[rb][d] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&PD, 16u * ({{KR}}u * sg + rb) * SH + 16u * d, false, SH);
        }
    }
    workgroupBarrier();
    for (var i = lid; i < KW * H4; i += WGW) {
        let n = i / H4;
        var v = vec4<f32>();
        if (k0 + n < p.seq) { v = widen(v_in[kv_row(b, k0 + n, hk) + i % H4]); }
        put4k(n * SH + 4u * (i % H4), v);
    }
    workgroupBarrier();
    var va: array<array<subgroup_matrix_left<f16, 16, 16>, {{DT}}>, {{KR}}>;
    for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
        for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
            va[rb][d] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&PD, 16u * ({{KR}}u * sg + rb) * SH + 16u * d, false, SH);
        }
    }
    // lane 2r + h: row r of each of the subgroup's row blocks, the query columns of parity
    // h, read in the bank-spread order of the 64-key kernel (rows 8..15 two columns later)
    let r = lane / 2u;
    let half = lane % 2u;
    let rot = 2u * (r / 8u);
    let row0 = 16u * {{KR}}u * sg + r;      // the lane's row in block rb: row0 + 16 rb
    var dk: array<array<subgroup_matrix_result<f32, 16, 16>, {{DT}}>, {{KR}}>;
    var dv: array<array<subgroup_matrix_result<f32, 16, 16>, {{DT}}>, {{KR}}>;
    var pr: array<array<f32, {{BQ2}} / 2>, {{KR}}>;
    let first = k0 / {{BQ2}}u;
    let tiles = (p.seq + {{BQ2}}u - 1u) / {{BQ2}}u;
    // the next query tile's q and do rows and statistics travel in registers while this
    // tile is multiplied; tiles run in (g, qt) order, qt from the diagonal up
    var qr: array<vec4<f16>, ({{BQ2}} * {{HD}} / 4 + 32 * {{NSG}} - 1) / (32 * {{NSG}})>;
    var dr: array<vec4<f16>, ({{BQ2}} * {{HD}} / 4 + 32 * {{NSG}} - 1) / (32 * {{NSG}})>;
    var st = 0.0;   // lanes below 2 BQ2: the tile's lse (base 2) or dvec
    if (first < tiles) {   // the first tile, (0, first)
        for (var t = 0u; t < ({{BQ2}}u * {{HD}}u / 4u + 32u * {{NSG}}u - 1u) / (32u * {{NSG}}u); t++) {   // @unroll
            let i = lid + t * WGW;
            let n = first * {{BQ2}}u + i / H4;
            qr[t] = vec4<f16>();
            dr[t] = vec4<f16>();
            if (i < {{BQ2}}u * H4 && n < p.seq) {
                qr[t] = vec4<f16>(widen(q_in[q_row(b, n, hk * group) + i % H4]) * qscale);
                dr[t] = narrow(do_in[o_row(b, n, hk * group) + i % H4]);
            }
        }
        if (lid < 2u * {{BQ2}}u && first * {{BQ2}}u + lid % {{BQ2}}u < p.seq) {
            if (lid < {{BQ2}}u) {
                st = lse_in[stat_index(b, hk * group, first * {{BQ2}}u + lid)] * LOG2E;
            } else {
                st = dvec_in[stat_index(b, hk * group, first * {{BQ2}}u + lid % {{BQ2}}u)];
            }
        }
    }
    for (var g = 0u; g < group; g++) {
        let h = hk * group + g;
        for (var qt = first; qt < tiles; qt++) {
            let q0 = qt * {{BQ2}}u;
            workgroupBarrier();              // the previous tile's products are done
            for (var t = 0u; t < ({{BQ2}}u * {{HD}}u / 4u + 32u * {{NSG}}u - 1u) / (32u * {{NSG}}u); t++) {   // @unroll
                let i = lid + t * WGW;
                if (i < {{BQ2}}u * H4) {
                    put4q((i / H4) * SH + 4u * (i % H4), qr[t], 1u);
                    put4q((i / H4) * SH + 4u * (i % H4), dr[t], 2u);
                }
            }
            if (lid < 2u * {{BQ2}}u) {
                stats[lid] = st;
            }
            workgroupBarrier();
            var lq = qt + 1u;                // the next tile (lg, lq)
            var lg = g;
            if (lq == tiles) {
                lq = first;
                lg = g + 1u;
            }
            if (lg < group) {
                for (var t = 0u; t < ({{BQ2}}u * {{HD}}u / 4u + 32u * {{NSG}}u - 1u) / (32u * {{NSG}}u); t++) {   // @unroll
                    let i = lid + t * WGW;
                    let n = lq * {{BQ2}}u + i / H4;
                    qr[t] = vec4<f16>();
                    dr[t] = vec4<f16>();
                    if (i < {{BQ2}}u * H4 && n < p.seq) {
                        qr[t] = vec4<f16>(widen(q_in[q_row(b, n, hk * group + lg) + i % H4]) * qscale);
                        dr[t] = narrow(do_in[o_row(b, n, hk * group + lg) + i % H4]);
                    }
                }
                st = 0.0;
                if (lid < 2u * {{BQ2}}u && lq * {{BQ2}}u + lid % {{BQ2}}u < p.seq) {
                    if (lid < {{BQ2}}u) {
                        st = lse_in[stat_index(b, hk * group + lg, lq * {{BQ2}}u + lid)] * LOG2E;
                    } else {
                        st = dvec_in[stat_index(b, hk * group + lg, lq * {{BQ2}}u + lid % {{BQ2}}u)];
                    }
                }
            }
            // s^T = k q'^T, each q matrix loaded once for the KR row blocks
            for (var j = 0u; j < {{BQ2}}u / 16u; j++) {   // @unroll
                var sacc: array<subgroup_matrix_result<f32, 16, 16>, {{KR}}>;
                for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                    let qb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Qs, 16u * j * SH + 16u * d, true, SH);
                    for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
                        sacc[rb] = subgroupMatrixMultiplyAccumulate(ka[rb][d], qb, sacc[rb]);
                    }
                }
                for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
                    subgroupMatrixStore(&Ss, 16u * ({{KR}}u * sg + rb) * SSK + 16u * j, sacc[rb], false, SSK);
                }
            }
            workgroupBarrier();
            for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
                let kpos = k0 + row0 + 16u * rb;
                for (var c = 0u; c < {{BQ2}}u / 2u; c++) {   // @unroll
                    let col = (2u * c + half + rot) % {{BQ2}}u;
                    let qi = q0 + col;
                    let e = exp2(Ss[(row0 + 16u * rb) * SSK + col] - stats[col]);
                    pr[rb][c] = select(0.0, e, qi >= kpos && qi < p.seq && kpos < p.seq);
                    PD[(row0 + 16u * rb) * SPK + col] = f16(pr[rb][c]);
                }
            }
            workgroupBarrier();              // s^T read: Ss takes (v do^T)^T
            for (var j = 0u; j < {{BQ2}}u / 16u; j++) {   // @unroll
                var tacc: array<subgroup_matrix_result<f32, 16, 16>, {{KR}}>;
                for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                    let db = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ds, 16u * j * SH + 16u * d, true, SH);
                    for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
                        tacc[rb] = subgroupMatrixMultiplyAccumulate(va[rb][d], db, tacc[rb]);
                    }
                }
                for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
                    subgroupMatrixStore(&Ss, 16u * ({{KR}}u * sg + rb) * SSK + 16u * j, tacc[rb], false, SSK);
                }
            }
            workgroupBarrier();
            for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
                for (var c = 0u; c < {{BQ2}}u / 2u; c++) {   // @unroll
                    let col = (2u * c + half + rot) % {{BQ2}}u;
                    PD[DSW + (row0 + 16u * rb) * SPK + col] = f16(pr[rb][c] * (Ss[(row0 + 16u * rb) * SSK + col] - stats[{{BQ2}}u + col]));
                }
            }
            workgroupBarrier();
            // dv += p^T do, dk += ds^T q': each do and q matrix loaded once for the row blocks
            for (var ks = 0u; ks < {{BQ2}}u / 16u; ks++) {   // @unroll
                var pl: array<subgroup_matrix_left<f16, 16, 16>, {{KR}}>;
                var dl: array<subgroup_matrix_left<f16, 16, 16>, {{KR}}>;
                for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
                    pl[rb] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&PD, 16u * ({{KR}}u * sg + rb) * SPK + 16u * ks, false, SPK);
                    dl[rb] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&PD, DSW + 16u * ({{KR}}u * sg + rb) * SPK + 16u * ks, false, SPK);
                }
                for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                    let db = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ds, 16u * ks * SH + 16u * d, false, SH);
                    let qb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Qs, 16u * ks * SH + 16u * d, false, SH);
                    for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
                        dv[rb][d] = subgroupMatrixMultiplyAccumulate(pl[rb], db, dv[rb][d]);
                        dk[rb][d] = subgroupMatrixMultiplyAccumulate(dl[rb], qb, dk[rb][d]);
                    }
                }
            }
        }
    }
    // q was staged pre-scaled by scale*log2(e): dk = scale * sum ds q = LN2 * sum ds q'.
    // Out through Ss, 16 columns at a time (at BQ2 16 a row of Ss holds only one block).
    for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
        workgroupBarrier();
        for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
            subgroupMatrixStore(&Ss, 16u * ({{KR}}u * sg + rb) * SSK, dk[rb][d], false, SSK);
        }
        workgroupBarrier();
        for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
            let kpos = k0 + row0 + 16u * rb;
            if (kpos < p.seq) {   // lane (r, half): 8 of the 16 columns of this d tile
                let s = (row0 + 16u * rb) * SSK + 8u * half;
                let at = kv_row(b, kpos, hk) + 4u * d + 2u * half;
                dk_out[at] = LN2 * vec4<f32>(Ss[s], Ss[s + 1u], Ss[s + 2u], Ss[s + 3u]);
                dk_out[at + 1u] = LN2 * vec4<f32>(Ss[s + 4u], Ss[s + 5u], Ss[s + 6u], Ss[s + 7u]);
            }
        }
        workgroupBarrier();
        for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
            subgroupMatrixStore(&Ss, 16u * ({{KR}}u * sg + rb) * SSK, dv[rb][d], false, SSK);
        }
        workgroupBarrier();
        for (var rb = 0u; rb < {{KR}}u; rb++) {   // @unroll
            let kpos = k0 + row0 + 16u * rb;
            if (kpos < p.seq) {
                let s = (row0 + 16u * rb) * SSK + 8u * half;
                let at = kv_row(b, kpos, hk) + 4u * d + 2u * half;
                dv_out[at] = vec4<f32>(Ss[s], Ss[s + 1u], Ss[s + 2u], Ss[s + 3u]);
                dv_out[at + 1u] = vec4<f32>(Ss[s + 4u], Ss[s + 5u], Ss[s + 6u], Ss[s + 7u]);
            }
        }
    }
}
