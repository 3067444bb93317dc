// bpe_compact.wgsl — token ids out of the per-byte buffer, each document's first token, and
// the encoder's counters, laid out in one buffer exactly as the host reads them back (one
// copy into the staging buffer instead of three).
//
//   bpe_compact       for i < n_bytes with tok_buf[i] != NONE: out[ids_at + excl[i]] = tok_buf[i];
//                     for d <= n_docs: out[COUNTERS + d] = excl[starts[d]] (excl[n_bytes] =
//                     total), so document d's ids are those from out[COUNTERS + d] to
//                     out[COUNTERS + d + 1]; out[0 .. COUNTERS] = counters.
//   bpe_scan_compact  the same for a call of at most SMALL_BYTES bytes in ONE workgroup, the
//                     exclusive scan of (tok_buf != NONE) included (it writes `excl` itself):
//                     one dispatch instead of bpe_scan's and bpe_compact's, what a lone small
//                     request waits for (each dispatch costs it ~10-25 us, more at the GPU's
//                     idle clock).
// `excl` is the exclusive prefix sum of (tok_buf != NONE) over n_bytes + 1 positions
// (bpe_scan.wgsl, MODE 1); ids_at = COUNTERS + n_docs + 1.
//
// Bindings (group 0):
//   0 tok_buf   array<u32>  read   per byte: token id or NONE
//   1 excl      array<u32>  read (bpe_compact) / rw (bpe_scan_compact)   n_bytes + 1
//   2 starts    array<u32>  read   n_docs + 1 document starts
//   3 counters  array<u32>  read   the encoder's COUNTERS words
//   4 out       array<u32>  rw     counters, document offsets, ids
//   5 p         uniform Params
// Dispatch: bpe_compact 256 invocations per workgroup, one per byte (and per document
// start), ceil(max(n_bytes, n_docs + 1) / 256) workgroups; bpe_scan_compact one workgroup.

const NONE: u32 = 0xffffffffu;
const COUNTERS: u32 = 8u;
const WG: u32 = 256u;
const SMALL_ITEMS: u32 = 16u;
const SMALL_BYTES: u32 = WG * SMALL_ITEMS - 1u;   // n_bytes + 1 scanned positions fit

struct Params {
    n_bytes: u32,
    n_docs: u32,
    _a: u32,
    _b: u32,
}

var<workgroup> part: array<u32, 512>;

// --- KERNEL: bpe_compact ---
@group(0) @binding(0) var<storage, read> tok_buf: array<u32>;
@group(0) @binding(1) var<storage, read> excl: array<u32>;
@group(0) @binding(2) var<storage, read> starts: array<u32>;
@group(0) @binding(3) var<storage, read> counters: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(256)
fn bpe_compact(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = workgroup_index(wg, nwg) * WG + lid;
    let ids_at = COUNTERS + p.n_docs + 1u;
    if (i < p.n_bytes) {
        let t = tok_buf[i];
        if (t != NONE) { out[ids_at + excl[i]] = t; }
    }
    if (i <= p.n_docs) { out[COUNTERS + i] = excl[starts[i]]; }
    if (i < COUNTERS) { out[i] = counters[i]; }
}

// --- KERNEL: bpe_scan_compact ---
@group(0) @binding(0) var<storage, read> tok_buf: array<u32>;
@group(0) @binding(1) var<storage, read_write> excl: array<u32>;
@group(0) @binding(2) var<storage, read> starts: array<u32>;
@group(0) @binding(3) var<storage, read> counters: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(256)
fn bpe_scan_compact(@builtin(local_invocation_index) lid: u32) {
    // the scan: SMALL_ITEMS consecutive positions per invocation, a Hillis-Steele scan of
    // the invocations' totals in workgroup memory (as bpe_scan.wgsl's blocks)
    let base = lid * SMALL_ITEMS;
    var flags = 0u;   // bit k: a token starts at base + k
    var total = 0u;
    for (var k = 0u; k < SMALL_ITEMS; k += 1u) {
        let j = base + k;
        if (j < p.n_bytes && tok_buf[j] != NONE) {
            flags |= 1u << k;
            total += 1u;
        }
    }
    var half = 0u;
    part[lid] = total;
    workgroupBarrier();
    for (var step = 1u; step < WG; step *= 2u) {
        var x = part[half + lid];
        if (lid >= step) { x += part[half + lid - step]; }
        part[(WG - half) + lid] = x;
        half = WG - half;
        workgroupBarrier();
    }
    var run = part[half + lid] - total;
    let ids_at = COUNTERS + p.n_docs + 1u;
    for (var k = 0u; k < SMALL_ITEMS; k += 1u) {
        let j = base + k;
        if (j <= p.n_bytes) { excl[j] = run; }
        if ((flags & (1u << k)) != 0u) {
            out[ids_at + run] = tok_buf[j];
            run += 1u;
        }
    }
    // every invocation's excl writes, visible to the whole workgroup
    storageBarrier();
    workgroupBarrier();
    for (var d = lid; d <= p.n_docs; d += WG) { out[COUNTERS + d] = excl[starts[d]]; }
    if (lid < COUNTERS) { out[lid] = counters[lid]; }
}
