// 02_rmsnorm.wgsl — RMSNorm forward and backward over rows of any length n (the vec4
// forwards, f32 and f16 y, are in 02_rmsnorm_forward.wgsl).
//
//   rmsnorm_forward           rstd[r] = 1 / sqrt(mean_j x[r,j]^2 + eps)
//                             y[r,j]  = x[r,j] * rstd[r] * w[j]
//   rmsnorm_backward[_vec4]   g = dy * w, xhat = x * rstd
//                             dx[r,j] (=, +=) rstd[r] * (g[j] - xhat[j] * mean_k(g[k] xhat[k]))
//   rmsnorm_dw_partial        part[b, j] = sum over rows r of block b of dy[r,j] x[r,j] rstd[r]
//   rmsnorm_dw_reduce         dw[j] += sum_b part[b, j]   (deterministic two-stage column sum)
//
// Layouts: x, y, dy, dx f32[rows, n] (contiguous rows); w, dw f32[n]; rstd f32[rows];
// part f32[ceil(rows / RB), n]. The _vec4 kernels view rows as vec4<f32> (n % 4 == 0) and
// `dim` then counts vec4s; `n` is always the true row length.
//
// Bindings (group 0):
//   forward:      0 x, 1 w, 2 y (rw), 3 rstd (rw), 4 Params
//   backward:     0 x, 1 w, 2 dy, 3 rstd, 4 dx (rw), 5 Params   (mode 0 store, 1 accumulate)
//   dw_partial:   0 x, 1 dy, 2 rstd, 3 part (rw), 4 Params
//   dw_reduce:    0 part, 1 dw (rw), 2 Params
// Dispatch: forward/backward one workgroup of WG invocations per row (rows folded into 2-D
// beyond 65,535); dw_partial (ceil(n / 64), ceil(rows / RB)); dw_reduce ceil(n / 64).

override WG: u32 = 64u;
const CW: u32 = 64u;   // columns per workgroup of the dw kernels

struct Params {
    rows: u32,
    dim: u32,    // row length in Elems (vec4s for the _vec4 kernels)
    n: u32,      // row length in floats
    mode: u32,   // backward: 0 store, 1 accumulate; dw kernels: RB or block count
    eps: f32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

fn sum_elem(v: f32) -> f32 { return v; }
fn sum_elem4(v: vec4<f32>) -> f32 { return v.x + v.y + v.z + v.w; }

// --- KERNEL: rmsnorm_forward ---
alias Elem = f32;
@group(0) @binding(0) var<storage, read> x_in: array<Elem>;
@group(0) @binding(1) var<storage, read> weight: array<Elem>;
@group(0) @binding(2) var<storage, read_write> y_out: array<Elem>;
@group(0) @binding(3) var<storage, read_write> rstd_out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn rmsnorm_forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32,
                   @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
                   @builtin(subgroup_size) sg_size: u32, @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
    let row = workgroup_index(wg, nwg);
    let live = row < p.rows;
    let base = row * p.dim;
    var ss = 0.0;
    if (live) {
        for (var j = lid; j < p.dim; j += WG) { let v = x_in[base + j]; ss += sum_elem(v * v); }
    }
    let rstd = inverseSqrt(wg_sum(ss, sg) / f32(p.n) + p.eps);
    if (live) {
        for (var j = lid; j < p.dim; j += WG) { y_out[base + j] = x_in[base + j] * rstd * weight[j]; }
        if (lid == 0u) { rstd_out[row] = rstd; }
    }
}

// --- KERNEL: rmsnorm_backward ---
alias Elem = f32;
@group(0) @binding(0) var<storage, read> x_in: array<Elem>;
@group(0) @binding(1) var<storage, read> weight: array<Elem>;
@group(0) @binding(2) var<storage, read> dy_in: array<Elem>;
@group(0) @binding(3) var<storage, read> rstd_in: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx_out: array<Elem>;
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn rmsnorm_backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32,
                    @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
                    @builtin(subgroup_size) sg_size: u32, @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
    let row = workgroup_index(wg, nwg);
    let live = row < p.rows;
    let base = row * p.dim;
    var rstd = 0.0;
    var dot = 0.0;
    if (live) {
        rstd = rstd_in[row];
        for (var j = lid; j < p.dim; j += WG) {
            dot += sum_elem(dy_in[base + j] * weight[j] * x_in[base + j]);
        }
    }
    // mean(g * xhat) = rstd * mean(dy * w * x)
    let c = wg_sum(dot, sg) * rstd / f32(p.n);
    if (live) {
        for (var j = lid; j < p.dim; j += WG) {
            let xhat = x_in[base + j] * rstd;
            let d = rstd * (dy_in[base + j] * weight[j] - xhat * c);
            if (p.mode == 1u) { dx_out[base + j] = dx_out[base + j] + d; } else { dx_out[base + j] = d; }
        }
    }
}

// --- KERNEL: rmsnorm_backward_vec4 ---
alias Elem = vec4<f32>;
@group(0) @binding(0) var<storage, read> x_in: array<Elem>;
@group(0) @binding(1) var<storage, read> weight: array<Elem>;
@group(0) @binding(2) var<storage, read> dy_in: array<Elem>;
@group(0) @binding(3) var<storage, read> rstd_in: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx_out: array<Elem>;
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn rmsnorm_backward_vec4(@builtin(workgroup_id) wg: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>,
                         @builtin(local_invocation_index) lid: u32,
                         @builtin(subgroup_id) sg_id: u32,
                         @builtin(subgroup_invocation_id) lane: u32,
                         @builtin(subgroup_size) sg_size: u32,
                         @builtin(num_subgroups) num_sg: u32) {
    let sg = Subgroup(sg_id, lane, sg_size, num_sg);
    let row = workgroup_index(wg, nwg);
    let live = row < p.rows;
    let base = row * p.dim;
    var rstd = 0.0;
    var dot = 0.0;
    if (live) {
        rstd = rstd_in[row];
        for (var j = lid; j < p.dim; j += WG) {
            dot += sum_elem4(dy_in[base + j] * weight[j] * x_in[base + j]);
        }
    }
    let c = wg_sum(dot, sg) * rstd / f32(p.n);
    if (live) {
        for (var j = lid; j < p.dim; j += WG) {
            let xhat = x_in[base + j] * rstd;
            let d = rstd * (dy_in[base + j] * weight[j] - xhat * c);
            if (p.mode == 1u) { dx_out[base + j] = dx_out[base + j] + d; } else { dx_out[base + j] = d; }
        }
    }
}

// --- KERNEL: rmsnorm_dw_partial ---
@group(0) @binding(0) var<storage, read> x_in: array<f32>;
@group(0) @binding(1) var<storage, read> dy_in: array<f32>;
@group(0) @binding(2) var<storage, read> rstd_in: array<f32>;
@group(0) @binding(3) var<storage, read_write> part: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(CW)
fn rmsnorm_dw_partial(@builtin(workgroup_id) wg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let j = wg.x * CW + lid;
    let block = wg.y;
    if (j >= p.n) { return; }
    let first = block * p.mode;               // mode = RB rows per block
    let last = min(first + p.mode, p.rows);
    var acc = 0.0;
    for (var r = first; r < last; r++) {
        acc += dy_in[r * p.n + j] * x_in[r * p.n + j] * rstd_in[r];
    }
    part[block * p.n + j] = acc;
}

// --- KERNEL: rmsnorm_dw_reduce ---
@group(0) @binding(0) var<storage, read> part: array<f32>;
@group(0) @binding(1) var<storage, read_write> dw: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(CW)
fn rmsnorm_dw_reduce(@builtin(workgroup_id) wg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let j = wg.x * CW + lid;
    if (j >= p.n) { return; }
    var acc = 0.0;
    for (var b = 0u; b < p.mode; b++) {       // mode = number of blocks
        acc += part[b * p.n + j];
    }
    dw[j] = dw[j] + acc;
}
