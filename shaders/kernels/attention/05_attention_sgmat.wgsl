// 05_attention_sgmat.wgsl — causal GQA attention on the tensor cores (Dawn's
// chromium_experimental_subgroup_matrix, f16 x f16 -> f32): the products of
// 05_attention_tiled.wgsl (same layouts, same bindings, same outputs), picked by
// shaders/kernels/attention/ops.py with tensor_cores=True.
//
//   attention_forward_sgmat       o = softmax(q k^T * scale + causal mask) v; lse per query
//   attention_backward_dq_sgmat   dq = scale * sum_keys ds k,  ds = p * (do.v - dvec)
//   attention_backward_dkv_sgmat  dk = scale * sum_queries ds q, dv = sum_queries p do, over
//                                 the H/Hkv query heads sharing the kv head (no atomics)
//
// Numerics: q (pre-scaled by scale*log2(e): scores in base 2), k, v, do, the probabilities
// p and ds are rounded to f16 where they enter a product; every product accumulates in f32,
// the softmax statistics (row max, sum, lse) and the output rescaling are f32.
//
// Staged rows are HD + 8 f16 long (the rows that later hold p or ds: at least the tile's key
// count + 8). Tiling: a workgroup is 4 subgroups of 32; each subgroup owns 16 rows (queries for forward
// and dq, keys for dkv), its lane 2r + h the half h of row r's columns (the forward reads
// them in an order rotated by lane, so each read spreads over 32 banks). Tiles are staged in
// workgroup memory as f16 rows of HD + 8 (padding spreads the 16-row matrix loads over
// banks); the rows' own operand (q, or k and v for dkv; do for dq) is loaded into subgroup
// matrices once. Per tile: scores S (16 x 16 subgroup-matrix products over HD/16 steps) go
// through f32 workgroup memory (Ss) to the lanes, which apply the mask and softmax (the
// forward's online softmax keeps max, sum and the output rows in f32 registers: a
// subgroup matrix cannot be rescaled row by row) and write p (or ds) back as f16 for the
// next product. Forward: BQ 64 queries x BKV 64 keys; dq: 64 x 32; dkv: 64 keys x 32
// queries. Results leave through Ss, 16 x 16 at a time.
// A template (shaders/wgsl_expand.py): HD (head dim, a multiple of 16, <= 64); IN4 and
// F16_BITS, how q, k, v and do are stored: vec4<f32> rows, or f16 (the trainer's f16
// head-major copies: half the bytes; q is widened and pre-scaled in f32, then rounded
// again), F16_BITS, read as their bits (vec2<u32>).
//
// Bindings (group 0), as 05_attention_tiled.wgsl:
//   forward:  0 q, 1 k, 2 v, 3 o (rw), 4 lse (rw), 5 Params
//   dq:       0 q, 1 k, 2 v, 3 do, 4 lse, 5 dvec, 6 dq (rw), 7 Params
//   dkv:      0 q, 1 k, 2 v, 3 do, 4 lse, 5 dvec, 6 dk (rw), 7 dv (rw), 8 Params
// Dispatch: forward and dq (B*H, ceil(T / 64)), the last (heaviest) query tile first;
// dkv (B*Hkv, ceil(T / 64)), the first (heaviest) key tile first. 128 invocations.

const HD: u32 = {{HD}}u;
const DT: u32 = HD / 16u;        // 16-wide column tiles of a head row
const SH: u32 = HD + 8u;         // f16 row stride of staged head rows
const SPF: u32 = max(HD, 64u) + 8u;   // forward: q rows, then p rows of 64 keys
const SPQ: u32 = max(HD, 32u) + 8u;   // dq: q, do rows, then ds rows of 32 keys
const H4: u32 = HD / 4u;
const WG: u32 = 128u;
const LOG2E: f32 = 1.4426950408889634;
const LN2: f32 = 0.6931471805599453;
const MASKED: f32 = -1e30;

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

// --- KERNEL: attention_forward_sgmat ---
@group(0) @binding(0) var<storage, read> q_in: array<{{IN4}}>;
@group(0) @binding(1) var<storage, read> k_in: array<{{IN4}}>;
@group(0) @binding(2) var<storage, read> v_in: array<{{IN4}}>;
@group(0) @binding(3) var<storage, read_write> o_out: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> lse_out: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

var<workgroup> QP: array<f16, 64u * SPF>;    // the q tile, then p of the current key tile
var<workgroup> Ks: array<f16, 64u * SH>;
var<workgroup> Vs: array<f16, 64u * SH>;
var<workgroup> Ss: array<f32, 64u * 64u>;   // scores, then p @ v (a subgroup's 16 rows each)

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
fn attention_forward_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                           @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32,
                           @builtin(subgroup_id) sg: u32,
                           @builtin(subgroup_invocation_id) lane: u32) {
    let bh = wg.x;
    let b = bh / p.heads;
    let h = bh % p.heads;
    let hk = h / (p.heads / p.kv_heads);
    let qt = nwg.y - 1u - wg.y;              // heaviest (last) query tile first
    let q0 = qt * 64u;
    let qscale = p.scale * LOG2E;
    for (var i = lid; i < 64u * H4; i += WG) {
        let r = i / H4;
        var v = vec4<f32>();
        if (q0 + r < p.seq) { v = widen(q_in[q_row(b, q0 + r, h) + i % H4]) * qscale; }
        put4(r * SPF + 4u * (i % H4), v, 0u);
    }
    workgroupBarrier();
    var qa: array<subgroup_matrix_left<f16, 16, 16>, {{DT}}>;
    for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
        qa[d] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&QP, 16u * sg * SPF + 16u * d, false, SPF);
    }
    let r = 16u * sg + lane / 2u;            // this lane's row of the tile and half of it
    let half = lane % 2u;
    let qpos = q0 + r;
    var m = MASKED;
    var l = 0.0;
    var o: array<f32, {{HD}} / 2>;
    let last = min(qt, (p.seq - 1u) / 64u);
    // Key tile kt + 1's k and v rows travel in registers while tile kt is multiplied: all of
    // a tile's loads are in flight at once and under the previous tile's work (loading and
    // staging them row by row in one loop waited for each load in turn)
    var kr: array<vec4<f16>, {{HD}} / 8>;
    var vr: array<vec4<f16>, {{HD}} / 8>;
    for (var t = 0u; t < {{HD}}u / 8u; t++) {   // @unroll
        let i = lid + t * WG;                // 64 rows x H4 vec4 = HD / 8 per invocation
        let n = i / H4;
        kr[t] = vec4<f16>();
        vr[t] = vec4<f16>();
        if (n < p.seq) {
            kr[t] = narrow(k_in[kv_row(b, n, hk) + i % H4]);
            vr[t] = narrow(v_in[kv_row(b, n, hk) + i % H4]);
        }
    }
    for (var kt = 0u; kt <= last; kt++) {
        let k0 = kt * 64u;
        workgroupBarrier();                  // the previous tile's readers are done
        for (var t = 0u; t < {{HD}}u / 8u; t++) {   // @unroll
            let i = lid + t * WG;
            put4h((i / H4) * SH + 4u * (i % H4), kr[t], 1u);
            put4h((i / H4) * SH + 4u * (i % H4), vr[t], 2u);
        }
        workgroupBarrier();
        if (kt < last) {
            for (var t = 0u; t < {{HD}}u / 8u; t++) {   // @unroll
                let i = lid + t * WG;
                let n = k0 + 64u + i / H4;
                kr[t] = vec4<f16>();
                vr[t] = vec4<f16>();
                if (n < p.seq) {
                    kr[t] = narrow(k_in[kv_row(b, n, hk) + i % H4]);
                    vr[t] = narrow(v_in[kv_row(b, n, hk) + i % H4]);
                }
            }
        }
        for (var j = 0u; j < 4u; j++) {   // @unroll
            var s = subgroup_matrix_result<f32, 16, 16>();
            for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                let kb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ks, 16u * j * SH + 16u * d, true, SH);
                s = subgroupMatrixMultiplyAccumulate(qa[d], kb, s);
            }
            subgroupMatrixStore(&Ss, 16u * sg * 64u + 16u * j, s, false, 64u);
        }
        workgroupBarrier();
        // sv[c] is column 32 half + (c + lane) % 32: at each c the subgroup's 32 lanes read 32
        // banks (rows are 64 words, so reading in column order put all 32 lanes on one bank)
        var sv: array<f32, 32>;
        var mx = MASKED;
        for (var c = 0u; c < 32u; c++) {   // @unroll
            let col = 32u * half + ((c + lane) & 31u);
            let key = k0 + col;
            sv[c] = select(MASKED, Ss[r * 64u + col], key <= qpos && key < p.seq);
            mx = max(mx, sv[c]);
        }
        mx = max(mx, subgroupShuffleXor(mx, 1u));
        let m_new = max(m, mx);
        let alpha = exp2(m - m_new);
        var sum = 0.0;
        for (var c = 0u; c < 32u; c++) {   // @unroll
            let pc = exp2(sv[c] - m_new);
            sum += pc;
            QP[r * SPF + 32u * half + ((c + lane) & 31u)] = f16(pc);
        }
        sum += subgroupShuffleXor(sum, 1u);
        l = l * alpha + sum;
        m = m_new;
        workgroupBarrier();
        // p's 4 key steps, loaded once for every column tile of v
        var pa: array<subgroup_matrix_left<f16, 16, 16>, 4>;   // @let
        for (var ks = 0u; ks < 4u; ks++) {   // @unroll
            pa[ks] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&QP, 16u * sg * SPF + 16u * ks, false, SPF);
        }
        for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
            var acc = subgroup_matrix_result<f32, 16, 16>();
            for (var ks = 0u; ks < 4u; ks++) {   // @unroll
                let vb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Vs, 16u * ks * SH + 16u * d, false, SH);
                acc = subgroupMatrixMultiplyAccumulate(pa[ks], vb, acc);
            }
            subgroupMatrixStore(&Ss, 16u * sg * 64u + 16u * d, acc, false, 64u);
        }
        workgroupBarrier();
        // o[c] is column (HD / 2) half + (c + lane) % (HD / 2), read rotated as sv above
        for (var c = 0u; c < {{HD}}u / 2u; c++) {   // @unroll
            o[c] = alpha * o[c] + Ss[r * 64u + (HD / 2u) * half + ((c + lane) % (HD / 2u))];
        }
    }
    // back to column order through the lane's own words of Ss: each lane rewrites exactly the
    // words it read last (no other lane reads them), so no barrier
    let inv = 1.0 / l;
    for (var c = 0u; c < {{HD}}u / 2u; c++) {   // @unroll
        Ss[r * 64u + (HD / 2u) * half + ((c + lane) % (HD / 2u))] = inv * o[c];
    }
    if (qpos < p.seq) {
        let base = o_row(b, qpos, h) + (H4 / 2u) * half;
        let s0 = r * 64u + (HD / 2u) * half;
        for (var c = 0u; c < {{HD}}u / 8u; c++) {   // @unroll
            o_out[base + c] = vec4<f32>(Ss[s0 + 4u * c], Ss[s0 + 4u * c + 1u], Ss[s0 + 4u * c + 2u], Ss[s0 + 4u * c + 3u]);
        }
        if (half == 0u) { lse_out[stat_index(b, h, qpos)] = (m + log2(l)) * LN2; }
    }
}

// --- KERNEL: attention_backward_dq_sgmat ---
@group(0) @binding(0) var<storage, read> q_in: array<{{IN4}}>;
@group(0) @binding(1) var<storage, read> k_in: array<{{IN4}}>;
@group(0) @binding(2) var<storage, read> v_in: array<{{IN4}}>;
@group(0) @binding(3) var<storage, read> do_in: array<{{IN4}}>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dvec_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> dq_out: array<vec4<f32>>;
@group(0) @binding(7) var<uniform> p: Params;

var<workgroup> QP: array<f16, 64u * SPQ>;    // q, then do (both loaded once), then ds
var<workgroup> Ks: array<f16, 32u * SH>;
var<workgroup> Vs: array<f16, 32u * SH>;
var<workgroup> Ss: array<f32, 64u * 32u>;   // scores, then do v^T; at the end dq

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

@compute @workgroup_size(WG)
fn attention_backward_dq_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
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
    let r = 16u * sg + lane / 2u;
    let half = lane % 2u;
    let qpos = q0 + r;
    var lse2 = 0.0;
    var dvec = 0.0;
    if (qpos < p.seq) {
        lse2 = lse_in[stat_index(b, h, qpos)] * LOG2E;
        dvec = dvec_in[stat_index(b, h, qpos)];
    }
    var dq: array<subgroup_matrix_result<f32, 16, 16>, {{DT}}>;
    let last = min((q0 + 63u) / 32u, (p.seq - 1u) / 32u);
    for (var kt = 0u; kt <= last; kt++) {
        let k0 = kt * 32u;
        workgroupBarrier();
        for (var i = lid; i < 32u * H4; i += WG) {
            let n = i / H4;
            var kv = vec4<f32>();
            var vv = vec4<f32>();
            if (k0 + n < p.seq) {
                kv = widen(k_in[kv_row(b, k0 + n, hk) + i % H4]);
                vv = widen(v_in[kv_row(b, k0 + n, hk) + i % H4]);
            }
            put4(n * SH + 4u * (i % H4), kv, 1u);
            put4(n * SH + 4u * (i % H4), vv, 2u);
        }
        workgroupBarrier();
        for (var j = 0u; j < 2u; j++) {   // @unroll
            var s = subgroup_matrix_result<f32, 16, 16>();
            for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                let kb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ks, 16u * j * SH + 16u * d, true, SH);
                s = subgroupMatrixMultiplyAccumulate(qa[d], kb, s);
            }
            subgroupMatrixStore(&Ss, 16u * sg * 32u + 16u * j, s, false, 32u);
        }
        workgroupBarrier();
        var pr: array<f32, 16>;
        for (var c = 0u; c < 16u; c++) {   // @unroll
            let key = k0 + 16u * half + c;
            let e = exp2(Ss[r * 32u + 16u * half + c] - lse2);
            pr[c] = select(0.0, e, key <= qpos && key < p.seq && qpos < p.seq);
        }
        workgroupBarrier();
        for (var j = 0u; j < 2u; j++) {   // @unroll
            var s = subgroup_matrix_result<f32, 16, 16>();
            for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                let vb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Vs, 16u * j * SH + 16u * d, true, SH);
                s = subgroupMatrixMultiplyAccumulate(da[d], vb, s);
            }
            subgroupMatrixStore(&Ss, 16u * sg * 32u + 16u * j, s, false, 32u);
        }
        workgroupBarrier();
        for (var c = 0u; c < 16u; c++) {   // @unroll
            QP[r * SPQ + 16u * half + c] = f16(pr[c] * (Ss[r * 32u + 16u * half + c] - dvec));
        }
        workgroupBarrier();
        for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
            for (var ks = 0u; ks < 2u; ks++) {   // @unroll
                let dsa = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&QP, 16u * sg * SPQ + 16u * ks, false, SPQ);
                let kb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ks, 16u * ks * SH + 16u * d, false, SH);
                dq[d] = subgroupMatrixMultiplyAccumulate(dsa, kb, dq[d]);
            }
        }
    }
    for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
        workgroupBarrier();
        subgroupMatrixStore(&Ss, 16u * sg * 32u, dq[d], false, 32u);
        workgroupBarrier();
        if (qpos < p.seq) {   // lane (r, half): 8 of the 16 columns of this d tile
            let s = r * 32u + 8u * half;
            let at = q_row(b, qpos, h) + 4u * d + 2u * half;
            dq_out[at] = p.scale * vec4<f32>(Ss[s], Ss[s + 1u], Ss[s + 2u], Ss[s + 3u]);
            dq_out[at + 1u] = p.scale * vec4<f32>(Ss[s + 4u], Ss[s + 5u], Ss[s + 6u], Ss[s + 7u]);
        }
    }
}

// --- KERNEL: attention_backward_dkv_sgmat ---
@group(0) @binding(0) var<storage, read> q_in: array<{{IN4}}>;
@group(0) @binding(1) var<storage, read> k_in: array<{{IN4}}>;
@group(0) @binding(2) var<storage, read> v_in: array<{{IN4}}>;
@group(0) @binding(3) var<storage, read> do_in: array<{{IN4}}>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dvec_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> dk_out: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> dv_out: array<vec4<f32>>;
@group(0) @binding(8) var<uniform> p: Params;

var<workgroup> KV: array<f16, 64u * SH>;    // k, then v of this tile (loaded once)
var<workgroup> Qs: array<f16, 32u * SH>;    // the query tile, pre-scaled like the forward's
var<workgroup> Ds: array<f16, 32u * SH>;    // its do rows
var<workgroup> Ps: array<f16, 64u * 40u>;   // p^T [key][query]
var<workgroup> DSs: array<f16, 64u * 40u>;  // ds^T
var<workgroup> Ss: array<f32, 64u * 32u>;   // s^T, then v do^T; at the end dk and dv
var<workgroup> stats: array<f32, 64u>;      // the query tile's lse (base 2) and dvec

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

@compute @workgroup_size(WG)
fn attention_backward_dkv_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
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
    let r = 16u * sg + lane / 2u;            // this lane's key row of the tile
    let half = lane % 2u;                    // and half of the query tile's 32 columns
    let kpos = k0 + r;
    var dk: array<subgroup_matrix_result<f32, 16, 16>, {{DT}}>;
    var dv: array<subgroup_matrix_result<f32, 16, 16>, {{DT}}>;
    let first = k0 / 32u;
    let tiles = (p.seq + 31u) / 32u;
    for (var g = 0u; g < group; g++) {
        let h = hk * group + g;
        for (var qt = first; qt < tiles; qt++) {
            let q0 = qt * 32u;
            workgroupBarrier();
            for (var i = lid; i < 32u * H4; i += WG) {
                let n = i / H4;
                var qv = vec4<f32>();
                var dv4 = vec4<f32>();
                if (q0 + n < p.seq) {
                    qv = widen(q_in[q_row(b, q0 + n, h) + i % H4]) * qscale;
                    dv4 = widen(do_in[o_row(b, q0 + n, h) + i % H4]);
                }
                put4(n * SH + 4u * (i % H4), qv, 1u);
                put4(n * SH + 4u * (i % H4), dv4, 2u);
            }
            if (lid < 32u) {
                var l2 = 0.0;
                var dvc = 0.0;
                if (q0 + lid < p.seq) {
                    l2 = lse_in[stat_index(b, h, q0 + lid)] * LOG2E;
                    dvc = dvec_in[stat_index(b, h, q0 + lid)];
                }
                stats[lid] = l2;
                stats[32u + lid] = dvc;
            }
            workgroupBarrier();
            for (var j = 0u; j < 2u; j++) {   // @unroll
                var s = subgroup_matrix_result<f32, 16, 16>();
                for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                    let qb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Qs, 16u * j * SH + 16u * d, true, SH);
                    s = subgroupMatrixMultiplyAccumulate(ka[d], qb, s);
                }
                subgroupMatrixStore(&Ss, 16u * sg * 32u + 16u * j, s, false, 32u);
            }
            workgroupBarrier();
            var pr: array<f32, 16>;
            for (var c = 0u; c < 16u; c++) {   // @unroll
                let qi = 16u * half + c;
                let e = exp2(Ss[r * 32u + qi] - stats[qi]);
                pr[c] = select(0.0, e, q0 + qi >= kpos && q0 + qi < p.seq && kpos < p.seq);
                Ps[r * 40u + qi] = f16(pr[c]);
            }
            workgroupBarrier();
            for (var j = 0u; j < 2u; j++) {   // @unroll
                var s = subgroup_matrix_result<f32, 16, 16>();
                for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                    let db = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ds, 16u * j * SH + 16u * d, true, SH);
                    s = subgroupMatrixMultiplyAccumulate(va[d], db, s);
                }
                subgroupMatrixStore(&Ss, 16u * sg * 32u + 16u * j, s, false, 32u);
            }
            for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                for (var ks = 0u; ks < 2u; ks++) {   // @unroll
                    let pl = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&Ps, 16u * sg * 40u + 16u * ks, false, 40u);
                    let db = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Ds, 16u * ks * SH + 16u * d, false, SH);
                    dv[d] = subgroupMatrixMultiplyAccumulate(pl, db, dv[d]);
                }
            }
            workgroupBarrier();
            for (var c = 0u; c < 16u; c++) {   // @unroll
                let qi = 16u * half + c;
                DSs[r * 40u + qi] = f16(pr[c] * (Ss[r * 32u + qi] - stats[32u + qi]));
            }
            workgroupBarrier();
            for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
                for (var ks = 0u; ks < 2u; ks++) {   // @unroll
                    let dl = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&DSs, 16u * sg * 40u + 16u * ks, false, 40u);
                    let qb = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Qs, 16u * ks * SH + 16u * d, false, SH);
                    dk[d] = subgroupMatrixMultiplyAccumulate(dl, qb, dk[d]);
                }
            }
        }
    }
    // q was staged pre-scaled by scale*log2(e): dk = scale * sum ds q = LN2 * sum ds q'
    for (var d = 0u; d < {{DT}}u; d++) {   // @unroll
        workgroupBarrier();
        subgroupMatrixStore(&Ss, 16u * sg * 32u, dk[d], false, 32u);
        subgroupMatrixStore(&Ss, 16u * sg * 32u + 16u, dv[d], false, 32u);
        workgroupBarrier();
        if (kpos < p.seq) {   // lane (r, half): 8 of the 16 columns of this d tile
            let s = r * 32u + 8u * half;
            let at = kv_row(b, kpos, hk) + 4u * d + 2u * half;
            dk_out[at] = LN2 * vec4<f32>(Ss[s], Ss[s + 1u], Ss[s + 2u], Ss[s + 3u]);
            dk_out[at + 1u] = LN2 * vec4<f32>(Ss[s + 4u], Ss[s + 5u], Ss[s + 6u], Ss[s + 7u]);
            dv_out[at] = vec4<f32>(Ss[s + 16u], Ss[s + 17u], Ss[s + 18u], Ss[s + 19u]);
            dv_out[at + 1u] = vec4<f32>(Ss[s + 20u], Ss[s + 21u], Ss[s + 22u], Ss[s + 23u]);
        }
    }
}
