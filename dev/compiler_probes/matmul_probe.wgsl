// matmul_probe.wgsl — why do the tiled matmuls plateau at ~2 TFLOP/s on the H200?
// Three kernels run the same arithmetic: per k step, 2 vec4 of A and 2 vec4 of B from
// workgroup memory, an 8x8 block of FMAs (16 vec4 FMAs) into registers.
//   probe_loops     accumulators in array<vec4<f32>, 16>, loops over g, r, h (as the product)
//   probe_unrolled  16 named vec4 accumulators, every FMA written out
//   probe_regs      probe_unrolled with operands from registers (upper bound, no LDS)
// Bindings: 0 out (read_write f32 per invocation), 1 uniform {iters}.
// Dispatch: 256 invocations per workgroup, any number of workgroups.
struct Params { iters: u32, _a: u32, _b: u32, _c: u32 }
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<uniform> p: Params;
var<workgroup> As: array<vec4<f32>, 16u * 33u>;
var<workgroup> Bs: array<vec4<f32>, 16u * 33u>;

fn fill_tiles(lid: u32) {
    for (var i = lid; i < 16u * 33u; i += 256u) {
        As[i] = vec4<f32>(f32(i) * 1e-3, 0.5, 0.25, 0.125);
        Bs[i] = vec4<f32>(0.999, 1e-4, f32(i) * 1e-4, 0.5);
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn probe_loops(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    fill_tiles(lid);
    let tx = lid % 16u;
    let ty = lid / 16u;
    var acc: array<vec4<f32>, 16>;
    for (var it = 0u; it < p.iters; it++) {
        let kk = it % 16u;
        var a: array<vec4<f32>, 2>;
        var b: array<vec4<f32>, 2>;
        for (var g = 0u; g < 2u; g++) { a[g] = As[kk * 33u + ty + g * 16u]; }
        for (var h = 0u; h < 2u; h++) { b[h] = Bs[kk * 33u + tx + h * 16u]; }
        for (var g = 0u; g < 2u; g++) {
            for (var r = 0u; r < 4u; r++) {
                let av = vec4<f32>(a[g][r]);
                for (var h = 0u; h < 2u; h++) {
                    let i = (g * 4u + r) * 2u + h;
                    acc[i] = fma(av, b[h], acc[i]);
                }
            }
        }
    }
    var s = vec4<f32>();
    for (var i = 0u; i < 16u; i++) { s += acc[i]; }
    out[gid.x] = s.x + s.y + s.z + s.w;
}

@compute @workgroup_size(256)
fn probe_unrolled(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    fill_tiles(lid);
    let tx = lid % 16u;
    let ty = lid / 16u;
    var c0 = vec4<f32>();
    var c1 = vec4<f32>();
    var c2 = vec4<f32>();
    var c3 = vec4<f32>();
    var c4 = vec4<f32>();
    var c5 = vec4<f32>();
    var c6 = vec4<f32>();
    var c7 = vec4<f32>();
    var c8 = vec4<f32>();
    var c9 = vec4<f32>();
    var c10 = vec4<f32>();
    var c11 = vec4<f32>();
    var c12 = vec4<f32>();
    var c13 = vec4<f32>();
    var c14 = vec4<f32>();
    var c15 = vec4<f32>();
    for (var it = 0u; it < p.iters; it++) {
        let kk = it % 16u;
        let a0 = As[kk * 33u + ty]; let a1 = As[kk * 33u + ty + 16u];
        let b0 = Bs[kk * 33u + tx]; let b1 = Bs[kk * 33u + tx + 16u];
        c0 = fma(vec4<f32>(a0.x), b0, c0);
        c1 = fma(vec4<f32>(a0.x), b1, c1);
        c2 = fma(vec4<f32>(a0.y), b0, c2);
        c3 = fma(vec4<f32>(a0.y), b1, c3);
        c4 = fma(vec4<f32>(a0.z), b0, c4);
        c5 = fma(vec4<f32>(a0.z), b1, c5);
        c6 = fma(vec4<f32>(a0.w), b0, c6);
        c7 = fma(vec4<f32>(a0.w), b1, c7);
        c8 = fma(vec4<f32>(a1.x), b0, c8);
        c9 = fma(vec4<f32>(a1.x), b1, c9);
        c10 = fma(vec4<f32>(a1.y), b0, c10);
        c11 = fma(vec4<f32>(a1.y), b1, c11);
        c12 = fma(vec4<f32>(a1.z), b0, c12);
        c13 = fma(vec4<f32>(a1.z), b1, c13);
        c14 = fma(vec4<f32>(a1.w), b0, c14);
        c15 = fma(vec4<f32>(a1.w), b1, c15);
    }
    let s = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9 + c10 + c11 + c12 + c13 + c14 + c15;
    out[gid.x] = s.x + s.y + s.z + s.w;
}

@compute @workgroup_size(256)
fn probe_regs(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    fill_tiles(lid);
    let tx = lid % 16u;
    let ty = lid / 16u;
    var c0 = vec4<f32>();
    var c1 = vec4<f32>();
    var c2 = vec4<f32>();
    var c3 = vec4<f32>();
    var c4 = vec4<f32>();
    var c5 = vec4<f32>();
    var c6 = vec4<f32>();
    var c7 = vec4<f32>();
    var c8 = vec4<f32>();
    var c9 = vec4<f32>();
    var c10 = vec4<f32>();
    var c11 = vec4<f32>();
    var c12 = vec4<f32>();
    var c13 = vec4<f32>();
    var c14 = vec4<f32>();
    var c15 = vec4<f32>();
    var a0 = As[ty]; var a1 = As[ty + 16u]; var b0 = Bs[tx]; var b1 = Bs[tx + 16u];
    for (var it = 0u; it < p.iters; it++) {
        c0 = fma(vec4<f32>(a0.x), b0, c0);
        c1 = fma(vec4<f32>(a0.x), b1, c1);
        c2 = fma(vec4<f32>(a0.y), b0, c2);
        c3 = fma(vec4<f32>(a0.y), b1, c3);
        c4 = fma(vec4<f32>(a0.z), b0, c4);
        c5 = fma(vec4<f32>(a0.z), b1, c5);
        c6 = fma(vec4<f32>(a0.w), b0, c6);
        c7 = fma(vec4<f32>(a0.w), b1, c7);
        c8 = fma(vec4<f32>(a1.x), b0, c8);
        c9 = fma(vec4<f32>(a1.x), b1, c9);
        c10 = fma(vec4<f32>(a1.y), b0, c10);
        c11 = fma(vec4<f32>(a1.y), b1, c11);
        c12 = fma(vec4<f32>(a1.z), b0, c12);
        c13 = fma(vec4<f32>(a1.z), b1, c13);
        c14 = fma(vec4<f32>(a1.w), b0, c14);
        c15 = fma(vec4<f32>(a1.w), b1, c15);
        a0 = a0.yzwx; b1 = b1.wxyz;
    }
    let s = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7 + c8 + c9 + c10 + c11 + c12 + c13 + c14 + c15;
    out[gid.x] = s.x + s.y + s.z + s.w;
}
