// bpe_train.wgsl — byte-level BPE vocabulary training on the device.
// The contract (pair counts, tie-break, overlapping runs) is merges.py; the host loop is
// trainer.py (both in this folder).
//
// Data on the device:
//   tokens[i]        token ids of every unique piece, back to back (positions)
//   piece_of[i]      the piece of position i
//   pieces[p]        (start, len, count_lo, count_hi): where piece p lives, its current token
//                    count (shrinks as merges apply; the tail behind it is stale) and how often
//                    it occurs in the corpus (64-bit)
//   stamps[p]        the last merge step that claimed piece p (merge index + 1)
//   resume[2p..2p+1] where an unfinished rewrite of piece p continues (software devices)
//   keys[k]          pair (left, right); counts[2k], counts[2k+1] its 64-bit count (lo, hi),
//                    updated by atomics with carry: exact for any corpus size
//                    Byte pairs are keys a*256+b; every other pair is found through `slots`,
//                    an open-addressing hash table (linear probing) holding key index + 1
//                    (0 = empty, so a zeroed buffer is an empty table). Keys
//                    [num_keys, key_end) are the last merge's new pairs: in the list, not
//                    yet counted or hashed (the next merge_select does that)
//   step[3c..3c+2]   the last merge's new pairs by code c (2x: (x, N); 2y+1: (N, y)): count
//                    lo, count hi, "listed" flag
//   tok_len[t]       bytes of token t (for --max-token-bytes)
//   merges[m]        (left, right, count_lo, count_hi) of merge m; its token is 256 + m
//   state[]          the loop's scalars (S_* below)
//   seen[]           the state words as merge_select saw them: what merge_apply decides
//                    from (state itself changes while apply runs)
//   partials[g]      merge_select's best pair of key block g
//
// One merge step is two dispatches, recorded many times per submit:
//   merge_select  (ceil(key_cap / 1024) workgroups): makes the last merge's new pairs in
//                 its block of SELECT_ITEMS keys counted keys and writes the block's best
//                 pair to partials[]; workgroup 0 copies the state to seen[]
//   merge_apply   (ceil(positions / 1024) workgroups, host-sized): every workgroup reduces
//                 partials[] itself (the same answer everywhere: the order is total; the
//                 reads are amortized over a tile of 1024 positions, whose first loads are
//                 issued before it) and decides from seen[] whether and what to merge;
//                 workgroup 0 records the merge in state, merges[] and tok_len[]; then the
//                 first invocation to see the pair in a piece claims the piece and rewrites
//                 it, subtracting the pairs it destroys and adding the ones it creates (to
//                 the step table and the key list)
// The two share one bind group layout (Device.kernels_sharing_layout), so the host sets
// one bind group per round and records a step as set_pipeline + dispatch twice (the
// pipeline and bind group calls of three separate kernels were most of its recording time,
// dev/vocab_train_speed/README.md). No read-back inside a round and no indirect dispatch (wgpu
// validates each indirect dispatch with a dispatch of its own). A status other than RUNNING makes
// apply do nothing, so steps recorded past the end (or past a pause for more key room)
// are no-ops. On software devices merge_apply compiled with CONTINUE also runs a few passes
// per step (see its work budget). Outside the merge loop: count_pairs (initial byte-pair
// counts), compact, compact_tokens and compact_finish (drop pieces that became a single
// token), rehash (after the key list grew).
//
// Bindings (group 0) per kernel: read-only inputs, then read_write outputs (merge_select and
// merge_apply: the indices of their shared layout); no uniforms (the scalars live in
// `state`, which kernels update on the device).

const WG: u32 = 256u;
const SELECT_ITEMS: u32 = 1024u;  // keys per select workgroup
const APPLY_SPAN: u32 = 4u;  // positions per apply invocation
const APPLY_TILE: u32 = 1024u;  // positions per apply workgroup: WG * APPLY_SPAN
const EMPTY: u32 = 0xffffffffu;
const NO_CAP: u32 = 0xffffffffu;

// state[] words
const S_STATUS: u32 = 0u;
const S_MERGES: u32 = 1u;        // merges done
const S_NEXT_ID: u32 = 2u;       // the next new token's id
const S_TARGET: u32 = 3u;        // stop when NEXT_ID reaches this
const S_NUM_KEYS: u32 = 4u;      // keys counted and hashed
const S_KEY_CAP: u32 = 5u;
const S_N_PIECES: u32 = 6u;
const S_N_POSITIONS: u32 = 7u;   // extent of tokens[] in use (live tokens plus stale tails)
const S_LIVE: u32 = 8u;          // live tokens: sum of piece lengths
const S_DEAD: u32 = 9u;          // pieces that became shorter than two tokens
const S_A: u32 = 10u;            // the pair being merged and its token
const S_B: u32 = 11u;
const S_N: u32 = 12u;
const S_KEY_END: u32 = 13u;      // keys in the list: num_keys plus the last merge's new pairs
const S_CAP: u32 = 14u;          // max token bytes, NO_CAP for none
const S_ERRORS: u32 = 15u;
const S_HASH_MASK: u32 = 16u;
const S_COMPACT_PIECES: u32 = 17u;
const S_COMPACT_POSITIONS: u32 = 18u;
const S_PENDING: u32 = 19u;      // pieces whose rewrite continues in a further pass
const S_BUDGET: u32 = 20u;       // loop iterations per invocation and pass (NO_CAP: unlimited)
const S_WORDS: u32 = 32u;

const ST_RUNNING: u32 = 0u;
const ST_DONE: u32 = 1u;
const ST_EXHAUSTED: u32 = 2u;
const ST_PAUSED_KEYS: u32 = 3u;  // the key list needs room before the next merge

const ERR_MISSING_PAIR: u32 = 1u;
const ERR_TABLE_FULL: u32 = 2u;

fn pair_hash(a: u32, b: u32) -> u32 {
    var h = (a * 0x9e3779b1u) ^ ((b + 0x7f4a7c15u) * 0x85ebca77u);
    h ^= h >> 16u;
    h *= 0x7feb352du;
    h ^= h >> 15u;
    h *= 0x846ca68bu;
    h ^= h >> 16u;
    return h;
}

// A candidate pair: 64-bit count (hi, lo), then ids. Rule 3 of merges.py.
struct Best {
    hi: u32,
    lo: u32,
    a: u32,
    b: u32,
}

fn no_best() -> Best {
    return Best(0u, 0u, EMPTY, EMPTY);
}

// x strictly before y: higher count, then lower left id, then lower right id.
fn better(x: Best, y: Best) -> bool {
    if (x.hi != y.hi) { return x.hi > y.hi; }
    if (x.lo != y.lo) { return x.lo > y.lo; }
    if (x.a != y.a) { return x.a < y.a; }
    return x.b < y.b;
}

// The best of a subgroup, field by field (every lane gets it). Uniform control flow only.
fn subgroup_best(v: Best) -> Best {
    let hi = subgroupMax(v.hi);
    var tied = v.hi == hi;
    let lo = subgroupMax(select(0u, v.lo, tied));
    tied = tied && v.lo == lo;
    let a = subgroupMin(select(EMPTY, v.a, tied));
    tied = tied && v.a == a;
    let b = subgroupMin(select(EMPTY, v.b, tied));
    return Best(hi, lo, a, b);
}

// select's and apply's workgroup-wide best (merge_select, merge_apply)
var<workgroup> sg_best: array<vec4<u32>, 256>;

// The best of the workgroup's values, at invocation 0 (every invocation must call it).
fn workgroup_best(v: Best, lid: u32, sg_id: u32, lane: u32, num_sg: u32) -> Best {
    let r = subgroup_best(v);
    if (lane == 0u) { sg_best[sg_id] = vec4<u32>(r.hi, r.lo, r.a, r.b); }
    workgroupBarrier();
    var w = no_best();
    if (lid == 0u) {
        for (var s = 0u; s < num_sg; s++) {
            let x = sg_best[s];
            let c = Best(x.x, x.y, x.z, x.w);
            if ((c.hi | c.lo) != 0u && better(c, w)) { w = c; }
        }
    }
    return w;
}

// --- KERNEL: count_pairs ---
// Initial counts: every position i whose pair (tokens[i], tokens[i+1]) lies inside one piece
// adds the piece's count to byte pair tokens[i]*256 + tokens[i+1]. Tokens are bytes here.
// Dispatch: ceil(n_positions / 256) workgroups of 256.
@group(0) @binding(0) var<storage, read> tokens: array<u32>;
@group(0) @binding(1) var<storage, read> piece_of: array<u32>;
@group(0) @binding(2) var<storage, read> pieces: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> state: array<u32>;
@group(0) @binding(4) var<storage, read_write> counts: array<atomic<u32>>;

@compute @workgroup_size(256)
fn count_pairs(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let i = workgroup_index(wg, nwg) * WG + lid;
    if (i + 1u >= state[S_N_POSITIONS]) { return; }
    let pc = pieces[piece_of[i]];
    if (i + 1u >= pc.x + pc.y) { return; }
    let k = tokens[i] * 256u + tokens[i + 1u];
    let old = atomicAdd(&counts[2u * k], pc.z);
    let carry = select(0u, 1u, old + pc.z < old);
    if (pc.w + carry != 0u) { atomicAdd(&counts[2u * k + 1u], pc.w + carry); }
}

// --- KERNEL: merge_select ---
// The first half of a merge step. Workgroup g takes keys [g*1024, (g+1)*1024): those of the
// previous merge's new pairs, keys [num_keys, key_end), get their counts from the step
// table (cleared for the next merge) and a hash table entry; the best of the block's keys
// with a count above zero goes to partials[g]; workgroup 0 copies the state to seen[] (what
// merge_apply decides from). merge_apply makes key_end the new num_keys. Nothing registers
// while a merge is still pending (software continuation passes): its list is not complete.
// Dispatch: ceil(key_cap / 1024) workgroups of 256. Shares merge_apply's bind group layout.
@group(0) @binding(5) var<storage, read_write> keys: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> counts: array<u32>;
@group(0) @binding(7) var<storage, read_write> slots: array<atomic<u32>>;
@group(0) @binding(8) var<storage, read_write> step: array<atomic<u32>>;
@group(0) @binding(11) var<storage, read_write> partials: array<vec4<u32>>;
@group(0) @binding(12) var<storage, read_write> seen: array<u32>;
@group(0) @binding(13) var<storage, read_write> state: array<atomic<u32>>;

var<workgroup> st: array<u32, S_WORDS>;  // the state words, one parallel load

fn insert_key(k: u32, a: u32, b: u32, mask: u32) {
    var h = pair_hash(a, b) & mask;
    for (var probe = 0u; probe <= mask; probe++) {
        loop {  // a weak compare-exchange may fail spuriously on an empty slot: retry it
            let got = atomicCompareExchangeWeak(&slots[h], 0u, k + 1u);
            if (got.exchanged) { return; }
            if (got.old_value != 0u) { break; }
        }
        h = (h + 1u) & mask;
    }
    atomicOr(&state[S_ERRORS], ERR_TABLE_FULL);
}

@compute @workgroup_size(256)
fn merge_select(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32,
                @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
                @builtin(num_subgroups) num_sg: u32) {
    let block = workgroup_index(wg, nwg);
    if (lid < S_WORDS) { st[lid] = atomicLoad(&state[lid]); }
    workgroupBarrier();
    if (block == 0u && lid < S_WORDS) { seen[lid] = st[lid]; }
    let n_keys = st[S_NUM_KEYS];
    let key_end = st[S_KEY_END];
    let n = st[S_N];
    let mask = st[S_HASH_MASK];
    let settled = st[S_PENDING] == 0u;
    let running = settled && st[S_STATUS] == ST_RUNNING;
    var best = no_best();
    let base = block * SELECT_ITEMS;
    let block_end = base + SELECT_ITEMS;
    if (settled) {  // this block's new pairs (x, N) and (N, y) of the last merge
        for (var k = max(n_keys, base) + lid; k < min(key_end, block_end); k += WG) {
            let key = keys[k];
            let code = select(2u * key.y + 1u, 2u * key.x, key.y == n);
            let lo = atomicLoad(&step[3u * code]);
            let hi = atomicLoad(&step[3u * code + 1u]);
            atomicStore(&step[3u * code], 0u);
            atomicStore(&step[3u * code + 1u], 0u);
            atomicStore(&step[3u * code + 2u], 0u);
            counts[2u * k] = lo;
            counts[2u * k + 1u] = hi;
            insert_key(k, key.x, key.y, mask);
            let c = Best(hi, lo, key.x, key.y);
            if (running && (lo | hi) != 0u && better(c, best)) { best = c; }
        }
    }
    if (running) {  // and its counted keys
        for (var k = base + lid; k < min(n_keys, block_end); k += WG) {
            let lo = counts[2u * k];
            let hi = counts[2u * k + 1u];
            if ((lo | hi) != 0u) {
                let key = keys[k];
                let c = Best(hi, lo, key.x, key.y);
                if (better(c, best)) { best = c; }
            }
        }
    }
    let w = workgroup_best(best, lid, sg_id, lane, num_sg);
    if (lid == 0u) { partials[block] = vec4<u32>(w.hi, w.lo, w.a, w.b); }
}

// --- KERNEL: merge_apply ---
// The second half of a merge step (shares merge_select's bind group layout).
//
// apply: the best of the partials becomes merge number seen[S_MERGES] (or the corpus is
// exhausted, or the key list needs room first), then it is applied (A, B) -> N to every
// piece that holds it (rule 4 of merges.py), updating the pair counts by exactly the pairs
// that change: for each replaced occurrence the old pairs (left neighbour, A), (A, B),
// (B, right neighbour), each once; then the new pairs that hold N, which go to the step
// table and the key list (they are all new keys); the others already are keys.
//
// Claiming: the invocation at position i checks tokens[i], tokens[i+1] and claims the piece
// with atomicMax(stamps[p], stamp); only the winner touches the piece. Other invocations may
// read a piece while its owner rewrites it, but then their claim fails; a piece nobody owns
// is never written, so a claim is only ever won on a real occurrence.
//
// Work budget (state[S_BUDGET], NO_CAP = unlimited): llvmpipe silently stops an invocation's
// loops after 65,535 iterations in all (shaders/NOTES.md), so on software devices an owner
// stops after `budget` loop iterations, saves its cursor in resume[2p..2p+1] and counts the
// piece in state[S_PENDING]; the same entry point compiled with CONTINUE = true (one
// invocation per piece, any grid) resumes such pieces. While any piece is pending, select's
// registration and apply's decision wait (do nothing), so extra steps finish the merge first.
//
// Dispatch: ceil(n_positions / 1024) workgroups of 256 (tiles of APPLY_TILE positions) as
// the host last knew n_positions (a bound: compaction only shrinks it; folded into 2-D), or
// fewer (grid-stride over tiles); with CONTINUE: ceil(pieces / 256) workgroups.
override CONTINUE: bool = false;

@group(0) @binding(0) var<storage, read> piece_of: array<u32>;
@group(0) @binding(1) var<storage, read_write> tokens: array<u32>;
@group(0) @binding(2) var<storage, read_write> pieces: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> stamps: array<atomic<u32>>;
@group(0) @binding(4) var<storage, read_write> resume: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> keys: array<vec2<u32>>;
@group(0) @binding(6) var<storage, read_write> counts: array<atomic<u32>>;
@group(0) @binding(7) var<storage, read_write> slots: array<u32>;  // read only here
@group(0) @binding(8) var<storage, read_write> step: array<atomic<u32>>;
@group(0) @binding(9) var<storage, read_write> tok_len: array<u32>;
@group(0) @binding(10) var<storage, read_write> merges: array<vec4<u32>>;
@group(0) @binding(11) var<storage, read_write> partials: array<vec4<u32>>;  // read only here
@group(0) @binding(12) var<storage, read_write> seen: array<u32>;  // read only here
@group(0) @binding(13) var<storage, read_write> state: array<atomic<u32>>;

// The state words as select saw them, one parallel load from seen[]
var<workgroup> st: array<u32, S_WORDS>;

// apply: what every invocation of the workgroup needs of the merge (written by invocation 0)
struct Merge {
    go: u32,      // 0: nothing to apply this step
    a: u32,
    b: u32,
    n: u32,
    stamp: u32,
    n_len: u32,   // bytes of token n
}
var<workgroup> decided: Merge;

var<private> work: u32;      // loop iterations so far (entering a loop counts one)
var<private> hash_mask: u32;
// This merge's token and its length: tok_len[new_token] is being written while apply runs.
var<private> new_token: u32;
var<private> new_len: u32;

// Invocation 0 of each apply workgroup: the merge this step makes, from the partials' best
// `r` and the state as select saw it (st[], the workgroup's copy of seen[]). Workgroup 0
// alone writes it down (no other reads it in this dispatch).
fn decide(r: Best, writer: bool) -> Merge {
    var none = Merge(0u, 0u, 0u, 0u, 0u, 0u);
    // The last merge is still being applied (continuation passes): leave everything as it is.
    if (st[S_PENDING] != 0u) { return none; }
    // select made the last merge's new pairs keys num_keys .. key_end - 1
    let n_keys = st[S_KEY_END];
    if (writer) { atomicStore(&state[S_NUM_KEYS], n_keys); }
    if (st[S_STATUS] != ST_RUNNING) { return none; }
    if ((r.hi | r.lo) == 0u) {
        if (writer) { atomicStore(&state[S_STATUS], ST_EXHAUSTED); }
        return none;
    }
    let n = st[S_NEXT_ID];
    // Room for this merge's new keys: at most one per code (2n + 1 of them) and at most two
    // per occurrence (occurrences <= count).
    var room = 2u * n + 1u;
    if (r.hi == 0u && r.lo < 0x7fffffffu) { room = min(room, 2u * r.lo); }
    if (n_keys + room > st[S_KEY_CAP]) {
        if (writer) { atomicStore(&state[S_STATUS], ST_PAUSED_KEYS); }
        return none;
    }
    let m = st[S_MERGES];
    let n_len = tok_len[r.a] + tok_len[r.b];
    if (writer) {
        merges[m] = vec4<u32>(r.a, r.b, r.lo, r.hi);
        tok_len[n] = n_len;
        atomicStore(&state[S_A], r.a);
        atomicStore(&state[S_B], r.b);
        atomicStore(&state[S_N], n);
        atomicStore(&state[S_MERGES], m + 1u);
        atomicStore(&state[S_NEXT_ID], n + 1u);
        if (n + 1u >= st[S_TARGET]) { atomicStore(&state[S_STATUS], ST_DONE); }
    }
    return Merge(1u, r.a, r.b, n, m + 1u, n_len);
}

// Where an owner is in its piece: read and write positions, the old token before `r`, the
// old position of the last replaced occurrence's B, the token last written and whether this
// merge produced it.
struct Cursor {
    r: u32,
    w: u32,
    prev_old: u32,
    prev_b: u32,
    prev_new: u32,
    prev_is_n: u32,
}

fn token_bytes(t: u32) -> u32 {
    if (t == new_token) { return new_len; }
    return tok_len[t];
}

fn fits(a: u32, b: u32, cap: u32) -> bool {
    return cap == NO_CAP || token_bytes(a) + token_bytes(b) <= cap;
}

fn key_of(a: u32, b: u32) -> u32 {
    if (a < 256u && b < 256u) { return a * 256u + b; }
    var h = pair_hash(a, b) & hash_mask;
    work += 1u;
    for (var probe = 0u; probe <= hash_mask; probe++) {
        work += 1u;
        let slot = slots[h];
        if (slot == 0u) { break; }
        let key = keys[slot - 1u];
        if (key.x == a && key.y == b) { return slot - 1u; }
        h = (h + 1u) & hash_mask;
    }
    atomicOr(&state[S_ERRORS], ERR_MISSING_PAIR);
    return EMPTY;
}

fn sub_count(k: u32, lo: u32, hi: u32) {
    let old = atomicSub(&counts[2u * k], lo);
    let borrow = select(0u, 1u, old < lo);
    if (hi + borrow != 0u) { atomicSub(&counts[2u * k + 1u], hi + borrow); }
}

fn lose_pair(a: u32, b: u32, lo: u32, hi: u32, cap: u32) {
    if (!fits(a, b, cap)) { return; }
    let k = key_of(a, b);
    if (k != EMPTY) { sub_count(k, lo, hi); }
}

// A pair holding n: counted in the step table; the first to list it appends it to the keys.
fn gain_new_pair(a: u32, b: u32, n: u32, lo: u32, hi: u32, cap: u32) {
    if (!fits(a, b, cap)) { return; }
    let code = select(2u * b + 1u, 2u * a, b == n);
    let old = atomicAdd(&step[3u * code], lo);
    let carry = select(0u, 1u, old + lo < old);
    if (hi + carry != 0u) { atomicAdd(&step[3u * code + 1u], hi + carry); }
    if (atomicExchange(&step[3u * code + 2u], 1u) == 0u) {
        keys[atomicAdd(&state[S_KEY_END], 1u)] = vec2<u32>(a, b);
    }
}

// Rewrite piece p from cursor c until it ends or the budget is spent (at least one step).
fn merge_run(pc: vec4<u32>, cur: Cursor, a: u32, b: u32, n: u32, cap: u32,
             budget: u32) -> Cursor {
    var c = cur;
    let start = pc.x;
    let end = pc.x + pc.y;
    let lo = pc.z;
    let hi = pc.w;
    let first = c.r;
    work += 1u;
    loop {
        if (c.r >= end || (c.r != first && work >= budget)) { break; }
        work += 1u;
        let t = tokens[c.r];
        if (c.r + 1u < end && t == a && tokens[c.r + 1u] == b) {
            if (c.r > start && c.prev_b + 1u != c.r) { lose_pair(c.prev_old, a, lo, hi, cap); }
            lose_pair(a, b, lo, hi, cap);
            if (c.r + 2u < end) { lose_pair(b, tokens[c.r + 2u], lo, hi, cap); }
            if (c.w > start) { gain_new_pair(c.prev_new, n, n, lo, hi, cap); }
            tokens[c.w] = n;
            c.prev_new = n;
            c.prev_is_n = 1u;
            c.prev_b = c.r + 1u;
            c.prev_old = b;
            c.r += 2u;
        } else {
            if (c.prev_is_n != 0u) { gain_new_pair(n, t, n, lo, hi, cap); }
            tokens[c.w] = t;
            c.prev_new = t;
            c.prev_is_n = 0u;
            c.prev_old = t;
            c.r += 1u;
        }
        c.w += 1u;
    }
    return c;
}

// The piece is done (its new length is w - start) or saved for a continuation pass.
fn settle(p: u32, pc: vec4<u32>, c: Cursor, was_pending: bool) {
    if (c.r < pc.x + pc.y) {
        resume[2u * p] = vec4<u32>(c.r, c.w, c.prev_old, c.prev_b);
        resume[2u * p + 1u] = vec4<u32>(c.prev_new, c.prev_is_n, 1u, 0u);
        if (!was_pending) { atomicAdd(&state[S_PENDING], 1u); }
        return;
    }
    let len = c.w - pc.x;
    pieces[p] = vec4<u32>(pc.x, len, pc.z, pc.w);
    atomicSub(&state[S_LIVE], pc.y - len);
    if (len < 2u) { atomicAdd(&state[S_DEAD], 1u); }
    if (was_pending) {
        resume[2u * p + 1u] = vec4<u32>(0u);
        atomicSub(&state[S_PENDING], 1u);
    }
}

fn apply_merge(index: u32, nwg: vec3<u32>, lid: u32, sg_id: u32, lane: u32, num_sg: u32) {
    if (lid < S_WORDS) { st[lid] = seen[lid]; }  // for decide (workgroup_best's barrier)
    let limit = seen[S_N_POSITIONS];
    // This invocation's first pairs (a tile of WG * APPLY_SPAN positions per workgroup),
    // loaded now: the loads overlap the reduction below.
    var x: array<u32, APPLY_SPAN>;
    var y: array<u32, APPLY_SPAN>;
    for (var q = 0u; q < APPLY_SPAN; q++) {
        let at = index * APPLY_TILE + q * WG + lid;
        x[q] = EMPTY;
        y[q] = EMPTY;
        if (at + 1u < limit) {
            x[q] = tokens[at];
            y[q] = tokens[at + 1u];
        }
    }
    // select's partials: only the blocks that held keys can hold a best
    let blocks = ceil_div(seen[S_KEY_END], SELECT_ITEMS);
    var best = no_best();
    for (var j = lid; j < blocks; j += WG) {
        let v = partials[j];
        let c = Best(v.x, v.y, v.z, v.w);
        if ((c.hi | c.lo) != 0u && better(c, best)) { best = c; }
    }
    let r = workgroup_best(best, lid, sg_id, lane, num_sg);
    if (lid == 0u) { decided = decide(r, index == 0u); }
    workgroupBarrier();
    let d = decided;
    if (d.go == 0u) { return; }
    hash_mask = st[S_HASH_MASK];
    new_token = d.n;
    new_len = d.n_len;
    let cap = st[S_CAP];
    let budget = st[S_BUDGET];
    // Tiles index, index + tiles in the grid, ...: one each when the grid covers them all
    // (the default), several when the host caps the grid (TrainerOptions.find_groups).
    let tiles = nwg.x * nwg.y;
    for (var tile = index; tile * APPLY_TILE + 1u < limit; tile += tiles) {
        for (var q = 0u; q < APPLY_SPAN; q++) {
            let at = tile * APPLY_TILE + q * WG + lid;
            if (tile != index) {
                x[q] = EMPTY;
                y[q] = EMPTY;
                if (at + 1u < limit) {
                    x[q] = tokens[at];
                    y[q] = tokens[at + 1u];
                }
            }
        }
        for (var q = 0u; q < APPLY_SPAN; q++) {
            let at = tile * APPLY_TILE + q * WG + lid;
            if (x[q] != d.a || y[q] != d.b) { continue; }  // (EMPTY past the end)
            let p = piece_of[at];
            let pc = pieces[p];
            if (at + 1u >= pc.x + pc.y) { continue; }  // straddles two pieces, or a stale tail
            if (atomicMax(&stamps[p], d.stamp) >= d.stamp) { continue; }  // another owns it
            let c = merge_run(pc, Cursor(pc.x, pc.x, EMPTY, EMPTY, EMPTY, 0u), d.a, d.b, d.n,
                              cap, budget);
            settle(p, pc, c, false);
        }
    }
}

// CONTINUE: invocation i resumes piece i if it is pending (the merge in state[S_A..S_N]).
fn continue_merge(i: u32) {
    if (i >= atomicLoad(&state[S_N_PIECES]) || resume[2u * i + 1u].z == 0u) { return; }
    let a = atomicLoad(&state[S_A]);
    let b = atomicLoad(&state[S_B]);
    let n = atomicLoad(&state[S_N]);
    hash_mask = atomicLoad(&state[S_HASH_MASK]);
    new_token = n;
    new_len = tok_len[n];
    let pc = pieces[i];
    let r0 = resume[2u * i];
    let r1 = resume[2u * i + 1u];
    let c = merge_run(pc, Cursor(r0.x, r0.y, r0.z, r0.w, r1.x, r1.y), a, b, n,
                      atomicLoad(&state[S_CAP]), atomicLoad(&state[S_BUDGET]));
    settle(i, pc, c, true);
}

@compute @workgroup_size(256)
fn merge_apply(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_id) sg_id: u32, @builtin(subgroup_invocation_id) lane: u32,
               @builtin(num_subgroups) num_sg: u32) {
    let index = workgroup_index(wg, nwg);
    if (CONTINUE) {
        continue_merge(index * WG + lid);
    } else {
        apply_merge(index, nwg, lid, sg_id, lane, num_sg);
    }
}

// --- KERNEL: rehash ---
// Re-inserts keys [65536, num_keys) into a fresh (zeroed) hash table after the key list grew.
// Dispatch: ceil((num_keys - 65536) / 256) workgroups of 256.
@group(0) @binding(0) var<storage, read> keys: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read_write> slots: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> state: array<atomic<u32>>;

fn insert_key(k: u32, a: u32, b: u32) {
    let mask = atomicLoad(&state[S_HASH_MASK]);
    var h = pair_hash(a, b) & mask;
    for (var probe = 0u; probe <= mask; probe++) {
        loop {
            let got = atomicCompareExchangeWeak(&slots[h], 0u, k + 1u);
            if (got.exchanged) { return; }
            if (got.old_value != 0u) { break; }
        }
        h = (h + 1u) & mask;
    }
    atomicOr(&state[S_ERRORS], ERR_TABLE_FULL);
}

@compute @workgroup_size(256)
fn rehash(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let k = 65536u + workgroup_index(wg, nwg) * WG + lid;
    if (k >= atomicLoad(&state[S_NUM_KEYS])) { return; }
    let key = keys[k];
    insert_key(k, key.x, key.y);
}

// --- KERNEL: compact ---
// Moves the pieces that still hold a pair (two or more tokens) into the other buffer set,
// densely: each subgroup reserves room for its live pieces with one atomic per counter.
// moved[p] = (new start, new index) of old piece p (EMPTY if dropped) for compact_tokens,
// which copies the tokens position by position; compact_finish then makes the new sizes
// current. Piece order changes; training results do not depend on it.
// Dispatch: ceil(pieces / 256) workgroups of 256.
@group(0) @binding(0) var<storage, read> pieces: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> pieces_out: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> stamps_out: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> moved: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> state: array<atomic<u32>>;

@compute @workgroup_size(256)
fn compact(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32,
           @builtin(subgroup_invocation_id) lane: u32) {
    let p = workgroup_index(wg, nwg) * WG + lid;
    let in_range = p < atomicLoad(&state[S_N_PIECES]);
    var pc = vec4<u32>(0u);
    if (in_range) { pc = pieces[p]; }
    let live = pc.y >= 2u;
    let len = select(0u, pc.y, live);
    let one = select(0u, 1u, live);
    // no early return above: every lane takes part in the subgroup operations
    let len_before = subgroupExclusiveAdd(len);
    let len_total = subgroupAdd(len);
    let one_before = subgroupExclusiveAdd(one);
    let one_total = subgroupAdd(one);
    var base_len = 0u;
    var base_one = 0u;
    if (lane == 0u) {
        base_len = atomicAdd(&state[S_COMPACT_POSITIONS], len_total);
        base_one = atomicAdd(&state[S_COMPACT_PIECES], one_total);
    }
    base_len = subgroupBroadcastFirst(base_len);
    base_one = subgroupBroadcastFirst(base_one);
    if (live) {
        let q = base_one + one_before;
        let s = base_len + len_before;
        pieces_out[q] = vec4<u32>(s, len, pc.z, pc.w);
        atomicStore(&stamps_out[q], 0u);
        moved[p] = vec2<u32>(s, q);
    } else if (in_range) {
        moved[p] = vec2<u32>(EMPTY, EMPTY);
    }
}

// --- KERNEL: compact_tokens ---
// tokens_out / piece_of_out for every live position of a moved piece (see compact).
// Dispatch: ceil(n_positions / 256) workgroups of 256 (folded into 2-D).
@group(0) @binding(0) var<storage, read> tokens: array<u32>;
@group(0) @binding(1) var<storage, read> piece_of: array<u32>;
@group(0) @binding(2) var<storage, read> pieces: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> moved: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read> state: array<u32>;
@group(0) @binding(5) var<storage, read_write> tokens_out: array<u32>;
@group(0) @binding(6) var<storage, read_write> piece_of_out: array<u32>;

@compute @workgroup_size(256)
fn compact_tokens(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let i = workgroup_index(wg, nwg) * WG + lid;
    if (i >= state[S_N_POSITIONS]) { return; }
    let p = piece_of[i];
    let to = moved[p];
    let pc = pieces[p];
    if (to.x == EMPTY || i - pc.x >= pc.y) { return; }
    tokens_out[to.x + i - pc.x] = tokens[i];
    piece_of_out[to.x + i - pc.x] = to.y;
}

// --- KERNEL: compact_finish ---
// The compacted sizes become current; the counters are cleared for the next compaction.
// Dispatch: 1 workgroup of 1.
@group(0) @binding(0) var<storage, read_write> state: array<atomic<u32>>;

@compute @workgroup_size(1)
fn compact_finish() {
    let pieces = atomicExchange(&state[S_COMPACT_PIECES], 0u);
    let positions = atomicExchange(&state[S_COMPACT_POSITIONS], 0u);
    atomicStore(&state[S_N_PIECES], pieces);
    atomicStore(&state[S_N_POSITIONS], positions);
    atomicStore(&state[S_LIVE], positions);
    atomicStore(&state[S_DEAD], 0u);
}
