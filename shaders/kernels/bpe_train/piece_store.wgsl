// piece_store.wgsl — the corpus's unique pieces, kept on the device from chunk to chunk.
// piece_count.wgsl finds the unique pieces of one chunk (start, length, count in `found`);
// store_pieces adds them to a store that lives for the whole corpus, so only the store comes
// back to the host, once, at the end (piece_store.py). The reference
// is reference.py:piece_store_reference.
//
// The store:
//   slots[h]      open-addressing table (linear probing): record index + 1, 0 = empty
//   records[r]       (first arena word, length in bytes) of record r; length 0: a hole (a record
//                 reserved by an insert that lost its slot to a spurious compare-exchange
//                 failure and then found its piece elsewhere)
//   counts[2r..]  64-bit occurrences of record r (lo, hi; atomics with carry)
//   arena[w]      the records' bytes, 4 per word little-endian, each record word-aligned
//   info[]        [0] records used, [1] arena words used, [2] records before this dispatch
//
// Exactness without ordering between invocations: the pieces of one call are distinct (one
// chunk's unique list), so an invocation that meets a record made in this same dispatch
// (index >= info[2], its bytes perhaps not written yet) knows it holds another piece and
// probes on; records from earlier dispatches are compared byte by byte. The host grows the
// store before a call so that it cannot fill up during one (records, arena words, table at
// most half full).
//
//   store_begin    info[2] = info[0]                                   [1 workgroup of 1]
//   store_pieces   one invocation per found piece                      [ceil(n_found / 64)]
//   store_rehash   one invocation per record: re-insert into a fresh (zeroed) larger table
//                                                                      [ceil(records / 64)]
// Bindings (group 0) of store_pieces and store_rehash:
//   0 text    array<u32>          read  the chunk's bytes (store_rehash: unused)
//   1 found   array<u32>          read  the chunk's unique pieces: start, length, count
//   2 slots   array<atomic<u32>>  rw
//   3 records array<vec2<u32>>    rw
//   4 counts  array<atomic<u32>>  rw
//   5 arena   array<u32>          rw
//   6 info    array<atomic<u32>>  rw
//   7 p       uniform Params

const WG: u32 = 64u;
const FNV_OFFSET: u32 = 2166136261u;
const FNV_PRIME: u32 = 16777619u;
const NONE: u32 = 0xffffffffu;

struct Params {
    n_found: u32,   // pieces in `found` (store_pieces) or records (store_rehash)
    mask: u32,      // slots - 1
    unused0: u32,
    unused1: u32,
}

fn mix(h: u32, byte: u32) -> u32 {
    return (h ^ byte) * FNV_PRIME;
}

// --- KERNEL: store_begin ---
@group(0) @binding(0) var<storage, read_write> info: array<atomic<u32>>;

@compute @workgroup_size(1)
fn store_begin() {
    atomicStore(&info[2], atomicLoad(&info[0]));
}

// --- KERNEL: store_pieces ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> found: array<u32>;
@group(0) @binding(2) var<storage, read_write> slots: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> records: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> counts: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read_write> arena: array<u32>;
@group(0) @binding(6) var<storage, read_write> info: array<atomic<u32>>;
@group(0) @binding(7) var<uniform> p: Params;

fn text_byte(i: u32) -> u32 {
    return (text[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

fn arena_byte(w: u32, k: u32) -> u32 {
    return (arena[w + (k >> 2u)] >> ((k & 3u) * 8u)) & 0xffu;
}

// Does record r (from an earlier dispatch) hold the n bytes at text[s..]?
fn same_as_record(r: u32, s: u32, n: u32) -> bool {
    let m = records[r];
    if (m.y != n) { return false; }
    for (var k = 0u; k < n; k += 1u) {
        if (arena_byte(m.x, k) != text_byte(s + k)) { return false; }
    }
    return true;
}

// Put v into the empty slot h: 0 when done, else the record + 1 that got there first.
fn claim(h: u32, v: u32) -> u32 {
    var first = 0u;
    loop {  // a weak compare-exchange may fail spuriously on an empty slot: retry it
        let got = atomicCompareExchangeWeak(&slots[h], 0u, v);
        if (got.exchanged) { break; }
        if (got.old_value != 0u) {
            first = got.old_value;
            break;
        }
    }
    return first;
}

fn add_count(r: u32, c: u32) {
    let old = atomicAdd(&counts[2u * r], c);
    if (old + c < old) { atomicAdd(&counts[2u * r + 1u], 1u); }
}

@compute @workgroup_size(64)
fn store_pieces(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let t = workgroup_index(wg, nwg) * WG + lid;
    if (t >= p.n_found) { return; }
    let s = found[3u * t];
    let n = found[3u * t + 1u];
    let c = found[3u * t + 2u];
    var h = FNV_OFFSET;
    for (var k = 0u; k < n; k += 1u) { h = mix(h, text_byte(s + k)); }
    h &= p.mask;
    let base = atomicLoad(&info[2]);
    var mine = NONE;  // the record this invocation reserved, once it met an empty slot
    for (var probe = 0u; probe <= p.mask; probe += 1u) {
        var owner = atomicLoad(&slots[h]);
        if (owner == 0u) {
            if (mine == NONE) { mine = atomicAdd(&info[0], 1u); }
            owner = claim(h, mine + 1u);
            if (owner == 0u) {
                let words = (n + 3u) / 4u;
                let w = atomicAdd(&info[1], words);
                for (var j = 0u; j < words; j += 1u) {
                    var word = 0u;
                    for (var b = 0u; b < 4u; b += 1u) {
                        let k = 4u * j + b;
                        if (k < n) { word |= text_byte(s + k) << (8u * b); }
                    }
                    arena[w + j] = word;
                }
                records[mine] = vec2<u32>(w, n);
                atomicStore(&counts[2u * mine], c);
                return;
            }
        }
        let r = owner - 1u;
        if (r < base && same_as_record(r, s, n)) {
            add_count(r, c);
            return;
        }
        h = (h + 1u) & p.mask;
    }
}

// --- KERNEL: store_rehash ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> found: array<u32>;
@group(0) @binding(2) var<storage, read_write> slots: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> records: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> counts: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read_write> arena: array<u32>;
@group(0) @binding(6) var<storage, read_write> info: array<atomic<u32>>;
@group(0) @binding(7) var<uniform> p: Params;

fn touch_all() {
    _ = &text; _ = &found; _ = &counts; _ = &info;
}

@compute @workgroup_size(64)
fn store_rehash(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let r = workgroup_index(wg, nwg) * WG + lid;
    if (r >= p.n_found) { return; }
    let m = records[r];
    if (m.y == 0u) { return; }  // a hole
    var h = FNV_OFFSET;
    for (var k = 0u; k < m.y; k += 1u) {
        h = mix(h, (arena[m.x + (k >> 2u)] >> ((k & 3u) * 8u)) & 0xffu);
    }
    h &= p.mask;
    for (var probe = 0u; probe <= p.mask; probe += 1u) {
        loop {  // a weak compare-exchange may fail spuriously on an empty slot: retry it
            let got = atomicCompareExchangeWeak(&slots[h], 0u, r + 1u);
            if (got.exchanged) { return; }
            if (got.old_value != 0u) { break; }
        }
        h = (h + 1u) & p.mask;
    }
}
