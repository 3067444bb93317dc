// roofline.wgsl — register-only FMA loops that measure the device's arithmetic ceilings.
//
// Each invocation runs `iters` iterations of 8 independent FMA chains (enough instruction-
// level parallelism to hide FMA latency) on values that stay in registers, then writes one
// value so the compiler cannot drop the loop. FLOPs = invocations * iters * 8 * 2 * width.
//
//   fma_f32       scalar f32
//   fma_vec4f32   vec4<f32>
//   fma_vec2f16   vec2<f16> (packed half math; needs shader-f16)
//   fma_vec4f16   vec4<f16> (needs shader-f16)
//
// Bindings: 0 out (read_write, one f32 per invocation), 1 uniform Params.
// Dispatch: 256 invocations per workgroup, any number of workgroups.
//
//   fma_vec4f32_chains4, fma_vec4f16_chains4: four independent vec4 chains with constant
//   operands and the trip count an override constant (ITERS), the form that reached the
//   H200's fp32 peak under Dawn (63.8 of ~67 TFLOP/s; the loops above: ~30, below what the
//   matmuls reach). FLOPs = invocations * ITERS * 4 * 2 * 4. Binding: 0 out only.

struct Params {
    iters: u32,
    seed: f32,
    _pad0: u32,
    _pad1: u32,
}

// --- KERNEL: fma_f32 ---
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(256)
fn fma_f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    let b = p.seed * 1e-7;
    var a0 = f32(t) * 1e-9; var a1 = a0 + 1.0; var a2 = a0 + 2.0; var a3 = a0 + 3.0;
    var a4 = a0 + 4.0; var a5 = a0 + 5.0; var a6 = a0 + 6.0; var a7 = a0 + 7.0;
    let m = 0.999999;
    for (var i = 0u; i < p.iters; i++) {
        a0 = fma(a0, m, b); a1 = fma(a1, m, b); a2 = fma(a2, m, b); a3 = fma(a3, m, b);
        a4 = fma(a4, m, b); a5 = fma(a5, m, b); a6 = fma(a6, m, b); a7 = fma(a7, m, b);
    }
    out[t] = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

// --- KERNEL: fma_vec4f32 ---
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(256)
fn fma_vec4f32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    let b = vec4<f32>(p.seed * 1e-7);
    let m = vec4<f32>(0.999999);
    var a0 = vec4<f32>(f32(t) * 1e-9, 1.0, 2.0, 3.0);
    var a1 = a0 + 1.0; var a2 = a0 + 2.0; var a3 = a0 + 3.0;
    var a4 = a0 + 4.0; var a5 = a0 + 5.0; var a6 = a0 + 6.0; var a7 = a0 + 7.0;
    for (var i = 0u; i < p.iters; i++) {
        a0 = fma(a0, m, b); a1 = fma(a1, m, b); a2 = fma(a2, m, b); a3 = fma(a3, m, b);
        a4 = fma(a4, m, b); a5 = fma(a5, m, b); a6 = fma(a6, m, b); a7 = fma(a7, m, b);
    }
    let s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
    out[t] = s.x + s.y + s.z + s.w;
}

// --- KERNEL: fma_vec2f16 ---
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(256)
fn fma_vec2f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    let b = vec2<f16>(f16(p.seed * 1e-4));
    let m = vec2<f16>(0.999h);
    var a0 = vec2<f16>(f16(t & 7u) * 0.01h, 1.0h);
    var a1 = a0 + 1.0h; var a2 = a0 + 2.0h; var a3 = a0 + 3.0h;
    var a4 = a0 + 4.0h; var a5 = a0 + 5.0h; var a6 = a0 + 6.0h; var a7 = a0 + 7.0h;
    for (var i = 0u; i < p.iters; i++) {
        a0 = fma(a0, m, b); a1 = fma(a1, m, b); a2 = fma(a2, m, b); a3 = fma(a3, m, b);
        a4 = fma(a4, m, b); a5 = fma(a5, m, b); a6 = fma(a6, m, b); a7 = fma(a7, m, b);
    }
    let s = vec2<f32>(a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7);
    out[t] = s.x + s.y;
}

// --- KERNEL: fma_vec4f16 ---
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;

@compute @workgroup_size(256)
fn fma_vec4f16(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    let b = vec4<f16>(f16(p.seed * 1e-4));
    let m = vec4<f16>(0.999h);
    var a0 = vec4<f16>(f16(t & 7u) * 0.01h, 1.0h, 2.0h, 3.0h);
    var a1 = a0 + 1.0h; var a2 = a0 + 2.0h; var a3 = a0 + 3.0h;
    var a4 = a0 + 4.0h; var a5 = a0 + 5.0h; var a6 = a0 + 6.0h; var a7 = a0 + 7.0h;
    for (var i = 0u; i < p.iters; i++) {
        a0 = fma(a0, m, b); a1 = fma(a1, m, b); a2 = fma(a2, m, b); a3 = fma(a3, m, b);
        a4 = fma(a4, m, b); a5 = fma(a5, m, b); a6 = fma(a6, m, b); a7 = fma(a7, m, b);
    }
    let s = vec4<f32>(a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7);
    out[t] = s.x + s.y + s.z + s.w;
}

// --- KERNEL: fma_vec4f32_chains4 ---
override ITERS: u32 = 4096u;
@group(0) @binding(0) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn fma_vec4f32_chains4(@builtin(global_invocation_id) gid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    var a = vec4<f32>(f32(t) * 1e-9, 1.0, 2.0, 3.0);
    var b = a + 1.0; var c = a + 2.0; var d = a + 3.0;
    let m = vec4<f32>(0.999);
    let k = vec4<f32>(0.001);
    for (var i = 0u; i < ITERS; i++) {
        a = fma(a, m, k); b = fma(b, m, k); c = fma(c, m, k); d = fma(d, m, k);
    }
    let s = a + b + c + d;
    out[t] = s.x + s.y + s.z + s.w;
}

// --- KERNEL: fma_vec4f16_chains4 ---
override ITERS: u32 = 4096u;
@group(0) @binding(0) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn fma_vec4f16_chains4(@builtin(global_invocation_id) gid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = gid.x + gid.y * nwg.x * 256u;
    var a = vec4<f16>(f16(t & 7u) * 0.01h, 1.0h, 2.0h, 3.0h);
    var b = a + 1.0h; var c = a + 2.0h; var d = a + 3.0h;
    let m = vec4<f16>(0.999h);
    let k = vec4<f16>(0.001h);
    for (var i = 0u; i < ITERS; i++) {
        a = fma(a, m, k); b = fma(b, m, k); c = fma(c, m, k); d = fma(d, m, k);
    }
    let s = vec4<f32>(a + b + c + d);
    out[t] = s.x + s.y + s.z + s.w;
}
