// piece_count.wgsl — count the unique pre-tokenized pieces of a text on the device, exactly.
// Input: the text and, per byte, the length of the piece that starts there (NONE elsewhere),
// as bpe_encode.wgsl's bpe_pretok writes it with MARK_PIECES = 1. The host side is
// piece_count.py; the reference is reference.py:piece_count_reference.
//
//   count_pieces   one invocation per byte before p.n_bytes that starts a piece: FNV-1a hash of its bytes, then
//                  linear probing in `slots`, an open-addressing table holding the start + 1
//                  of the piece's first representative (0 = empty; claimed by compare-exchange).
//                  A slot matches only when the representative has the same length and the
//                  same bytes (compared byte by byte: collisions never merge two pieces), and
//                  its counter goes up by one. Pieces longer than LONG_MIN bytes are listed in
//                  `longs` for the host to count (bounded loops on every device). A table with
//                  no free slot left sets info[1]; the host retries with a larger one.
//   list_pieces    one invocation per slot: each used slot appends (start, length, count).
//
// Bindings (group 0):
//   0 text    array<u32>          read  the bytes, 4 per word, little-endian
//   1 lens    array<u32>          read  per byte: length of the piece starting there, or NONE
//   2 slots   array<atomic<u32>>  rw    the table (power-of-two size, mask = size - 1)
//   3 counts  array<atomic<u32>>  rw    occurrences per slot (< 2^32: one text is < 4 GiB)
//   4 out     array<u32>          rw    unique pieces, 3 words each: start, length, count
//   5 longs   array<vec2<u32>>    rw    pieces longer than LONG_MIN: (start, length)
//   6 info    array<atomic<u32>>  rw    [0] unique pieces listed, [1] table full, [2] long pieces
//   7 p       uniform Params
// Dispatch: workgroups of 64; count_pieces ceil(n_bytes / 64), list_pieces ceil(slots / 64)
// (folded into 2-D by the engine when large).

const NONE: u32 = 0xffffffffu;
const WG: u32 = 64u;
const LONG_MIN: u32 = 512u;   // must equal LONG_MIN in gpu_corpus.py
const FNV_OFFSET: u32 = 2166136261u;
const FNV_PRIME: u32 = 16777619u;

struct Params {
    n_bytes: u32,   // count the pieces that start before this byte (the rest is context)
    mask: u32,      // slots - 1
    n_slots: u32,
    unused: u32,
}

fn touch_all() {
    _ = &text; _ = &lens; _ = &slots; _ = &counts; _ = &out; _ = &longs; _ = &info; _ = &p;
}

fn byte_at(i: u32) -> u32 {
    return (text[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

fn piece_hash(s: u32, n: u32) -> u32 {
    var h = FNV_OFFSET;
    for (var k = 0u; k < n; k += 1u) {
        h = (h ^ byte_at(s + k)) * FNV_PRIME;
    }
    return h;
}

// Do the pieces at a and b (both of length n) hold the same bytes?
fn same_piece(a: u32, b: u32, n: u32) -> bool {
    if (lens[a] != n) { return false; }
    for (var k = 0u; k < n; k += 1u) {
        if (byte_at(a + k) != byte_at(b + k)) { return false; }
    }
    return true;
}

// --- KERNEL: count_pieces ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> lens: array<u32>;
@group(0) @binding(2) var<storage, read_write> slots: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> counts: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<storage, read_write> longs: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> info: array<atomic<u32>>;
@group(0) @binding(7) var<uniform> p: Params;

@compute @workgroup_size(64)
fn count_pieces(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let i = workgroup_index(wg, nwg) * WG + lid;
    if (i >= p.n_bytes) { return; }
    let n = lens[i];
    if (n == NONE || n == 0u) { return; }
    if (n > LONG_MIN) {
        longs[atomicAdd(&info[2], 1u)] = vec2<u32>(i, n);   // room: n_bytes / (LONG_MIN + 1)
        return;
    }
    var s = piece_hash(i, n) & p.mask;
    var probes = 0u;
    loop {
        if (probes >= p.n_slots) {
            atomicOr(&info[1], 1u);
            return;
        }
        var owner = atomicLoad(&slots[s]);
        if (owner == 0u) {
            let r = atomicCompareExchangeWeak(&slots[s], 0u, i + 1u);
            if (r.exchanged) {
                atomicAdd(&counts[s], 1u);
                return;
            }
            if (r.old_value == 0u) { continue; }   // a spurious failure: try the slot again
            owner = r.old_value;
        }
        if (same_piece(owner - 1u, i, n)) {
            atomicAdd(&counts[s], 1u);
            return;
        }
        s = (s + 1u) & p.mask;
        probes += 1u;
    }
}

// --- KERNEL: list_pieces ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> lens: array<u32>;
@group(0) @binding(2) var<storage, read_write> slots: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> counts: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> out: array<u32>;
@group(0) @binding(5) var<storage, read_write> longs: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> info: array<atomic<u32>>;
@group(0) @binding(7) var<uniform> p: Params;

@compute @workgroup_size(64)
fn list_pieces(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let s = workgroup_index(wg, nwg) * WG + lid;
    if (s >= p.n_slots) { return; }
    let owner = atomicLoad(&slots[s]);
    if (owner == 0u) { return; }
    let k = atomicAdd(&info[0], 1u);
    out[3u * k] = owner - 1u;
    out[3u * k + 1u] = lens[owner - 1u];
    out[3u * k + 2u] = atomicLoad(&counts[s]);
}
