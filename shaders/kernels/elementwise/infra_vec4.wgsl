// infra_vec4.wgsl — the element-wise kernels of infra.wgsl over vec4s, four vec4s (16
// elements) per invocation: fewer invocations and index computations per byte moved, and
// 16-byte loads and stores (the fast path of ops.py when n % 4 == 0 and the
// views are 16-byte aligned).
//
//   fill_vec4          y[i] = value
//   scale_vec4         y[i] = alpha * x[i]
//   axpy_vec4          y[i] = alpha * x[i] + y[i]
//   copy_vec4x4        y[i] = x[i]
//   copy_heads_vec4    copy_heads of infra.wgsl over vec4s, one per invocation (its own
//                      HeadCopy uniform, counts and strides in vec4s)
//   copy_heads_vec4_f16  copy_heads_vec4 into an f16 y, converted as cast_f32_f16_vec4
//                      (needs shader-f16): the tensor-core attention loads f16 tiles of v,
//                      half the bytes of f32
//   cast_f32_f16_vec4  y[i] = f16(clamp(x[i], -65504, 65504)), rounded to nearest; NaN stays
//                      NaN (an overflow stays finite, not Inf) (needs shader-f16)
//   cast_f16_f32_vec4  y[i] = f32(x[i]) (needs shader-f16)
//
// Bindings (group 0): read-only inputs, then read_write outputs, then the uniform Params
// (that of infra.wgsl; n counts vec4s).
// Dispatch: ceil(n / (256 * VPT)) workgroups of 256 (folded into 2-D beyond 65,535);
// invocation lid of workgroup w handles vec4s w*256*VPT + lid + 256*k, k < VPT (coalesced).

const EW: u32 = 256u;
const VPT: u32 = 4u;

struct Params {
    n: u32,        // vec4 count
    cols: u32,
    alpha: f32,
    _pad: u32,
}

fn first_vec4(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return workgroup_index(wg, nwg) * EW * VPT + lid;
}

// The uniform of the copy_heads kernels
struct HeadCopy {
    n: u32,        // rows * width
    seq: u32,      // T
    heads: u32,
    width: u32,    // vec4s per head row
    x_token: u32,  // strides of x and y in vec4s
    x_head: u32,
    x_batch: u32,
    y_token: u32,
    y_head: u32,
    y_batch: u32,
    _pad0: u32,
    _pad1: u32,
}

// (x index, y index) of vec4 i < c.n of a copy_heads; i runs over (b, t, h, e) row-major
fn head_copy_at(c: HeadCopy, i: u32) -> vec2<u32> {
    let e = i % c.width;
    let row = i / c.width;
    let h = row % c.heads;
    let bt = row / c.heads;
    let t = bt % c.seq;
    let b = bt / c.seq;
    return vec2<u32>(b * c.x_batch + t * c.x_token + h * c.x_head + e,
                     b * c.y_batch + t * c.y_token + h * c.y_head + e);
}

// --- KERNEL: fill_vec4 ---
@group(0) @binding(0) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(256)
fn fill_vec4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let base = first_vec4(wg, nwg, lid);
    for (var k = 0u; k < VPT; k++) {
        let i = base + k * EW;
        if (i < p.n) { y[i] = vec4<f32>(p.alpha); }
    }
}

// --- KERNEL: scale_vec4 ---
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn scale_vec4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let base = first_vec4(wg, nwg, lid);
    for (var k = 0u; k < VPT; k++) {
        let i = base + k * EW;
        if (i < p.n) { y[i] = p.alpha * x[i]; }
    }
}

// --- KERNEL: axpy_vec4 ---
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn axpy_vec4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let base = first_vec4(wg, nwg, lid);
    for (var k = 0u; k < VPT; k++) {
        let i = base + k * EW;
        if (i < p.n) { y[i] = fma(vec4<f32>(p.alpha), x[i], y[i]); }
    }
}

// --- KERNEL: copy_vec4x4 ---
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn copy_vec4x4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let base = first_vec4(wg, nwg, lid);
    for (var k = 0u; k < VPT; k++) {
        let i = base + k * EW;
        if (i < p.n) { y[i] = x[i]; }
    }
}

// --- KERNEL: copy_heads_vec4 ---
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: HeadCopy;

@compute @workgroup_size(256)
fn copy_heads_vec4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let i = workgroup_index(wg, nwg) * 256u + lid;
    if (i >= p.n) { return; }
    let at = head_copy_at(p, i);
    y[at.y] = x[at.x];
}

// --- KERNEL: copy_heads_vec4_f16 ---
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f16>>;
@group(0) @binding(2) var<uniform> p: HeadCopy;

@compute @workgroup_size(256)
fn copy_heads_vec4_f16(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let i = workgroup_index(wg, nwg) * 256u + lid;
    if (i >= p.n) { return; }
    let at = head_copy_at(p, i);
    y[at.y] = vec4<f16>(f16_range(x[at.x]));
}

// --- KERNEL: cast_f32_f16_vec4 ---
@group(0) @binding(0) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f16>>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn cast_f32_f16_vec4(@builtin(workgroup_id) wg: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let base = first_vec4(wg, nwg, lid);
    for (var k = 0u; k < VPT; k++) {
        let i = base + k * EW;
        if (i < p.n) { y[i] = vec4<f16>(f16_range(x[i])); }
    }
}

// --- KERNEL: cast_f16_f32_vec4 ---
@group(0) @binding(0) var<storage, read> x: array<vec4<f16>>;
@group(0) @binding(1) var<storage, read_write> y: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(256)
fn cast_f16_f32_vec4(@builtin(workgroup_id) wg: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let base = first_vec4(wg, nwg, lid);
    for (var k = 0u; k < VPT; k++) {
        let i = base + k * EW;
        if (i < p.n) { y[i] = vec4<f32>(x[i]); }
    }
}
