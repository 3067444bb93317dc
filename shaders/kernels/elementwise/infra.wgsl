// infra.wgsl — element-wise infrastructure kernels over f32 (and f16) arrays.
//
//   fill            y[i] = value
//   scale           y[i] = alpha * x[i]
//   axpy            y[i] = alpha * x[i] + y[i]
//   copy            y[i] = x[i]
//   copy_vec4       y[i] = x[i] over vec4<f32> (the copy-bandwidth probe of the roofline)
//   copy_rows       y[r * y_stride + e] = x[r * x_stride + e], r < rows, e < width: one
//                   strided part of a tensor into another (own RowCopy uniform)
//   copy_heads      y = x for [B, T, heads, D] tensors laid out by (token, head, batch)
//                   strides each, e.g. head-major [B, H, T, D] from a fused qkv part (own
//                   HeadCopy uniform)
//   cast_f32_f16    y[i] = f16(clamp(x[i], -65504, 65504)); NaN stays NaN
//   cast_f16_f32    y[i] = f32(x[i])
//   reduce_rows     per row of `cols` values: out[2r] = sum, out[2r+1] = max
//                   (two reductions back to back through the preamble's wg_sum/wg_max)
//
// Bindings (group 0): read-only inputs, then read_write outputs, then the uniform Params.
// Dispatch: element-wise kernels use 256 invocations per workgroup, one element each, over
// ceil(n / 256) workgroups (the engine folds grids above 65,535 into 2-D);
// reduce_rows runs one workgroup of WG invocations per row.

const EW: u32 = 256u;

struct Params {
    n: u32,        // element count (for copy_vec4: count of vec4s)
    cols: u32,     // reduce_rows: row length
    alpha: f32,    // scale, axpy, fill's value
    _pad: u32,
}

fn element_index(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return workgroup_index(wg, nwg) * EW + lid;
}

// --- KERNEL: fill ---
@group(0) @binding(0) var<storage, read_write> y: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(256)
fn fill(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < p.n) { y[i] = p.alpha; }
}

// --- KERNEL: scale ---
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < p.n) { y[i] = p.alpha * x[i]; }
}

// --- KERNEL: axpy ---
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn axpy(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < p.n) { y[i] = fma(p.alpha, x[i], y[i]); }
}

// --- KERNEL: copy ---
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn copy(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < p.n) { y[i] = x[i]; }
}

// --- KERNEL: copy_vec4 ---
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn copy_vec4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < p.n) { y[i] = x[i]; }
}

// --- KERNEL: copy_rows ---
struct RowCopy {
    rows: u32,
    width: u32,
    x_stride: u32,
    y_stride: u32,
}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: RowCopy;

@compute @workgroup_size(256)
fn copy_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i >= p.rows * p.width) { return; }
    let r = i / p.width;
    let e = i % p.width;
    y[r * p.y_stride + e] = x[r * p.x_stride + e];
}

// --- KERNEL: copy_heads ---
struct HeadCopy {
    n: u32,        // rows * width
    seq: u32,      // T
    heads: u32,
    width: u32,    // elements per head row
    x_token: u32,  // strides of x and y in elements
    x_head: u32,
    x_batch: u32,
    y_token: u32,
    y_head: u32,
    y_batch: u32,
    _pad0: u32,
    _pad1: u32,
}
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: HeadCopy;

@compute @workgroup_size(256)
fn copy_heads(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = workgroup_index(wg, nwg) * 256u + lid;
    if (i >= p.n) { return; }
    let e = i % p.width;
    let row = i / p.width;          // (b, t, h) row-major
    let h = row % p.heads;
    let bt = row / p.heads;
    let t = bt % p.seq;
    let b = bt / p.seq;
    y[b * p.y_batch + t * p.y_token + h * p.y_head + e] =
        x[b * p.x_batch + t * p.x_token + h * p.x_head + e];
}

// --- KERNEL: cast_f32_f16 ---
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f16>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn cast_f32_f16(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < p.n) {
        // clamp keeps overflow finite (f16 max is 65504). NaN is tested on the bits: drivers
        // may compile `v != v` as an ordered compare (false for NaN) and clamp(NaN) is undefined.
        let v = x[i];
        if ((bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u) {
            y[i] = f16(v);   // converting NaN gives NaN (OpFConvert)
        } else {
            y[i] = f16(clamp(v, -65504.0, 65504.0));
        }
    }
}

// --- KERNEL: cast_f16_f32 ---
@group(0) @binding(0) var<storage, read> x: array<f16>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn cast_f16_f32(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = element_index(wg, nwg, lid);
    if (i < p.n) { y[i] = f32(x[i]); }
}

// --- KERNEL: reduce_rows ---
override WG: u32 = 256u;
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn reduce_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
               @builtin(subgroup_size) sg_size: u32, @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
    let row = workgroup_index(wg, nwg);
    let rows = p.n;
    // no early return: every invocation must reach the reductions (uniform control flow)
    let live = row < rows;
    var s = 0.0;
    var m = -3.402823466e+38;
    if (live) {
        for (var c = lid; c < p.cols; c += WG) {
            let v = x[row * p.cols + c];
            s += v;
            m = max(m, v);
        }
    }
    let total = wg_sum(s, sg);
    let biggest = wg_max(m, sg);   // back to back with the sum: must not race on the slots
    if (live && lid == 0u) {
        y[2u * row] = total;
        y[2u * row + 1u] = biggest;
    }
}
