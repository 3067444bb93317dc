// 12_optim.wgsl — global gradient statistics and the fused multi-tensor AdamW step.
//
//   reduce_norm_sq[_vec4]   part[slot0 + wg] = sum of g^2 over this workgroup's grid-stride
//                           share of one gradient range (one dispatch per range)
//   finalize_grad_stats     stats = (|g|^2, |g|, gradient factor, non-finite flag, clip, 0, 0,
//                           0) of the true gradient g = unscale * (what the ranges hold: the
//                           loss-scaled gradient in f16 training, else unscale = 1):
//                           |g|^2 = unscale^2 * sum of all partials; clip = min(1, max_norm /
//                           (|g| + 1e-6)) when max_norm > 0, else 1; factor = clip * unscale
//                           (what AdamW multiplies the stored gradient by); flag = 1 when the
//                           sum is Inf/NaN (a NaN or Inf gradient, e.g. an f16 overflow, or
//                           squares beyond f32's range), else 0
//   adamw[_vec4]            for one parameter range (PyTorch's AdamW, decoupled decay):
//                             if flag: nothing (the step is skipped; moments stay)
//                             g = grad * factor
//                             p = p * (1 - lr * wd * decay)
//                             m = m + (1 - b1) (g - m);  v = b2 v + (1 - b2) g^2
//                             p = p - (lr / bc1) m / (sqrt(v) / sqrt(bc2) + eps)
//                             mirror = f16(clamp(p, -65504, 65504))   (when has_mirror)
//
// Layouts: every range is a flat f32 view (params, grads, m, v at the same element offsets of
// their buffers) and, for the mirror, the f16 view at the same offset; stats f32[8];
// hyper f32[8] = (lr, b1, b2, eps, wd, lr / bc1, sqrt(bc2), 0), written by the host each step
// (bc1 = 1 - b1^step, bc2 = 1 - b2^step); part f32[slots].
//
// Bindings (group 0):
//   reduce_norm_sq:       0 grads, 1 part (rw), 2 Params
//   finalize_grad_stats:  0 part, 1 stats (rw), 2 Params
//   adamw:                0 grads, 1 stats, 2 hyper, 3 params (rw), 4 m (rw), 5 v (rw),
//                         6 mirror f16 (rw; a dummy unless has_mirror), 7 Params
// The adamw kernels need shader-f16 (the mirror binding); the statistics kernels do not.
// Dispatch: reduce_norm_sq `groups` workgroups of 256 (Params.groups); finalize one
// workgroup of 256; adamw ceil(n / 256) workgroups of 256 (folded into 2-D beyond 65,535).

const EW: u32 = 256u;

struct Params {
    n: u32,          // elements (vec4s for the _vec4 kernels)
    groups: u32,     // reduce: workgroups of this dispatch; finalize: partial count
    slot0: u32,      // reduce: first partial slot of this range
    flags: u32,      // adamw: bit 0 has_mirror
    max_norm: f32,   // finalize
    decay: f32,      // adamw: weight-decay multiplier of this range (0 or 1)
    unscale: f32,    // finalize: 1 / the loss scale the gradients carry (0 means 1)
    _pad1: u32,
}

fn not_finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) >= 0x7f800000u;
}

// --- KERNEL: reduce_norm_sq ---
@group(0) @binding(0) var<storage, read> grads: array<f32>;
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn reduce_norm_sq(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32,
                  @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
                  @builtin(subgroup_size) sg_size: u32, @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
    var acc = 0.0;
    for (var i = wg.x * EW + lid; i < p.n; i += p.groups * EW) {
        let g = grads[i];
        acc = fma(g, g, acc);
    }
    let total = wg_sum(acc, sg);
    if (lid == 0u) { part[p.slot0 + wg.x] = total; }
}

// --- KERNEL: reduce_norm_sq_vec4 ---
@group(0) @binding(0) var<storage, read> grads: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn reduce_norm_sq_vec4(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32,
                       @builtin(subgroup_id) sg_id: u32,
                       @builtin(subgroup_invocation_id) lane: u32,
                       @builtin(subgroup_size) sg_size: u32,
                       @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
    var acc = 0.0;
    for (var i = wg.x * EW + lid; i < p.n; i += p.groups * EW) {
        acc += dot(grads[i], grads[i]);
    }
    let total = wg_sum(acc, sg);
    if (lid == 0u) { part[p.slot0 + wg.x] = total; }
}

// --- KERNEL: finalize_grad_stats ---
@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> stats: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn finalize_grad_stats(@builtin(local_invocation_index) lid: u32,
                       @builtin(subgroup_id) sg_id: u32,
                       @builtin(subgroup_invocation_id) lane: u32,
                       @builtin(subgroup_size) sg_size: u32,
                       @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
    var acc = 0.0;
    for (var i = lid; i < p.groups; i += EW) { acc += part[i]; }
    let scaled_sq = wg_sum(acc, sg);
    if (lid == 0u) {
        let unscale = select(1.0, p.unscale, p.unscale > 0.0);
        let bad = not_finite(scaled_sq);
        let norm_sq = scaled_sq * unscale * unscale;
        let norm = sqrt(norm_sq);
        var clip = 1.0;
        if (p.max_norm > 0.0 && !bad) { clip = min(1.0, p.max_norm / (norm + 1e-6)); }
        stats[0] = norm_sq;
        stats[1] = norm;
        stats[2] = clip * unscale;
        stats[3] = select(0.0, 1.0, bad);
        stats[4] = clip;
        stats[5] = 0.0;
        stats[6] = 0.0;
        stats[7] = 0.0;
    }
}

// --- KERNEL: adamw ---
// clamp keeps overflow finite; NaN is tested on the bits (see shaders/NOTES.md)
fn to_f16(x: f32) -> f16 {
    if ((bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u) { return f16(x); }
    return f16(clamp(x, -65504.0, 65504.0));
}

@group(0) @binding(0) var<storage, read> grads: array<f32>;
@group(0) @binding(1) var<storage, read> stats: array<f32>;
@group(0) @binding(2) var<storage, read> hyper: array<f32>;
@group(0) @binding(3) var<storage, read_write> params: array<f32>;
@group(0) @binding(4) var<storage, read_write> m1: array<f32>;
@group(0) @binding(5) var<storage, read_write> m2: array<f32>;
@group(0) @binding(6) var<storage, read_write> mirror: array<f16>;
@group(0) @binding(7) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn adamw(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = workgroup_index(wg, nwg) * EW + lid;
    if (i >= p.n || stats[3] != 0.0) { return; }
    let lr = hyper[0];
    let b1 = hyper[1];
    let b2 = hyper[2];
    let g = grads[i] * stats[2];
    let m = m1[i] + (1.0 - b1) * (g - m1[i]);
    let v = b2 * m2[i] + (1.0 - b2) * g * g;
    var w = params[i] * (1.0 - lr * hyper[4] * p.decay);
    w = w - hyper[5] * m / (sqrt(v) / hyper[6] + hyper[3]);
    m1[i] = m;
    m2[i] = v;
    params[i] = w;
    if ((p.flags & 1u) != 0u) { mirror[i] = to_f16(w); }
}

// --- KERNEL: adamw_vec4 ---
// clamp keeps overflow finite; NaN is tested on the bits (see shaders/NOTES.md)
fn to_f16(x: f32) -> f16 {
    if ((bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u) { return f16(x); }
    return f16(clamp(x, -65504.0, 65504.0));
}

@group(0) @binding(0) var<storage, read> grads: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> stats: array<f32>;
@group(0) @binding(2) var<storage, read> hyper: array<f32>;
@group(0) @binding(3) var<storage, read_write> params: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> m1: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> m2: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> mirror: array<vec4<f16>>;
@group(0) @binding(7) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn adamw_vec4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = workgroup_index(wg, nwg) * EW + lid;
    if (i >= p.n || stats[3] != 0.0) { return; }
    let lr = hyper[0];
    let b1 = hyper[1];
    let b2 = hyper[2];
    let g = grads[i] * stats[2];
    let m = m1[i] + (1.0 - b1) * (g - m1[i]);
    let v = b2 * m2[i] + (1.0 - b2) * g * g;
    var w = params[i] * (1.0 - lr * hyper[4] * p.decay);
    w = w - hyper[5] * m / (sqrt(v) / hyper[6] + hyper[3]);
    m1[i] = m;
    m2[i] = v;
    params[i] = w;
    if ((p.flags & 1u) != 0u) {
        mirror[i] = vec4<f16>(to_f16(w.x), to_f16(w.y), to_f16(w.z), to_f16(w.w));
    }
}
