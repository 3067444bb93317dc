// roofline_sgmat.wgsl — the subgroup-matrix (tensor-core) ceiling: multiply-accumulates on
// operands that stay in registers, for a device with the `subgroup-matrix` feature (Dawn's
// chromium-experimental-subgroup-matrix; the engine writes its enable line).
//
//   sgmat_f16_f32_16x16x16   f16 x f16 -> f32, M = N = K = 16: each subgroup loads one left
//                            and one right matrix from workgroup memory, then runs ITERS
//                            steps of 8 independent accumulators (latency hidden), and
//                            stores them so the compiler keeps the work.
//
// Only for an adapter that lists an f16 -> f32 16x16x16 configuration (ladder.py checks).
// The matrix operations' arguments are subgroup-uniform (tile offsets from subgroup_id).
// FLOPs = workgroups * subgroups per workgroup * ITERS * 8 * 2 * 16 * 16 * 16.
// Bindings: 0 out (read_write, 8 * 256 f32 per subgroup of a workgroup; every workgroup
// writes the same values to the same place). Dispatch: 128 invocations per workgroup.

// --- KERNEL: sgmat_f16_f32_16x16x16 ---
override ITERS: u32 = 1024u;
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
var<workgroup> tile: array<f16, 256>;

@compute @workgroup_size(128)
fn sgmat_f16_f32_16x16x16(@builtin(local_invocation_index) lid: u32,
                          @builtin(subgroup_id) sg: u32) {
    for (var i = lid; i < 256u; i += 128u) {
        tile[i] = f16(f32(i % 7u) * 0.001);   // small: 8 * ITERS steps stay finite
    }
    workgroupBarrier();
    let a = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&tile, 0u, false, 16u);
    let b = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&tile, 0u, false, 16u);
    var c0 = subgroup_matrix_result<f32, 16, 16>();
    var c1 = subgroup_matrix_result<f32, 16, 16>();
    var c2 = subgroup_matrix_result<f32, 16, 16>();
    var c3 = subgroup_matrix_result<f32, 16, 16>();
    var c4 = subgroup_matrix_result<f32, 16, 16>();
    var c5 = subgroup_matrix_result<f32, 16, 16>();
    var c6 = subgroup_matrix_result<f32, 16, 16>();
    var c7 = subgroup_matrix_result<f32, 16, 16>();
    for (var i = 0u; i < ITERS; i++) {
        c0 = subgroupMatrixMultiplyAccumulate(a, b, c0);
        c1 = subgroupMatrixMultiplyAccumulate(a, b, c1);
        c2 = subgroupMatrixMultiplyAccumulate(a, b, c2);
        c3 = subgroupMatrixMultiplyAccumulate(a, b, c3);
        c4 = subgroupMatrixMultiplyAccumulate(a, b, c4);
        c5 = subgroupMatrixMultiplyAccumulate(a, b, c5);
        c6 = subgroupMatrixMultiplyAccumulate(a, b, c6);
        c7 = subgroupMatrixMultiplyAccumulate(a, b, c7);
    }
    let base = sg * 2048u;
    subgroupMatrixStore(&out, base, c0, false, 16u);
    subgroupMatrixStore(&out, base + 256u, c1, false, 16u);
    subgroupMatrixStore(&out, base + 512u, c2, false, 16u);
    subgroupMatrixStore(&out, base + 768u, c3, false, 16u);
    subgroupMatrixStore(&out, base + 1024u, c4, false, 16u);
    subgroupMatrixStore(&out, base + 1280u, c5, false, 16u);
    subgroupMatrixStore(&out, base + 1536u, c6, false, 16u);
    subgroupMatrixStore(&out, base + 1792u, c7, false, 16u);
}
