// bpe_decode.wgsl — token ids back to bytes: a length pass, a prefix sum, a gather.
//
//   dec_lengths  lens[t] = byte length of token ids[t]; an id outside the table or a hole
//                (length 0) gives 0 and atomicMin(status[0], t): the first bad position.
//   (bpe_scan.wgsl turns lens into offs, n_ids + 1 exclusive offsets)
//   dec_gather   per token t: every output word whose first byte lies in the token's
//                bytes [offs[t], offs[t+1]) is assembled from this and the following
//                tokens and written whole (no two invocations write the same word).
//   dec_total    status[1] = offs[n_ids] (one invocation), so one read brings both values.
//   dec_bounds   per document of a batch: the byte offset of its first token.
//
// Bindings (group 0), the same for both kernels:
//   0 ids     array<u32>         read   one id per word, or two (p.ids16: low half first)
//   1 vocab   array<u32>         read   the encoder's table (tok_info and token bytes)
//   2 offs    array<u32>         read   n_ids + 1 byte offsets (dec_gather)
//   3 lens    array<u32>         rw     n_ids (dec_lengths)
//   4 out     array<u32>         rw     bytes, 4 per word, little-endian (dec_gather)
//   5 status  array<atomic<u32>> rw     [0] first invalid position (NONE if all valid),
//                                        [1] total bytes
//   6 p       uniform Params
// Dispatch: 256 invocations per workgroup, one per token, ceil(n_ids / 256) workgroups.

const NONE: u32 = 0xffffffffu;

struct Params {
    n_ids: u32,
    n_table: u32,
    info_off: u32,
    bytes_off: u32,
    n_out: u32,     // bytes `out` holds (the gather writes no further)
    ids16: u32,     // 1: ids packed two per word (vocabularies of at most 65,535 ids)
    _b: u32,
    _c: u32,
}

fn touch_all() {
    _ = &ids; _ = &vocab; _ = &offs; _ = &lens; _ = &out; _ = &status; _ = &p;
}

fn token_id(t: u32) -> u32 {   // id of token t, read from one word or half of one
    if (p.ids16 != 0u) { return (ids[t >> 1u] >> ((t & 1u) * 16u)) & 0xffffu; }
    return ids[t];
}

fn token_byte(t: u32, k: u32) -> u32 {   // byte k of token t
    let id = token_id(t);
    let b = vocab[p.info_off + 2u * id] + k;
    return (vocab[p.bytes_off + (b >> 2u)] >> ((b & 3u) * 8u)) & 0xffu;
}

// --- KERNEL: dec_lengths ---
@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read> vocab: array<u32>;
@group(0) @binding(2) var<storage, read> offs: array<u32>;
@group(0) @binding(3) var<storage, read_write> lens: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<storage, read_write> status: array<atomic<u32>>;
@group(0) @binding(6) var<uniform> p: Params;

@compute @workgroup_size(256)
fn dec_lengths(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let t = workgroup_index(wg, nwg) * 256u + lid;
    if (t >= p.n_ids) { return; }
    let id = token_id(t);
    var len = 0u;
    if (id < p.n_table) { len = vocab[p.info_off + 2u * id + 1u]; }
    if (len == 0u) { atomicMin(&status[0], t); }
    lens[t] = len;
}

// --- KERNEL: dec_gather ---
@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read> vocab: array<u32>;
@group(0) @binding(2) var<storage, read> offs: array<u32>;
@group(0) @binding(3) var<storage, read_write> lens: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<storage, read_write> status: array<atomic<u32>>;
@group(0) @binding(6) var<uniform> p: Params;

@compute @workgroup_size(256)
fn dec_gather(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let t = workgroup_index(wg, nwg) * 256u + lid;
    if (t >= p.n_ids) { return; }
    let lo = offs[t];
    let hi = offs[t + 1u];
    // bytes past the last token or past `out` (sized by the driver's guess, possibly short:
    // it then gathers again) are not written
    let limit = min(p.n_out, offs[p.n_ids]);
    // first word whose first byte is inside this token
    for (var w = (lo + 3u) / 4u; 4u * w < min(hi, limit); w += 1u) {
        var word = 0u;
        var tt = t;
        var tok_end = hi;
        for (var k = 0u; k < 4u; k += 1u) {
            let b = 4u * w + k;
            if (b >= limit) { break; }
            while (b >= tok_end) {
                tt += 1u;
                tok_end = offs[tt + 1u];
            }
            word |= token_byte(tt, b - offs[tt]) << (8u * k);
        }
        out[w] = word;
    }
}

// --- KERNEL: dec_total ---
@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read> vocab: array<u32>;
@group(0) @binding(2) var<storage, read> offs: array<u32>;
@group(0) @binding(3) var<storage, read_write> lens: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<storage, read_write> status: array<atomic<u32>>;
@group(0) @binding(6) var<uniform> p: Params;

// status[1] = offs[n_ids], the total byte count (one invocation), so one read brings both.
@compute @workgroup_size(1)
fn dec_total() {
    touch_all();
    atomicStore(&status[1], offs[p.n_ids]);
}

// --- KERNEL: dec_bounds ---
@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read> vocab: array<u32>;
@group(0) @binding(2) var<storage, read> offs: array<u32>;
@group(0) @binding(3) var<storage, read_write> lens: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<storage, read_write> status: array<atomic<u32>>;
@group(0) @binding(6) var<uniform> p: Params;

// Byte offsets of documents: lens[d] = offs[ids[d]] for d < p.n_ids, where `ids` holds the
// documents' first token positions (n_docs + 1 of them) and `offs` the tokens' byte offsets
// of the main pass, so a batch learns where each document's bytes start without reading the
// per-token offsets back. Bound to those buffers, not the main pass's ids and lens.
@compute @workgroup_size(256)
fn dec_bounds(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let d = workgroup_index(wg, nwg) * 256u + lid;
    if (d < p.n_ids) { lens[d] = offs[ids[d]]; }
}
