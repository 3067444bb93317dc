// 03_linear_sgmat.wgsl — the tensor-core matmuls: subgroup matrices (Dawn's
// chromium_experimental_subgroup_matrix, f16 x f16 -> f32), the same products and epilogues as
// 03_linear_tiled.wgsl (shaders/kernels/matmul/ops.py picks them with tensor_cores=True).
//
//   matmul_nt_sgmat       C[M,N] = alpha * A[M,K]   @ B[N,K]^T   (Linear forward)
//   matmul_nn_sgmat       C[M,N] = alpha * A[M,K]   @ B[K,N]     (Linear dX = dy @ W)
//   matmul_tn_sgmat       C[M,N] = alpha * A[K,M]^T @ B[K,N]     (Linear dW = dy^T @ x)
//   matmul_nt_w16_sgmat   as matmul_nt_sgmat, B the f16 weight mirror
//   matmul_nn_w16_sgmat   as matmul_nn_sgmat, B the f16 weight mirror
//   matmul_tn_w16_sgmat   as matmul_tn_sgmat, B an f16 activation (f16 precision's h, h2, s)
//   matmul_<layout>_a16[_w16]_sgmat   the same with A in f16 (e.g. the LM head's dlogits,
//                         which the cross-entropy writes in f16 for them): half A's bytes,
//                         no rounding while staging
//
// Numerics: both operands are rounded to f16 when staged, products accumulate in f32 over all
// of K (or of a K split), alpha scales the f32 sum. The forward (nt) clamps A to f16's range
// (+-65504, as the packed-f16 kernel); nn/tn do not, so a gradient that overflows f16 becomes
// inf and the optimizer's NaN/Inf guard skips the step (dynamic loss scaling).
//
// A template (shaders/wgsl_expand.py), parameters: SGR x SGC subgroups per workgroup, each
// owning TI x TJ result tiles of 16 x 16 (so BM = 16 SGR TI, BN = 16 SGC TJ), BK (the K slice
// staged per step, a multiple of 16), PAD (f16 elements added to each staged row: spreads the
// tile loads over banks), LA / LB (vec4 loads of A / B per invocation per slice), KSTEPS
// (BK / 16), AHEAD, DIRECT, SINGLE (below; STAGES follows from it), CLAMP_A (the forward
// clamps an f32 A to f16's range), A16 (the _a16 kernels: A is f16), F16_ROW and F16_READ
// (how f16 A and B rows are read from storage, op_support.F16_READ_PARAMS: vec2<u32> bits
// bitcast to vec4<f16>), A_READ (F16_READ for A16, nothing for an f32 A).
// Subgroup size 32 (Dawn's f16 configurations on NVIDIA say so; the op checks).
//
// Staging: operands are read as vec4 along their contiguous dimension and written, rounded,
// in the same orientation into one of two stages (As: [m][k] rows of BK + PAD, or [k][m] rows
// of BM + PAD for tn; Bs: [n][k] for nt, [k][n] otherwise); the subgroup-matrix loads read
// them row- or column-major as the orientation says. The next slice's global loads go into
// registers before this slice's multiplies and into the other stage after them: one barrier
// per slice. Matrix arguments derive from @builtin(subgroup_id) (they must be subgroup-
// uniform).
// SINGLE ("-b1", STAGES 1): one stage, rewritten after a second barrier once every subgroup
// has read it. Half the workgroup memory, so a slice of BK 32 fits 128 x 256 tiles. On the
// H200 that won at every 124M product (round 11, dev/tensor_core_matmul/README.md): the two-stage
// kernels stalled on their loads at each slice (more slices in flight, fewer staging stores or
// bytes changed nothing; taking the loads out did); twice the multiplies between barriers and
// more subgroups per SM (half the workgroup memory) hide them.
// AHEAD (1 or 2): slices in flight in registers. 1: the next slice's loads are issued before
// this slice's multiplies, so one slice of multiplies hides their latency; 2: two register
// sets, the loads of slice s + 2 are issued at slice s (the slice loop written out in pairs,
// so each set keeps its registers: no copies that would wait for the loads).
// Epilogue (DIRECT): where the workgroup's whole tile of C is inside the matrix and alpha is
// 1 (every call of the model), the accumulators start from C (accumulate) or R (residual)
// and each subgroup stores its tiles straight to C with subgroupMatrixStore: no workgroup
// memory, no barriers. Elsewhere (ragged edges, alpha != 1; and every tile without DIRECT),
// each result tile goes through the subgroup's 16 x 16 f32 slot of Cs, from where the
// subgroup's 32 lanes write it with bounds checks and the mode (0 store, 1 accumulate,
// 2 residual), two barriers per tile. Split-K as 03_linear_tiled.wgsl (partial z at
// z * c_split; the partials are stored, mode 0).
// Layout requirements as the tiled kernels: contiguous and leading dimensions multiples of
// 4, operands 16-byte aligned (8-byte for f16 B).
// Bindings (group 0): 0 A (read, vec4<f32>; F16_ROW for _a16), 1 B (read, vec4<f32> or F16_ROW), 2 R (read,
// vec4<f32>; f32 with DIRECT), 3 C (read_write, vec4<f32>; f32 with DIRECT: the element type
// subgroupMatrixStore needs), 4 Params (uniform).
// Dispatch: (ceil(N / BN), ceil(M / BM), splits) workgroups of 32 SGR SGC invocations.

const SGR: u32 = {{SGR}}u;
const SGC: u32 = {{SGC}}u;
const BM: u32 = 16u * SGR * {{TI}}u;
const BN: u32 = 16u * SGC * {{TJ}}u;
const BK: u32 = {{BK}}u;
const WG: u32 = 32u * SGR * SGC;
const SA: u32 = select(BK, BM, A_KMAJOR) + {{PAD}}u;   // f16 elements per staged row of A
const SB: u32 = select(BK, BN, B_KMAJOR) + {{PAD}}u;
const STAGE_A: u32 = select(BM, BK, A_KMAJOR) * SA;    // f16 elements per stage
const STAGE_B: u32 = select(BN, BK, B_KMAJOR) * SB;

struct Params {
    m: u32,
    n: u32,
    k: u32,
    mode: u32,     // 0 store, 1 accumulate, 2 residual
    alpha: f32,
    lda: u32,
    ldb: u32,
    ldc: u32,
    k_split: u32,  // K per split (multiple of BK)
    c_split: u32,  // elements between the partial products of consecutive splits
    _pad0: u32,
    _pad1: u32,
}

// @if SINGLE
const STAGES: u32 = 1u;   // one stage, two barriers a slice
// @else
const STAGES: u32 = 2u;   // double-buffered
// @endif
var<workgroup> As: array<f16, STAGES * STAGE_A>;
var<workgroup> Bs: array<f16, STAGES * STAGE_B>;
var<workgroup> Cs: array<f32, 256u * SGR * SGC>;

// Global vec4 slot t of this invocation's share of the A slice at k0 (zero outside), rounded
// to f16 (A16: read as f16). The f32 path is written exactly as before the f16 A: a version
// that returned from inside the bounds checks ran the forward (nt) 2x slower on the H200.
fn fetch_a(t: u32, lid: u32, m0: u32, k0: u32, k_end: u32) -> vec4<f16> {
    let i = lid + t * WG;
// @if A16
    var v = vec4<f16>();
// @else
    var v = vec4<f32>();
// @endif
    if (A_KMAJOR) {
        let k = k0 + i / (BM / 4u);
        let m = m0 + 4u * (i % (BM / 4u));
        if (k < k_end && m < p.m) { v = {{A_READ}}(a_in[(k * p.lda + m) / 4u]); }
    } else {
        let m = m0 + i / (BK / 4u);
        let k = k0 + 4u * (i % (BK / 4u));
        if (m < p.m && k < k_end) { v = {{A_READ}}(a_in[(m * p.lda + k) / 4u]); }
    }
// @if CLAMP_A
    v = clamp(v, vec4<f32>(-65504.0), vec4<f32>(65504.0));
// @endif
    return vec4<f16>(v);
}

fn fetch_b(t: u32, lid: u32, n0: u32, k0: u32, k_end: u32) -> vec4<f16> {
    let i = lid + t * WG;
    if (B_KMAJOR) {
        let k = k0 + i / (BN / 4u);
        let n = n0 + 4u * (i % (BN / 4u));
        if (k < k_end && n < p.n) { return load_b4((k * p.ldb + n) / 4u); }
    } else {
        let n = n0 + i / (BK / 4u);
        let k = k0 + 4u * (i % (BK / 4u));
        if (n < p.n && k < k_end) { return load_b4((n * p.ldb + k) / 4u); }
    }
    return vec4<f16>();
}

// Slot t into stage `stage`, in the orientation it was read in (4 consecutive f16).
fn stash_a(t: u32, lid: u32, stage: u32, v: vec4<f16>) {
    let i = lid + t * WG;
    var at = stage * STAGE_A;
    if (A_KMAJOR) {
        at += (i / (BM / 4u)) * SA + 4u * (i % (BM / 4u));
    } else {
        at += (i / (BK / 4u)) * SA + 4u * (i % (BK / 4u));
    }
    As[at] = v.x;
    As[at + 1u] = v.y;
    As[at + 2u] = v.z;
    As[at + 3u] = v.w;
}

fn stash_b(t: u32, lid: u32, stage: u32, v: vec4<f16>) {
    let i = lid + t * WG;
    var at = stage * STAGE_B;
    if (B_KMAJOR) {
        at += (i / (BN / 4u)) * SB + 4u * (i % (BN / 4u));
    } else {
        at += (i / (BK / 4u)) * SB + 4u * (i % (BK / 4u));
    }
    Bs[at] = v.x;
    Bs[at + 1u] = v.y;
    Bs[at + 2u] = v.z;
    Bs[at + 3u] = v.w;
}

// Offset of staged A element (row m, column k) and whether A's tiles are column-major there.
fn a_at(stage: u32, m: u32, k: u32) -> u32 {
    if (A_KMAJOR) { return stage * STAGE_A + k * SA + m; }
    return stage * STAGE_A + m * SA + k;
}

fn b_at(stage: u32, k: u32, n: u32) -> u32 {
    if (B_KMAJOR) { return stage * STAGE_B + k * SB + n; }
    return stage * STAGE_B + n * SB + k;
}

// Write the result tile the subgroup just put in its Cs slot to rows r0.., columns c0.. of C.
fn write_tile(sg: u32, lane: u32, r0: u32, c0: u32, split: u32) {
    workgroupBarrier();
    for (var e = 0u; e < 2u; e++) {   // @unroll
        let idx = lane + 32u * e;      // vec4 e of the lane: row idx / 4, columns 4 (idx % 4)..
        let r = idx / 4u;
        let q = 4u * (idx % 4u);
        let row = r0 + r;
        let col = c0 + q;
        if (row < p.m && col < p.n) {
            let s = sg * 256u + r * 16u + q;
            let v = p.alpha * vec4<f32>(Cs[s], Cs[s + 1u], Cs[s + 2u], Cs[s + 3u]);
// @if DIRECT
            let o = split * p.c_split + row * p.ldc + col;   // C and R as f32 elements
            var base = vec4<f32>();
            if (p.mode == 1u) {
                base = vec4<f32>(c_out[o], c_out[o + 1u], c_out[o + 2u], c_out[o + 3u]);
            } else if (p.mode == 2u) {
                base = vec4<f32>(residual[o], residual[o + 1u], residual[o + 2u], residual[o + 3u]);
            }
            let w = base + v;
            c_out[o] = w.x;
            c_out[o + 1u] = w.y;
            c_out[o + 2u] = w.z;
            c_out[o + 3u] = w.w;
// @else
            let o = (split * p.c_split + row * p.ldc + col) / 4u;
            if (p.mode == 1u) {
                c_out[o] = c_out[o] + v;
            } else if (p.mode == 2u) {
                c_out[o] = residual[o] + v;
            } else {
                c_out[o] = v;
            }
// @endif
        }
    }
    workgroupBarrier();
}

fn tile_body(wg: vec3<u32>, lid: u32, sg: u32, lane: u32) {
    let sr = sg / SGC;
    let sc = sg % SGC;
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let k_begin = wg.z * p.k_split;
    let k_end = min(p.k, k_begin + p.k_split);
    let slices = (k_end - k_begin + BK - 1u) / BK;
    let am = sr * (BM / SGR);   // this subgroup's first row and column in the tile
    let bn = sc * (BN / SGC);
    var c: array<subgroup_matrix_result<f32, 16, 16>, {{TI}} * {{TJ}}>;
// @if DIRECT
    // the whole tile inside C and alpha 1: accumulate from C or R, store straight to C
    let direct = p.alpha == 1.0 && m0 + BM <= p.m && n0 + BN <= p.n;
    if (direct && p.mode != 0u) {
        for (var i = 0u; i < {{TI}}u; i++) {   // @unroll
            for (var j = 0u; j < {{TJ}}u; j++) {   // @unroll
                let o = wg.z * p.c_split + (m0 + am + 16u * i) * p.ldc + n0 + bn + 16u * j;
                if (p.mode == 1u) {
                    c[i * {{TJ}}u + j] = subgroupMatrixLoad<subgroup_matrix_result<f32, 16, 16>>(&c_out, o, false, p.ldc);
                } else {
                    c[i * {{TJ}}u + j] = subgroupMatrixLoad<subgroup_matrix_result<f32, 16, 16>>(&residual, o, false, p.ldc);
                }
            }
        }
    }
// @endif
    // register set h holds the slices s with s % AHEAD == h between their loads and stashes
    var ra: array<array<vec4<f16>, {{LA}}>, {{AHEAD}}>;
    var rb: array<array<vec4<f16>, {{LB}}>, {{AHEAD}}>;
    for (var h = 0u; h < {{AHEAD}}u; h++) {   // @unroll
        for (var t = 0u; t < {{LA}}u; t++) {   // @unroll
            ra[h][t] = fetch_a(t, lid, m0, k_begin + h * BK, k_end);
        }
        for (var t = 0u; t < {{LB}}u; t++) {   // @unroll
            rb[h][t] = fetch_b(t, lid, n0, k_begin + h * BK, k_end);
        }
    }
    for (var t = 0u; t < {{LA}}u; t++) {   // @unroll
        stash_a(t, lid, 0u, ra[0][t]);
    }
    for (var t = 0u; t < {{LB}}u; t++) {   // @unroll
        stash_b(t, lid, 0u, rb[0][t]);
    }
    workgroupBarrier();

    for (var s0 = 0u; s0 < slices; s0 += {{AHEAD}}u) {
        for (var h = 0u; h < {{AHEAD}}u; h++) {   // @unroll
            let s = s0 + h;
            if (s < slices) {
                let stage = s % STAGES;
                {   // slice s + AHEAD's loads land while the multiplies below run (zeros past
                    // the end); its set was stashed at the previous slice
                    let k_next = k_begin + (s + {{AHEAD}}u) * BK;
                    for (var t = 0u; t < {{LA}}u; t++) {   // @unroll
                        ra[h][t] = fetch_a(t, lid, m0, k_next, k_end);
                    }
                    for (var t = 0u; t < {{LB}}u; t++) {   // @unroll
                        rb[h][t] = fetch_b(t, lid, n0, k_next, k_end);
                    }
                }
                for (var kk = 0u; kk < {{KSTEPS}}u; kk++) {   // @unroll
                    let ks = 16u * kk;
                    var a: array<subgroup_matrix_left<f16, 16, 16>, {{TI}}>;    // @let
                    var b: array<subgroup_matrix_right<f16, 16, 16>, {{TJ}}>;   // @let
                    for (var i = 0u; i < {{TI}}u; i++) {   // @unroll
                        a[i] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&As, a_at(stage, am + 16u * i, ks), A_KMAJOR, SA);
                    }
                    for (var j = 0u; j < {{TJ}}u; j++) {   // @unroll
                        b[j] = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Bs, b_at(stage, ks, bn + 16u * j), !B_KMAJOR, SB);
                    }
                    for (var i = 0u; i < {{TI}}u; i++) {   // @unroll
                        for (var j = 0u; j < {{TJ}}u; j++) {   // @unroll
                            c[i * {{TJ}}u + j] = subgroupMatrixMultiplyAccumulate(a[i], b[j], c[i * {{TJ}}u + j]);
                        }
                    }
                }
                {   // slice s + 1 into the other stage, last read before the previous barrier
                    // (one stage: into this one, once every subgroup has read it)
                    let next = (s + 1u) % STAGES;
// @if SINGLE
                    workgroupBarrier();
// @endif
                    for (var t = 0u; t < {{LA}}u; t++) {   // @unroll
                        stash_a(t, lid, next, ra[(h + 1u) % {{AHEAD}}u][t]);
                    }
                    for (var t = 0u; t < {{LB}}u; t++) {   // @unroll
                        stash_b(t, lid, next, rb[(h + 1u) % {{AHEAD}}u][t]);
                    }
                }
                workgroupBarrier();
            }
        }
    }

// @if DIRECT
    if (direct) {
        for (var i = 0u; i < {{TI}}u; i++) {   // @unroll
            for (var j = 0u; j < {{TJ}}u; j++) {   // @unroll
                subgroupMatrixStore(&c_out, wg.z * p.c_split + (m0 + am + 16u * i) * p.ldc + n0 + bn + 16u * j, c[i * {{TJ}}u + j], false, p.ldc);
            }
        }
        return;
    }
// @endif
    for (var i = 0u; i < {{TI}}u; i++) {   // @unroll
        for (var j = 0u; j < {{TJ}}u; j++) {   // @unroll
            subgroupMatrixStore(&Cs, sg * 256u, c[i * {{TJ}}u + j], false, 16u);
            write_tile(sg, lane, m0 + am + 16u * i, n0 + bn + 16u * j, wg.z);
        }
    }
}

// --- KERNEL: matmul_nt_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = false;   // B[N,K]
fn load_b4(i: u32) -> vec4<f16> { return vec4<f16>(clamp(b_in[i], vec4<f32>(-65504.0), vec4<f32>(65504.0))); }

@compute @workgroup_size(WG)
fn matmul_nt_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32,
                   @builtin(subgroup_id) sg: u32,
                   @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, lid, sg, lane);
}

// --- KERNEL: matmul_nn_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = true;    // B[K,N]
fn load_b4(i: u32) -> vec4<f16> { return vec4<f16>(b_in[i]); }

@compute @workgroup_size(WG)
fn matmul_nn_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32,
                   @builtin(subgroup_id) sg: u32,
                   @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, lid, sg, lane);
}

// --- KERNEL: matmul_tn_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = true;    // A[K,M]
const B_KMAJOR: bool = true;    // B[K,N]
fn load_b4(i: u32) -> vec4<f16> { return vec4<f16>(b_in[i]); }

@compute @workgroup_size(WG)
fn matmul_tn_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32,
                   @builtin(subgroup_id) sg: u32,
                   @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, lid, sg, lane);
}

// --- KERNEL: matmul_tn_w16_sgmat ---
// B in f16: the trainer's f16 activations (h, h2, s) in the weight gradients dW = dy^T x
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<{{F16_ROW}}>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = true;    // A[K,M]
const B_KMAJOR: bool = true;    // B[K,N] in f16
fn load_b4(i: u32) -> vec4<f16> { return {{F16_READ}}(b_in[i]); }

@compute @workgroup_size(WG)
fn matmul_tn_w16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32,
                       @builtin(subgroup_id) sg: u32,
                       @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, lid, sg, lane);
}

// --- KERNEL: matmul_nt_w16_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<{{F16_ROW}}>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = false;   // B[N,K] in f16
fn load_b4(i: u32) -> vec4<f16> { return {{F16_READ}}(b_in[i]); }

@compute @workgroup_size(WG)
fn matmul_nt_w16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32,
                       @builtin(subgroup_id) sg: u32,
                       @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, lid, sg, lane);
}

// --- KERNEL: matmul_nn_w16_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<{{F16_ROW}}>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = true;    // B[K,N] in f16
fn load_b4(i: u32) -> vec4<f16> { return {{F16_READ}}(b_in[i]); }

@compute @workgroup_size(WG)
fn matmul_nn_w16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32,
                       @builtin(subgroup_id) sg: u32,
                       @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, lid, sg, lane);
}

// --- KERNEL: matmul_nt_a16_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<{{F16_ROW}}>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = false;   // B[N,K]
fn load_b4(i: u32) -> vec4<f16> { return vec4<f16>(clamp(b_in[i], vec4<f32>(-65504.0), vec4<f32>(65504.0))); }

@compute @workgroup_size(WG)
fn matmul_nt_a16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, lid, sg, lane);
}

// --- KERNEL: matmul_nn_a16_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<{{F16_ROW}}>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = true;    // B[K,N]
fn load_b4(i: u32) -> vec4<f16> { return vec4<f16>(b_in[i]); }

@compute @workgroup_size(WG)
fn matmul_nn_a16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, lid, sg, lane);
}

// --- KERNEL: matmul_tn_a16_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<{{F16_ROW}}>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = true;    // A[K,M]
const B_KMAJOR: bool = true;    // B[K,N]
fn load_b4(i: u32) -> vec4<f16> { return vec4<f16>(b_in[i]); }

@compute @workgroup_size(WG)
fn matmul_tn_a16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, lid, sg, lane);
}

// --- KERNEL: matmul_nt_a16_w16_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<{{F16_ROW}}>;
@group(0) @binding(1) var<storage, read> b_in: array<{{F16_ROW}}>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = false;   // B[N,K] in f16
fn load_b4(i: u32) -> vec4<f16> { return {{F16_READ}}(b_in[i]); }

@compute @workgroup_size(WG)
fn matmul_nt_a16_w16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, lid, sg, lane);
}

// --- KERNEL: matmul_nn_a16_w16_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<{{F16_ROW}}>;
@group(0) @binding(1) var<storage, read> b_in: array<{{F16_ROW}}>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = true;    // B[K,N] in f16
fn load_b4(i: u32) -> vec4<f16> { return {{F16_READ}}(b_in[i]); }

@compute @workgroup_size(WG)
fn matmul_nn_a16_w16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, lid, sg, lane);
}
