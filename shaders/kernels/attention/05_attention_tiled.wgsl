// 05_attention_tiled.wgsl — causal GQA attention with register-tiled score blocks and vec4
// workgroup tiles (the fast path of shaders/kernels/attention/ops.py; 05_attention.wgsl is
// the general fallback and holds the backward's prep kernel). No T x T matrix in memory.
//
//   attention_forward_tiled       o = softmax(q k^T * scale + causal mask) v; lse per query
//   attention_backward_dq_tiled   dq = scale * sum_keys ds k,  ds = p * (do.v - dvec),
//                                 p = exp(s - lse)
//   attention_backward_dkv_tiled  dk = scale * sum_queries ds q, dv = sum_queries p do, over
//                                 the H/Hkv query heads sharing the kv head (no atomics)
//
// Layouts: those of 05_attention.wgsl (batch, token and head strides per tensor group: q/dq,
// k/v/dk/dv, o/do; lse, dvec [B,H,T]), read and written as vec4: D and every stride must be
// multiples of 4 and the views 16-byte aligned (the op checks and falls back to the general
// kernels otherwise).
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
// Prefetch: each kernel issues the NEXT tile's global loads (forward and dq: the key tile's
// k and v; dkv: the query tile's q, do, lse, dvec) into prefetch registers before this
// tile's math and stores them to workgroup memory after it, so the load latency hides
// behind the math (H200: forward 1.02 vs 1.32 ms, dq 4.70 vs 5.20, dkv 4.71 vs 5.07 ms
// without it; dev/compare_trees/README.md). PF prefetch registers per operand (a parameter: 16, or
// 32 for tiles that need more; PL of them live) and 4 per statistic (SL of them live),
// selected by constant branches. Tiles that would need more than 32 (e.g. the backward at
// head dim 128 in 48 KiB) run with PREFETCH off: each tile staged after a barrier, no
// prefetch registers, the same sums in the same order (bit-identical results). The forward stores the next tile's
// k and this tile's v between its two softmax barriers (two barriers per tile, not four).
//
// A template: shaders/wgsl_expand.py expands it when the kernel is made. Its loops marked
// `// @unroll` are written out and the register arrays (score blocks s, dp; output blocks
// o, a, dk, dv; operands; prefetch registers) become named values: NVIDIA's compiler keeps
// a private array indexed in loops in local memory (attention ran at 0.7-1.1 TFLOP/s that
// way, 6-9 with named values). The loops over head-dim vec4s (d4) and over a tile's keys or
// queries (n) are written out in runs of UNROLL_D and UNROLL_N iterations (parameters; 4:
// the backward 16% faster on the H200 than plain loops,
// dev/compiler_probes/results/h200/unroll_probe.md). Parameters: PREFETCH, PF, UNROLL_D, UNROLL_N
// (ops.template_params).
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

// vec4 indices of the first element of a head row
fn q_row(b: u32, t: u32, h: u32) -> u32 { return (b * p.bq + t * p.sq + h * p.hq) / 4u; }
fn kv_row(b: u32, t: u32, hk: u32) -> u32 { return (b * p.bkv + t * p.skv + hk * p.hkv) / 4u; }
fn o_row(b: u32, t: u32, h: u32) -> u32 { return (b * p.bo + t * p.so + h * p.ho) / 4u; }
fn stat_index(b: u32, h: u32, t: u32) -> u32 { return (b * p.heads + h) * p.seq + t; }

// --- KERNEL: attention_forward_tiled ---
// Block (i, j): query row tq + TQ*i, key tk + TK*j; output block o[i][j]: row i, vec4 column
// tk + TK*j (j < DV = D / BKV).
@group(0) @binding(0) var<storage, read> q_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v_in: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> o_out: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> lse_out: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

override DV: u32 = HD / BKV;                        // output vec4s per row and invocation
override PL: u32 = (BKV * H4 + WG - 1u) / WG;       // prefetch registers in use per operand
const NONE: u32 = 0xffffffffu;
var<workgroup> qs: array<vec4<f32>, BQ * RS>;
var<workgroup> ks: array<vec4<f32>, BKV * RS>;
var<workgroup> vs: array<vec4<f32>, BKV * H4>;
var<workgroup> ps: array<vec4<f32>, BKV * TQ>;      // [key][tq] -> the 4 rows of tq
var<workgroup> red_max: array<vec4<f32>, TK * TQ>;  // [tk][tq] partial row maxima
var<workgroup> red_sum: array<vec4<f32>, TK * TQ>;

// Global vec4 index of prefetch slot t of the key tile at kv0 (NONE past the sequence/tile).
fn slot_index(t: u32, lid: u32, b: u32, hk: u32, kv0: u32) -> u32 {
    let i = lid + t * WG;
    let n = i / H4;
    if (i < BKV * H4 && kv0 + n < p.seq) { return kv_row(b, kv0 + n, hk) + i % H4; }
    return NONE;
}
fn load_k(g: u32) -> vec4<f32> { if (g == NONE) { return vec4<f32>(); } return k_in[g]; }
fn load_v(g: u32) -> vec4<f32> { if (g == NONE) { return vec4<f32>(); } return v_in[g]; }
fn stash_k(t: u32, lid: u32, stage: u32, kv: vec4<f32>) {
    let i = lid + t * WG;
    if (i < BKV * H4) { ks[stage * BKV * RS + (i / H4) * RS + i % H4] = kv; }
}
fn stash_v(t: u32, lid: u32, stage: u32, vv: vec4<f32>) {
    let i = lid + t * WG;
    if (i < BKV * H4) { vs[stage * BKV * H4 + i] = vv; }
}

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
    var o: array<array<vec4<f32>, 4u>, 4u>;
    let kv_end = min(p.seq, q0 + BQ);
// @if PREFETCH
    let tiles = (kv_end + BKV - 1u) / BKV;
    var pk: array<vec4<f32>, {{PF}}u>;
    var pv: array<vec4<f32>, {{PF}}u>;
    for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
        if (PL > t) { let g = slot_index(t, lid, b, hk, 0u); pk[t] = load_k(g); pv[t] = load_v(g); }
    }
    for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
        if (PL > t) { stash_k(t, lid, 0u, pk[t]); }
    }
    workgroupBarrier();   // qs and the first key tile are staged
    for (var it = 0u; it < tiles; it++) {
        let kv0 = it * BKV;
        let stage = 0u;
        let kb = stage * BKV * RS;
        let vb = stage * BKV * H4;
        let more = it + 1u < tiles;
        if (more) {   // the next tile's k lands while the scores below run
            for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
                if (PL > t) { let g = slot_index(t, lid, b, hk, kv0 + BKV); pk[t] = load_k(g); }
            }
        }
// @else
    for (var kv0 = 0u; kv0 < kv_end; kv0 += BKV) {
        let kb = 0u;
        let vb = 0u;
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
// @endif

        var s: array<array<f32, 4u>, 4u>;
        for (var d4 = 0u; d4 < H4; d4++) {   // @unroll {{UNROLL_D}}
            var qr: array<vec4<f32>, 4u>;   // @let
            var kc: array<vec4<f32>, 4u>;   // @let
            for (var i = 0u; i < 4u; i++) {   // @unroll
                qr[i] = qs[(tq + i * TQ) * RS + d4];
            }
            for (var j = 0u; j < 4u; j++) {   // @unroll
                kc[j] = ks[kb + (tk + j * TK) * RS + d4];
            }
            for (var i = 0u; i < 4u; i++) {   // @unroll
                for (var j = 0u; j < 4u; j++) {   // @unroll
                    s[i][j] += dot(qr[i], kc[j]);
                }
            }
        }
        if (kv0 + BKV > q0 || kv0 + BKV > p.seq) {   // diagonal or last tile: mask
            var key: array<u32, 4u>;   // @let
            var row: array<u32, 4u>;   // @let
            for (var j = 0u; j < 4u; j++) {   // @unroll
                key[j] = kv0 + tk + j * TK;
            }
            for (var i = 0u; i < 4u; i++) {   // @unroll
                row[i] = q0 + tq + i * TQ;
            }
            for (var i = 0u; i < 4u; i++) {   // @unroll
                for (var j = 0u; j < 4u; j++) {   // @unroll
                    if (key[j] > row[i] || key[j] >= p.seq) { s[i][j] = MASKED; }
                }
            }
        }
        red_max[tk * TQ + tq] = vec4<f32>(max(max(s[0][0], s[0][1]), max(s[0][2], s[0][3])), max(max(s[1][0], s[1][1]), max(s[1][2], s[1][3])), max(max(s[2][0], s[2][1]), max(s[2][2], s[2][3])), max(max(s[3][0], s[3][1]), max(s[3][2], s[3][3])));
        workgroupBarrier();
        var m_new = m;
        for (var t = 0u; t < TK; t++) { m_new = max(m_new, red_max[t * TQ + tq]); }
        var p: array<vec4<f32>, 4u>;   // @let
        for (var j = 0u; j < 4u; j++) {   // @unroll
            p[j] = exp2(vec4<f32>(s[0][j], s[1][j], s[2][j], s[3][j]) - m_new);
            ps[(tk + j * TK) * TQ + tq] = p[j];
        }
        red_sum[tk * TQ + tq] = p[0] + p[1] + p[2] + p[3];
// @if PREFETCH
        // the readers of ks (these scores) and vs (the previous p v) are past the
        // barrier above: store this tile's v and the next tile's k
        for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
            if (PL > t) { stash_v(t, lid, 0u, pv[t]); }
        }
        if (more) {
            for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
                if (PL > t) { stash_k(t, lid, 0u, pk[t]); }
            }
        }
// @endif
        workgroupBarrier();
// @if PREFETCH
        if (more) {   // the next tile's v lands during p v and the next scores
            for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
                if (PL > t) { let g = slot_index(t, lid, b, hk, kv0 + BKV); pv[t] = load_v(g); }
            }
        }
// @endif
        var tile_sum = vec4<f32>();
        for (var t = 0u; t < TK; t++) { tile_sum += red_sum[t * TQ + tq]; }
        let alpha = exp2(m - m_new);
        l = l * alpha + tile_sum;
        m = m_new;
        for (var i = 0u; i < 4u; i++) {   // @unroll
            for (var j = 0u; j < 4u; j++) {   // @unroll
                o[i][j] *= alpha[i];
            }
        }
        for (var n = 0u; n < BKV; n++) {   // @unroll {{UNROLL_N}}
            let pn = ps[n * TQ + tq];
            var vc: array<vec4<f32>, 4u>;   // @let
            for (var j = 0u; j < 4u; j++) {   // @unroll
                if (j == 0u || DV > j) {
                    vc[j] = vs[vb + n * H4 + tk + j * TK];
                    for (var i = 0u; i < 4u; i++) {   // @unroll
                        o[i][j] = fma(vec4<f32>(pn[i]), vc[j], o[i][j]);
                    }
                }
            }
        }
    }
    for (var i = 0u; i < 4u; i++) {   // @unroll
        let qi = q0 + tq + i * TQ;
        if (qi < p.seq) {
            let inv = 1.0 / l[i];
            let base = o_row(b, qi, h);
            for (var j = 0u; j < 4u; j++) {   // @unroll
                if (j == 0u || DV > j) {
                    o_out[base + tk + j * TK] = o[i][j] * inv;
                }
            }
            if (tk == 0u) { lse_out[stat_index(b, h, qi)] = (m[i] + log2(l[i])) * LN2; }
        }
    }
}

// --- KERNEL: attention_backward_dq_tiled ---
// Block (i, j): query row tq + TQ*i, key tk + TK*j; output block a[i][j]: row i, vec4 column
// tk + TK*j (j < DV = D / BKV).
@group(0) @binding(0) var<storage, read> q_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v_in: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> do_in: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dvec_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> dq_out: array<vec4<f32>>;
@group(0) @binding(7) var<uniform> p: Params;

override DV: u32 = HD / BKV;                        // output vec4s per row and invocation
override PL: u32 = (BKV * H4 + WG - 1u) / WG;       // prefetch registers in use per operand
const NONE: u32 = 0xffffffffu;
var<workgroup> qs: array<vec4<f32>, BQ * RS>;
var<workgroup> dos: array<vec4<f32>, BQ * RS>;
var<workgroup> ks: array<vec4<f32>, BKV * RS>;
var<workgroup> vs: array<vec4<f32>, BKV * RS>;
var<workgroup> dss: array<vec4<f32>, BKV * TQ>;     // ds in the [key][tq] block order

// Global vec4 index of prefetch slot t of the key tile at kv0 (NONE past the sequence/tile).
fn slot_index(t: u32, lid: u32, b: u32, hk: u32, kv0: u32) -> u32 {
    let i = lid + t * WG;
    let n = i / H4;
    if (i < BKV * H4 && kv0 + n < p.seq) { return kv_row(b, kv0 + n, hk) + i % H4; }
    return NONE;
}
fn load_k(g: u32) -> vec4<f32> { if (g == NONE) { return vec4<f32>(); } return k_in[g]; }
fn load_v(g: u32) -> vec4<f32> { if (g == NONE) { return vec4<f32>(); } return v_in[g]; }
fn stash(t: u32, lid: u32, stage: u32, kv: vec4<f32>, vv: vec4<f32>) {
    let i = lid + t * WG;
    if (i >= BKV * H4) { return; }
    let j = (i / H4) * RS + i % H4;
    ks[stage * BKV * RS + j] = kv;
    vs[j] = vv;
}

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

    // the workgroup's query and dO rows (q pre-scaled by scale * log2 e)
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
    var lse2 = vec4<f32>();   // lse in base 2 and dvec of the invocation's 4 rows
    var dvec = vec4<f32>();
    for (var i = 0u; i < 4u; i++) {   // @unroll
        let qi = q0 + tq + i * TQ;
        if (qi < p.seq) {
            lse2[i] = lse_in[stat_index(b, h, qi)] * LOG2E;
            dvec[i] = dvec_in[stat_index(b, h, qi)];
        }
    }
    var a: array<array<vec4<f32>, 4u>, 4u>;
    let kv_end = min(p.seq, q0 + BQ);
// @if PREFETCH
    let tiles = (kv_end + BKV - 1u) / BKV;
    var pk: array<vec4<f32>, {{PF}}u>;
    var pv: array<vec4<f32>, {{PF}}u>;
    for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
        if (PL > t) { let g = slot_index(t, lid, b, hk, 0u); pk[t] = load_k(g); pv[t] = load_v(g); }
    }
    for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
        if (PL > t) { stash(t, lid, 0u, pk[t], pv[t]); }
    }
    workgroupBarrier();   // qs, dos and the first key tile are staged
    for (var it = 0u; it < tiles; it++) {
        let kv0 = it * BKV;
        let kb = 0u * BKV * RS;
        let more = it + 1u < tiles;
        if (more) {   // the next tile's loads land while the math below runs
            for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
                if (PL > t) { let g = slot_index(t, lid, b, hk, kv0 + BKV); pk[t] = load_k(g); pv[t] = load_v(g); }
            }
        }
// @else
    for (var kv0 = 0u; kv0 < kv_end; kv0 += BKV) {
        let kb = 0u;
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
// @endif

        var s: array<array<f32, 4u>, 4u>;
        var dp: array<array<f32, 4u>, 4u>;
        for (var d4 = 0u; d4 < H4; d4++) {   // @unroll {{UNROLL_D}}
            var qr: array<vec4<f32>, 4u>;   // @let
            var dr: array<vec4<f32>, 4u>;   // @let
            var kc: array<vec4<f32>, 4u>;   // @let
            var vc: array<vec4<f32>, 4u>;   // @let
            for (var i = 0u; i < 4u; i++) {   // @unroll
                qr[i] = qs[(tq + i * TQ) * RS + d4];
                dr[i] = dos[(tq + i * TQ) * RS + d4];
            }
            for (var j = 0u; j < 4u; j++) {   // @unroll
                kc[j] = ks[kb + (tk + j * TK) * RS + d4];
                vc[j] = vs[(tk + j * TK) * RS + d4];
            }
            for (var i = 0u; i < 4u; i++) {   // @unroll
                for (var j = 0u; j < 4u; j++) {   // @unroll
                    s[i][j] += dot(qr[i], kc[j]);
                    dp[i][j] += dot(dr[i], vc[j]);
                }
            }
        }
        let masking = kv0 + BKV > q0 || kv0 + BKV > p.seq;
        var row: array<u32, 4u>;   // @let
        for (var i = 0u; i < 4u; i++) {   // @unroll
            row[i] = q0 + tq + i * TQ;
        }
        for (var j = 0u; j < 4u; j++) {   // @unroll
            let key = kv0 + tk + j * TK;
            var ds = vec4<f32>();
            for (var i = 0u; i < 4u; i++) {   // @unroll
                if (!masking || (key <= row[i] && key < p.seq && row[i] < p.seq)) {
                    ds[i] = exp2(s[i][j] - lse2[i]) * (dp[i][j] - dvec[i]);
                }
            }
            dss[(tk + j * TK) * TQ + tq] = ds;
        }
        workgroupBarrier();
        for (var n = 0u; n < BKV; n++) {   // @unroll {{UNROLL_N}}
            let dn = dss[n * TQ + tq];
            var kc: array<vec4<f32>, 4u>;   // @let
            for (var j = 0u; j < 4u; j++) {   // @unroll
                if (j == 0u || DV > j) {
                    kc[j] = ks[kb + n * RS + tk + j * TK];
                    for (var i = 0u; i < 4u; i++) {   // @unroll
                        a[i][j] = fma(vec4<f32>(dn[i]), kc[j], a[i][j]);
                    }
                }
            }
        }
// @if PREFETCH
        workgroupBarrier();   // every read of the single stage is done
        if (more) {   // nobody reads ks/vs until the barrier below
            for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
                if (PL > t) { stash(t, lid, 0u, pk[t], pv[t]); }
            }
        }
        workgroupBarrier();
// @endif
    }
    for (var i = 0u; i < 4u; i++) {   // @unroll
        let qi = q0 + tq + i * TQ;
        if (qi < p.seq) {
            let base = q_row(b, qi, h);
            for (var j = 0u; j < 4u; j++) {   // @unroll
                if (j == 0u || DV > j) {
                    dq_out[base + tk + j * TK] = a[i][j] * p.scale;
                }
            }
        }
    }
}

// --- KERNEL: attention_backward_dkv_tiled ---
// Rows are keys (BKV of them, tk = row group), columns queries (BQ per tile, tq = column
// group); block (i, j): key tk + TK*i, query tq + TQ*j; output blocks dk[i][j], dv[i][j]:
// key i, vec4 column tq + TQ*j (j < DV = D / BQ). The (query head, query tile) loop is one
// step index, so the prefetch crosses head boundaries too.
@group(0) @binding(0) var<storage, read> q_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> k_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> v_in: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> do_in: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dvec_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> dk_out: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> dv_out: array<vec4<f32>>;
@group(0) @binding(8) var<uniform> p: Params;

override DV: u32 = HD / BQ;                         // output vec4s per row and invocation
override PL: u32 = (BQ * H4 + WG - 1u) / WG;        // prefetch registers in use per operand
override SL: u32 = (BQ + WG - 1u) / WG;             // ... per statistic (lse, dvec)
var<workgroup> ks: array<vec4<f32>, BKV * RS>;
var<workgroup> vs: array<vec4<f32>, BKV * RS>;
var<workgroup> qs: array<vec4<f32>, BQ * RS>;
var<workgroup> dos: array<vec4<f32>, BQ * RS>;
var<workgroup> pts: array<vec4<f32>, BQ * TK>;      // p^T in the [query][tk] block order
var<workgroup> dsts: array<vec4<f32>, BQ * TK>;     // ds^T
var<workgroup> stats: array<f32, 2u * BQ>;           // lse * log2(e), dvec of the query tile

// Prefetch slot t of the query tile at q0 of head hq (zero past the sequence).
fn fetch_q(t: u32, lid: u32, b: u32, hq: u32, q0: u32) -> vec4<f32> {
    let i = lid + t * WG;
    let r = i / H4;
    if (i < BQ * H4 && q0 + r < p.seq) { return q_in[q_row(b, q0 + r, hq) + i % H4] * p.scale; }
    return vec4<f32>();
}
fn fetch_do(t: u32, lid: u32, b: u32, hq: u32, q0: u32) -> vec4<f32> {
    let i = lid + t * WG;
    let r = i / H4;
    if (i < BQ * H4 && q0 + r < p.seq) { return do_in[o_row(b, q0 + r, hq) + i % H4]; }
    return vec4<f32>();
}
fn fetch_lse(t: u32, lid: u32, b: u32, hq: u32, q0: u32) -> f32 {
    let i = lid + t * WG;
    if (i < BQ && q0 + i < p.seq) { return lse_in[stat_index(b, hq, q0 + i)] * LOG2E; }
    return 0.0;
}
fn fetch_dvec(t: u32, lid: u32, b: u32, hq: u32, q0: u32) -> f32 {
    let i = lid + t * WG;
    if (i < BQ && q0 + i < p.seq) { return dvec_in[stat_index(b, hq, q0 + i)]; }
    return 0.0;
}
fn stash(t: u32, lid: u32, stage: u32, qv: vec4<f32>, dov: vec4<f32>) {
    let i = lid + t * WG;
    if (i >= BQ * H4) { return; }
    let j = stage * BQ * RS + (i / H4) * RS + i % H4;
    qs[j] = qv;
    dos[j] = dov;
}
fn stash_stats(t: u32, lid: u32, stage: u32, lse2: f32, dvv: f32) {
    let i = lid + t * WG;
    if (i >= BQ) { return; }
    stats[stage * 2u * BQ + i] = lse2;
    stats[stage * 2u * BQ + BQ + i] = dvv;
}

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
    var dk: array<array<vec4<f32>, 4u>, 4u>;
    var dv: array<array<vec4<f32>, 4u>, 4u>;
    var key: array<u32, 4u>;   // @let
    for (var i = 0u; i < 4u; i++) {   // @unroll
        key[i] = k0 + tk + i * TK;
    }
    let q_first = (k0 / BQ) * BQ;     // causal: queries before k0 see none of these keys
    let nq = (p.seq - q_first + BQ - 1u) / BQ;   // query tiles per head
    let total = group * nq;           // (head, query tile) steps, head-major
// @if PREFETCH
    var pq: array<vec4<f32>, {{PF}}u>;
    var pd: array<vec4<f32>, {{PF}}u>;
    var sl: array<f32, 4u>;
    var sd: array<f32, 4u>;
    for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
        if (PL > t) { pq[t] = fetch_q(t, lid, b, hk * group, q_first); pd[t] = fetch_do(t, lid, b, hk * group, q_first); }
    }
    for (var t = 0u; t < 4u; t++) {   // @unroll
        if (SL > t) { sl[t] = fetch_lse(t, lid, b, hk * group, q_first); sd[t] = fetch_dvec(t, lid, b, hk * group, q_first); }
    }
    for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
        if (PL > t) { stash(t, lid, 0u, pq[t], pd[t]); }
    }
    for (var t = 0u; t < 4u; t++) {   // @unroll
        if (SL > t) { stash_stats(t, lid, 0u, sl[t], sd[t]); }
    }
    workgroupBarrier();   // ks, vs and the first query tile are staged
    for (var it = 0u; it < total; it++) {
        let q0 = q_first + (it % nq) * BQ;
        let stage = 0u;
        let qb = stage * BQ * RS;
        let sb = stage * 2u * BQ;
        let more = it + 1u < total;
        if (more) {   // the next tile's loads land while the math below runs
            let hn = hk * group + (it + 1u) / nq;
            let qn = q_first + ((it + 1u) % nq) * BQ;
            for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
                if (PL > t) { pq[t] = fetch_q(t, lid, b, hn, qn); pd[t] = fetch_do(t, lid, b, hn, qn); }
            }
            for (var t = 0u; t < 4u; t++) {   // @unroll
                if (SL > t) { sl[t] = fetch_lse(t, lid, b, hn, qn); sd[t] = fetch_dvec(t, lid, b, hn, qn); }
            }
        }
// @else
    for (var hq = hk * group; hq < (hk + 1u) * group; hq++) {
    for (var q0 = q_first; q0 < p.seq; q0 += BQ) {
        let qb = 0u;
        let sb = 0u;
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
// @endif

        var s: array<array<f32, 4u>, 4u>;
        var dp: array<array<f32, 4u>, 4u>;
        for (var d4 = 0u; d4 < H4; d4++) {   // @unroll {{UNROLL_D}}
            var kr: array<vec4<f32>, 4u>;   // @let
            var vr: array<vec4<f32>, 4u>;   // @let
            var qc: array<vec4<f32>, 4u>;   // @let
            var dc: array<vec4<f32>, 4u>;   // @let
            for (var i = 0u; i < 4u; i++) {   // @unroll
                kr[i] = ks[(tk + i * TK) * RS + d4];
                vr[i] = vs[(tk + i * TK) * RS + d4];
            }
            for (var j = 0u; j < 4u; j++) {   // @unroll
                qc[j] = qs[qb + (tq + j * TQ) * RS + d4];
                dc[j] = dos[qb + (tq + j * TQ) * RS + d4];
            }
            for (var i = 0u; i < 4u; i++) {   // @unroll
                for (var j = 0u; j < 4u; j++) {   // @unroll
                    s[i][j] += dot(kr[i], qc[j]);
                    dp[i][j] += dot(vr[i], dc[j]);
                }
            }
        }
        let masking = q0 < k0 + BKV || q0 + BQ > p.seq;
        for (var j = 0u; j < 4u; j++) {   // @unroll
            let qj = q0 + tq + j * TQ;
            let lse2 = stats[sb + tq + j * TQ];
            let dvq = stats[sb + BQ + tq + j * TQ];
            var pt = vec4<f32>();
            var dst = vec4<f32>();
            for (var i = 0u; i < 4u; i++) {   // @unroll
                if (!masking || (key[i] <= qj && qj < p.seq && key[i] < p.seq)) {
                    pt[i] = exp2(fma(s[i][j], LOG2E, -lse2));
                    dst[i] = pt[i] * (dp[i][j] - dvq);
                }
            }
            pts[(tq + j * TQ) * TK + tk] = pt;
            dsts[(tq + j * TQ) * TK + tk] = dst;
        }
        workgroupBarrier();
        for (var n = 0u; n < BQ; n++) {   // @unroll {{UNROLL_N}}
            let pn = pts[n * TK + tk];
            let dn = dsts[n * TK + tk];
            var dc: array<vec4<f32>, 4u>;   // @let
            var qc: array<vec4<f32>, 4u>;   // @let
            for (var j = 0u; j < 4u; j++) {   // @unroll
                if (j == 0u || DV > j) {
                    dc[j] = dos[qb + n * RS + tq + j * TQ];
                    qc[j] = qs[qb + n * RS + tq + j * TQ];   // pre-scaled: dk = scale ds q
                    for (var i = 0u; i < 4u; i++) {   // @unroll
                        dv[i][j] = fma(vec4<f32>(pn[i]), dc[j], dv[i][j]);
                        dk[i][j] = fma(vec4<f32>(dn[i]), qc[j], dk[i][j]);
                    }
                }
            }
        }
// @if PREFETCH
        workgroupBarrier();   // every read of the single stage is done
        if (more) {   // nobody reads qs/dos/stats until the barrier below
            for (var t = 0u; t < {{PF}}u; t++) {   // @unroll
                if (PL > t) { stash(t, lid, 0u, pq[t], pd[t]); }
            }
            for (var t = 0u; t < 4u; t++) {   // @unroll
                if (SL > t) { stash_stats(t, lid, 0u, sl[t], sd[t]); }
            }
        }
        workgroupBarrier();
// @else
    }
// @endif
    }
    for (var i = 0u; i < 4u; i++) {   // @unroll
        if (key[i] < p.seq) {
            let base = kv_row(b, key[i], hk);
            for (var j = 0u; j < 4u; j++) {   // @unroll
                if (j == 0u || DV > j) {
                    dk_out[base + tq + j * TQ] = dk[i][j];
                    dv_out[base + tq + j * TQ] = dv[i][j];
                }
            }
        }
    }
}
