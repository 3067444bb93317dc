// 05_attention.wgsl — causal multi-head attention (GQA), forward and backward, tiled with an
// online softmax: no T x T matrix ever exists in memory.
//
//   attention_forward      o = softmax(q k^T * scale + causal mask) v;  lse = log-sum-exp of
//                          each query's scaled scores (saved for the backward)
//   attention_backward_prep  dvec[b,h,t] = sum_d do[b,t,h,d] * o[b,t,h,d] (_vec4: vec4 loads;
//                            _vec4_f16: also do16 = f16(do) for the tensor-core backward)
//   attention_backward_dq  dq = scale * sum_keys ds k,  ds = p * (do.v - dvec), p = exp(s - lse)
//   attention_backward_dkv dk = scale * sum_queries ds q,  dv = sum_queries p do, summed over
//                          the H/Hkv query heads that share the kv head (GQA; no atomics)
//
// Layouts (f32): element (b,t,h,d) of q and dq at b*bq + t*sq + h*hq + d; of k, v, dk, dv
// likewise with bkv, skv, hkv; of o and do with bo, so, ho (ops.py passes all nine strides:
// [B, T, H, D] rows, the q/k/v parts of a fused qkv buffer, or head-major [B, H, T, D]);
// lse, dvec [B, H, T]. Query head h reads kv head h / (H / Hkv).
//
// Tiling: a workgroup owns BQ query rows (forward, dq) or BKV key rows (dkv) of one head,
// with TPR = WG / rows invocations per row; each invocation keeps HD/TPR output columns in
// registers and computes the scores of every TPR-th key (query) of a tile. Tiles of q, k, v
// and do are staged in workgroup memory with rows padded to HD+1 floats (no bank
// conflicts); the score tile S[BQ][BKV+1] carries probabilities between the two halves.
// Overrides: HD (head dim, exact), BQ, BKV, WG; WG = rows * TPR; BKV, BQ and HD multiples
// of TPR; HD / TPR <= 32 and BKV / TPR, BQ / TPR <= 16 (register arrays).
// Masked scores use -1e30, not -inf: exp(-1e30 - m) is 0 while m is finite, and m is finite
// from the first key tile on (key 0 is visible to every query).
//
// Bindings (group 0):
//   forward:  0 q, 1 k, 2 v, 3 o (rw), 4 lse (rw), 5 Params
//   prep:     0 o, 1 do, 2 dvec (rw), 3 Params (_vec4_f16: 3 do16 (rw; f16 bits in u32
//             pairs), 4 Params)
//   dq:       0 q, 1 k, 2 v, 3 do, 4 lse, 5 dvec, 6 dq (rw), 7 Params
//   dkv:      0 q, 1 k, 2 v, 3 do, 4 lse, 5 dvec, 6 dk (rw), 7 dv (rw), 8 Params
// Dispatch: forward and dq (ceil(T / BQ), B*H); dkv (ceil(T / BKV), B*Hkv);
// prep ceil(B*T*H / 256), the _vec4 preps ceil(B*T*H / (256 / PREP_LANES)) (folded into
// 2-D beyond 65,535).

override HD: u32 = 64u;
override BQ: u32 = 32u;
override BKV: u32 = 32u;
override WG: u32 = 256u;

const MASKED: f32 = -1e30;
const MAX_COLS: u32 = 32u;   // HD / TPR
const MAX_ROWS: u32 = 16u;   // BKV / TPR (forward, dq) or BQ / TPR (dkv)

struct Params {
    batch: u32,
    seq: u32,
    heads: u32,
    kv_heads: u32,
    sq: u32,      // token stride of q and dq
    skv: u32,     // token stride of k, v, dk, dv
    so: u32,      // token stride of o and do
    _pad: u32,
    scale: f32,
    hq: u32,      // head strides of the same
    hkv: u32,
    ho: u32,
    bq: u32,      // batch strides of the same
    bkv: u32,
    bo: u32,
    _pad1: u32,
}

fn q_index(b: u32, t: u32, h: u32) -> u32 { return b * p.bq + t * p.sq + h * p.hq; }
fn kv_index(b: u32, t: u32, hk: u32) -> u32 { return b * p.bkv + t * p.skv + hk * p.hkv; }
fn o_index(b: u32, t: u32, h: u32) -> u32 { return b * p.bo + t * p.so + h * p.ho; }
fn stat_index(b: u32, h: u32, t: u32) -> u32 { return (b * p.heads + h) * p.seq + t; }

// --- KERNEL: attention_forward ---
@group(0) @binding(0) var<storage, read> q_in: array<f32>;
@group(0) @binding(1) var<storage, read> k_in: array<f32>;
@group(0) @binding(2) var<storage, read> v_in: array<f32>;
@group(0) @binding(3) var<storage, read_write> o_out: array<f32>;
@group(0) @binding(4) var<storage, read_write> lse_out: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

var<workgroup> qs: array<f32, BQ * (HD + 1u)>;
var<workgroup> ks: array<f32, BKV * (HD + 1u)>;
var<workgroup> vs: array<f32, BKV * (HD + 1u)>;
var<workgroup> sc: array<f32, BQ * (BKV + 1u)>;

@compute @workgroup_size(WG)
fn attention_forward(@builtin(workgroup_id) wg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let tpr = WG / BQ;
    let r = lid / tpr;
    let tr = lid % tpr;
    let q0 = wg.x * BQ;
    let b = wg.y / p.heads;
    let h = wg.y % p.heads;
    let hk = h / (p.heads / p.kv_heads);
    let qi = q0 + r;

    for (var i = lid; i < BQ * HD; i += WG) {
        let rr = i / HD;
        let d = i % HD;
        var v = 0.0;
        if (q0 + rr < p.seq) { v = q_in[q_index(b, q0 + rr, h) + d] * p.scale; }
        qs[rr * (HD + 1u) + d] = v;
    }

    var m = MASKED;
    var l = 0.0;
    var acc: array<f32, MAX_COLS>;
    let cols = HD / tpr;
    let keys = BKV / tpr;
    let kv_end = min(p.seq, q0 + BQ);
    for (var kv0 = 0u; kv0 < kv_end; kv0 += BKV) {
        workgroupBarrier();   // the previous tile's readers are done with ks, vs, sc
        for (var i = lid; i < BKV * HD; i += WG) {
            let n = i / HD;
            let d = i % HD;
            var kval = 0.0;
            var vval = 0.0;
            if (kv0 + n < p.seq) {
                let g = kv_index(b, kv0 + n, hk) + d;
                kval = k_in[g];
                vval = v_in[g];
            }
            ks[n * (HD + 1u) + d] = kval;
            vs[n * (HD + 1u) + d] = vval;
        }
        workgroupBarrier();
        // scores of this invocation's keys n = tr + j*tpr: one q load feeds `keys` FMAs
        var s_own = array<f32, MAX_ROWS>();
        for (var d = 0u; d < HD; d++) {
            let qd = qs[r * (HD + 1u) + d];
            for (var j = 0u; j < keys; j++) {
                s_own[j] = fma(qd, ks[(tr + j * tpr) * (HD + 1u) + d], s_own[j]);
            }
        }
        var tile_max = MASKED;
        for (var j = 0u; j < keys; j++) {
            let n = tr + j * tpr;
            if (kv0 + n > qi || kv0 + n >= p.seq) { s_own[j] = MASKED; }
            sc[r * (BKV + 1u) + n] = s_own[j];
        }
        workgroupBarrier();
        for (var n = 0u; n < BKV; n++) { tile_max = max(tile_max, sc[r * (BKV + 1u) + n]); }
        let m_new = max(m, tile_max);
        let alpha = exp(m - m_new);
        workgroupBarrier();   // every row's max is read before probabilities overwrite sc
        for (var j = 0u; j < keys; j++) {
            sc[r * (BKV + 1u) + tr + j * tpr] = exp(s_own[j] - m_new);
        }
        workgroupBarrier();
        var row_sum = 0.0;
        for (var n = 0u; n < BKV; n++) { row_sum += sc[r * (BKV + 1u) + n]; }
        l = l * alpha + row_sum;
        for (var c = 0u; c < cols; c++) { acc[c] *= alpha; }
        for (var n = 0u; n < BKV; n++) {
            let pn = sc[r * (BKV + 1u) + n];
            for (var c = 0u; c < cols; c++) {
                acc[c] = fma(pn, vs[n * (HD + 1u) + tr + c * tpr], acc[c]);
            }
        }
        m = m_new;
    }
    if (qi < p.seq) {
        let inv = 1.0 / l;
        let base = o_index(b, qi, h);
        for (var c = 0u; c < cols; c++) { o_out[base + tr + c * tpr] = acc[c] * inv; }
        if (tr == 0u) { lse_out[stat_index(b, h, qi)] = m + log(l); }
    }
}

// --- KERNEL: attention_backward_prep ---
@group(0) @binding(0) var<storage, read> o_in: array<f32>;
@group(0) @binding(1) var<storage, read> do_in: array<f32>;
@group(0) @binding(2) var<storage, read_write> dvec_out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn attention_backward_prep(@builtin(workgroup_id) wg: vec3<u32>,
                           @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wg, nwg) * 256u + lid;     // (b, t, h) row-major
    if (row >= p.batch * p.seq * p.heads) { return; }
    let h = row % p.heads;
    let bt = row / p.heads;
    let base = o_index(bt / p.seq, bt % p.seq, h);
    var acc = 0.0;
    for (var d = 0u; d < HD; d++) { acc = fma(do_in[base + d], o_in[base + d], acc); }
    dvec_out[stat_index(bt / p.seq, h, bt % p.seq)] = acc;
}

// --- KERNEL: attention_backward_prep_vec4 ---
// attention_backward_prep with vec4 loads (HD, every o/do stride a multiple of 4, 16-byte
// aligned views), coalesced: PREP_LANES consecutive invocations own one (b, t, h) row, lane
// c loading vec4s c, c + PREP_LANES, ... of it, so one load instruction of a subgroup reads
// whole cache lines. One invocation per row (the previous layout) put neighbouring lanes
// 256 bytes apart at HD 64: 32 cache lines per load, ~1 TB/s of the H200's ~4.
// The lanes' partial sums meet in workgroup memory (a tree of log2(PREP_LANES) steps), not
// in subgroup operations, which not every device has (lavapipe under wgpu-native).
// PREP_LANES: a power of two <= min(HD / 4, 32) (ops.py prep_lanes); a workgroup owns
// 256 / PREP_LANES rows. Barriers need every invocation, so rows past the end load nothing
// and store nothing, but take part.
override PREP_LANES: u32 = 16u;

@group(0) @binding(0) var<storage, read> o_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> do_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dvec_out: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> prep_part: array<f32, 256>;

@compute @workgroup_size(256)
fn attention_backward_prep_vec4(@builtin(workgroup_id) wg: vec3<u32>,
                                @builtin(num_workgroups) nwg: vec3<u32>,
                                @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wg, nwg) * (256u / PREP_LANES) + lid / PREP_LANES;   // (b, t, h)
    let lane = lid % PREP_LANES;
    let live = row < p.batch * p.seq * p.heads;
    let h = row % p.heads;
    let b = row / p.heads / p.seq;
    let t = row / p.heads % p.seq;
    var acc = vec4<f32>();
    if (live) {
        let base = o_index(b, t, h) / 4u;
        for (var c = lane; c < HD / 4u; c += PREP_LANES) {
            acc = fma(do_in[base + c], o_in[base + c], acc);
        }
    }
    prep_part[lid] = acc.x + acc.y + acc.z + acc.w;
    for (var w = PREP_LANES / 2u; w > 0u; w /= 2u) {
        workgroupBarrier();
        if (lane < w) { prep_part[lid] += prep_part[lid + w]; }
    }
    if (live && lane == 0u) { dvec_out[stat_index(b, h, t)] = prep_part[lid]; }
}

// --- KERNEL: attention_backward_prep_vec4_f16 ---
// attention_backward_prep_vec4 (same lanes, loads and reduction) that also writes do as f16
// (do16, o's layout) for the tensor-core dQ and dK/dV kernels given f16 q, k, v: they load
// half the bytes, and do16 holds exactly the values they would round do to themselves
// (vec4<f16>(do)). do16 is bound as u32 pairs, each lane storing its four halves as one
// 8-byte pair next to its neighbours' (like the loads). pack2x16float, not
// bitcast<vec2<u32>>(vec4<f16>(g)), which naga (wgpu-native) mis-types: the same bits for
// finite in-range values (tests: numpy's rounding, on naga and Tint), and no clamp (WGSL
// defines neither for out-of-range values). The kernel thus uses no f16 type itself.
override PREP_LANES: u32 = 16u;

@group(0) @binding(0) var<storage, read> o_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> do_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dvec_out: array<f32>;
@group(0) @binding(3) var<storage, read_write> do16_out: array<vec2<u32>>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> prep_part: array<f32, 256>;

@compute @workgroup_size(256)
fn attention_backward_prep_vec4_f16(@builtin(workgroup_id) wg: vec3<u32>,
                                    @builtin(num_workgroups) nwg: vec3<u32>,
                                    @builtin(local_invocation_index) lid: u32) {
    let row = workgroup_index(wg, nwg) * (256u / PREP_LANES) + lid / PREP_LANES;   // (b, t, h)
    let lane = lid % PREP_LANES;
    let live = row < p.batch * p.seq * p.heads;
    let h = row % p.heads;
    let b = row / p.heads / p.seq;
    let t = row / p.heads % p.seq;
    var acc = vec4<f32>();
    if (live) {
        let base = o_index(b, t, h) / 4u;
        for (var c = lane; c < HD / 4u; c += PREP_LANES) {
            let g = do_in[base + c];
            acc = fma(g, o_in[base + c], acc);
            do16_out[base + c] = vec2<u32>(pack2x16float(g.xy), pack2x16float(g.zw));
        }
    }
    prep_part[lid] = acc.x + acc.y + acc.z + acc.w;
    for (var w = PREP_LANES / 2u; w > 0u; w /= 2u) {
        workgroupBarrier();
        if (lane < w) { prep_part[lid] += prep_part[lid + w]; }
    }
    if (live && lane == 0u) { dvec_out[stat_index(b, h, t)] = prep_part[lid]; }
}

// --- KERNEL: attention_backward_dq ---
@group(0) @binding(0) var<storage, read> q_in: array<f32>;
@group(0) @binding(1) var<storage, read> k_in: array<f32>;
@group(0) @binding(2) var<storage, read> v_in: array<f32>;
@group(0) @binding(3) var<storage, read> do_in: array<f32>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dvec_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> dq_out: array<f32>;
@group(0) @binding(7) var<uniform> p: Params;

var<workgroup> qs: array<f32, BQ * (HD + 1u)>;
var<workgroup> dos: array<f32, BQ * (HD + 1u)>;
var<workgroup> ks: array<f32, BKV * (HD + 1u)>;
var<workgroup> vs: array<f32, BKV * (HD + 1u)>;
var<workgroup> sc: array<f32, BQ * (BKV + 1u)>;

@compute @workgroup_size(WG)
fn attention_backward_dq(@builtin(workgroup_id) wg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32) {
    let tpr = WG / BQ;
    let r = lid / tpr;
    let tr = lid % tpr;
    let q0 = wg.x * BQ;
    let b = wg.y / p.heads;
    let h = wg.y % p.heads;
    let hk = h / (p.heads / p.kv_heads);
    let qi = q0 + r;

    for (var i = lid; i < BQ * HD; i += WG) {
        let rr = i / HD;
        let d = i % HD;
        var qv = 0.0;
        var dov = 0.0;
        if (q0 + rr < p.seq) {
            qv = q_in[q_index(b, q0 + rr, h) + d] * p.scale;
            dov = do_in[o_index(b, q0 + rr, h) + d];
        }
        qs[rr * (HD + 1u) + d] = qv;
        dos[rr * (HD + 1u) + d] = dov;
    }
    var lse = 0.0;
    var dv = 0.0;
    if (qi < p.seq) {
        lse = lse_in[stat_index(b, h, qi)];
        dv = dvec_in[stat_index(b, h, qi)];
    }

    var acc: array<f32, MAX_COLS>;
    let cols = HD / tpr;
    let keys = BKV / tpr;
    let kv_end = min(p.seq, q0 + BQ);
    for (var kv0 = 0u; kv0 < kv_end; kv0 += BKV) {
        workgroupBarrier();
        for (var i = lid; i < BKV * HD; i += WG) {
            let n = i / HD;
            let d = i % HD;
            var kval = 0.0;
            var vval = 0.0;
            if (kv0 + n < p.seq) {
                let g = kv_index(b, kv0 + n, hk) + d;
                kval = k_in[g];
                vval = v_in[g];
            }
            ks[n * (HD + 1u) + d] = kval;
            vs[n * (HD + 1u) + d] = vval;
        }
        workgroupBarrier();
        var s_own = array<f32, MAX_ROWS>();
        var dp_own = array<f32, MAX_ROWS>();
        for (var d = 0u; d < HD; d++) {
            let qd = qs[r * (HD + 1u) + d];
            let dod = dos[r * (HD + 1u) + d];
            for (var j = 0u; j < keys; j++) {
                let at = (tr + j * tpr) * (HD + 1u) + d;
                s_own[j] = fma(qd, ks[at], s_own[j]);
                dp_own[j] = fma(dod, vs[at], dp_own[j]);
            }
        }
        for (var j = 0u; j < keys; j++) {
            let n = tr + j * tpr;
            var ds = 0.0;
            if (kv0 + n <= qi && kv0 + n < p.seq && qi < p.seq) {
                ds = exp(s_own[j] - lse) * (dp_own[j] - dv);
            }
            sc[r * (BKV + 1u) + n] = ds;
        }
        workgroupBarrier();
        for (var n = 0u; n < BKV; n++) {
            let dsn = sc[r * (BKV + 1u) + n];
            for (var c = 0u; c < cols; c++) {
                acc[c] = fma(dsn, ks[n * (HD + 1u) + tr + c * tpr], acc[c]);
            }
        }
    }
    if (qi < p.seq) {
        let base = q_index(b, qi, h);
        for (var c = 0u; c < cols; c++) { dq_out[base + tr + c * tpr] = acc[c] * p.scale; }
    }
}

// --- KERNEL: attention_backward_dkv ---
@group(0) @binding(0) var<storage, read> q_in: array<f32>;
@group(0) @binding(1) var<storage, read> k_in: array<f32>;
@group(0) @binding(2) var<storage, read> v_in: array<f32>;
@group(0) @binding(3) var<storage, read> do_in: array<f32>;
@group(0) @binding(4) var<storage, read> lse_in: array<f32>;
@group(0) @binding(5) var<storage, read> dvec_in: array<f32>;
@group(0) @binding(6) var<storage, read_write> dk_out: array<f32>;
@group(0) @binding(7) var<storage, read_write> dv_out: array<f32>;
@group(0) @binding(8) var<uniform> p: Params;

var<workgroup> ks: array<f32, BKV * (HD + 1u)>;
var<workgroup> vs: array<f32, BKV * (HD + 1u)>;
var<workgroup> qs: array<f32, BQ * (HD + 1u)>;
var<workgroup> dos: array<f32, BQ * (HD + 1u)>;
var<workgroup> pt: array<f32, BKV * (BQ + 1u)>;    // p^T tile: [key][query]
var<workgroup> dst: array<f32, BKV * (BQ + 1u)>;   // ds^T tile
var<workgroup> stats: array<f32, 2u * BQ>;          // lse, dvec of the query tile

@compute @workgroup_size(WG)
fn attention_backward_dkv(@builtin(workgroup_id) wg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let tpr = WG / BKV;
    let r = lid / tpr;            // key row of this invocation
    let tr = lid % tpr;
    let k0 = wg.x * BKV;
    let b = wg.y / p.kv_heads;
    let hk = wg.y % p.kv_heads;
    let group = p.heads / p.kv_heads;
    let ki = k0 + r;

    for (var i = lid; i < BKV * HD; i += WG) {
        let n = i / HD;
        let d = i % HD;
        var kval = 0.0;
        var vval = 0.0;
        if (k0 + n < p.seq) {
            let g = kv_index(b, k0 + n, hk) + d;
            kval = k_in[g];
            vval = v_in[g];
        }
        ks[n * (HD + 1u) + d] = kval;
        vs[n * (HD + 1u) + d] = vval;
    }

    var dk_acc: array<f32, MAX_COLS>;
    var dv_acc: array<f32, MAX_COLS>;
    let cols = HD / tpr;
    let queries = BQ / tpr;
    let q_first = (k0 / BQ) * BQ;     // causal: queries before k0 see none of these keys
    for (var hq = hk * group; hq < (hk + 1u) * group; hq++) {
        for (var q0 = q_first; q0 < p.seq; q0 += BQ) {
            workgroupBarrier();
            for (var i = lid; i < BQ * HD; i += WG) {
                let rr = i / HD;
                let d = i % HD;
                var qv = 0.0;
                var dov = 0.0;
                if (q0 + rr < p.seq) {
                    qv = q_in[q_index(b, q0 + rr, hq) + d] * p.scale;
                    dov = do_in[o_index(b, q0 + rr, hq) + d];
                }
                qs[rr * (HD + 1u) + d] = qv;
                dos[rr * (HD + 1u) + d] = dov;
            }
            for (var i = lid; i < BQ; i += WG) {
                var lse = 0.0;
                var dvv = 0.0;
                if (q0 + i < p.seq) {
                    lse = lse_in[stat_index(b, hq, q0 + i)];
                    dvv = dvec_in[stat_index(b, hq, q0 + i)];
                }
                stats[i] = lse;
                stats[BQ + i] = dvv;
            }
            workgroupBarrier();
            var s_own = array<f32, MAX_ROWS>();
            var dp_own = array<f32, MAX_ROWS>();
            for (var d = 0u; d < HD; d++) {
                let kd = ks[r * (HD + 1u) + d];
                let vd = vs[r * (HD + 1u) + d];
                for (var j = 0u; j < queries; j++) {
                    let at = (tr + j * tpr) * (HD + 1u) + d;
                    s_own[j] = fma(kd, qs[at], s_own[j]);
                    dp_own[j] = fma(vd, dos[at], dp_own[j]);
                }
            }
            for (var j = 0u; j < queries; j++) {
                let mq = tr + j * tpr;
                let qidx = q0 + mq;
                var pr = 0.0;
                if (ki <= qidx && qidx < p.seq && ki < p.seq) { pr = exp(s_own[j] - stats[mq]); }
                pt[r * (BQ + 1u) + mq] = pr;
                dst[r * (BQ + 1u) + mq] = pr * (dp_own[j] - stats[BQ + mq]);
            }
            workgroupBarrier();
            for (var mq = 0u; mq < BQ; mq++) {
                let pm = pt[r * (BQ + 1u) + mq];
                let dsm = dst[r * (BQ + 1u) + mq];
                for (var c = 0u; c < cols; c++) {
                    let col = tr + c * tpr;
                    dv_acc[c] = fma(pm, dos[mq * (HD + 1u) + col], dv_acc[c]);
                    dk_acc[c] = fma(dsm, qs[mq * (HD + 1u) + col], dk_acc[c]);  // qs is pre-scaled
                }
            }
        }
    }
    if (ki < p.seq) {
        let base = kv_index(b, ki, hk);
        for (var c = 0u; c < cols; c++) {
            dk_out[base + tr + c * tpr] = dk_acc[c];
            dv_out[base + tr + c * tpr] = dv_acc[c];
        }
    }
}
