// 02_rmsnorm_rows.wgsl — RMSNorm's backward over several rows per workgroup, each row read
// once (the fast path of ops.py for rows of n % 4 == 0 floats, n <= 4 * WG * MAX_C; its
// forward twin is rmsnorm_forward_rows in 02_rmsnorm_forward.wgsl).
//
//   rmsnorm_backward_rows    per block of RB rows (4 at a time):
//                              g = dy * w, c[r] = rstd[r]^2 * mean_j(g x) (= mean(g xhat)*rstd)
//                              dx[r,j] (=, +=) rstd[r] * (g[j] - x[r,j] * c[r])
//                            and, when `with_dw`, part[block, j] = sum over the block's rows of
//                            dy[r,j] x[r,j] rstd[r] (the first stage of the weight gradient)
//   rmsnorm_dw_reduce_rows   dw[j] += sum over blocks of part[block, j] (fixed order)
//
// x, dy and dx of a row are loaded once into registers: the row reduction, dx and the dw
// partial all use the same values (the general kernels in 02_rmsnorm.wgsl read them twice
// and the dw stage a third time). Four rows share one vec4 workgroup reduction (wg_sum4).
// Layouts: x, dy, dx f32[rows, n] contiguous, read as vec4; w, dw f32[n]; rstd f32[rows];
// part f32[blocks, n].
//
// Bindings (group 0):
//   backward:   0 x, 1 w, 2 dy, 3 rstd, 4 dx (rw; a dummy when mode bit 1 is clear),
//               5 part (rw; a dummy unless with_dw), 6 Params
//   dw_reduce:  0 part, 1 dw (rw), 2 Params
// Dispatch: backward ceil(rows / RB) workgroups of WG (grids folded into 2-D beyond 65,535); dw_reduce ceil(n / 4 / 16) workgroups of 256.
// Invocation lid owns the vec4 columns lid, lid + WG, ... (C = ceil(n / 4 / WG) of them).

override WG: u32 = 256u;
override C: u32 = 1u;            // vec4 columns per invocation
override RB: u32 = 8u;           // backward: rows per workgroup (multiple of 4)
const MAX_C: u32 = 4u;

struct Params {
    rows: u32,
    n4: u32,      // row length in vec4s
    n: u32,       // row length in floats
    mode: u32,    // backward: bit 0 accumulate dx, bit 1 write dx, bit 2 write dw partials;
                  // dw_reduce: number of blocks
    eps: f32,     // unused here (the forward's Params share this layout)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
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
