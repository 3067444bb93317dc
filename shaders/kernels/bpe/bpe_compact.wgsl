// bpe_compact.wgsl — token ids out of the per-byte buffer, and each document's first token.
//
//   bpe_compact   for i < n_bytes with tok_buf[i] != NONE: ids[excl[i]] = tok_buf[i];
//                 for d <= n_docs: doc_off[d] = excl[starts[d]] (excl[n_bytes] = total), so
//                 document d's ids are ids[doc_off[d] .. doc_off[d + 1]].
// `excl` is the exclusive prefix sum of (tok_buf != NONE) over n_bytes + 1 positions
// (bpe_scan.wgsl, MODE 1).
//
// Bindings (group 0):
//   0 tok_buf  array<u32>  read   per byte: token id or NONE
//   1 excl     array<u32>  read   n_bytes + 1
//   2 starts   array<u32>  read   n_docs + 1 document starts
//   3 ids      array<u32>  rw     the compacted ids
//   4 doc_off  array<u32>  rw     n_docs + 1
//   5 p        uniform Params
// Dispatch: 256 invocations per workgroup, one per byte (and per document start),
// ceil(max(n_bytes, n_docs + 1) / 256) workgroups.

const NONE: u32 = 0xffffffffu;

struct Params {
    n_bytes: u32,
    n_docs: u32,
    _a: u32,
    _b: u32,
}

// --- KERNEL: bpe_compact ---
@group(0) @binding(0) var<storage, read> tok_buf: array<u32>;
@group(0) @binding(1) var<storage, read> excl: array<u32>;
@group(0) @binding(2) var<storage, read> starts: array<u32>;
@group(0) @binding(3) var<storage, read_write> ids: array<u32>;
@group(0) @binding(4) var<storage, read_write> doc_off: array<u32>;
@group(0) @binding(5) var<uniform> p: Params;

@compute @workgroup_size(256)
fn bpe_compact(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = workgroup_index(wg, nwg) * 256u + lid;
    if (i < p.n_bytes) {
        let t = tok_buf[i];
        if (t != NONE) { ids[excl[i]] = t; }
    }
    if (i <= p.n_docs) { doc_off[i] = excl[starts[i]]; }
}
