// 02_rmsnorm_forward.wgsl — RMSNorm forward over rows viewed as vec4s (n % 4 == 0), y in
// f32 or f16; the bodies live once in this header, each kernel only binds y and stores it.
//
//   rmsnorm_forward_vec4       one row per workgroup (any n % 4 == 0)
//                              rstd[r] = 1 / sqrt(mean_j x[r,j]^2 + eps)
//                              y[r,j]  = x[r,j] * rstd[r] * w[j]
//   rmsnorm_forward_rows       the same, 4 rows per workgroup, each row read once (ops.py's
//                              fast path: n <= 4 * WG * MAX_C)
//   rmsnorm_forward_vec4_f16,  the two with y f16: the tensor-core matmuls read the norm's
//   rmsnorm_forward_rows_f16   output as f16 (they round an f32 A to f16 when staging anyway),
//                              so an f16 y gives them the same values at half the bytes.
//                              Computed in f32, clamped to +-65504 (as cast_f32_f16: overflow
//                              stays finite) and rounded to nearest once at the store (the
//                              preamble's f16_bits); NaN stays NaN. rstd stays f32.
//
// The scalar kernel (any n) is rmsnorm_forward in 02_rmsnorm.wgsl.
// Layouts: x f32[rows, n] contiguous, read as vec4; y f32[rows, n] or f16 (array<vec2<u32>>:
// the four halves of a vec4 as pack2x16float bits, one 8-byte store); w f32[n]; rstd f32[rows].
// Bindings (group 0): 0 x, 1 w, 2 y (rw), 3 rstd (rw), 4 Params.
// Dispatch: _vec4 one workgroup of WG per row, _rows one per 4 rows (grids folded into 2-D
// beyond 65,535). In _rows, invocation lid owns the vec4 columns lid, lid + WG, ...
// (C = ceil(n / 4 / WG) of them).

override WG: u32 = 64u;
override C: u32 = 1u;            // _rows: vec4 columns per invocation
const MAX_C: u32 = 4u;

struct Params {
    rows: u32,
    n4: u32,     // row length in vec4s
    n: u32,      // row length in floats
    mode: u32,
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// One row per workgroup; put_y(at, v) is the kernel's store of y's vec4 at.
fn forward_row(wg: vec3<u32>, nwg: vec3<u32>, lid: u32, sg: Subgroup) {
    let row = workgroup_index(wg, nwg);
    let live = row < p.rows;
    let base = row * p.n4;
    var ss = 0.0;
    if (live) {
        for (var j = lid; j < p.n4; j += WG) {
            let v = x_in[base + j];
            let s = v * v;
            ss += s.x + s.y + s.z + s.w;
        }
    }
    let rstd = inverseSqrt(wg_sum(ss, sg) / f32(p.n) + p.eps);
    if (live) {
        for (var j = lid; j < p.n4; j += WG) { put_y(base + j, x_in[base + j] * rstd * weight[j]); }
        if (lid == 0u) { rstd_out[row] = rstd; }
    }
}

// Four rows per workgroup, each element read once into registers.
fn forward_rows(wg: vec3<u32>, nwg: vec3<u32>, lid: u32, sg: Subgroup) {
    let r0 = workgroup_index(wg, nwg) * 4u;
    var xs: array<vec4<f32>, 4u * MAX_C>;     // [row i][column slot c]
    var ss = vec4<f32>();
    for (var c = 0u; c < C; c++) {
        let j = lid + c * WG;
        for (var i = 0u; i < 4u; i++) {
            if (j < p.n4 && r0 + i < p.rows) {
                let v = x_in[(r0 + i) * p.n4 + j];
                xs[i * MAX_C + c] = v;
                ss[i] += dot(v, v);
            }
        }
    }
    let rstd = inverseSqrt(wg_sum4(ss, sg) / f32(p.n) + p.eps);
    for (var c = 0u; c < C; c++) {
        let j = lid + c * WG;
        if (j < p.n4) {
            let w = weight[j];
            for (var i = 0u; i < 4u; i++) {
                if (r0 + i < p.rows) { put_y((r0 + i) * p.n4 + j, xs[i * MAX_C + c] * rstd[i] * w); }
            }
        }
    }
    if (lid < 4u && r0 + lid < p.rows) { rstd_out[r0 + lid] = rstd[lid]; }
}

// --- KERNEL: rmsnorm_forward_vec4 ---
@group(0) @binding(0) var<storage, read> x_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> weight: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y_out: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> rstd_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
fn put_y(at: u32, v: vec4<f32>) { y_out[at] = v; }

@compute @workgroup_size(WG)
fn rmsnorm_forward_vec4(@builtin(workgroup_id) wg: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32,
                        @builtin(subgroup_id) sg_id: u32,
                        @builtin(subgroup_invocation_id) lane: u32,
                        @builtin(subgroup_size) sg_size: u32,
                        @builtin(num_subgroups) num_sg: u32) {
    forward_row(wg, nwg, lid, Subgroup(sg_id, lane, sg_size, num_sg));
}

// --- KERNEL: rmsnorm_forward_vec4_f16 ---
@group(0) @binding(0) var<storage, read> x_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> weight: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y_out: array<vec2<u32>>;   // f16[rows, n]
@group(0) @binding(3) var<storage, read_write> rstd_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
fn put_y(at: u32, v: vec4<f32>) { y_out[at] = f16_bits(v); }

@compute @workgroup_size(WG)
fn rmsnorm_forward_vec4_f16(@builtin(workgroup_id) wg: vec3<u32>,
                            @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) lid: u32,
                            @builtin(subgroup_id) sg_id: u32,
                            @builtin(subgroup_invocation_id) lane: u32,
                            @builtin(subgroup_size) sg_size: u32,
                            @builtin(num_subgroups) num_sg: u32) {
    forward_row(wg, nwg, lid, Subgroup(sg_id, lane, sg_size, num_sg));
}

// --- KERNEL: rmsnorm_forward_rows ---
@group(0) @binding(0) var<storage, read> x_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> weight: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y_out: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> rstd_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
fn put_y(at: u32, v: vec4<f32>) { y_out[at] = v; }

@compute @workgroup_size(WG)
fn rmsnorm_forward_rows(@builtin(workgroup_id) wg: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32,
                        @builtin(subgroup_id) sg_id: u32,
                        @builtin(subgroup_invocation_id) lane: u32,
                        @builtin(subgroup_size) sg_size: u32,
                        @builtin(num_subgroups) num_sg: u32) {
    forward_rows(wg, nwg, lid, Subgroup(sg_id, lane, sg_size, num_sg));
}

// --- KERNEL: rmsnorm_forward_rows_f16 ---
@group(0) @binding(0) var<storage, read> x_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> weight: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y_out: array<vec2<u32>>;   // f16[rows, n]
@group(0) @binding(3) var<storage, read_write> rstd_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;
fn put_y(at: u32, v: vec4<f32>) { y_out[at] = f16_bits(v); }

@compute @workgroup_size(WG)
fn rmsnorm_forward_rows_f16(@builtin(workgroup_id) wg: vec3<u32>,
                            @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) lid: u32,
                            @builtin(subgroup_id) sg_id: u32,
                            @builtin(subgroup_invocation_id) lane: u32,
                            @builtin(subgroup_size) sg_size: u32,
                            @builtin(num_subgroups) num_sg: u32) {
    forward_rows(wg, nwg, lid, Subgroup(sg_id, lane, sg_size, num_sg));
}
