// 03_linear_tiled_h16.wgsl — register-tiled forward matmul with packed-f16 multiplies
// (needs shader-f16): the mixed-precision Linear forward.
//
//   matmul_nt_h16_tiled   C[M,N] = alpha * A[M,K] @ B[N,K]^T, A f32 (rounded to f16 when
//                         staged, clamped to +-65504), B f16 (the weight mirror); the
//                         products of FOLD consecutive k are summed in vec4<f16> registers,
//                         then added into f32 accumulators.
//
// Accuracy: f16 rounding of both operands (relative 2^-11 each) plus FOLD-term f16 partial
// sums; the f32 accumulators carry the rest of K. Measured on lavapipe against the float64
// product of the unrounded operands: see shaders/cases/linear.py (ladder case
// matmul_nt_h16_tiled, "f16" thresholds: PSNR >= 50 dB; FOLD = 16 gives ~65-70 dB with
// unit-normal x and 0.02-scale weights). Forward activations only, never gradients (their
// magnitudes fall below f16's range).
//
// Layout, epilogue modes, split-K, bindings and dispatch are those of 03_linear_tiled.wgsl:
// Bindings (group 0): 0 A (read, vec4<f32>), 1 B (read, vec4<f16>), 2 R (read, vec4<f32>;
// dummy unless mode 2), 3 C (read_write, vec4<f32>), 4 Params (uniform).
// Dispatch: (ceil(N / BN), ceil(M / BM), splits) workgroups of WG = (BM/TM)*(BN/TN).
// Overrides: as 03_linear_tiled.wgsl plus FOLD (k-steps per f16 partial sum; divides BK).

override BM: u32 = 128u;
override BN: u32 = 128u;
override BK: u32 = 32u;
override TM: u32 = 8u;
override TN: u32 = 8u;
override WG: u32 = 256u;
override FOLD: u32 = 16u;

override TX: u32 = BN / TN;
override TY: u32 = BM / TM;
override GM: u32 = TM / 4u;
override GN: u32 = TN / 4u;
override SA: u32 = (BM + 4u) / 4u;
override SB: u32 = (BN + 4u) / 4u;
override LA: u32 = (BM * BK / 4u + WG - 1u) / WG;
override LB: u32 = (BN * BK / 4u + WG - 1u) / WG;

const MAX_G: u32 = 2u;
const MAX_ACC: u32 = 16u;
const MAX_LOADS: u32 = 8u;

struct Params {
    m: u32,
    n: u32,
    k: u32,
    mode: u32,
    alpha: f32,
    lda: u32,
    ldb: u32,
    ldc: u32,
    k_split: u32,
    c_split: u32,
    _pad0: u32,
    _pad1: u32,
}

// --- KERNEL: matmul_nt_h16_tiled ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> As: array<vec4<f16>, 2u * BK * SA>;
var<workgroup> Bs: array<vec4<f16>, 2u * BK * SB>;

// A[M,K] and B[N,K] are both k-contiguous: slot i of the slice is row i / (BK/4), k-vec4
// i % (BK/4); stored transposed (k-major) into the stage.
fn fetch_a(t: u32, lid: u32, m0: u32, k0: u32, k_end: u32) -> vec4<f16> {
    let i = lid + t * WG;
    let m = m0 + i / (BK / 4u);
    let k = k0 + 4u * (i % (BK / 4u));
    if (i < BM * BK / 4u && m < p.m && k < k_end) {
        let v = a_in[m * (p.lda / 4u) + k / 4u];
        return vec4<f16>(clamp(v, vec4<f32>(-65504.0), vec4<f32>(65504.0)));
    }
    return vec4<f16>();
}

fn fetch_b(t: u32, lid: u32, n0: u32, k0: u32, k_end: u32) -> vec4<f16> {
    let i = lid + t * WG;
    let n = n0 + i / (BK / 4u);
    let k = k0 + 4u * (i % (BK / 4u));
    if (i < BN * BK / 4u && n < p.n && k < k_end) { return b_in[n * (p.ldb / 4u) + k / 4u]; }
    return vec4<f16>();
}

fn stash_a(t: u32, lid: u32, stage: u32, v: vec4<f16>) {
    let i = lid + t * WG;
    if (i >= BM * BK / 4u) { return; }
    let base = stage * BK * SA;
    let m = i / (BK / 4u);
    let k = 4u * (i % (BK / 4u));
    for (var j = 0u; j < 4u; j++) {
        let e = (k + j) * (BM + 4u) + m;
        As[base + e / 4u][e % 4u] = v[j];
    }
}

fn stash_b(t: u32, lid: u32, stage: u32, v: vec4<f16>) {
    let i = lid + t * WG;
    if (i >= BN * BK / 4u) { return; }
    let base = stage * BK * SB;
    let n = i / (BK / 4u);
    let k = 4u * (i % (BK / 4u));
    for (var j = 0u; j < 4u; j++) {
        let e = (k + j) * (BN + 4u) + n;
        Bs[base + e / 4u][e % 4u] = v[j];
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

@compute @workgroup_size(WG)
fn matmul_nt_h16_tiled(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let tx = lid % TX;
    let ty = lid / TX;
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let k_begin = wg.z * p.k_split;
    let k_end = min(p.k, k_begin + p.k_split);
    let slices = (k_end - k_begin + BK - 1u) / BK;

    var acc: array<vec4<f32>, MAX_ACC>;
    var pa: array<vec4<f16>, MAX_LOADS>;
    var pb: array<vec4<f16>, MAX_LOADS>;
    for (var t = 0u; t < LA; t++) { pa[t] = fetch_a(t, lid, m0, k_begin, k_end); }
    for (var t = 0u; t < LB; t++) { pb[t] = fetch_b(t, lid, n0, k_begin, k_end); }
    for (var t = 0u; t < LA; t++) { stash_a(t, lid, 0u, pa[t]); }
    for (var t = 0u; t < LB; t++) { stash_b(t, lid, 0u, pb[t]); }
    workgroupBarrier();

    for (var s = 0u; s < slices; s++) {
        let stage = s % 2u;
        let more = s + 1u < slices;
        if (more) {
            let k_next = k_begin + (s + 1u) * BK;
            for (var t = 0u; t < LA; t++) { pa[t] = fetch_a(t, lid, m0, k_next, k_end); }
            for (var t = 0u; t < LB; t++) { pb[t] = fetch_b(t, lid, n0, k_next, k_end); }
        }
        let a_base = stage * BK * SA + ty;
        let b_base = stage * BK * SB + tx;
        for (var k1 = 0u; k1 < BK; k1 += FOLD) {
            // explicit zeroing: naga initialises a `var` declared in a loop only once
            var part = array<vec4<f16>, MAX_ACC>();
            for (var kk = k1; kk < k1 + FOLD; kk++) {
                var a: array<vec4<f16>, MAX_G>;
                var b: array<vec4<f16>, MAX_G>;
                for (var g = 0u; g < GM; g++) { a[g] = As[a_base + kk * SA + g * TY]; }
                for (var h = 0u; h < GN; h++) { b[h] = Bs[b_base + kk * SB + h * TX]; }
                for (var g = 0u; g < GM; g++) {
                    for (var r = 0u; r < 4u; r++) {
                        let av = vec4<f16>(a[g][r]);
                        for (var h = 0u; h < GN; h++) {
                            let i = (g * 4u + r) * GN + h;
                            part[i] = fma(av, b[h], part[i]);
                        }
                    }
                }
            }
            for (var i = 0u; i < GM * 4u * GN; i++) { acc[i] += vec4<f32>(part[i]); }
        }
        if (more) {
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
