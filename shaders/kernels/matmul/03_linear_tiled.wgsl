// 03_linear_tiled.wgsl — the fast matmuls: register-tiled, vec4 loads, two-stage workgroup
// tiles, split-K (shaders/kernels/matmul/ops.py; 03_linear.wgsl is the any-shape fallback).
//
//   matmul_nt_tiled       C[M,N] = alpha * A[M,K]   @ B[N,K]^T   (Linear forward)
//   matmul_nn_tiled       C[M,N] = alpha * A[M,K]   @ B[K,N]     (Linear dX = dy @ W)
//   matmul_tn_tiled       C[M,N] = alpha * A[K,M]^T @ B[K,N]     (Linear dW = dy^T @ x)
//   matmul_nt_w16_tiled   as matmul_nt_tiled, B read from the f16 weight mirror (f32 math)
//   matmul_nn_w16_tiled   as matmul_nn_tiled, B read from the f16 weight mirror (f32 math)
//   matmul_nt_h16_tiled   as matmul_nt_w16_tiled in packed f16: A rounded to f16 when staged
//                         (clamped to +-65504), products of FOLD consecutive k summed in
//                         vec4<f16> partials, then added into the f32 accumulators. Needs
//                         shader-f16; forward activations only, never gradients.
//
// A template: shaders/wgsl_expand.py expands it when the kernel is made, with parameters
// TM, TN (the register block, 4 or 8 each), H16 (the packed-f16 kernel), ELEM (the staged
// scalar: f32, or f16 for H16), FOLD (H16: k per f16 partial) and UNROLL_K (f32: k-steps
// per written-out run of the slice loop; 1, the plain loop, is what runs). The loops marked
// `// @unroll` are written out and the register arrays (c, pa, pb, a, b, h) become named
// values, because NVIDIA's compiler keeps a private array indexed in loops in local memory
// (2.3 instead of 37 TFLOP/s for the 8x8 block, dev/compiler_probes/matmul_probe.py). The k-slice
// loop stays a loop for f32 (written-out runs of k-steps were 3-10% slower on the H200 at the
// tuned BK 8, dev/compare_trees/README.md); the FOLD k-steps of the f16 kernel are written out (~50
// instead of ~28 TFLOP/s as a nested loop, dev/compiler_probes/results/h200/h16_probe.txt).
//
// Layouts: row-major with leading dimensions lda, ldb, ldc (elements); every contiguous and
// leading dimension a multiple of 4 and every operand 16-byte aligned (8-byte for f16 B);
// the op checks and falls back to 03_linear.wgsl otherwise. Epilogue `mode`: 0 store,
// 1 accumulate (C += alpha*AB), 2 residual (C = R + alpha*AB). Split-K: workgroup z takes the
// K range [z*k_split, min(K, (z+1)*k_split)) and writes partial z at z*c_split (the op then
// runs matmul_splitk_reduce of 03_linear_splitk.wgsl: a fixed order, deterministic).
//
// Bindings (group 0): 0 A (read, vec4<f32>), 1 B (read, vec4<f32>; vec2<u32> = four packed
// f16 for *_w16; vec4<f16> for *_h16), 2 R (read, vec4<f32>; a dummy unless mode 2),
// 3 C (read_write, vec4<f32>), 4 Params (uniform).
// Dispatch: (ceil(N / BN), ceil(M / BM), splits) workgroups of WG = (BM/TM)*(BN/TN).
//
// Tiling: a workgroup owns a BM x BN tile of C; each invocation a TM x TN register block made
// of (TM/4) x (TN/4) 4x4 blocks spread BM/2 (TM 8) rows and BN/2 (TN 8) columns apart, so
// neighbouring invocations read neighbouring vec4s of the staged tiles (no bank conflicts)
// and write neighbouring vec4s of C. K advances in slices of BK staged k-major (As[k][m],
// Bs[k][n], rows padded by 4 floats so that the transposing stores of k-contiguous operands
// spread over banks) in two stages: the next slice's global loads go into the prefetch
// registers before the current slice's FMAs and into the other stage after them (one
// barrier per slice).
// Overrides: BM (multiple of TM), BN (multiple of TN), BK (multiple of 4; of FOLD for H16),
// WG = (BM/TM)*(BN/TN); at most 8 vec4 loads per invocation per operand and slice (LA, LB of
// the prefetch registers pa0..pa7, pb0..pb7 are live: constant branches once the pipeline
// is made).

override BM: u32 = 128u;
override BN: u32 = 128u;
override BK: u32 = 16u;
override WG: u32 = 256u;
override SA: u32 = (BM + 4u) / 4u;       // vec4s per k-row of As (padded by 4 floats)
override SB: u32 = (BN + 4u) / 4u;
override LA: u32 = (BM * BK / 4u + WG - 1u) / WG;   // vec4 loads of A per invocation, slice
override LB: u32 = (BN * BK / 4u + WG - 1u) / WG;

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

// Every kernel section declares the bindings, As, Bs, A_KMAJOR, B_KMAJOR, load_a4, load_b4.

// Global vec4 slot t of this invocation's share of the A slice starting at k0: the tile
// coordinates (k-major: [k][m4]; k-contiguous: [m][k4]) and bounds decide; zero outside.
// Staged as f16 (H16), A is clamped to f16's range first (no inf).
fn fetch_a(t: u32, lid: u32, m0: u32, k0: u32, k_end: u32) -> vec4<{{ELEM}}> {
    let i = lid + t * WG;
    if (i >= BM * BK / 4u) { return vec4<{{ELEM}}>(); }
    if (A_KMAJOR) {
        let k = k0 + i / (BM / 4u);
        let m = m0 + 4u * (i % (BM / 4u));
// @if H16
        if (k < k_end && m < p.m) { let row = k; let c4 = m / 4u; return vec4<f16>(clamp(load_a4(row, c4), vec4<f32>(-65504.0), vec4<f32>(65504.0))); }
// @else
        if (k < k_end && m < p.m) { let row = k; let c4 = m / 4u; return load_a4(row, c4); }
// @endif
    } else {
        let m = m0 + i / (BK / 4u);
        let k = k0 + 4u * (i % (BK / 4u));
// @if H16
        if (m < p.m && k < k_end) { let row = m; let c4 = k / 4u; return vec4<f16>(clamp(load_a4(row, c4), vec4<f32>(-65504.0), vec4<f32>(65504.0))); }
// @else
        if (m < p.m && k < k_end) { let row = m; let c4 = k / 4u; return load_a4(row, c4); }
// @endif
    }
    return vec4<{{ELEM}}>();
}

fn fetch_b(t: u32, lid: u32, n0: u32, k0: u32, k_end: u32) -> vec4<{{ELEM}}> {
    let i = lid + t * WG;
    if (i >= BN * BK / 4u) { return vec4<{{ELEM}}>(); }
    if (B_KMAJOR) {
        let k = k0 + i / (BN / 4u);
        let n = n0 + 4u * (i % (BN / 4u));
        if (k < k_end && n < p.n) { return load_b4(k, n / 4u); }
    } else {
        let n = n0 + i / (BK / 4u);
        let k = k0 + 4u * (i % (BK / 4u));
        if (n < p.n && k < k_end) { return load_b4(n, k / 4u); }
    }
    return vec4<{{ELEM}}>();
}

// Store slot t into stage `stage` (k-major rows of SA / SB vec4s). A k-contiguous vec4 holds
// 4 consecutive k of one row m: four scalar stores into 4 k-rows, all into component m % 4
// (a k-row is BM + 4 floats long, a multiple of 4).
fn stash_a(t: u32, lid: u32, stage: u32, v: vec4<{{ELEM}}>) {
    let i = lid + t * WG;
    if (i >= BM * BK / 4u) { return; }
    let base = stage * BK * SA;
    if (A_KMAJOR) {
        As[base + (i / (BM / 4u)) * SA + i % (BM / 4u)] = v;
    } else {
        let m = i / (BK / 4u);
        let row = base + 4u * (i % (BK / 4u)) * SA + m / 4u;
        let c = m % 4u;
        As[row][c] = v.x;
        As[row + SA][c] = v.y;
        As[row + 2u * SA][c] = v.z;
        As[row + 3u * SA][c] = v.w;
    }
}

fn stash_b(t: u32, lid: u32, stage: u32, v: vec4<{{ELEM}}>) {
    let i = lid + t * WG;
    if (i >= BN * BK / 4u) { return; }
    let base = stage * BK * SB;
    if (B_KMAJOR) {
        Bs[base + (i / (BN / 4u)) * SB + i % (BN / 4u)] = v;
    } else {
        let n = i / (BK / 4u);
        let row = base + 4u * (i % (BK / 4u)) * SB + n / 4u;
        let c = n % 4u;
        Bs[row][c] = v.x;
        Bs[row + SB][c] = v.y;
        Bs[row + 2u * SB][c] = v.z;
        Bs[row + 3u * SB][c] = v.w;
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

// One workgroup's BM x BN tile with TM x TN blocks per invocation. c[(4g + r) * TN/4 + q]:
// the accumulator of row 4 ty + r (+ BM/2 for g = 1) and columns 4 tx (+ BN/2 for q = 1).
fn tile_body(wg: vec3<u32>, lid: u32) {
    let tx = lid % (BN / {{TN}}u);
    let ty = lid / (BN / {{TN}}u);
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let k_begin = wg.z * p.k_split;
    let k_end = min(p.k, k_begin + p.k_split);
    let slices = (k_end - k_begin + BK - 1u) / BK;
    var c: array<vec4<f32>, {{TM}} * {{TN}} / 4u>;
    var pa: array<vec4<{{ELEM}}>, 8u>;
    var pb: array<vec4<{{ELEM}}>, 8u>;
    for (var t = 0u; t < 8u; t++) {   // @unroll
        if (LA > t) { pa[t] = fetch_a(t, lid, m0, k_begin, k_end); }
    }
    for (var t = 0u; t < 8u; t++) {   // @unroll
        if (LB > t) { pb[t] = fetch_b(t, lid, n0, k_begin, k_end); }
    }
    for (var t = 0u; t < 8u; t++) {   // @unroll
        if (LA > t) { stash_a(t, lid, 0u, pa[t]); }
    }
    for (var t = 0u; t < 8u; t++) {   // @unroll
        if (LB > t) { stash_b(t, lid, 0u, pb[t]); }
    }
    workgroupBarrier();

    for (var s = 0u; s < slices; s++) {
        let stage = s % 2u;
        // The next slice's loads land while the FMAs below run. On the last slice they
        // fetch zeros (bounds checks) into the stage nobody reads again: no branch, which
        // made BK 16 slices ~20% slower on the H200.
        {
            let k_next = k_begin + (s + 1u) * BK;
            for (var t = 0u; t < 8u; t++) {   // @unroll
                if (LA > t) { pa[t] = fetch_a(t, lid, m0, k_next, k_end); }
            }
            for (var t = 0u; t < 8u; t++) {   // @unroll
                if (LB > t) { pb[t] = fetch_b(t, lid, n0, k_next, k_end); }
            }
        }
        var ai = stage * BK * SA + ty;
        var bi = stage * BK * SB + tx;
// @if H16
        for (var k1 = 0u; k1 < BK; k1 += {{FOLD}}u) {
            // f16 partial sums of FOLD k-steps, written out
            var h: array<vec4<f16>, {{TM}} * {{TN}} / 4u>;
            for (var k = 0u; k < {{FOLD}}u; k++) {   // @unroll
                var a: array<vec4<f16>, {{TM}} / 4u>;   // @let
                var b: array<vec4<f16>, {{TN}} / 4u>;   // @let
                for (var g = 0u; g < {{TM}} / 4u; g++) {   // @unroll
                    a[g] = As[ai + k * SA + g * BM / {{TM}}u];
                }
                for (var q = 0u; q < {{TN}} / 4u; q++) {   // @unroll
                    b[q] = Bs[bi + k * SB + q * BN / {{TN}}u];
                }
                for (var g = 0u; g < {{TM}} / 4u; g++) {   // @unroll
                    for (var r = 0u; r < 4u; r++) {   // @unroll
                        for (var q = 0u; q < {{TN}} / 4u; q++) {   // @unroll
                            h[(g * 4u + r) * {{TN}} / 4u + q] = fma(vec4<f16>(a[g][r]), b[q], h[(g * 4u + r) * {{TN}} / 4u + q]);
                        }
                    }
                }
            }
            ai += {{FOLD}}u * SA;
            bi += {{FOLD}}u * SB;
            for (var i = 0u; i < {{TM}} * {{TN}} / 4u; i++) {   // @unroll
                c[i] += vec4<f32>(h[i]);
            }
        }
// @else
        for (var kk = 0u; kk < BK; kk++) {   // @unroll {{UNROLL_K}}
            var a: array<vec4<f32>, {{TM}} / 4u>;   // @let
            var b: array<vec4<f32>, {{TN}} / 4u>;   // @let
            for (var g = 0u; g < {{TM}} / 4u; g++) {   // @unroll
                a[g] = As[ai + g * BM / {{TM}}u];
            }
            for (var q = 0u; q < {{TN}} / 4u; q++) {   // @unroll
                b[q] = Bs[bi + q * BN / {{TN}}u];
            }
            for (var g = 0u; g < {{TM}} / 4u; g++) {   // @unroll
                for (var r = 0u; r < 4u; r++) {   // @unroll
                    for (var q = 0u; q < {{TN}} / 4u; q++) {   // @unroll
                        c[(g * 4u + r) * {{TN}} / 4u + q] = fma(vec4<f32>(a[g][r]), b[q], c[(g * 4u + r) * {{TN}} / 4u + q]);
                    }
                }
            }
            ai += SA;
            bi += SB;
        }
// @endif
        {   // the other stage was last read before the previous barrier
            for (var t = 0u; t < 8u; t++) {   // @unroll
                if (LA > t) { stash_a(t, lid, 1u - stage, pa[t]); }
            }
            for (var t = 0u; t < 8u; t++) {   // @unroll
                if (LB > t) { stash_b(t, lid, 1u - stage, pb[t]); }
            }
        }
        workgroupBarrier();
    }

    let row0 = m0 + 4u * ty;
    let col0 = n0 + 4u * tx;
    for (var g = 0u; g < {{TM}} / 4u; g++) {   // @unroll
        for (var r = 0u; r < 4u; r++) {   // @unroll
            for (var q = 0u; q < {{TN}} / 4u; q++) {   // @unroll
                store_c4(row0 + g * BM / 2u + r, col0 + q * BN / 2u, wg.z, c[(g * 4u + r) * {{TN}} / 4u + q]);
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
    tile_body(wg, lid);
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
    tile_body(wg, lid);
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
    tile_body(wg, lid);
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
    tile_body(wg, lid);
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
    tile_body(wg, lid);
}

// --- KERNEL: matmul_nt_h16_tiled ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: Params;
var<workgroup> As: array<vec4<f16>, 2u * BK * SA>;
var<workgroup> Bs: array<vec4<f16>, 2u * BK * SB>;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = false;   // B[N,K] in f16
fn load_a4(row: u32, c4: u32) -> vec4<f32> { return a_in[row * (p.lda / 4u) + c4]; }
fn load_b4(row: u32, c4: u32) -> vec4<f16> { return b_in[row * (p.ldb / 4u) + c4]; }

@compute @workgroup_size(WG)
fn matmul_nt_h16_tiled(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    tile_body(wg, lid);
}
