// 00_shared.wgsl — the preamble the engine prepends to every kernel (after its enable lines).
//
// What it gives every kernel:
//   workgroup_index(wg, nwg)     linear workgroup index of a grid the engine folded into 2-D
//   Subgroup / wg_sum / wg_max   workgroup-wide reductions built on subgroup operations
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
