// 03_linear_splitk.wgsl — the reduction step of split-K matmuls (03_linear_tiled.wgsl).
//
//   matmul_splitk_reduce  C = epilogue(alpha * sum_s P[s]) over `splits` partial products
//                         P[s] = [M, N] (leading dimension N) stored `stride` elements apart,
//                         summed in split order (deterministic); epilogue `mode` as in the
//                         matmuls: 0 store, 1 accumulate, 2 residual (R laid out like C).
//
// Needs N, ldc and stride to be multiples of 4 (vec4 access) and 16-byte aligned operands.
// Bindings (group 0): 0 partials (read), 1 R (read; a dummy unless mode 2), 2 C (read_write),
// 3 Params (uniform).
// Dispatch: ceil(M * N / 4 / 256) workgroups of 256 (folded into 2-D beyond 65,535).

struct Params {
    m: u32,
    n: u32,
    splits: u32,
    mode: u32,
    alpha: f32,
    ldc: u32,
    stride: u32,   // elements between consecutive partials
    _pad: u32,
}

// --- KERNEL: matmul_splitk_reduce ---
@group(0) @binding(0) var<storage, read> partials: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> c_out: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn matmul_splitk_reduce(@builtin(workgroup_id) wg: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let i = workgroup_index(wg, nwg) * 256u + lid;    // vec4 index into [M, N/4]
    let n4 = p.n / 4u;
    if (i >= p.m * n4) { return; }
    let row = i / n4;
    let c4 = i % n4;
    var sum = vec4<f32>();
    for (var s = 0u; s < p.splits; s++) { sum += partials[s * (p.stride / 4u) + i]; }
    let o = row * (p.ldc / 4u) + c4;
    let scaled = p.alpha * sum;
    if (p.mode == 1u) {
        c_out[o] = c_out[o] + scaled;
    } else if (p.mode == 2u) {
        c_out[o] = residual[o] + scaled;
    } else {
        c_out[o] = scaled;
    }
}
