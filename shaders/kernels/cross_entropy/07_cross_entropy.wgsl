// 07_cross_entropy.wgsl — fused softmax cross-entropy: loss and dlogits in one pass pair.
//
//   ce_rows[_vec4]    per row r (one workgroup), over the first V of its `stride` columns
//                     (rows of one chunk: logits row r is token row0 + r of targets/losses):
//                       lse = log sum_i exp(x_i)
//                       loss[r] = lse - (1-eps) x_t - (eps/V) sum_i x_i + z * lse^2
//                       dx_i = scale * ((1 + 2 z lse) softmax_i - (1-eps) [i == t] - eps/V)
//                     (eps: label smoothing, z: z-loss; scale = grad_scale / stats[0] when
//                     `per_valid`, else grad_scale). Ignored rows: loss 0, dx 0. Columns
//                     V..stride-1 (vocabulary padding): dx 0. A target >= V (and not the
//                     ignore index) gives a NaN loss and NaN dx, so the NaN guard trips.
//                     mode 0: loss only; 1: dx overwrites the logits (in place); 2: dx to dlogits.
//   ce_rows[_vec4]_h16  the same with dlogits f16 (mode 2): the tensor-core matmuls of the LM
//                     head's backward read it as their A (half the bytes; they round A to f16
//                     anyway). No clamp: an overflow becomes inf, which the NaN/Inf guard catches.
//
// ce_count (before) and ce_finalize (after) live in 07_cross_entropy_reduce.wgsl.
// Layouts: logits, dlogits f32[rows, stride] (dlogits f16 for _h16); targets, losses [row0 + rows] (u32, f32);
// stats f32[4] = (valid count, loss sum, mean loss, 0). The _vec4 kernel reads rows as
// vec4<f32> (stride % 4 == 0; V need not be).
//
// Bindings (group 0): 0 targets, 1 stats (read), 2 logits (rw; written only in mode 1),
// 3 dlogits (rw; a dummy unless mode 2), 4 losses (rw), 5 Params.
// Dispatch: one workgroup of WG per row (folded into 2-D beyond 65,535 rows). stats[0] is
// written by ce_count in an earlier dispatch of the same pass. The first pass keeps four
// loads in flight per invocation; a large WG keeps fewer rows in flight, so that the second
// pass over a row finds it in the last-level cache (the op picks WG per device class).

override WG: u32 = 256u;
const LOWEST: f32 = -3.402823466e+38;

struct Params {
    rows: u32,
    vocab: u32,        // V: columns that take part in the softmax
    stride: u32,       // row length in floats (>= V)
    ignore_index: u32,
    mode: u32,         // 0 loss only, 1 dx in place, 2 dx to dlogits
    per_valid: u32,    // 1: divide the gradient by the valid-row count
    eps: f32,          // label smoothing
    z: f32,            // z-loss coefficient
    grad_scale: f32,
    row0: u32,         // first token row of this chunk in targets and losses
    nan_bits: u32,     // 0x7fc00000 from the host: a NaN made at run time (WGSL refuses
                       // NaN constant expressions)
    _pad: u32,
}

fn nan_f32() -> f32 {
    return bitcast<f32>(p.nan_bits);
}

// One row per workgroup; `row` is uniform across the workgroup, so is `ignored`, and every
// invocation reaches the reductions.
fn ce_row(row: u32, lid: u32, sg: Subgroup) {
    let live = row < p.rows;
    var t = p.ignore_index;
    if (live) { t = targets[p.row0 + row]; }
    let ignored = t == p.ignore_index;
    let bad_target = !ignored && t >= p.vocab;
    let base = row * (p.stride / W);
    let elems = p.stride / W;
    var xt = 0.0;
    if (live && !ignored && !bad_target) {
        // read before any dx is written: in place, dx overwrites this very element
        xt = lane_of(logits[base + t / W], t % W);
    }
    // pass 1: online max and sum of exp, sum of logits (for label smoothing)
    var m = LOWEST;
    var s = 0.0;
    var sx = 0.0;
    if (live && !ignored) {
        // four loads in flight per invocation, one rescale per four elements
        var j = lid;
        for (; j + 3u * WG < elems; j += 4u * WG) {
            var v: array<Elem, 4>;
            var mloc = LOWEST;
            for (var u = 0u; u < 4u; u++) {
                let jj = j + u * WG;
                let in_vocab = lanes(jj) < Idx(p.vocab);
                v[u] = select(Elem(LOWEST), logits[base + jj], in_vocab);
                sx += esum(select(Elem(0.0), v[u], in_vocab));
                mloc = max(mloc, emax(v[u]));
            }
            let m_new = max(m, mloc);
            var part = s * exp(m - m_new);
            for (var u = 0u; u < 4u; u++) {
                let in_vocab = lanes(j + u * WG) < Idx(p.vocab);
                part += esum(select(Elem(0.0), exp(v[u] - m_new), in_vocab));
            }
            s = part;
            m = m_new;
        }
        for (; j < elems; j += WG) {
            let in_vocab = lanes(j) < Idx(p.vocab);
            let v = select(Elem(LOWEST), logits[base + j], in_vocab);
            let m_new = max(m, emax(v));
            s = s * exp(m - m_new) + esum(select(Elem(0.0), exp(v - m_new), in_vocab));
            sx += esum(select(Elem(0.0), v, in_vocab));
            m = m_new;
        }
    }
    let row_max = wg_max(m, sg);
    let row_sum = wg_sum(s * exp(m - row_max), sg);
    let row_sx = wg_sum(sx, sg);
    let lse = row_max + log(row_sum);
    if (!live) { return; }   // uniform: the whole workgroup leaves together
    if (lid == 0u) {
        var loss = 0.0;
        if (bad_target) {
            loss = nan_f32();
        } else if (!ignored) {
            loss = lse - (1.0 - p.eps) * xt - p.eps / f32(p.vocab) * row_sx + p.z * lse * lse;
        }
        losses[p.row0 + row] = loss;
    }
    if (p.mode == 0u) { return; }
    // pass 2: dx
    var scale = p.grad_scale;
    if (p.per_valid == 1u) { scale = scale / max(stats[0], 1.0); }
    let c_soft = scale * (1.0 + 2.0 * p.z * lse);
    let c_target = scale * (1.0 - p.eps);
    let c_uniform = scale * p.eps / f32(p.vocab);
    for (var j = lid; j < elems; j += WG) {
        let idx = lanes(j);
        var g = Elem(0.0);
        if (bad_target) {
            g = Elem(nan_f32());
        } else if (!ignored) {
            g = c_soft * exp(logits[base + j] - lse) - c_uniform
                - select(Elem(0.0), Elem(c_target), idx == Idx(t));
            g = select(Elem(0.0), g, idx < Idx(p.vocab));
        }
        if (p.mode == 1u) { logits[base + j] = g; } else { dlogits[base + j] = to_grad(g); }
    }
}

// --- KERNEL: ce_rows ---
alias Elem = f32;
alias Idx = u32;
const W: u32 = 1u;
fn esum(v: Elem) -> f32 { return v; }
fn emax(v: Elem) -> f32 { return v; }
fn lanes(j: u32) -> Idx { return j; }
fn lane_of(v: Elem, c: u32) -> f32 { return v; }
fn to_grad(g: Elem) -> Elem { return g; }

@group(0) @binding(0) var<storage, read> targets: array<u32>;
@group(0) @binding(1) var<storage, read> stats: array<f32>;
@group(0) @binding(2) var<storage, read_write> logits: array<Elem>;
@group(0) @binding(3) var<storage, read_write> dlogits: array<Elem>;
@group(0) @binding(4) var<storage, read_write> losses: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn ce_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32,
           @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
           @builtin(subgroup_size) sg_size: u32, @builtin(num_subgroups) num_sg: u32) {
    ce_row(workgroup_index(wg, nwg), lid, Subgroup(sg_id, lane, sg_size, num_sg));
}

// --- KERNEL: ce_rows_vec4 ---
alias Elem = vec4<f32>;
alias Idx = vec4<u32>;
const W: u32 = 4u;
fn esum(v: Elem) -> f32 { return v.x + v.y + v.z + v.w; }
fn emax(v: Elem) -> f32 { return max(max(v.x, v.y), max(v.z, v.w)); }
fn lanes(j: u32) -> Idx { return vec4<u32>(4u * j, 4u * j + 1u, 4u * j + 2u, 4u * j + 3u); }
fn lane_of(v: Elem, c: u32) -> f32 { return v[c]; }
fn to_grad(g: Elem) -> Elem { return g; }

@group(0) @binding(0) var<storage, read> targets: array<u32>;
@group(0) @binding(1) var<storage, read> stats: array<f32>;
@group(0) @binding(2) var<storage, read_write> logits: array<Elem>;
@group(0) @binding(3) var<storage, read_write> dlogits: array<Elem>;
@group(0) @binding(4) var<storage, read_write> losses: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn ce_rows_vec4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32,
                @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
                @builtin(subgroup_size) sg_size: u32, @builtin(num_subgroups) num_sg: u32) {
    ce_row(workgroup_index(wg, nwg), lid, Subgroup(sg_id, lane, sg_size, num_sg));
}

// --- KERNEL: ce_rows_h16 ---
alias Elem = f32;
alias Idx = u32;
const W: u32 = 1u;
fn esum(v: Elem) -> f32 { return v; }
fn emax(v: Elem) -> f32 { return v; }
fn lanes(j: u32) -> Idx { return j; }
fn lane_of(v: Elem, c: u32) -> f32 { return v; }
fn to_grad(g: Elem) -> f16 { return f16(g); }

@group(0) @binding(0) var<storage, read> targets: array<u32>;
@group(0) @binding(1) var<storage, read> stats: array<f32>;
@group(0) @binding(2) var<storage, read_write> logits: array<Elem>;
@group(0) @binding(3) var<storage, read_write> dlogits: array<f16>;
@group(0) @binding(4) var<storage, read_write> losses: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn ce_rows_h16(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32,
           @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
           @builtin(subgroup_size) sg_size: u32, @builtin(num_subgroups) num_sg: u32) {
    ce_row(workgroup_index(wg, nwg), lid, Subgroup(sg_id, lane, sg_size, num_sg));
}

// --- KERNEL: ce_rows_vec4_h16 ---
alias Elem = vec4<f32>;
alias Idx = vec4<u32>;
const W: u32 = 4u;
fn esum(v: Elem) -> f32 { return v.x + v.y + v.z + v.w; }
fn emax(v: Elem) -> f32 { return max(max(v.x, v.y), max(v.z, v.w)); }
fn lanes(j: u32) -> Idx { return vec4<u32>(4u * j, 4u * j + 1u, 4u * j + 2u, 4u * j + 3u); }
fn lane_of(v: Elem, c: u32) -> f32 { return v[c]; }
fn to_grad(g: Elem) -> vec4<f16> { return vec4<f16>(g); }

@group(0) @binding(0) var<storage, read> targets: array<u32>;
@group(0) @binding(1) var<storage, read> stats: array<f32>;
@group(0) @binding(2) var<storage, read_write> logits: array<Elem>;
@group(0) @binding(3) var<storage, read_write> dlogits: array<vec4<f16>>;
@group(0) @binding(4) var<storage, read_write> losses: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn ce_rows_vec4_h16(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32,
                @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
                @builtin(subgroup_size) sg_size: u32, @builtin(num_subgroups) num_sg: u32) {
    ce_row(workgroup_index(wg, nwg), lid, Subgroup(sg_id, lane, sg_size, num_sg));
}
