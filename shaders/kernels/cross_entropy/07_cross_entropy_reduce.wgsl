// 07_cross_entropy_reduce.wgsl — the single-workgroup reductions around ce_rows
// (07_cross_entropy.wgsl).
//
//   ce_count      stats[0] = number of rows whose target != ignore_index
//   ce_finalize   stats[1] = sum of losses[r], stats[2] = stats[1] / max(stats[0], 1)
//                 (stats[3] = 0). With every target ignored the mean loss is 0.
//
// Layouts: targets u32[rows]; losses f32[rows]; stats f32[4].
// Bindings (group 0): ce_count 0 targets, 1 stats (rw), 2 Params;
//                     ce_finalize 0 losses, 1 stats (rw), 2 Params.
// Dispatch: one workgroup of WG invocations (the sums run in a fixed order: deterministic).

override WG: u32 = 256u;

struct Params {
    rows: u32,
    vocab: u32,
    stride: u32,
    ignore_index: u32,
    mode: u32,
    per_valid: u32,
    eps: f32,
    z: f32,
    grad_scale: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// --- KERNEL: ce_count ---
@group(0) @binding(0) var<storage, read> targets: array<u32>;
@group(0) @binding(1) var<storage, read_write> stats: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn ce_count(@builtin(local_invocation_index) lid: u32,
            @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
            @builtin(subgroup_size) sg_size: u32, @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
    var count = 0.0;
    for (var r = lid; r < p.rows; r += WG) {
        if (targets[r] != p.ignore_index) { count += 1.0; }
    }
    let total = wg_sum(count, sg);
    if (lid == 0u) { stats[0] = total; }
}

// --- KERNEL: ce_finalize ---
@group(0) @binding(0) var<storage, read> losses: array<f32>;
@group(0) @binding(1) var<storage, read_write> stats: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn ce_finalize(@builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
               @builtin(subgroup_size) sg_size: u32, @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
    var acc = 0.0;
    for (var r = lid; r < p.rows; r += WG) { acc += losses[r]; }
    let total = wg_sum(acc, sg);
    if (lid == 0u) {
        stats[1] = total;
        stats[2] = total / max(stats[0], 1.0);
        stats[3] = 0.0;
    }
}
