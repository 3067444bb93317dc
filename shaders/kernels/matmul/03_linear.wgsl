// 03_linear.wgsl — the matmul family with f32 arithmetic (f32 accumulation throughout).
//
//   matmul_nn       C[M,N] = alpha * A[M,K]   @ B[K,N]
//   matmul_nt       C[M,N] = alpha * A[M,K]   @ B[N,K]^T     (Linear forward: x @ W^T)
//   matmul_tn       C[M,N] = alpha * A[K,M]^T @ B[K,N]       (Linear dW: dy^T @ x)
//   matmul_nn_w16   as matmul_nn with B read as f16 (dX = dy @ W from the f16 weight mirror)
//   matmul_nt_w16   as matmul_nt with B read as f16 (f32 math; see 03_linear_h16.wgsl for
//                   the packed-f16 variant)
//
// Every operand is row-major with a leading dimension (elements between consecutive rows):
// A: lda, B: ldb, C and R: ldc. Epilogue `mode`: 0 store C = alpha*AB; 1 accumulate
// C += alpha*AB; 2 residual C = R + alpha*AB (R bound at binding 2, same layout as C).
//
// Bindings (group 0): 0 A (read), 1 B (read, f32 or f16), 2 R (read; a dummy unless mode 2),
// 3 C (read_write), 4 Params (uniform).
// Dispatch: (ceil(N / BN), ceil(M / BM), 1) workgroups of WG = (BM/8)*(BN/8) invocations.
//
// Tiling: each workgroup computes a BM x BN tile of C, stepping through K in slices of BK
// that are staged in workgroup memory k-major (As[k][m], Bs[k][n]) as vec4s. Each invocation
// owns an 8x8 register block: rows {4ty..4ty+3} and {BM/2+4ty..}, columns {4tx..4tx+3} and
// {BN/2+4tx..}, so neighbouring invocations read neighbouring vec4s (no bank conflicts).
// Tile loads are bounds-checked (zero fill), so any M, N, K >= 1 works.
// Overrides: BM, BN multiples of 8; BK >= 1; WG must equal (BM/8)*(BN/8).
// The kernel sections below only declare bindings, the layout consts and load_a/load_b;
// the body is shared (WGSL resolves module-scope names in any order).

override BM: u32 = 64u;
override BN: u32 = 64u;
override BK: u32 = 16u;
override WG: u32 = 64u;

struct Params {
    m: u32,
    n: u32,
    k: u32,
    mode: u32,   // 0 store, 1 accumulate, 2 residual
    alpha: f32,
    lda: u32,
    ldb: u32,
    ldc: u32,
}

var<workgroup> As: array<vec4<f32>, BK * BM / 4u>;
var<workgroup> Bs: array<vec4<f32>, BK * BN / 4u>;

// Stage the K-slice [k0, k0+BK) of the A and B tiles. A_K_CONTIG / B_K_CONTIG (per kernel)
// say which index is contiguous in memory, so consecutive invocations read consecutive
// addresses.
fn stage_tiles(lid: u32, m0: u32, n0: u32, k0: u32) {
    for (var i = lid; i < BM * BK; i += WG) {
        var mm: u32;
        var kk: u32;
        if (A_K_CONTIG) { kk = i % BK; mm = i / BK; } else { mm = i % BM; kk = i / BM; }
        var v = 0.0;
        if (m0 + mm < p.m && k0 + kk < p.k) { v = load_a(m0 + mm, k0 + kk); }
        As[kk * (BM / 4u) + mm / 4u][mm % 4u] = v;
    }
    for (var i = lid; i < BN * BK; i += WG) {
        var nn: u32;
        var kk: u32;
        if (B_K_CONTIG) { kk = i % BK; nn = i / BK; } else { nn = i % BN; kk = i / BN; }
        var v = 0.0;
        if (n0 + nn < p.n && k0 + kk < p.k) { v = load_b(k0 + kk, n0 + nn); }
        Bs[kk * (BN / 4u) + nn / 4u][nn % 4u] = v;
    }
}

fn store_c(row: u32, col: u32, v: f32) {
    if (row < p.m && col < p.n) {
        let i = row * p.ldc + col;
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

fn matmul_body(wg: vec3<u32>, lid: u32) {
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let tx = lid % (BN / 8u);
    let ty = lid / (BN / 8u);
    // acc[2*i + j]: row group i (0..3 -> 4ty+i, 4..7 -> BM/2+4ty+i-4), column vec4 j.
    var acc: array<vec4<f32>, 16>;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        stage_tiles(lid, m0, n0, k0);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let a_lo = As[kk * (BM / 4u) + ty];
            let a_hi = As[kk * (BM / 4u) + BM / 8u + ty];
            let b_lo = Bs[kk * (BN / 4u) + tx];
            let b_hi = Bs[kk * (BN / 4u) + BN / 8u + tx];
            for (var i = 0u; i < 4u; i++) {
                acc[2u * i] = fma(vec4<f32>(a_lo[i]), b_lo, acc[2u * i]);
                acc[2u * i + 1u] = fma(vec4<f32>(a_lo[i]), b_hi, acc[2u * i + 1u]);
                acc[8u + 2u * i] = fma(vec4<f32>(a_hi[i]), b_lo, acc[8u + 2u * i]);
                acc[9u + 2u * i] = fma(vec4<f32>(a_hi[i]), b_hi, acc[9u + 2u * i]);
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 8u; i++) {
        let row = m0 + select(4u * ty + i, BM / 2u + 4u * ty + i - 4u, i >= 4u);
        for (var h = 0u; h < 2u; h++) {
            let v = acc[2u * i + h];
            let col = n0 + h * (BN / 2u) + 4u * tx;
            store_c(row, col, v.x);
            store_c(row, col + 1u, v.y);
            store_c(row, col + 2u, v.z);
            store_c(row, col + 3u, v.w);
        }
    }
}

// --- KERNEL: matmul_nn ---
@group(0) @binding(0) var<storage, read> a_in: array<f32>;
@group(0) @binding(1) var<storage, read> b_in: array<f32>;
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
const A_K_CONTIG: bool = true;    // A[M,K]
const B_K_CONTIG: bool = false;   // B[K,N]
fn load_a(m: u32, k: u32) -> f32 { return a_in[m * p.lda + k]; }
fn load_b(k: u32, n: u32) -> f32 { return b_in[k * p.ldb + n]; }

@compute @workgroup_size(WG)
fn matmul_nn(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    matmul_body(wg, lid);
}

// --- KERNEL: matmul_nt ---
@group(0) @binding(0) var<storage, read> a_in: array<f32>;
@group(0) @binding(1) var<storage, read> b_in: array<f32>;
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
const A_K_CONTIG: bool = true;    // A[M,K]
const B_K_CONTIG: bool = true;    // B[N,K]
fn load_a(m: u32, k: u32) -> f32 { return a_in[m * p.lda + k]; }
fn load_b(k: u32, n: u32) -> f32 { return b_in[n * p.ldb + k]; }

@compute @workgroup_size(WG)
fn matmul_nt(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    matmul_body(wg, lid);
}

// --- KERNEL: matmul_tn ---
@group(0) @binding(0) var<storage, read> a_in: array<f32>;
@group(0) @binding(1) var<storage, read> b_in: array<f32>;
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
const A_K_CONTIG: bool = false;   // A[K,M]
const B_K_CONTIG: bool = false;   // B[K,N]
fn load_a(m: u32, k: u32) -> f32 { return a_in[k * p.lda + m]; }
fn load_b(k: u32, n: u32) -> f32 { return b_in[k * p.ldb + n]; }

@compute @workgroup_size(WG)
fn matmul_tn(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    matmul_body(wg, lid);
}

// --- KERNEL: matmul_nn_w16 ---
@group(0) @binding(0) var<storage, read> a_in: array<f32>;
@group(0) @binding(1) var<storage, read> b_in: array<f16>;
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
const A_K_CONTIG: bool = true;    // A[M,K]
const B_K_CONTIG: bool = false;   // B[K,N] in f16
fn load_a(m: u32, k: u32) -> f32 { return a_in[m * p.lda + k]; }
fn load_b(k: u32, n: u32) -> f32 { return f32(b_in[k * p.ldb + n]); }

@compute @workgroup_size(WG)
fn matmul_nn_w16(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    matmul_body(wg, lid);
}

// --- KERNEL: matmul_nt_w16 ---
@group(0) @binding(0) var<storage, read> a_in: array<f32>;
@group(0) @binding(1) var<storage, read> b_in: array<f16>;
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
const A_K_CONTIG: bool = true;    // A[M,K]
const B_K_CONTIG: bool = true;    // B[N,K] in f16
fn load_a(m: u32, k: u32) -> f32 { return a_in[m * p.lda + k]; }
fn load_b(k: u32, n: u32) -> f32 { return f32(b_in[n * p.ldb + k]); }

@compute @workgroup_size(WG)
fn matmul_nt_w16(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    matmul_body(wg, lid);
}
