// 05_attention_tiled.wgsl — causal GQA attention with register-tiled score blocks and vec4
// workgroup tiles (the fast path of shaders/ops/attention.py; 05_attention.wgsl is the
// general fallback and holds the backward's prep kernel). No T x T matrix in memory.
//
//   attention_forward_tiled       o = softmax(q k^T * scale + causal mask) v; lse per query
//   attention_backward_dq_tiled   dq = scale * sum_keys ds k,  ds = p * (do.v - dvec),
//                                 p = exp(s - lse)
//   attention_backward_dkv_tiled  dk = scale * sum_queries ds q, dv = sum_queries p do, over
//                                 the H/Hkv query heads sharing the kv head (no atomics)
//
// Layouts: those of 05_attention.wgsl (q, dq [B,T,H,D] with token stride sq; k, v, dk, dv
// [B,T,Hkv,D] with skv; o, do [B,T,H,D] with so; lse, dvec [B,H,T]), read and written as
// vec4: D and the token strides must be multiples of 4 and the views 16-byte aligned (the op
// checks and falls back to the general kernels otherwise).
//
// Tiling. A workgroup owns R rows (queries: forward, dq; keys: dkv) of one head and walks
// tiles of C columns (keys; queries for dkv). Rows and columns are staged row-major in
// workgroup memory as vec4s with rows padded by one vec4 (HD + 4 floats), so that the rows
// neighbouring invocations read fall in different banks. Invocation (tr, tc) of the
// (R/4) x (C/4) grid owns rows tr + (R/4)*i and columns tc + (C/4)*j (i, j < 4): a 4 x 4
// block of scores computed as vec4 dot products over D (8 vec4 loads feed 64 FMAs). The
// probabilities (and ds) go to workgroup memory in the block's own order ([column][tr*4+i]),
// from where the same invocation's output block — its 4 rows x D/C vec4 columns
// (tc + (C/4)*j) — accumulates p @ v with one vec4 load of p and D/C loads of v per column.
// The forward keeps an online softmax per row: the row max and sum over the C/4 invocations
// sharing the row go through workgroup memory as vec4s (one per invocation). Scores are in
// base 2 (q pre-scaled by scale*log2(e), exp2); lse is stored in natural log.
// Causal work balance: the workgroups of the last query tiles (most keys) start first.
//
// Overrides: HD (head dim, multiple of 4), BQ, BKV (multiples of 4); forward and dq need
// HD % BKV == 0 and HD / BKV <= 4; dkv needs HD % BQ == 0 and HD / BQ <= 4.
// Workgroup size: (BQ/4)*(BKV/4) invocations.
//
// Bindings (group 0):
//   forward:  0 q, 1 k, 2 v, 3 o (rw), 4 lse (rw), 5 Params
//   dq:       0 q, 1 k, 2 v, 3 do, 4 lse, 5 dvec, 6 dq (rw), 7 Params
//   dkv:      0 q, 1 k, 2 v, 3 do, 4 lse, 5 dvec, 6 dk (rw), 7 dv (rw), 8 Params
// Dispatch: forward and dq (B*H, ceil(T / BQ)): the query tile is the y index, heaviest
// (last, most keys) first; workgroups start in x-fastest order, so every head's long tiles
// start before any short one and the causal imbalance leaves no tail of long tiles started
// last (7-8% faster on the H200). dkv (HC, ceil(T / BKV), ceil(B*Hkv / HC)): heads in
// chunks of HC, each chunk's heaviest (first) key tiles first; whole-grid head-major order
// was 4% slower (every head's q and do at once overflow L2), a chunk of heads keeps them
// in L2 and still starts most long tiles early.

override HD: u32 = 64u;
override BQ: u32 = 64u;
override BKV: u32 = 32u;

override H4: u32 = HD / 4u;          // vec4s per head row
override RS: u32 = HD / 4u + 1u;     // padded row stride of the staged tiles, in vec4s
override TQ: u32 = BQ / 4u;          // invocations across the query dimension
override TK: u32 = BKV / 4u;         // invocations across the key dimension
override WG: u32 = (BQ / 4u) * (BKV / 4u);

const MAX_DV: u32 = 4u;
const LOG2E: f32 = 1.4426950408889634;
const LN2: f32 = 0.6931471805599453;
const MASKED: f32 = -1e30;

struct Params {
    batch: u32,
    seq: u32,
    heads: u32,
    kv_heads: u32,
    sq: u32,
    skv: u32,
    so: u32,
    _pad: u32,
    scale: f32,
    _pad1: u32,
    _pad2: u32,
    _pad3: u32,
}

// vec4 indices of the first element of a head row
fn q_row(b: u32, t: u32, h: u32) -> u32 { return ((b * p.seq + t) * p.sq + h * HD) / 4u; }
fn kv_row(b: u32, t: u32, hk: u32) -> u32 { return ((b * p.seq + t) * p.skv + hk * HD) / 4u; }
fn o_row(b: u32, t: u32, h: u32) -> u32 { return ((b * p.seq + t) * p.so + h * HD) / 4u; }
fn stat_index(b: u32, h: u32, t: u32) -> u32 { return (b * p.heads + h) * p.seq + t; }

fn max4(v: vec4<f32>) -> f32 { return max(max(v.x, v.y), max(v.z, v.w)); }

// --- KERNEL: attention_forward_tiled ---
@group(0) @binding(0) var<storage, read> q_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v_in: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> o_out: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> lse_out: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

var<workgroup> qs: array<vec4<f32>, BQ * RS>;
var<workgroup> ks: array<vec4<f32>, BKV * RS>;
var<workgroup> vs: array<vec4<f32>, BKV * H4>;
var<workgroup> ps: array<vec4<f32>, BKV * TQ>;      // [key][tq] -> the 4 rows of tq
var<workgroup> red_max: array<vec4<f32>, TK * TQ>;  // [tk][tq] partial row maxima
var<workgroup> red_sum: array<vec4<f32>, TK * TQ>;

@compute @workgroup_size(WG)
fn attention_forward_tiled(@builtin(workgroup_id) wg: vec3<u32>,
                           @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let tk = lid % TK;
    let tq = lid / TK;
    let q0 = (nwg.y - 1u - wg.y) * BQ;
    let b = wg.x / p.heads;
    let h = wg.x % p.heads;
    let hk = h / (p.heads / p.kv_heads);
    let qscale = p.scale * LOG2E;

    for (var i = lid; i < BQ * H4; i += WG) {
        let r = i / H4;
        let d4 = i % H4;
        var v = vec4<f32>();
        if (q0 + r < p.seq) { v = q_in[q_row(b, q0 + r, h) + d4] * qscale; }
        qs[r * RS + d4] = v;
    }

    var m = vec4<f32>(MASKED);
    var l = vec4<f32>();
    var o: array<vec4<f32>, 4u * MAX_DV>;
    let dv = H4 / TK;
    let kv_end = min(p.seq, q0 + BQ);
    for (var kv0 = 0u; kv0 < kv_end; kv0 += BKV) {
        workgroupBarrier();   // the previous tile's readers are done with ks, vs, ps
        for (var i = lid; i < BKV * H4; i += WG) {
            let n = i / H4;
            let d4 = i % H4;
            var kv = vec4<f32>();
            var vv = vec4<f32>();
            if (kv0 + n < p.seq) {
                let g = kv_row(b, kv0 + n, hk) + d4;
                kv = k_in[g];
                vv = v_in[g];
            }
            ks[n * RS + d4] = kv;
            vs[n * H4 + d4] = vv;
        }
        workgroupBarrier();

        var s = array<f32, 16>();   // s[4*i + j]: row tq + TQ*i, key tk + TK*j (zeroed per tile)
        for (var d4 = 0u; d4 < H4; d4++) {
            var qv: array<vec4<f32>, 4>;
            var kv: array<vec4<f32>, 4>;
            for (var i = 0u; i < 4u; i++) { qv[i] = qs[(tq + TQ * i) * RS + d4]; }
            for (var j = 0u; j < 4u; j++) { kv[j] = ks[(tk + TK * j) * RS + d4]; }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) { s[4u * i + j] += dot(qv[i], kv[j]); }
            }
        }
        if (kv0 + BKV > q0 || kv0 + BKV > p.seq) {   // diagonal or last tile: mask
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    let key = kv0 + tk + TK * j;
                    if (key > q0 + tq + TQ * i || key >= p.seq) { s[4u * i + j] = MASKED; }
                }
            }
        }
        var part = vec4<f32>();
        for (var i = 0u; i < 4u; i++) {
            part[i] = max4(vec4<f32>(s[4u * i], s[4u * i + 1u], s[4u * i + 2u], s[4u * i + 3u]));
        }
        red_max[tk * TQ + tq] = part;
        workgroupBarrier();
        var m_new = m;
        for (var t = 0u; t < TK; t++) { m_new = max(m_new, red_max[t * TQ + tq]); }
        var psum = vec4<f32>();
        for (var j = 0u; j < 4u; j++) {
            let pj = exp2(vec4<f32>(s[j], s[4u + j], s[8u + j], s[12u + j]) - m_new);
            ps[(tk + TK * j) * TQ + tq] = pj;
            psum += pj;
        }
        red_sum[tk * TQ + tq] = psum;
        workgroupBarrier();
        var tile_sum = vec4<f32>();
        for (var t = 0u; t < TK; t++) { tile_sum += red_sum[t * TQ + tq]; }
        let alpha = exp2(m - m_new);
        l = l * alpha + tile_sum;
        m = m_new;
        for (var i = 0u; i < 4u; i++) {
            for (var j = 0u; j < dv; j++) { o[i * MAX_DV + j] *= alpha[i]; }
        }
        for (var n = 0u; n < BKV; n++) {
            let pn = ps[n * TQ + tq];
            for (var j = 0u; j < dv; j++) {
                let vv = vs[n * H4 + j * TK + tk];
                for (var i = 0u; i < 4u; i++) {
                    o[i * MAX_DV + j] = fma(vec4<f32>(pn[i]), vv, o[i * MAX_DV + j]);
                }
            }
        }
    }
    for (var i = 0u; i < 4u; i++) {
        let qi = q0 + tq + TQ * i;
        if (qi < p.seq) {
            let inv = 1.0 / l[i];
            let base = o_row(b, qi, h);
            for (var j = 0u; j < dv; j++) { o_out[base + j * TK + tk] = o[i * MAX_DV + j] * inv; }
            if (tk == 0u) { lse_out[stat_index(b, h, qi)] = (m[i] + log2(l[i])) * LN2; }
        }
    }
}

// --- KERNEL: attention_backward_dq_tiled ---
@group(0) @binding(0) var<storage, read> q_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v_in: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> do_in: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dvec_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> dq_out: array<vec4<f32>>;
@group(0) @binding(7) var<uniform> p: Params;

var<workgroup> qs: array<vec4<f32>, BQ * RS>;
var<workgroup> dos: array<vec4<f32>, BQ * RS>;
var<workgroup> ks: array<vec4<f32>, BKV * RS>;
var<workgroup> vs: array<vec4<f32>, BKV * RS>;
var<workgroup> dss: array<vec4<f32>, BKV * TQ>;     // ds in the [key][tq] block order

@compute @workgroup_size(WG)
fn attention_backward_dq_tiled(@builtin(workgroup_id) wg: vec3<u32>,
                               @builtin(num_workgroups) nwg: vec3<u32>,
                               @builtin(local_invocation_index) lid: u32) {
    let tk = lid % TK;
    let tq = lid / TK;
    let q0 = (nwg.y - 1u - wg.y) * BQ;
    let b = wg.x / p.heads;
    let h = wg.x % p.heads;
    let hk = h / (p.heads / p.kv_heads);
    let qscale = p.scale * LOG2E;

    for (var i = lid; i < BQ * H4; i += WG) {
        let r = i / H4;
        let d4 = i % H4;
        var qv = vec4<f32>();
        var dov = vec4<f32>();
        if (q0 + r < p.seq) {
            qv = q_in[q_row(b, q0 + r, h) + d4] * qscale;
            dov = do_in[o_row(b, q0 + r, h) + d4];
        }
        qs[r * RS + d4] = qv;
        dos[r * RS + d4] = dov;
    }
    var lse2 = vec4<f32>();
    var dvec = vec4<f32>();
    for (var i = 0u; i < 4u; i++) {
        let qi = q0 + tq + TQ * i;
        if (qi < p.seq) {
            lse2[i] = lse_in[stat_index(b, h, qi)] * LOG2E;
            dvec[i] = dvec_in[stat_index(b, h, qi)];
        }
    }

    var acc: array<vec4<f32>, 4u * MAX_DV>;
    let dv = H4 / TK;
    let kv_end = min(p.seq, q0 + BQ);
    for (var kv0 = 0u; kv0 < kv_end; kv0 += BKV) {
        workgroupBarrier();
        for (var i = lid; i < BKV * H4; i += WG) {
            let n = i / H4;
            let d4 = i % H4;
            var kv = vec4<f32>();
            var vv = vec4<f32>();
            if (kv0 + n < p.seq) {
                let g = kv_row(b, kv0 + n, hk) + d4;
                kv = k_in[g];
                vv = v_in[g];
            }
            ks[n * RS + d4] = kv;
            vs[n * RS + d4] = vv;
        }
        workgroupBarrier();

        var s = array<f32, 16>();
        var dp = array<f32, 16>();
        for (var d4 = 0u; d4 < H4; d4++) {
            var qv: array<vec4<f32>, 4>;
            var dov: array<vec4<f32>, 4>;
            var kv: array<vec4<f32>, 4>;
            var vv: array<vec4<f32>, 4>;
            for (var i = 0u; i < 4u; i++) {
                qv[i] = qs[(tq + TQ * i) * RS + d4];
                dov[i] = dos[(tq + TQ * i) * RS + d4];
            }
            for (var j = 0u; j < 4u; j++) {
                kv[j] = ks[(tk + TK * j) * RS + d4];
                vv[j] = vs[(tk + TK * j) * RS + d4];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    s[4u * i + j] += dot(qv[i], kv[j]);
                    dp[4u * i + j] += dot(dov[i], vv[j]);
                }
            }
        }
        let masking = kv0 + BKV > q0 || kv0 + BKV > p.seq;
        for (var j = 0u; j < 4u; j++) {
            let key = kv0 + tk + TK * j;
            var ds = vec4<f32>();
            for (var i = 0u; i < 4u; i++) {
                let qi = q0 + tq + TQ * i;
                let visible = !masking || (key <= qi && key < p.seq && qi < p.seq);
                if (visible) {
                    ds[i] = exp2(s[4u * i + j] - lse2[i]) * (dp[4u * i + j] - dvec[i]);
                }
            }
            dss[(tk + TK * j) * TQ + tq] = ds;
        }
        workgroupBarrier();
        for (var n = 0u; n < BKV; n++) {
            let dn = dss[n * TQ + tq];
            for (var j = 0u; j < dv; j++) {
                let kv = ks[n * RS + j * TK + tk];
                for (var i = 0u; i < 4u; i++) {
                    acc[i * MAX_DV + j] = fma(vec4<f32>(dn[i]), kv, acc[i * MAX_DV + j]);
                }
            }
        }
    }
    for (var i = 0u; i < 4u; i++) {
        let qi = q0 + tq + TQ * i;
        if (qi < p.seq) {
            let base = q_row(b, qi, h);
            for (var j = 0u; j < dv; j++) {
                dq_out[base + j * TK + tk] = acc[i * MAX_DV + j] * p.scale;
            }
        }
    }
}

// --- KERNEL: attention_backward_dkv_tiled ---
// Rows are keys (BKV of them, tk = row group), columns queries (BQ per tile, tq = column
// group); the output blocks are 4 keys x D/BQ vec4 columns (tq + (BQ/4)*j).
@group(0) @binding(0) var<storage, read> q_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v_in: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> do_in: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dvec_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> dk_out: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> dv_out: array<vec4<f32>>;
@group(0) @binding(8) var<uniform> p: Params;

var<workgroup> ks: array<vec4<f32>, BKV * RS>;
var<workgroup> vs: array<vec4<f32>, BKV * RS>;
var<workgroup> qs: array<vec4<f32>, BQ * RS>;
var<workgroup> dos: array<vec4<f32>, BQ * RS>;
var<workgroup> pts: array<vec4<f32>, BQ * TK>;      // p^T in the [query][tk] block order
var<workgroup> dsts: array<vec4<f32>, BQ * TK>;     // ds^T
var<workgroup> stats: array<f32, 2u * BQ>;           // lse * log2(e), dvec of the query tile

@compute @workgroup_size(WG)
fn attention_backward_dkv_tiled(@builtin(workgroup_id) wg: vec3<u32>,
                                @builtin(num_workgroups) nwg: vec3<u32>,
                                @builtin(local_invocation_index) lid: u32) {
    let tq = lid % TQ;
    let tk = lid / TQ;
    let bh = wg.z * nwg.x + wg.x;   // (head in chunk, key tile, chunk)
    if (bh >= p.batch * p.kv_heads) { return; }   // the last chunk's spare heads
    let k0 = wg.y * BKV;
    let b = bh / p.kv_heads;
    let hk = bh % p.kv_heads;
    let group = p.heads / p.kv_heads;

    for (var i = lid; i < BKV * H4; i += WG) {
        let n = i / H4;
        let d4 = i % H4;
        var kv = vec4<f32>();
        var vv = vec4<f32>();
        if (k0 + n < p.seq) {
            let g = kv_row(b, k0 + n, hk) + d4;
            kv = k_in[g];
            vv = v_in[g];
        }
        ks[n * RS + d4] = kv;
        vs[n * RS + d4] = vv;
    }

    var dk_acc: array<vec4<f32>, 4u * MAX_DV>;
    var dv_acc: array<vec4<f32>, 4u * MAX_DV>;
    let dv = H4 / TQ;
    let q_first = (k0 / BQ) * BQ;     // causal: queries before k0 see none of these keys
    for (var hq = hk * group; hq < (hk + 1u) * group; hq++) {
        for (var q0 = q_first; q0 < p.seq; q0 += BQ) {
            workgroupBarrier();
            for (var i = lid; i < BQ * H4; i += WG) {
                let r = i / H4;
                let d4 = i % H4;
                var qv = vec4<f32>();
                var dov = vec4<f32>();
                if (q0 + r < p.seq) {
                    qv = q_in[q_row(b, q0 + r, hq) + d4] * p.scale;
                    dov = do_in[o_row(b, q0 + r, hq) + d4];
                }
                qs[r * RS + d4] = qv;
                dos[r * RS + d4] = dov;
            }
            for (var i = lid; i < BQ; i += WG) {
                var lse2 = 0.0;
                var dvv = 0.0;
                if (q0 + i < p.seq) {
                    lse2 = lse_in[stat_index(b, hq, q0 + i)] * LOG2E;
                    dvv = dvec_in[stat_index(b, hq, q0 + i)];
                }
                stats[i] = lse2;
                stats[BQ + i] = dvv;
            }
            workgroupBarrier();

            var s = array<f32, 16>();    // s[4*i + j]: key tk + TK*i, query tq + TQ*j
            var dp = array<f32, 16>();
            for (var d4 = 0u; d4 < H4; d4++) {
                var kv: array<vec4<f32>, 4>;
                var vv: array<vec4<f32>, 4>;
                var qv: array<vec4<f32>, 4>;
                var dov: array<vec4<f32>, 4>;
                for (var i = 0u; i < 4u; i++) {
                    kv[i] = ks[(tk + TK * i) * RS + d4];
                    vv[i] = vs[(tk + TK * i) * RS + d4];
                }
                for (var j = 0u; j < 4u; j++) {
                    qv[j] = qs[(tq + TQ * j) * RS + d4];
                    dov[j] = dos[(tq + TQ * j) * RS + d4];
                }
                for (var i = 0u; i < 4u; i++) {
                    for (var j = 0u; j < 4u; j++) {
                        s[4u * i + j] += dot(kv[i], qv[j]);
                        dp[4u * i + j] += dot(vv[i], dov[j]);
                    }
                }
            }
            let masking = q0 < k0 + BKV || q0 + BQ > p.seq;
            for (var j = 0u; j < 4u; j++) {
                let qj = q0 + tq + TQ * j;
                let lse2 = stats[tq + TQ * j];
                let dvq = stats[BQ + tq + TQ * j];
                var pt = vec4<f32>();
                var dst = vec4<f32>();
                for (var i = 0u; i < 4u; i++) {
                    let key = k0 + tk + TK * i;
                    let visible = !masking || (key <= qj && qj < p.seq && key < p.seq);
                    if (visible) {
                        pt[i] = exp2(fma(s[4u * i + j], LOG2E, -lse2));
                        dst[i] = pt[i] * (dp[4u * i + j] - dvq);
                    }
                }
                pts[(tq + TQ * j) * TK + tk] = pt;
                dsts[(tq + TQ * j) * TK + tk] = dst;
            }
            workgroupBarrier();
            for (var n = 0u; n < BQ; n++) {
                let pn = pts[n * TK + tk];
                let dn = dsts[n * TK + tk];
                for (var j = 0u; j < dv; j++) {
                    let dov = dos[n * RS + j * TQ + tq];
                    let qv = qs[n * RS + j * TQ + tq];   // pre-scaled: dk = scale * ds q
                    for (var i = 0u; i < 4u; i++) {
                        dv_acc[i * MAX_DV + j] = fma(vec4<f32>(pn[i]), dov, dv_acc[i * MAX_DV + j]);
                        dk_acc[i * MAX_DV + j] = fma(vec4<f32>(dn[i]), qv, dk_acc[i * MAX_DV + j]);
                    }
                }
            }
        }
    }
    for (var i = 0u; i < 4u; i++) {
        let ki = k0 + tk + TK * i;
        if (ki < p.seq) {
            let base = kv_row(b, ki, hk);
            for (var j = 0u; j < dv; j++) {
                dk_out[base + j * TQ + tq] = dk_acc[i * MAX_DV + j];
                dv_out[base + j * TQ + tq] = dv_acc[i * MAX_DV + j];
            }
        }
    }
}
