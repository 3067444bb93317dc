// 05_attention_decode.wgsl — decoding: one new query per sequence against a KV cache.
//
//   kv_cache_write    k_cache[b, pos + t] = k_src[b, t], v_cache[b, pos + t] = v_src[b, t]
//                     for t < T (prefill: T = prompt length, pos = 0; decoding: T = 1)
//   decode_partial    split-K attention: for chunk c of CH cache positions and query head h,
//                     with s_j = q . k_j * scale over keys j < n_ctx of the chunk:
//                     part[b, h, c] = (m = max s_j, l = sum exp(s_j - m), o = sum exp(s_j - m) v_j)
//   decode_combine    o[b, h] = sum_c exp(m_c - M) o_c / sum_c exp(m_c - M) l_c, M = max m_c
//
// Layouts (f32): q [B, H, D] with batch stride q_stride (the q part of a fused [B, (H+2Hkv)D]
// projection output fits); k_cache, v_cache [B, Tmax, Hkv, D] contiguous; k_src, v_src
// [B, T, Hkv, D] with token stride src_stride; o [B, H, D] contiguous; part
// [B, H, chunks, D + 2] (m, l, o). Query head h reads kv head h / (H / Hkv).
//
// Bindings (group 0):
//   kv_cache_write:  0 k_src, 1 v_src, 2 k_cache (rw), 3 v_cache (rw), 4 Params
//   decode_partial:  0 q, 1 k_cache, 2 v_cache, 3 part (rw), 4 Params
//   decode_combine:  0 part, 1 o (rw), 2 Params
// Dispatch: kv_cache_write ceil(B*T*Hkv*D / 256) (folded); decode_partial (chunks, B*H) with
// CH = WG invocations, one key each; decode_combine B*H workgroups of WG.

override WG: u32 = 128u;
const LOWEST: f32 = -3.402823466e+38;

struct Params {
    batch: u32,
    heads: u32,
    kv_heads: u32,
    dim: u32,        // D
    n_ctx: u32,      // valid cache positions (decode) / tokens T (cache write)
    t_max: u32,      // cache capacity per sequence
    stride: u32,     // q batch stride (decode) / source token stride (cache write)
    pos: u32,        // first cache position written (cache write)
    chunks: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
}

// --- KERNEL: kv_cache_write ---
@group(0) @binding(0) var<storage, read> k_src: array<f32>;
@group(0) @binding(1) var<storage, read> v_src: array<f32>;
@group(0) @binding(2) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(3) var<storage, read_write> v_cache: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(256)
fn kv_cache_write(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let i = workgroup_index(wg, nwg) * 256u + lid;
    let row = p.kv_heads * p.dim;
    if (i >= p.batch * p.n_ctx * row) { return; }
    let e = i % row;
    let bt = i / row;
    let b = bt / p.n_ctx;
    let t = bt % p.n_ctx;
    let dst = (b * p.t_max + p.pos + t) * row + e;
    let src = bt * p.stride + e;
    k_cache[dst] = k_src[src];
    v_cache[dst] = v_src[src];
}

// --- KERNEL: decode_partial ---
@group(0) @binding(0) var<storage, read> q_in: array<f32>;
@group(0) @binding(1) var<storage, read> k_cache: array<f32>;
@group(0) @binding(2) var<storage, read> v_cache: array<f32>;
@group(0) @binding(3) var<storage, read_write> part: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> qs: array<f32, 256>;      // D <= 256
var<workgroup> probs: array<f32, WG>;

@compute @workgroup_size(WG)
fn decode_partial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32,
                  @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
                  @builtin(subgroup_size) sg_size: u32, @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
    let chunk = wg.x;
    let bh = wg.y;
    let b = bh / p.heads;
    let h = bh % p.heads;
    let hk = h / (p.heads / p.kv_heads);
    let row = p.kv_heads * p.dim;
    for (var d = lid; d < p.dim; d += WG) { qs[d] = q_in[b * p.stride + h * p.dim + d] * p.scale; }
    workgroupBarrier();
    let key = chunk * WG + lid;
    var s = LOWEST;
    if (key < p.n_ctx) {
        let base = (b * p.t_max + key) * row + hk * p.dim;
        var acc = 0.0;
        for (var d = 0u; d < p.dim; d++) { acc = fma(qs[d], k_cache[base + d], acc); }
        s = acc;
    }
    let m = wg_max(s, sg);
    var e = 0.0;
    if (key < p.n_ctx) { e = exp(s - m); }
    probs[lid] = e;
    let l = wg_sum(e, sg);   // its barriers also publish probs
    let out = (bh * p.chunks + chunk) * (p.dim + 2u);
    let keys = min(WG, p.n_ctx - chunk * WG);
    for (var d = lid; d < p.dim; d += WG) {
        var acc = 0.0;
        for (var j = 0u; j < keys; j++) {
            acc = fma(probs[j], v_cache[(b * p.t_max + chunk * WG + j) * row + hk * p.dim + d], acc);
        }
        part[out + 2u + d] = acc;
    }
    if (lid == 0u) {
        part[out] = m;
        part[out + 1u] = l;
    }
}

// --- KERNEL: decode_combine ---
@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> o_out: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn decode_combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let bh = wg.x;
    let stride = p.dim + 2u;
    let first = bh * p.chunks * stride;
    var big = LOWEST;
    for (var c = 0u; c < p.chunks; c++) { big = max(big, part[first + c * stride]); }
    var denom = 0.0;
    for (var c = 0u; c < p.chunks; c++) {
        denom += exp(part[first + c * stride] - big) * part[first + c * stride + 1u];
    }
    for (var d = lid; d < p.dim; d += WG) {
        var acc = 0.0;
        for (var c = 0u; c < p.chunks; c++) {
            acc += exp(part[first + c * stride] - big) * part[first + c * stride + 2u + d];
        }
        o_out[bh * p.dim + d] = acc / denom;
    }
}
