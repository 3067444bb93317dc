// 02_rmsnorm_rows.wgsl — RMSNorm over several rows per workgroup, each row read once (the
// fast path of ops.py for rows of n % 4 == 0 floats, n <= 4 * WG * MAX_C).
//
//   rmsnorm_forward_rows     rstd[r] = 1 / sqrt(mean_j x[r,j]^2 + eps)
//                            y[r,j]  = x[r,j] * rstd[r] * w[j]           (4 rows per workgroup)
//   rmsnorm_forward_rows_f16 the same with y f16: the tensor-core matmuls read the norm's output
//                            as f16 (they round an f32 A to f16 when staging anyway), so an f16
//                            y gives them the same values at half the bytes. Computed in f32,
//                            clamped to +-65504 (as cast_f32_f16: overflow stays finite) and
//                            rounded to nearest once at the store; NaN stays NaN. rstd stays f32.
//   rmsnorm_backward_rows    per block of RB rows (4 at a time):
//                              g = dy * w, c[r] = rstd[r]^2 * mean_j(g x) (= mean(g xhat)*rstd)
//                              dx[r,j] (=, +=) rstd[r] * (g[j] - x[r,j] * c[r])
//                            and, when `with_dw`, part[block, j] = sum over the block's rows of
//                            dy[r,j] x[r,j] rstd[r] (the first stage of the weight gradient)
//   rmsnorm_dw_reduce_rows   dw[j] += sum over blocks of part[block, j] (fixed order)
//
// x, dy and dx of a row are loaded once into registers: the row reduction, dx and the dw
// partial all use the same values (the general kernels in 02_rmsnorm.wgsl read them twice
// and the dw stage a third time). Four rows share one vec4 workgroup reduction.
// Layouts: x, y, dy, dx f32[rows, n] contiguous, read as vec4 (y f16 in _f16); w, dw f32[n];
// rstd f32[rows]; part f32[blocks, n].
//
// Bindings (group 0):
//   forward:    0 x, 1 w, 2 y (rw; array<vec2<u32>> in _f16: the four halves of a vec4 as the
//               bits of pack2x16float, one 8-byte store), 3 rstd (rw), 4 Params
//   backward:   0 x, 1 w, 2 dy, 3 rstd, 4 dx (rw; a dummy when mode bit 1 is clear),
//               5 part (rw; a dummy unless with_dw), 6 Params
//   dw_reduce:  0 part, 1 dw (rw), 2 Params
// Dispatch: forward ceil(rows / 4) workgroups of WG; backward ceil(rows / RB) workgroups of
// WG (grids folded into 2-D beyond 65,535); dw_reduce ceil(n / 4 / 16) workgroups of 256.
// Invocation lid owns the vec4 columns lid, lid + WG, ... (C = ceil(n / 4 / WG) of them).

override WG: u32 = 256u;
override C: u32 = 1u;            // vec4 columns per invocation
override RB: u32 = 8u;           // backward: rows per workgroup (multiple of 4)
const MAX_C: u32 = 4u;
const RED_SLOTS4: u32 = 256u;

struct Params {
    rows: u32,
    n4: u32,      // row length in vec4s
    n: u32,       // row length in floats
    mode: u32,    // backward: bit 0 accumulate dx, bit 1 write dx, bit 2 write dw partials;
                  // dw_reduce: number of blocks
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

var<workgroup> red4: array<vec4<f32>, RED_SLOTS4>;

// Sum of v over the workgroup, per component (the preamble's wg_sum for vec4s).
fn wg_sum4(v: vec4<f32>, sg: Subgroup) -> vec4<f32> {
    let part = subgroupAdd(v);
    if (sg.lane == 0u) {
        red4[sg.id] = part;
    }
    workgroupBarrier();
    var acc = vec4<f32>();
    for (var i = sg.lane; i < sg.count; i += sg.size) {
        acc += red4[i];
    }
    let total = subgroupAdd(acc);
    workgroupBarrier();
    return total;
}

// --- KERNEL: rmsnorm_forward_rows ---
@group(0) @binding(0) var<storage, read> x_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> weight: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y_out: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> rstd_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn rmsnorm_forward_rows(@builtin(workgroup_id) wg: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32,
                        @builtin(subgroup_id) sg_id: u32,
                        @builtin(subgroup_invocation_id) lane: u32,
                        @builtin(subgroup_size) sg_size: u32,
                        @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
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
                if (r0 + i < p.rows) { y_out[(r0 + i) * p.n4 + j] = xs[i * MAX_C + c] * rstd[i] * w; }
            }
        }
    }
    if (lid < 4u && r0 + lid < p.rows) { rstd_out[r0 + lid] = rstd[lid]; }
}

// --- KERNEL: rmsnorm_forward_rows_f16 ---
@group(0) @binding(0) var<storage, read> x_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> weight: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> y_out: array<vec2<u32>>;   // f16[rows, n]
@group(0) @binding(3) var<storage, read_write> rstd_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn rmsnorm_forward_rows_f16(@builtin(workgroup_id) wg: vec3<u32>,
                            @builtin(num_workgroups) nwg: vec3<u32>,
                            @builtin(local_invocation_index) lid: u32,
                            @builtin(subgroup_id) sg_id: u32,
                            @builtin(subgroup_invocation_id) lane: u32,
                            @builtin(subgroup_size) sg_size: u32,
                            @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
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
                if (r0 + i < p.rows) {
                    y_out[(r0 + i) * p.n4 + j] = f16_bits(xs[i * MAX_C + c] * rstd[i] * w);
                }
            }
        }
    }
    if (lid < 4u && r0 + lid < p.rows) { rstd_out[r0 + lid] = rstd[lid]; }
}

// --- KERNEL: rmsnorm_backward_rows ---
@group(0) @binding(0) var<storage, read> x_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> weight: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> dy_in: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> rstd_in: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx_out: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> part: array<vec4<f32>>;
@group(0) @binding(6) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn rmsnorm_backward_rows(@builtin(workgroup_id) wg: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32,
                         @builtin(subgroup_id) sg_id: u32,
                         @builtin(subgroup_invocation_id) lane: u32,
                         @builtin(subgroup_size) sg_size: u32,
                         @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
    let block = workgroup_index(wg, nwg);
    let accumulate = (p.mode & 1u) != 0u;
    let write_dx = (p.mode & 2u) != 0u;
    let write_dw = (p.mode & 4u) != 0u;
    var ws: array<vec4<f32>, MAX_C>;
    var dwp: array<vec4<f32>, MAX_C>;
    for (var c = 0u; c < C; c++) {
        let j = lid + c * WG;
        if (j < p.n4) { ws[c] = weight[j]; }
    }
    for (var r0 = block * RB; r0 < (block + 1u) * RB; r0 += 4u) {
        var xs: array<vec4<f32>, 4u * MAX_C>;
        var gs: array<vec4<f32>, 4u * MAX_C>;     // dy * w
        var rstd = vec4<f32>();
        var dots = vec4<f32>();
        for (var i = 0u; i < 4u; i++) {
            if (r0 + i < p.rows) { rstd[i] = rstd_in[r0 + i]; }
        }
        for (var c = 0u; c < C; c++) {
            let j = lid + c * WG;
            for (var i = 0u; i < 4u; i++) {
                if (j < p.n4 && r0 + i < p.rows) {
                    let x = x_in[(r0 + i) * p.n4 + j];
                    let dy = dy_in[(r0 + i) * p.n4 + j];
                    xs[i * MAX_C + c] = x;
                    gs[i * MAX_C + c] = dy * ws[c];
                    dots[i] += dot(dy * ws[c], x);
                    dwp[c] += dy * x * rstd[i];
                }
            }
        }
        // c = rstd^2 * mean(g x): every invocation reaches the reduction (uniform loop)
        let coef = wg_sum4(dots, sg) * rstd * rstd / f32(p.n);
        if (write_dx) {
            for (var c = 0u; c < C; c++) {
                let j = lid + c * WG;
                for (var i = 0u; i < 4u; i++) {
                    if (j < p.n4 && r0 + i < p.rows) {
                        let at = (r0 + i) * p.n4 + j;
                        let d = rstd[i] * (gs[i * MAX_C + c] - xs[i * MAX_C + c] * coef[i]);
                        if (accumulate) { dx_out[at] = dx_out[at] + d; } else { dx_out[at] = d; }
                    }
                }
            }
        }
    }
    if (write_dw) {
        for (var c = 0u; c < C; c++) {
            let j = lid + c * WG;
            if (j < p.n4) { part[block * p.n4 + j] = dwp[c]; }
        }
    }
}

// --- KERNEL: rmsnorm_dw_reduce_rows ---
// 16 lanes per vec4 column split the blocks; lane partials meet in workgroup memory.
@group(0) @binding(0) var<storage, read> part_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dw: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> lanes: array<vec4<f32>, 256>;

@compute @workgroup_size(256)
fn rmsnorm_dw_reduce_rows(@builtin(workgroup_id) wg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let col = wg.x * 16u + lid % 16u;
    let lane = lid / 16u;
    var acc = vec4<f32>();
    if (col < p.n4) {
        for (var b = lane; b < p.mode; b += 16u) { acc += part_in[b * p.n4 + col]; }
    }
    lanes[lid] = acc;
    workgroupBarrier();
    if (lane == 0u && col < p.n4) {
        var total = vec4<f32>();
        for (var l = 0u; l < 16u; l++) { total += lanes[l * 16u + lid]; }
        dw[col] = dw[col] + total;
    }
}
