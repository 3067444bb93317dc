// 03_linear_h16.wgsl — forward matmul with packed-f16 multiplies (needs shader-f16).
//
//   matmul_nt_h16   C[M,N] = alpha * A[M,K] @ B[N,K]^T, A f32 (rounded to f16, clamped to
//                   +-65504), B f16 (the f16 weight mirror); products and partial sums of one
//                   K-slice (BK terms) in vec4<f16>, then added into f32 accumulators.
//
// Accuracy: f16 rounding of both operands plus BK-term f16 partial sums: ~75 dB PSNR against
// the exact product (measured on lavapipe, unit-normal x, 0.02-scale W, K = 45..3072). For the
// forward pass of mixed precision, never for gradients, whose magnitudes can fall below
// f16's range. |A| above 65504 is clamped.
// Layout, epilogue modes, bindings and dispatch are those of 03_linear.wgsl:
// Bindings (group 0): 0 A f32 (read), 1 B f16 (read), 2 R f32 (read; dummy unless mode 2),
// 3 C f32 (read_write), 4 Params (uniform).
// Dispatch: (ceil(N / BN), ceil(M / BM), 1) workgroups of WG = (BM/8)*(BN/8) invocations.

override BM: u32 = 64u;
override BN: u32 = 64u;
override BK: u32 = 16u;
override WG: u32 = 64u;

struct Params {
    m: u32,
    n: u32,
    k: u32,
    mode: u32,
    alpha: f32,
    lda: u32,
    ldb: u32,
    ldc: u32,
}

// --- KERNEL: matmul_nt_h16 ---
@group(0) @binding(0) var<storage, read> a_in: array<f32>;
@group(0) @binding(1) var<storage, read> b_in: array<f16>;
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> As: array<vec4<f16>, BK * BM / 4u>;
var<workgroup> Bs: array<vec4<f16>, BK * BN / 4u>;

fn stage_tiles(lid: u32, m0: u32, n0: u32, k0: u32) {
    // Both operands are k-contiguous: consecutive invocations walk k.
    for (var i = lid; i < BM * BK; i += WG) {
        let kk = i % BK;
        let mm = i / BK;
        var v = 0.0;
        if (m0 + mm < p.m && k0 + kk < p.k) { v = a_in[(m0 + mm) * p.lda + k0 + kk]; }
        As[kk * (BM / 4u) + mm / 4u][mm % 4u] = f16(clamp(v, -65504.0, 65504.0));
    }
    for (var i = lid; i < BN * BK; i += WG) {
        let kk = i % BK;
        let nn = i / BK;
        var v = 0.0h;
        if (n0 + nn < p.n && k0 + kk < p.k) { v = b_in[(n0 + nn) * p.ldb + k0 + kk]; }
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

@compute @workgroup_size(WG)
fn matmul_nt_h16(@builtin(workgroup_id) wg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let tx = lid % (BN / 8u);
    let ty = lid / (BN / 8u);
    var acc: array<vec4<f32>, 16>;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        stage_tiles(lid, m0, n0, k0);
        workgroupBarrier();
        // explicit zeroing: naga initialises a `var` declared in a loop only once
        var part = array<vec4<f16>, 16>();
        for (var kk = 0u; kk < BK; kk++) {
            let a_lo = As[kk * (BM / 4u) + ty];
            let a_hi = As[kk * (BM / 4u) + BM / 8u + ty];
            let b_lo = Bs[kk * (BN / 4u) + tx];
            let b_hi = Bs[kk * (BN / 4u) + BN / 8u + tx];
            for (var i = 0u; i < 4u; i++) {
                part[2u * i] = fma(vec4<f16>(a_lo[i]), b_lo, part[2u * i]);
                part[2u * i + 1u] = fma(vec4<f16>(a_lo[i]), b_hi, part[2u * i + 1u]);
                part[8u + 2u * i] = fma(vec4<f16>(a_hi[i]), b_lo, part[8u + 2u * i]);
                part[9u + 2u * i] = fma(vec4<f16>(a_hi[i]), b_hi, part[9u + 2u * i]);
            }
        }
        for (var j = 0u; j < 16u; j++) {
            acc[j] += vec4<f32>(part[j]);
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
