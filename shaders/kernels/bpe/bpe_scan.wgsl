// bpe_scan.wgsl — exclusive prefix sum of u32 values (token flags, token lengths), any length.
//
//   scan_blocks  dst[i] = sum of value(j) for j < i within i's block of BLOCK = 1024 elements;
//                sums[block] = the block's total. value(j) = src[j] (MODE 0) or
//                (src[j] != NONE) (MODE 1: "a token starts here"), and 0 for j >= n_src, so
//                scanning n_out = n_src + 1 elements leaves the grand total in dst[n_src].
//   scan_add     dst[i] += sums[block of i] (sums already scanned): the blocks' offsets.
//
// The driver (shaders/kernels/bpe/scan.py) scans `sums` recursively with the same two kernels
// until one block remains. Sums are u32: totals must stay below 2^32.
//
// Bindings (group 0), the same for both kernels:
//   0 src   array<u32>  read
//   1 dst   array<u32>  rw
//   2 sums  array<u32>  rw
//   3 p     uniform Params
// Dispatch: 256 invocations per workgroup, 4 consecutive elements each, one workgroup per
// block (ceil(n_out / 1024) workgroups, folded into 2-D by the engine when large).
// The in-block scan is a Hillis-Steele scan over the 256 per-invocation sums in workgroup
// memory (no subgroup size assumed).

const NONE: u32 = 0xffffffffu;
const SCAN_WG: u32 = 256u;
const ITEMS: u32 = 4u;
const BLOCK: u32 = 1024u;

override MODE: u32 = 0u;

struct Params {
    n_src: u32,
    n_out: u32,
    _a: u32,
    _b: u32,
}

var<workgroup> part: array<u32, 512>;

fn touch_all() {
    _ = &src; _ = &dst; _ = &sums; _ = &p;
}

fn value(j: u32) -> u32 {
    if (j >= p.n_src) { return 0u; }
    let v = src[j];
    if (MODE == 1u) { return select(0u, 1u, v != NONE); }
    return v;
}

// --- KERNEL: scan_blocks ---
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<storage, read_write> sums: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn scan_blocks(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let block = workgroup_index(wg, nwg);
    let base = block * BLOCK + lid * ITEMS;
    var v: array<u32, 4>;
    var total = 0u;
    for (var k = 0u; k < ITEMS; k += 1u) {
        v[k] = value(base + k);
        total += v[k];
    }
    // inclusive scan of the per-invocation totals, double-buffered in `part`
    var src_half = 0u;
    part[lid] = total;
    workgroupBarrier();
    for (var step = 1u; step < SCAN_WG; step *= 2u) {
        var x = part[src_half + lid];
        if (lid >= step) { x += part[src_half + lid - step]; }
        part[(SCAN_WG - src_half) + lid] = x;
        src_half = SCAN_WG - src_half;
        workgroupBarrier();
    }
    let inclusive = part[src_half + lid];
    var run = inclusive - total;
    for (var k = 0u; k < ITEMS; k += 1u) {
        if (base + k < p.n_out) { dst[base + k] = run; }
        run += v[k];
    }
    if (lid == SCAN_WG - 1u) { sums[block] = inclusive; }
}

// --- KERNEL: scan_add ---
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<storage, read_write> sums: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(256)
fn scan_add(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let block = workgroup_index(wg, nwg);
    let add = sums[block];
    let base = block * BLOCK + lid * ITEMS;
    for (var k = 0u; k < ITEMS; k += 1u) {
        if (base + k < p.n_out) { dst[base + k] += add; }
    }
}
