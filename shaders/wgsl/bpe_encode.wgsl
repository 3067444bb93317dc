// bpe_encode.wgsl — exact byte-level BPE encoding on the GPU (tiktoken's semantics).
//
// Output: tok_buf[i] = id of the token that starts at byte i of the input, NONE elsewhere;
// bpe_compact.wgsl then compacts it into ids. The reference is tokenizer_svc/reference.py.
//
//   bpe_fill_none     tok_buf[i] = NONE for i < n_bytes                     (one per byte)
//   bpe_cuts          cuts[c] = first provable piece boundary in chunk c, or NONE   (one per chunk)
//   bpe_pretok        per chunk with a cut: pre-tokenize [cut, next cut) with the PATTERN's
//                     rules, BPE every piece of <= SHORT_MAX bytes, queue longer ones (one per chunk)
//   bpe_merge_pieces  per piece made on the CPU ([starts[i], starts[i+1])): BPE or queue
//   bpe_merge_long    per queued long piece: BPE with a binary heap in `scratch` (grid-stride)
//
// Bindings (group 0), the same for every kernel of this file (each kernel calls touch_all()):
//   0 text      array<u32>        read   input bytes, 4 per word, little-endian
//   1 starts    array<u32>        read   document starts, n_starts + 1 entries (last = n_bytes);
//                                        for bpe_merge_pieces: piece starts
//   2 classes   array<u32>        read   Unicode classes: stage 1 (4352 words), then stage 2
//   3 vocab     array<u32>        read   byte_tok[256] | tok_info (offset, length) per id |
//                                        token bytes | piece slots (FNV-1a hash, id)
//   4 pairs     array<vec4<u32>>  read   (left, right) -> (priority, merged id) hash table
//   5 cuts      array<u32>        rw     one per chunk
//   6 tok_buf   array<u32>        rw     one per input byte
//   7 longs     array<vec4<u32>>  rw     queued long pieces: (start, length, scratch base, 0)
//   8 scratch   array<u32>        rw     4 words per byte of queued long pieces
//   9 counters  array<atomic<u32>> rw    [0] long pieces, [1] long bytes, [2] boundary overruns
//  10 p         uniform Params
// Dispatch: workgroups of 64 invocations, one invocation per byte / chunk / piece as listed,
// over ceil(count / 64) workgroups (folded into 2-D by the engine when large).
//
// Why chunks can be processed independently: a segment starts only at a position p that is
// provably the start of a piece, so the pieces found from p on are the ones a sequential
// matcher from the document start would find (no pattern looks behind). `is_cut` proves it:
// the code point before p is a letter (\p{L}) and the code point at p is not a letter (gpt2,
// cl100k), resp. neither a letter, a mark nor an apostrophe (o200k). Every alternative that
// can contain a letter — gpt2 ` ?\p{L}++` and the contractions; cl100k
// `[^\r\n\p{L}\p{N}]?+\p{L}++` and the contractions; o200k's two letter alternatives
// `P?[Lu Lt Lm Lo M]*[Ll Lm Lo M]+C?` / `P?[..]+[..]*C?`, where C starts with an apostrophe —
// can only continue past a letter with a letter (resp. a letter, a mark or `'`), and no other
// alternative contains a letter at all (letters, digits, whitespace are disjoint classes). So
// the piece containing the letter before p ends exactly at p. Document starts are cuts too.
// A segment's invocation checks that its last piece ends exactly at the next cut and counts
// an overrun otherwise (the driver treats any overrun as an internal error).

const NONE: u32 = 0xffffffffu;
const SHORT_MAX: u32 = 64u;   // pieces up to this many bytes are merged in registers
const WG: u32 = 64u;
const STAGE1_WORDS: u32 = 4352u;

// Unicode class bits (tokenizer_svc/unicode_table.py BIT_*), plus END for "no character".
const CL_L: u32 = 1u;
const CL_N: u32 = 2u;
const CL_S: u32 = 4u;
const CL_M: u32 = 8u;
const CL_UP: u32 = 16u;   // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
const CL_LO: u32 = 32u;   // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
const CL_END: u32 = 128u;

override PATTERN: u32 = 0u;   // 0 gpt2/r50k, 1 cl100k, 2 o200k

struct Params {
    n_bytes: u32,
    n_starts: u32,     // documents (or pieces for bpe_merge_pieces)
    n_chunks: u32,
    chunk: u32,        // bytes per chunk
    info_off: u32,     // word offsets into `vocab`
    bytes_off: u32,
    piece_off: u32,
    piece_mask: u32,
    pair_mask: u32,
    max_tok_len: u32,
    whole_piece: u32,  // 1: a piece that is itself a token is that token (tiktoken)
    _pad: u32,
}

struct Ch {
    cp: u32,
    len: u32,
    cls: u32,
}

struct WsRun {
    stop: u32,      // first byte after the run
    last: u32,      // start of the run's last character
    crlf_end: u32,  // one past the run's last \r or \n, NONE if none
    count: u32,     // characters in the run
}

var<private> heap_size: u32;
var<private> h_pri: u32;   // word offsets of the current long piece's arrays in `scratch`
var<private> h_heap: u32;
var<private> h_idx: u32;

fn touch_all() {
    _ = &text; _ = &starts; _ = &classes; _ = &vocab; _ = &pairs;
    _ = &cuts; _ = &tok_buf; _ = &longs; _ = &scratch; _ = &counters; _ = &p;
}

fn linear_index(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return workgroup_index(wg, nwg) * WG + lid;
}

// ---- text and Unicode classes ------------------------------------------------------------

fn byte_at(i: u32) -> u32 {
    return (text[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

fn class_of(cp: u32) -> u32 {
    let block = classes[min(cp >> 8u, STAGE1_WORDS - 1u)];
    let word = classes[STAGE1_WORDS + block * 64u + ((cp & 255u) >> 2u)];
    return (word >> ((cp & 3u) * 8u)) & 0xffu;
}

// The code point starting at byte i of valid UTF-8, or END at/after `end`.
fn ch_at(i: u32, end: u32) -> Ch {
    if (i >= end) {
        return Ch(NONE, 0u, CL_END);
    }
    let b0 = byte_at(i);
    var cp = b0;
    var len = 1u;
    if (b0 >= 0xf0u) {
        cp = ((b0 & 0x07u) << 18u) | ((byte_at(i + 1u) & 0x3fu) << 12u)
            | ((byte_at(i + 2u) & 0x3fu) << 6u) | (byte_at(i + 3u) & 0x3fu);
        len = 4u;
    } else if (b0 >= 0xe0u) {
        cp = ((b0 & 0x0fu) << 12u) | ((byte_at(i + 1u) & 0x3fu) << 6u) | (byte_at(i + 2u) & 0x3fu);
        len = 3u;
    } else if (b0 >= 0xc0u) {
        cp = ((b0 & 0x1fu) << 6u) | (byte_at(i + 1u) & 0x3fu);
        len = 2u;
    }
    return Ch(cp, len, class_of(cp));
}

// The code point that ends just before byte i (i > start of its document).
fn ch_before(i: u32) -> Ch {
    var j = i - 1u;
    for (var k = 0u; k < 3u; k += 1u) {
        if ((byte_at(j) & 0xc0u) != 0x80u || j == 0u) {
            break;
        }
        j -= 1u;
    }
    return ch_at(j, i);
}

fn is_other(c: Ch) -> bool {   // [^\s\p{L}\p{N}], and not the end
    return (c.cls & (CL_L | CL_N | CL_S | CL_END)) == 0u;
}

fn run_while(i0: u32, end: u32, mask: u32) -> u32 {   // end of the run of chars in `mask`
    var i = i0;
    loop {
        let c = ch_at(i, end);
        if ((c.cls & mask) == 0u) { break; }
        i += c.len;
    }
    return i;
}

fn run_other(i0: u32, end: u32) -> u32 {
    var i = i0;
    loop {
        let c = ch_at(i, end);
        if (!is_other(c)) { break; }
        i += c.len;
    }
    return i;
}

fn run_bytes(i0: u32, end: u32, slash: bool) -> u32 {   // [\r\n]* or [\r\n/]*
    var i = i0;
    loop {
        if (i >= end) { break; }
        let b = byte_at(i);
        if (b != 10u && b != 13u && !(slash && b == 47u)) { break; }
        i += 1u;
    }
    return i;
}

fn ws_run(p0: u32, end: u32) -> WsRun {
    var r = WsRun(p0, p0, NONE, 0u);
    var i = p0;
    loop {
        let c = ch_at(i, end);
        if ((c.cls & CL_S) == 0u) { break; }
        r.last = i;
        if (c.cp == 10u || c.cp == 13u) { r.crlf_end = i + 1u; }
        r.count += 1u;
        i += c.len;
    }
    r.stop = i;
    return r;
}

// Case-insensitive ASCII letter test as tiktoken's regex engine folds it: (?i:s) also
// matches U+017F LATIN SMALL LETTER LONG S (checked against tiktoken by the unicode tests).
fn ci(cp: u32, lower: u32) -> bool {
    return cp == lower || cp == lower - 32u || (lower == 115u && cp == 0x17fu);
}

// ---- the three patterns: each returns the end of the piece that starts at p ---------------

// '(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s
fn match_gpt2(p0: u32, end: u32) -> u32 {
    let c0 = ch_at(p0, end);
    if (c0.cp == 39u) {
        let a = ch_at(p0 + 1u, end).cp;
        if (a == 115u || a == 100u || a == 109u || a == 116u) { return p0 + 2u; }
        if (a == 108u || a == 118u || a == 114u) {
            let b = ch_at(p0 + 2u, end).cp;
            if ((a == 108u && b == 108u) || (a != 108u && b == 101u)) { return p0 + 3u; }
        }
    }
    var q = p0;
    var c = c0;
    if (c0.cp == 32u) {
        let c1 = ch_at(p0 + 1u, end);
        if ((c1.cls & (CL_L | CL_N)) != 0u || is_other(c1)) {
            q = p0 + 1u;
            c = c1;
        }
    }
    if ((c.cls & CL_L) != 0u) { return run_while(q, end, CL_L); }
    if ((c.cls & CL_N) != 0u) { return run_while(q, end, CL_N); }
    if (is_other(c)) { return run_other(q, end); }
    let w = ws_run(p0, end);
    if (w.stop == end) { return end; }           // \s++$
    if (w.count >= 2u) { return w.last; }        // \s+(?!\S): all but the last
    return p0 + c0.len;                          // \s
}

// '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|
// \s++$|\s*[\r\n]|\s+(?!\S)|\s
fn match_cl100k(p0: u32, end: u32) -> u32 {
    let c0 = ch_at(p0, end);
    if (c0.cp == 39u) {
        let c1 = ch_at(p0 + 1u, end);
        if (ci(c1.cp, 115u) || ci(c1.cp, 100u) || ci(c1.cp, 109u) || ci(c1.cp, 116u)) {
            return p0 + 1u + c1.len;
        }
        if (ci(c1.cp, 108u) || ci(c1.cp, 118u) || ci(c1.cp, 114u)) {
            let b = ch_at(p0 + 2u, end).cp;
            if ((ci(c1.cp, 108u) && ci(b, 108u)) || (!ci(c1.cp, 108u) && ci(b, 101u))) {
                return p0 + 3u;
            }
        }
    }
    if ((c0.cls & CL_L) != 0u) { return run_while(p0, end, CL_L); }
    if (c0.cp != 10u && c0.cp != 13u && (c0.cls & CL_N) == 0u) {
        // possessive optional prefix: taken, then at least one letter must follow
        let c1 = ch_at(p0 + c0.len, end);
        if ((c1.cls & CL_L) != 0u) { return run_while(p0 + c0.len, end, CL_L); }
    }
    if ((c0.cls & CL_N) != 0u) {
        var i = p0 + c0.len;
        for (var k = 0u; k < 2u; k += 1u) {
            let c = ch_at(i, end);
            if ((c.cls & CL_N) == 0u) { break; }
            i += c.len;
        }
        return i;
    }
    var q = p0;
    var c = c0;
    if (c0.cp == 32u) {
        let c1 = ch_at(p0 + 1u, end);
        if (is_other(c1)) {
            q = p0 + 1u;
            c = c1;
        }
    }
    if (is_other(c)) { return run_bytes(run_other(q, end), end, false); }
    let w = ws_run(p0, end);
    if (w.stop == end) { return end; }                 // \s++$
    if (w.crlf_end != NONE) { return w.crlf_end; }     // \s*[\r\n]
    if (w.count >= 2u) { return w.last; }              // \s+(?!\S)
    return p0 + c0.len;                                // \s
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)? after o200k's letter runs
fn o200k_suffix(e: u32, end: u32) -> u32 {
    if (ch_at(e, end).cp != 39u) { return e; }
    let c1 = ch_at(e + 1u, end);
    if (ci(c1.cp, 115u) || ci(c1.cp, 116u) || ci(c1.cp, 109u) || ci(c1.cp, 100u)) {
        return e + 1u + c1.len;
    }
    if (ci(c1.cp, 114u) || ci(c1.cp, 118u) || ci(c1.cp, 108u)) {
        let b = ch_at(e + 2u, end).cp;
        if ((ci(c1.cp, 108u) && ci(b, 108u)) || (!ci(c1.cp, 108u) && ci(b, 101u))) {
            return e + 3u;
        }
    }
    return e;
}

// [UP]*[LO]+ from s, with backtracking: the UP run is given back until a LO char follows.
// Returns the end including the optional contraction, or NONE if there is no match.
fn o200k_lower_run(s: u32, end: u32) -> u32 {
    var i = s;
    var last_lo_end = NONE;   // end of the last char of the UP run that is also LO
    loop {
        let c = ch_at(i, end);
        if ((c.cls & CL_UP) == 0u) { break; }
        if ((c.cls & CL_LO) != 0u) { last_lo_end = i + c.len; }
        i += c.len;
    }
    var e = NONE;
    if ((ch_at(i, end).cls & CL_LO) != 0u) {
        e = run_while(i, end, CL_LO);
    } else if (last_lo_end != NONE) {
        e = last_lo_end;   // [LO]+ is then exactly that one char (the ones after it are not LO)
    } else {
        return NONE;
    }
    return o200k_suffix(e, end);
}

// [UP]+[LO]* from s, or NONE.
fn o200k_upper_run(s: u32, end: u32) -> u32 {
    if ((ch_at(s, end).cls & CL_UP) == 0u) { return NONE; }
    return o200k_suffix(run_while(run_while(s, end, CL_UP), end, CL_LO), end);
}

// [^\r\n\p{L}\p{N}]?[UP]*[LO]+C?|[^\r\n\p{L}\p{N}]?[UP]+[LO]*C?|\p{N}{1,3}|
// ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
fn match_o200k(p0: u32, end: u32) -> u32 {
    let c0 = ch_at(p0, end);
    if (c0.cp != 10u && c0.cp != 13u && (c0.cls & (CL_L | CL_N)) == 0u) {
        // the optional prefix, tried taken first, then empty (only a mark can start a run)
        let s1 = p0 + c0.len;
        let e1 = o200k_lower_run(s1, end);
        if (e1 != NONE) { return e1; }
        if ((c0.cls & CL_M) != 0u) { return o200k_lower_run(p0, end); }
        let e2 = o200k_upper_run(s1, end);
        if (e2 != NONE) { return e2; }
    } else if ((c0.cls & CL_L) != 0u) {
        let e1 = o200k_lower_run(p0, end);
        if (e1 != NONE) { return e1; }
        return o200k_upper_run(p0, end);
    }
    if ((c0.cls & CL_N) != 0u) {
        var i = p0 + c0.len;
        for (var k = 0u; k < 2u; k += 1u) {
            let c = ch_at(i, end);
            if ((c.cls & CL_N) == 0u) { break; }
            i += c.len;
        }
        return i;
    }
    var q = p0;
    var c = c0;
    if (c0.cp == 32u) {
        let c1 = ch_at(p0 + 1u, end);
        if (is_other(c1)) {
            q = p0 + 1u;
            c = c1;
        }
    }
    if (is_other(c)) { return run_bytes(run_other(q, end), end, true); }
    let w = ws_run(p0, end);
    if (w.crlf_end != NONE) { return w.crlf_end; }          // \s*[\r\n]+
    if (w.stop == end || w.count < 2u) { return w.stop; }   // \s+(?!\S) at the end; \s+
    return w.last;                                          // \s+(?!\S)
}

fn match_piece(p0: u32, end: u32) -> u32 {
    if (PATTERN == 2u) { return match_o200k(p0, end); }
    if (PATTERN == 1u) { return match_cl100k(p0, end); }
    return match_gpt2(p0, end);
}

fn is_cut(prev: Ch, cur: Ch) -> bool {
    if ((prev.cls & CL_L) == 0u) { return false; }
    if (PATTERN == 2u) {
        return (cur.cls & (CL_L | CL_M | CL_END)) == 0u && cur.cp != 39u;
    }
    return (cur.cls & (CL_L | CL_END)) == 0u;
}

// Index of the document containing byte x: the last d < n_starts with starts[d] <= x.
fn doc_of(x: u32) -> u32 {
    var lo = 0u;
    var hi = p.n_starts;   // starts[hi] = n_bytes > x
    while (hi - lo > 1u) {
        let mid = (lo + hi) / 2u;
        if (starts[mid] <= x) { lo = mid; } else { hi = mid; }
    }
    return lo;
}

// ---- vocabulary lookups -----------------------------------------------------------------

fn tok_len(id: u32) -> u32 {
    return vocab[p.info_off + 2u * id + 1u];
}

fn arena_byte(b: u32) -> u32 {
    return (vocab[p.bytes_off + (b >> 2u)] >> ((b & 3u) * 8u)) & 0xffu;
}

fn pair_hash(a: u32, b: u32) -> u32 {
    var h = (a * 0x9e3779b1u) ^ ((b + 0x7f4a7c15u) * 0x85ebca77u);
    h ^= h >> 15u;
    h *= 0x2c1b3c6du;
    h ^= h >> 12u;
    return h;
}

// (priority, merged id) of the pair, or (NONE, NONE) if it never merges.
fn pair_lookup(a: u32, b: u32) -> vec2<u32> {
    var slot = pair_hash(a, b) & p.pair_mask;
    loop {
        let e = pairs[slot];
        if (e.x == a && e.y == b) { return e.zw; }
        if (e.x == NONE) { return vec2<u32>(NONE, NONE); }
        slot = (slot + 1u) & p.pair_mask;
    }
    return vec2<u32>(NONE, NONE);
}

// The id of the token whose bytes are text[s, s+n), or NONE.
fn lookup_piece(s: u32, n: u32) -> u32 {
    var h = 2166136261u;
    for (var k = 0u; k < n; k += 1u) {
        h = (h ^ byte_at(s + k)) * 16777619u;
    }
    var slot = h & p.piece_mask;
    loop {
        let base = p.piece_off + 2u * slot;
        let id = vocab[base + 1u];
        if (id == NONE) { return NONE; }
        if (vocab[base] == h && tok_len(id) == n) {
            let off = vocab[p.info_off + 2u * id];
            var same = true;
            for (var k = 0u; k < n; k += 1u) {
                if (arena_byte(off + k) != byte_at(s + k)) {
                    same = false;
                    break;
                }
            }
            if (same) { return id; }
        }
        slot = (slot + 1u) & p.piece_mask;
    }
    return NONE;
}

// ---- BPE of one piece ---------------------------------------------------------------------

// tiktoken's algorithm in registers: repeatedly merge the lowest-priority pair, leftmost first.
fn bpe_short(s: u32, n: u32) {
    if (n == 1u) {
        tok_buf[s] = vocab[byte_at(s)];
        return;
    }
    if (p.whole_piece != 0u && n <= p.max_tok_len) {
        let whole = lookup_piece(s, n);
        if (whole != NONE) {
            tok_buf[s] = whole;
            return;
        }
    }
    var ids: array<u32, SHORT_MAX>;
    var pri: array<u32, SHORT_MAX>;
    var mrg: array<u32, SHORT_MAX>;
    for (var k = 0u; k < n; k += 1u) {
        ids[k] = vocab[byte_at(s + k)];
    }
    for (var k = 0u; k + 1u < n; k += 1u) {
        let pm = pair_lookup(ids[k], ids[k + 1u]);
        pri[k] = pm.x;
        mrg[k] = pm.y;
    }
    var m = n;
    loop {
        var best = NONE;
        var best_pri = NONE;
        for (var k = 0u; k + 1u < m; k += 1u) {
            if (pri[k] < best_pri) {
                best_pri = pri[k];
                best = k;
            }
        }
        if (best == NONE) { break; }
        ids[best] = mrg[best];
        for (var k = best + 1u; k + 1u < m; k += 1u) {
            ids[k] = ids[k + 1u];
            pri[k] = pri[k + 1u];
            mrg[k] = mrg[k + 1u];
        }
        m -= 1u;
        if (best + 1u < m) {
            let pm = pair_lookup(ids[best], ids[best + 1u]);
            pri[best] = pm.x;
            mrg[best] = pm.y;
        }
        if (best > 0u) {
            let pm = pair_lookup(ids[best - 1u], ids[best]);
            pri[best - 1u] = pm.x;
            mrg[best - 1u] = pm.y;
        }
    }
    var pos = s;
    for (var k = 0u; k < m; k += 1u) {
        tok_buf[pos] = ids[k];
        pos += tok_len(ids[k]);
    }
}

fn encode_piece(s: u32, n: u32) {
    if (n <= SHORT_MAX) {
        bpe_short(s, n);
        return;
    }
    let slot = atomicAdd(&counters[0], 1u);
    let base = atomicAdd(&counters[1], n);
    longs[slot] = vec4<u32>(s, n, base, 0u);
}

// Indexed binary min-heap of part starts keyed by (priority of the pair starting there, start).
fn heap_less(a: u32, b: u32) -> bool {
    let pa = scratch[h_pri + a];
    let pb = scratch[h_pri + b];
    return pa < pb || (pa == pb && a < b);
}

fn heap_put(slot: u32, pos: u32) {
    scratch[h_heap + slot] = pos;
    scratch[h_idx + pos] = slot;
}

fn sift_up(slot0: u32) {
    var slot = slot0;
    let pos = scratch[h_heap + slot];
    loop {
        if (slot == 0u) { break; }
        let parent = (slot - 1u) / 2u;
        let other = scratch[h_heap + parent];
        if (!heap_less(pos, other)) { break; }
        heap_put(slot, other);
        slot = parent;
    }
    heap_put(slot, pos);
}

fn sift_down(slot0: u32) {
    var slot = slot0;
    let pos = scratch[h_heap + slot];
    loop {
        let left = 2u * slot + 1u;
        if (left >= heap_size) { break; }
        var child = left;
        let right = left + 1u;
        if (right < heap_size && heap_less(scratch[h_heap + right], scratch[h_heap + left])) {
            child = right;
        }
        let other = scratch[h_heap + child];
        if (!heap_less(other, pos)) { break; }
        heap_put(slot, other);
        slot = child;
    }
    heap_put(slot, pos);
}

// Set the priority of the pair starting at part `pos` (NONE: no pair) and fix the heap.
fn heap_set(pos: u32, pri: u32) {
    let slot = scratch[h_idx + pos];
    let old = scratch[h_pri + pos];
    scratch[h_pri + pos] = pri;
    if (slot == NONE) {
        if (pri == NONE) { return; }
        heap_put(heap_size, pos);
        heap_size += 1u;
        sift_up(heap_size - 1u);
        return;
    }
    if (pri == NONE) {
        scratch[h_idx + pos] = NONE;
        heap_size -= 1u;
        if (slot < heap_size) {
            let moved = scratch[h_heap + heap_size];
            heap_put(slot, moved);
            sift_up(slot);
            sift_down(scratch[h_idx + moved]);
        }
        return;
    }
    if (pri < old) { sift_up(slot); } else { sift_down(slot); }
}

// The same rule as bpe_short for a piece of any length, in O(n log n): parts are linked
// through the token lengths (next) and `prev`; tok_buf holds the part ids in place.
fn bpe_long(s: u32, n: u32, base: u32) {
    if (p.whole_piece != 0u && n <= p.max_tok_len) {
        let whole = lookup_piece(s, n);
        if (whole != NONE) {
            tok_buf[s] = whole;
            return;
        }
    }
    let h_prev = 4u * base;
    h_pri = h_prev + n;
    h_heap = h_pri + n;
    h_idx = h_heap + n;
    for (var k = 0u; k < n; k += 1u) {
        tok_buf[s + k] = vocab[byte_at(s + k)];
        scratch[h_prev + k] = k - 1u;   // NONE for k = 0
        scratch[h_idx + k] = NONE;
    }
    heap_size = 0u;
    for (var k = 0u; k < n; k += 1u) {
        var pri = NONE;
        if (k + 1u < n) { pri = pair_lookup(tok_buf[s + k], tok_buf[s + k + 1u]).x; }
        scratch[h_pri + k] = pri;
        if (pri != NONE) {
            heap_put(heap_size, k);
            heap_size += 1u;
        }
    }
    if (heap_size > 1u) {
        var k = heap_size / 2u;
        loop {
            k -= 1u;
            sift_down(k);
            if (k == 0u) { break; }
        }
    }
    loop {
        if (heap_size == 0u) { break; }
        let i = scratch[h_heap];
        let ti = tok_buf[s + i];
        let j = i + tok_len(ti);
        let tj = tok_buf[s + j];
        let merged = pair_lookup(ti, tj).y;
        tok_buf[s + i] = merged;
        tok_buf[s + j] = NONE;
        heap_set(j, NONE);
        let k = j + tok_len(tj);
        if (k < n) {
            scratch[h_prev + k] = i;
            heap_set(i, pair_lookup(merged, tok_buf[s + k]).x);
        } else {
            heap_set(i, NONE);
        }
        let l = scratch[h_prev + i];
        if (l != NONE) {
            heap_set(l, pair_lookup(tok_buf[s + l], merged).x);
        }
    }
}

// --- KERNEL: bpe_fill_none ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<u32>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

@compute @workgroup_size(64)
fn bpe_fill_none(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let i = linear_index(wg, nwg, lid);
    if (i < p.n_bytes) { tok_buf[i] = NONE; }
}

// --- KERNEL: bpe_cuts ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<u32>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

@compute @workgroup_size(64)
fn bpe_cuts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let c = linear_index(wg, nwg, lid);
    if (c >= p.n_chunks) { return; }
    let hi = min((c + 1u) * p.chunk, p.n_bytes);
    var i = c * p.chunk;
    while (i < hi && (byte_at(i) & 0xc0u) == 0x80u) { i += 1u; }
    if (i >= hi) {
        cuts[c] = NONE;
        return;
    }
    var d = doc_of(i);
    var prev = Ch(NONE, 0u, CL_END);
    if (starts[d] < i) { prev = ch_before(i); }
    loop {
        if (i >= hi) { break; }
        while (starts[d + 1u] <= i) { d += 1u; }
        if (starts[d] == i) {
            cuts[c] = i;
            return;
        }
        let cur = ch_at(i, starts[d + 1u]);
        if (is_cut(prev, cur)) {
            cuts[c] = i;
            return;
        }
        prev = cur;
        i += cur.len;
    }
    cuts[c] = NONE;
}

// --- KERNEL: bpe_pretok ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<u32>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

@compute @workgroup_size(64)
fn bpe_pretok(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let c = linear_index(wg, nwg, lid);
    if (c >= p.n_chunks) { return; }
    let first = cuts[c];
    if (first == NONE) { return; }
    var j = c + 1u;
    while (j < p.n_chunks && cuts[j] == NONE) { j += 1u; }
    var seg_end = p.n_bytes;
    if (j < p.n_chunks) { seg_end = cuts[j]; }
    var d = doc_of(first);
    var pos = first;
    loop {
        if (pos >= seg_end) { break; }
        while (starts[d + 1u] <= pos) { d += 1u; }
        let e = match_piece(pos, starts[d + 1u]);
        encode_piece(pos, e - pos);
        pos = e;
    }
    if (pos != seg_end) { atomicAdd(&counters[2], 1u); }
}

// --- KERNEL: bpe_merge_pieces ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<u32>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

@compute @workgroup_size(64)
fn bpe_merge_pieces(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let i = linear_index(wg, nwg, lid);
    if (i >= p.n_starts) { return; }
    let s = starts[i];
    let e = starts[i + 1u];
    if (e > s) { encode_piece(s, e - s); }
}

// --- KERNEL: bpe_merge_long ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<u32>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

@compute @workgroup_size(64)
fn bpe_merge_long(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let total = atomicLoad(&counters[0]);
    let stride = nwg.x * nwg.y * WG;
    for (var i = linear_index(wg, nwg, lid); i < total; i += stride) {
        let piece = longs[i];
        bpe_long(piece.x, piece.y, piece.z);
    }
}
