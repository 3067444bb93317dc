// 03_linear_tiled.wgsl — register-tiled matmuls with vec4 loads, double-buffered workgroup
// tiles and split-K (the fast path of shaders/ops/linear.py; 03_linear.wgsl is the general
// fallback for shapes that cannot be read as vec4).
//
//   matmul_nt_tiled       C[M,N] = alpha * A[M,K]   @ B[N,K]^T   (Linear forward)
//   matmul_nn_tiled       C[M,N] = alpha * A[M,K]   @ B[K,N]     (Linear dX = dy @ W)
//   matmul_tn_tiled       C[M,N] = alpha * A[K,M]^T @ B[K,N]     (Linear dW = dy^T @ x)
//   matmul_nt_w16_tiled   as matmul_nt_tiled, B read from the f16 weight mirror (f32 math)
//   matmul_nn_w16_tiled   as matmul_nn_tiled, B read from the f16 weight mirror (f32 math)
//
// Layouts: row-major with leading dimensions lda, ldb, ldc (elements). The vec4 path needs
// every contiguous dimension and every leading dimension to be a multiple of 4 and every
// operand 16-byte aligned (8-byte for f16 B); the op checks and falls back otherwise.
// Epilogue `mode`: 0 store, 1 accumulate (C += alpha*AB), 2 residual (C = R + alpha*AB).
//
// Split-K: workgroup z computes the K range [z*k_split, min(K, (z+1)*k_split)); with more
// than one split the op points C at a scratch buffer of `splits` partial [M, N] products
// (c_split elements apart, mode 0, alpha 1) and matmul_splitk_reduce sums them in a fixed
// order (deterministic) and applies alpha and the real epilogue (03_linear_splitk.wgsl).
//
// Bindings (group 0): 0 A (read, vec4<f32>), 1 B (read, vec4<f32>, or
// vec2<u32> = four packed f16 for *_w16), 2 R (read, vec4<f32>; a dummy unless mode 2),
// 3 C (read_write, vec4<f32>), 4 Params (uniform).
// Dispatch: (ceil(N / BN), ceil(M / BM), splits) workgroups of WG = (BM/TM)*(BN/TN).
//
// Tiling: a workgroup owns a BM x BN tile of C; each invocation a TM x TN register block
// made of (TM/4) x (TN/4) 4x4 blocks spread BM/(TM/4) rows and BN/(TN/4) columns apart, so
// neighbouring invocations read neighbouring vec4s of the workgroup tiles (no bank conflicts)
// and write neighbouring vec4s of C (coalesced). K advances in slices of BK staged k-major
// (As[k][m], Bs[k][n], rows padded by 4 floats so that the transposing stores of k-contiguous
// operands spread over banks) in two stages: the next slice's global loads are issued into
// registers before the current slice's FMAs and stored to the other stage after them (one
// barrier per slice).
// Overrides: BM, BN (multiples of 4*TY and 4*TX), BK (multiple of 4), TM, TN in {4, 8},
// WG = (BM/TM)*(BN/TN); at most MAX_LOADS vec4 loads per invocation per operand and slice.

override BM: u32 = 128u;
override BN: u32 = 128u;
override BK: u32 = 16u;
override TM: u32 = 8u;
override TN: u32 = 8u;
override WG: u32 = 256u;

override TX: u32 = BN / TN;              // invocations across a tile row
override TY: u32 = BM / TM;              // invocations across a tile column
override GM: u32 = TM / 4u;              // 4-row groups per invocation
override GN: u32 = TN / 4u;              // 4-column groups per invocation
override SA: u32 = (BM + 4u) / 4u;       // vec4s per k-row of As (padded)
override SB: u32 = (BN + 4u) / 4u;
override LA: u32 = (BM * BK / 4u + WG - 1u) / WG;   // vec4 loads of A per invocation, slice
override LB: u32 = (BN * BK / 4u + WG - 1u) / WG;

const MAX_G: u32 = 2u;
const MAX_ACC: u32 = 16u;
const MAX_LOADS: u32 = 8u;

struct Params {
    m: u32,
    n: u32,
    k: u32,
    mode: u32,     // 0 store, 1 accumulate, 2 residual
    alpha: f32,
    lda: u32,
    ldb: u32,
    ldc: u32,
    k_split: u32,  // K per split (multiple of BK); the reduce kernel reads it as the split count
    c_split: u32,  // elements between the partial products of consecutive splits
    _pad0: u32,
    _pad1: u32,
}

// --- shared body (every kernel section declares the bindings, A_KMAJOR, B_KMAJOR,
// load_a4 and load_b4 it uses) ---

// Global vec4 slot t of this invocation's share of the A slice starting at k0: the tile
// coordinates (k-major: [k][m4]; k-contiguous: [m][k4]) and bounds decide; zero outside.
fn fetch_a(t: u32, lid: u32, m0: u32, k0: u32, k_end: u32) -> vec4<f32> {
    let i = lid + t * WG;
    if (i >= BM * BK / 4u) { return vec4<f32>(); }
    if (A_KMAJOR) {
        let k = k0 + i / (BM / 4u);
        let m = m0 + 4u * (i % (BM / 4u));
        if (k < k_end && m < p.m) { return load_a4(k, m / 4u); }
    } else {
        let m = m0 + i / (BK / 4u);
        let k = k0 + 4u * (i % (BK / 4u));
        if (m < p.m && k < k_end) { return load_a4(m, k / 4u); }
    }
    return vec4<f32>();
}

fn fetch_b(t: u32, lid: u32, n0: u32, k0: u32, k_end: u32) -> vec4<f32> {
    let i = lid + t * WG;
    if (i >= BN * BK / 4u) { return vec4<f32>(); }
    if (B_KMAJOR) {
        let k = k0 + i / (BN / 4u);
        let n = n0 + 4u * (i % (BN / 4u));
        if (k < k_end && n < p.n) { return load_b4(k, n / 4u); }
    } else {
        let n = n0 + i / (BK / 4u);
        let k = k0 + 4u * (i % (BK / 4u));
        if (n < p.n && k < k_end) { return load_b4(n, k / 4u); }
    }
    return vec4<f32>();
}

fn stash_a(t: u32, lid: u32, stage: u32, v: vec4<f32>) {
    let i = lid + t * WG;
    if (i >= BM * BK / 4u) { return; }
    let base = stage * BK * SA;
    if (A_KMAJOR) {
        As[base + (i / (BM / 4u)) * SA + i % (BM / 4u)] = v;
    } else {
        let m = i / (BK / 4u);
        let k = 4u * (i % (BK / 4u));
        for (var j = 0u; j < 4u; j++) {
            let e = (k + j) * (BM + 4u) + m;
            As[base + e / 4u][e % 4u] = v[j];
        }
    }
}

fn stash_b(t: u32, lid: u32, stage: u32, v: vec4<f32>) {
    let i = lid + t * WG;
    if (i >= BN * BK / 4u) { return; }
    let base = stage * BK * SB;
    if (B_KMAJOR) {
        Bs[base + (i / (BN / 4u)) * SB + i % (BN / 4u)] = v;
    } else {
        let n = i / (BK / 4u);
        let k = 4u * (i % (BK / 4u));
        for (var j = 0u; j < 4u; j++) {
            let e = (k + j) * (BN + 4u) + n;
            Bs[base + e / 4u][e % 4u] = v[j];
        }
    }
}

fn store_c4(row: u32, col: u32, split: u32, v: vec4<f32>) {
    if (row < p.m && col < p.n) {
        let i = (split * p.c_split + row * p.ldc + col) / 4u;
        let scaled = p.alpha * v;
        if (p.mode == 1u) {
            c_out[i] = c_out[i] + scaled;
        } else if (p.mode == 2u) {
            c_out[i] = residual[i] + scaled;
        } else {
            c_out[i] = scaled;
        }
    }
}

fn matmul_tiled_body(wg: vec3<u32>, lid: u32) {
    let tx = lid % TX;
    let ty = lid / TX;
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let k_begin = wg.z * p.k_split;
    let k_end = min(p.k, k_begin + p.k_split);
    let slices = (k_end - k_begin + BK - 1u) / BK;

    var acc: array<vec4<f32>, MAX_ACC>;
    var pa: array<vec4<f32>, MAX_LOADS>;
    var pb: array<vec4<f32>, MAX_LOADS>;
    for (var t = 0u; t < LA; t++) { pa[t] = fetch_a(t, lid, m0, k_begin, k_end); }
    for (var t = 0u; t < LB; t++) { pb[t] = fetch_b(t, lid, n0, k_begin, k_end); }
    for (var t = 0u; t < LA; t++) { stash_a(t, lid, 0u, pa[t]); }
    for (var t = 0u; t < LB; t++) { stash_b(t, lid, 0u, pb[t]); }
    workgroupBarrier();

    for (var s = 0u; s < slices; s++) {
        let stage = s % 2u;
        let more = s + 1u < slices;
        if (more) {   // issue the next slice's loads; they land while the FMAs below run
            let k_next = k_begin + (s + 1u) * BK;
            for (var t = 0u; t < LA; t++) { pa[t] = fetch_a(t, lid, m0, k_next, k_end); }
            for (var t = 0u; t < LB; t++) { pb[t] = fetch_b(t, lid, n0, k_next, k_end); }
        }
        let a_base = stage * BK * SA + ty;
        let b_base = stage * BK * SB + tx;
        for (var kk = 0u; kk < BK; kk++) {
            var a: array<vec4<f32>, MAX_G>;
            var b: array<vec4<f32>, MAX_G>;
            for (var g = 0u; g < GM; g++) { a[g] = As[a_base + kk * SA + g * TY]; }
            for (var h = 0u; h < GN; h++) { b[h] = Bs[b_base + kk * SB + h * TX]; }
            for (var g = 0u; g < GM; g++) {
                for (var r = 0u; r < 4u; r++) {
                    let av = vec4<f32>(a[g][r]);
                    for (var h = 0u; h < GN; h++) {
                        let i = (g * 4u + r) * GN + h;
                        acc[i] = fma(av, b[h], acc[i]);
                    }
                }
            }
        }
        if (more) {   // the other stage was last read before the previous barrier
            for (var t = 0u; t < LA; t++) { stash_a(t, lid, 1u - stage, pa[t]); }
            for (var t = 0u; t < LB; t++) { stash_b(t, lid, 1u - stage, pb[t]); }
        }
        workgroupBarrier();
    }

    for (var g = 0u; g < GM; g++) {
        for (var r = 0u; r < 4u; r++) {
            let row = m0 + g * (4u * TY) + 4u * ty + r;
            for (var h = 0u; h < GN; h++) {
                let col = n0 + h * (4u * TX) + 4u * tx;
                store_c4(row, col, wg.z, acc[(g * 4u + r) * GN + h]);
            }
        }
    }
}

// --- KERNEL: matmul_nt_tiled ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: Params;
var<workgroup> As: array<vec4<f32>, 2u * BK * SA>;
var<workgroup> Bs: array<vec4<f32>, 2u * BK * SB>;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = false;   // B[N,K]
fn load_a4(row: u32, c4: u32) -> vec4<f32> { return a_in[row * (p.lda / 4u) + c4]; }
fn load_b4(row: u32, c4: u32) -> vec4<f32> { return b_in[row * (p.ldb / 4u) + c4]; }

@compute @workgroup_size(WG)
fn matmul_nt_tiled(@builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    matmul_tiled_body(wg, lid);
}

// --- KERNEL: matmul_nn_tiled ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: Params;
var<workgroup> As: array<vec4<f32>, 2u * BK * SA>;
var<workgroup> Bs: array<vec4<f32>, 2u * BK * SB>;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = true;    // B[K,N]
fn load_a4(row: u32, c4: u32) -> vec4<f32> { return a_in[row * (p.lda / 4u) + c4]; }
fn load_b4(row: u32, c4: u32) -> vec4<f32> { return b_in[row * (p.ldb / 4u) + c4]; }

@compute @workgroup_size(WG)
fn matmul_nn_tiled(@builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    matmul_tiled_body(wg, lid);
}

// --- KERNEL: matmul_tn_tiled ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: Params;
var<workgroup> As: array<vec4<f32>, 2u * BK * SA>;
var<workgroup> Bs: array<vec4<f32>, 2u * BK * SB>;
const A_KMAJOR: bool = true;    // A[K,M]
const B_KMAJOR: bool = true;    // B[K,N]
fn load_a4(row: u32, c4: u32) -> vec4<f32> { return a_in[row * (p.lda / 4u) + c4]; }
fn load_b4(row: u32, c4: u32) -> vec4<f32> { return b_in[row * (p.ldb / 4u) + c4]; }

@compute @workgroup_size(WG)
fn matmul_tn_tiled(@builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    matmul_tiled_body(wg, lid);
}

// --- KERNEL: matmul_nt_w16_tiled ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec2<u32>>;   // 4 packed f16
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: Params;
var<workgroup> As: array<vec4<f32>, 2u * BK * SA>;
var<workgroup> Bs: array<vec4<f32>, 2u * BK * SB>;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = false;   // B[N,K] in f16
fn load_a4(row: u32, c4: u32) -> vec4<f32> { return a_in[row * (p.lda / 4u) + c4]; }
fn load_b4(row: u32, c4: u32) -> vec4<f32> {
    let w = b_in[row * (p.ldb / 4u) + c4];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

@compute @workgroup_size(WG)
fn matmul_nt_w16_tiled(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    matmul_tiled_body(wg, lid);
}

// --- KERNEL: matmul_nn_w16_tiled ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec2<u32>>;   // 4 packed f16
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: Params;
var<workgroup> As: array<vec4<f32>, 2u * BK * SA>;
var<workgroup> Bs: array<vec4<f32>, 2u * BK * SB>;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = true;    // B[K,N] in f16
fn load_a4(row: u32, c4: u32) -> vec4<f32> { return a_in[row * (p.lda / 4u) + c4]; }
fn load_b4(row: u32, c4: u32) -> vec4<f32> {
    let w = b_in[row * (p.ldb / 4u) + c4];
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

@compute @workgroup_size(WG)
fn matmul_nn_w16_tiled(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    matmul_tiled_body(wg, lid);
}

