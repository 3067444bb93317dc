// 00_shared.wgsl — the preamble the engine prepends to every kernel (after its enable lines).
//
// What it gives every kernel:
//   workgroup_index(wg, nwg)     linear workgroup index of a grid the engine folded into 2-D
//   Subgroup / wg_sum / wg_max   workgroup-wide reductions built on subgroup operations
//   wg_sum4                      wg_sum of a vec4, per component (four rows' sums at once)
//   f16_range(v), f16_bits(v)    f32 values made ready for f16 storage (clamped, NaN kept)
//
// Reductions: every invocation of the workgroup must call them (uniform control flow, as
// for workgroupBarrier), and every invocation receives the result. They are correct for any
// subgroup size (lavapipe runs 8 lanes, NVIDIA 32, others 4..128) because they never assume
// one: partial sums go to one slot per subgroup (`subgroup_id`), each subgroup then folds all
// slots itself. The closing barrier makes back-to-back calls race-free: no invocation can
// overwrite a slot of the next reduction while another is still reading the previous one.
// Slots: 256, enough for workgroups of up to 1024 invocations at subgroup size >= 4.
//
// The preamble itself uses no f16, so it compiles on devices without shader-f16.

const RED_SLOTS: u32 = 256u;
var<workgroup> red_slots: array<f32, RED_SLOTS>;
var<workgroup> red_slots4: array<vec4<f32>, RED_SLOTS>;   // only kernels calling wg_sum4 hold it

// Where an invocation sits among its workgroup's subgroups (from the entry point's builtins:
// subgroup_id, subgroup_invocation_id, subgroup_size, num_subgroups).
struct Subgroup {
    id: u32,
    lane: u32,
    size: u32,
    count: u32,
}

fn workgroup_index(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.x + wg.y * nwg.x + wg.z * nwg.x * nwg.y;
}

fn ceil_div(a: u32, b: u32) -> u32 {
    return (a + b - 1u) / b;
}

fn wg_sum(v: f32, sg: Subgroup) -> f32 {
    let part = subgroupAdd(v);
    if (sg.lane == 0u) {
        red_slots[sg.id] = part;
    }
    workgroupBarrier();
    var acc = 0.0;
    for (var i = sg.lane; i < sg.count; i += sg.size) {
        acc += red_slots[i];
    }
    let total = subgroupAdd(acc);
    workgroupBarrier();
    return total;
}

fn wg_sum4(v: vec4<f32>, sg: Subgroup) -> vec4<f32> {
    let part = subgroupAdd(v);
    if (sg.lane == 0u) {
        red_slots4[sg.id] = part;
    }
    workgroupBarrier();
    var acc = vec4<f32>();
    for (var i = sg.lane; i < sg.count; i += sg.size) {
        acc += red_slots4[i];
    }
    let total = subgroupAdd(acc);
    workgroupBarrier();
    return total;
}

fn wg_max(v: f32, sg: Subgroup) -> f32 {
    let part = subgroupMax(v);
    if (sg.lane == 0u) {
        red_slots[sg.id] = part;
    }
    workgroupBarrier();
    var acc = -3.402823466e+38;
    for (var i = sg.lane; i < sg.count; i += sg.size) {
        acc = max(acc, red_slots[i]);
    }
    let total = subgroupMax(acc);
    workgroupBarrier();
    return total;
}

// f16 storage: beyond +-65504 a value becomes +-65504 (overflow stays finite, as the
// tensor-core matmuls clamp their f32 operands), NaN stays NaN. NaN is tested on the bits:
// drivers may compile `v != v` as an ordered compare (false for NaN) and clamp(NaN) is
// undefined. f32 and u32 only, so the preamble compiles without shader-f16.
fn nan4(v: vec4<f32>) -> vec4<bool> {
    return (bitcast<vec4<u32>>(v) & vec4<u32>(0x7fffffffu)) > vec4<u32>(0x7f800000u);
}

// v clamped to the f16 range, NaN kept: ready for vec4<f16>(...) (converting NaN gives NaN).
fn f16_range(v: vec4<f32>) -> vec4<f32> {
    return select(clamp(v, vec4<f32>(-65504.0), vec4<f32>(65504.0)), v, nan4(v));
}

// The f16 bits of v for an array<vec2<u32>> binding viewing f16 storage (8-byte stores):
// clamped, rounded to nearest by pack2x16float (indeterminate for out-of-range input, hence
// the clamp first), NaN written as the quiet NaN 0x7e00. (naga rejects
// bitcast<vec2<u32>>(vec4<f16>), so the bits come from pack2x16float.)
fn f16_bits(v: vec4<f32>) -> vec2<u32> {
    let nan = nan4(v);
    let c = select(clamp(v, vec4<f32>(-65504.0), vec4<f32>(65504.0)), vec4<f32>(0.0), nan);
    let q = select(vec4<u32>(0u), vec4<u32>(0x7e00u), nan);
    return vec2<u32>(pack2x16float(c.xy) | q.x | (q.y << 16u),
                     pack2x16float(c.zw) | q.z | (q.w << 16u));
}
