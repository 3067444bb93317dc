// bpe_encode.wgsl — exact byte-level BPE encoding on the GPU (tiktoken's semantics).
//
// Output: tok_buf[i] = id of the token that starts at byte i of the input, NONE elsewhere;
// bpe_compact.wgsl then compacts it into ids. The reference is tokenizer_svc/reference.py.
//
//   bpe_fill_none     tok_buf[i] = NONE for i < n_bytes, counters = 0       (one per byte)
//   bpe_utf8_check    (optional, right after bpe_fill_none) counters[6] = ~(the first byte
//                     where some document stops being valid UTF-8), 0 if all are valid;
//                     bpe_cuts then finds no boundary, so nothing is encoded (one per 16 bytes)
//   bpe_cuts          per chunk of `chunk` bytes: its first provable piece boundary (or NONE)
//                     and a summary of its characters for skipping long runs  (one per chunk)
//   bpe_digit_cuts    (cl100k, o200k) per chunk inside a run of digits: a cut at a digit
//                     group's start (one per chunk)
//   bpe_pretok        per chunk with a boundary: pre-tokenize [boundary, next boundary) with
//                     the PATTERN's rules, BPE each piece of <= SHORT_MAX bytes (per-invocation
//                     arrays),
//                     queue longer ones                                       (one per chunk)
//   bpe_merge_pieces  per piece cut on the CPU ([starts[i], starts[i+1])): BPE or queue
//   bpe_merge_long    per queued window of a long piece: BPE with a binary heap in `scratch`
//   bpe_merge_long_sg   (grid-stride; the _sg variant uses only lane 0 of each subgroup, see
//                       `budget`)
//   bpe_merge_long_wg per queued window of at most LW_MAX bytes: the same merges, one
//                     workgroup per window, its parts in workgroup memory (before the above)
//   bpe_long_stitch   per window: its seam with the window on its left    (one per window)
//   bpe_long_copy     per window: its tokens between its seam and the next one -> tok_buf
//                                                                  (one workgroup per window)
//
// Bindings (group 0), the same for every kernel of this file (each kernel calls touch_all()):
//   0 text      array<u32>         read  input bytes, 4 per word, little-endian
//   1 starts    array<u32>         read  document starts, n_starts + 1 entries (last =
//                                        n_bytes); for bpe_merge_pieces: piece starts
//   2 classes   array<u32>         read  Unicode classes: stage 1 (4352 words), then stage 2
//   3 vocab     array<u32>         read  byte_tok[256] | tok_info (offset, length) per id |
//                                        token bytes | piece slots (FNV-1a hash, id)
//   4 pairs     array<vec4<u32>>   read  (left, right) -> (priority, merged id) hash table
//   5 cuts      array<vec4<u32>>   rw    per chunk: (boundary, resume position, summary0,
//                                        summary1), see bpe_cuts
//   6 tok_buf   array<u32>         rw    one per input byte
//   7 longs     array<vec4<u32>>   rw    queued windows of long pieces, two entries each:
//                                        (start, length, scratch base, LONG_NEW / _STARTED /
//                                        _FINISHED / _SEAM_FAILED), (piece start, piece
//                                        length, window index k, windows of the piece m)
//   8 scratch   array<u32>         rw    per window: state (phase, position, heap size,
//                                        seam), then prev, pri, heap slots, heap index, toks
//                                        (length words each)
//   9 counters  array<atomic<u32>> rw    [0] windows, [1] scratch words, [2] boundary
//                                        overruns, [3] unfinished (resume needed),
//                                        [4] progress (pieces matched / long-merge steps),
//                                        [5] failed seams, [6] ~(first invalid UTF-8 byte)
//                                        or 0 (bpe_utf8_check)
//  10 p         uniform Params
// Dispatch: workgroups of 64 invocations, one invocation per byte / chunk / piece as listed,
// ceil(count / 64) workgroups (folded into 2-D by the engine when large).
//
// Work budget: llvmpipe silently ends all loops of an invocation after 65,535 iterations in
// total, where entering a loop counts too (shaders/NOTES.md). Every loop here adds one to
// `work` when entered and one per iteration (an underestimate still: structurised early
// returns cost extra, hence the driver's margins); bpe_pretok and bpe_merge_long
// stop between two pieces / merges once `work` exceeds p.budget, save where they are (cuts.y,
// the long piece's state words) and count themselves in counters[3]; the driver dispatches
// again until nothing is unfinished. Each invocation does at least one piece / one merge
// step before the budget can stop it and adds what it did to counters[4], so a resume that
// made no progress is an internal error the driver raises instead of looping forever.
// On real GPUs the budget is unlimited: one dispatch.
//
// Why chunks can be processed independently: a segment starts only at a position p that is
// provably the start of a piece, so the pieces found from p on are the ones a sequential
// matcher from the document start would find (none of the patterns looks behind). `is_cut`
// holds a proof for each rule (prev = code point before p, cur = at p, nxt = after cur):
//  L  prev is a letter; cur is not a letter (gpt2, cl100k), resp. not a letter, mark or `'`
//     (o200k). Every alternative that can contain a letter — gpt2 ` ?\p{L}++` and the
//     contractions; cl100k `[^\r\n\p{L}\p{N}]?+\p{L}++` and the contractions; o200k's
//     `P?[Lu Lt Lm Lo M]*[Ll Lm Lo M]+C?` / `P?[..]+[..]*C?` whose suffix C starts with `'` —
//     continues past a letter only with a letter (resp. letter, mark, `'`); no other
//     alternative contains a letter. So the piece containing prev ends exactly at p.
//  LU (o200k) prev is \p{Ll} (lower only: CL_LO without CL_UP), cur is \p{Lu} or \p{Lt} (CL_UP
//     without CL_LO) other than E and L. An Ll character is matched only by a [LO] run or by
//     the contraction suffix (?i:'s|'t|'re|'ve|'m|'ll|'d); a [LO] run is followed only by
//     [LO] characters, the suffix (starting with `'`) or the piece's end, and within the
//     suffix an Ll letter is followed only by e/E or l/L ('re 've 'll) or the end, so the
//     piece containing prev ends at p ("aBaB..." is one segment per two letters, not one).
//  D  prev is a digit, cur is not: digits only occur in digit pieces (` ?\p{N}++` or
//     `\p{N}{1,3}` groups tiling the run from its start), which end with the run.
//  O  prev is "other" ([^\s\p{L}\p{N}], not `'`), cur is a digit or a whitespace other than
//     \r \n: prev's piece is a run of others (+ [\r\n]* in cl100k, + [\r\n/]* in o200k) or
//     (o200k) a letter piece ending in a mark; neither can take cur. A piece that starts
//     with prev as the optional prefix needs a letter at p.
//  NL prev is \r or \n, cur is not whitespace (nor `/` for o200k): prev's piece is
//     whitespace only, or (cl100k, o200k) others + [\r\n]* / [\r\n/]*, which stop at cur.
//  W  prev and cur are whitespace, cur is not \r \n, nxt is not whitespace and not the end:
//     cur is the last character of a run of >= 2. From any position x before cur in the run
//     no alternative can end after cur (` ?X`/prefix forms need a non-space after x; the
//     \r\n forms end after the run's last \r/\n, which lies before cur; `\s+(?!\S)` ends
//     exactly at cur), and pieces from x end at cur or earlier, so one ends at cur.
// Document starts are boundaries too. tests/test_tokenizer_gpu.py checks the rules against
// the reference on every code point; a segment's invocation also checks that its last piece
// ends exactly at the next boundary and counts an overrun otherwise (the driver raises).
//
// Long pieces (over SHORT_MAX bytes) are merged in windows, in parallel, and stitched exactly.
// Write BPE(x) for tiktoken's merge loop on the bytes x (lowest rank first, leftmost on
// ties) without the whole-piece lookup, which only applies to pieces of at most the longest
// token. Two facts about it, true for any rank table (BPE(x) picks its merges from the
// pairs inside x, and a pair's rank depends only on its two tokens):
//  (II)  if BPE(x) has a token boundary at q, then BPE(x) = BPE(x[..q]) ++ BPE(x[q..]): the
//        merges on either side are the ones the whole run made there, in the same order.
//  (III) if BPE(a) ends with token t and BPE(b) starts with t, where a and b overlap in
//        exactly t's bytes, then BPE(a ∪ b) = BPE(a) ++ BPE(b) without its first t: a run on
//        a ∪ b that merged across one of t's two edges would, at its first such merge, make
//        the same choice as the run on a (or on b) from the same state, which never merges
//        across it.
// A piece of n > LONG_WINDOW + LONG_OVERLAP bytes gets windows k = 0..m-1 of
// [k W, (k+1) W + OVERLAP) (the last to the end), each merged on its own (bpe_merge_long).
// The seam of window k > 0 is the first position q in its overlap with window k-1 where both
// encodings hold a token t with the same start and id. By induction the tokens of window 0
// before seam 1, of window 1 from seam 1 to seam 2, ... are BPE of the piece: the stitched
// result so far is BPE(piece[..end of window k-1]) and holds window k-1's tokens after seam
// k-1 (W > OVERLAP + the longest token puts seam k after t_{k-1}), so it has t at q; by (II)
// its part up to t is BPE(piece[..q + |t|]) and window k's part from t is
// BPE(piece[q..end of window k]); by (III) together they are BPE(piece[..end of window k]).
// When a seam has no shared token (a periodic run whose token period does not divide W; on
// real vocabularies runs of one character have periods of 1 to 128 bytes, multiples of 3 for
// 3-byte characters, and the shipped W = 384 = 2^7 3; or a run whose phase its piece's first
// character set) the driver encodes that piece again: first with windows started on a token boundary
// of its first window, then with longer windows, at last as one window, which is the plain
// heap merge. Every window costs O(W log W), so the work is linear in n and the windows run
// in parallel.
//
// Long runs: bpe_cuts records per chunk the AND and OR of its characters' classes, the offset
// of its first and last character, of its last \r/\n and the end of its last "lower" (o200k)
// character; a run scan that reaches a chunk's first character and finds the whole chunk in
// the run jumps over it (run scans are O(run / chunk + chunk)).

const NONE: u32 = 0xffffffffu;
const COUNTER_WORDS: u32 = 8u;   // counters' length (shaders/kernels/bpe/encode.py)
const UTF8_INVALID: u32 = 6u;    // counters[6]: bpe_utf8_check's report (encode.py UTF8_WORD)
const UTF8_BYTES: u32 = 16u;     // bytes per bpe_utf8_check invocation (encode.py UTF8_BYTES)
const SHORT_MAX: u32 = 64u;   // pieces up to this many bytes are merged by one invocation
const WG: u32 = 64u;
const STAGE1_WORDS: u32 = 4352u;
const STATE_WORDS: u32 = 4u;  // per long-piece window: phase, position, heap size, seam
const SCRATCH_PER_BYTE: u32 = 5u;   // per window byte: prev, pri, heap slot, heap index, toks

// Unicode class bits (shaders/kernels/bpe/unicode_table.py BIT_*), plus END for "no character".
const CL_L: u32 = 1u;
const CL_N: u32 = 2u;
const CL_S: u32 = 4u;
const CL_M: u32 = 8u;
const CL_UP: u32 = 16u;   // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
const CL_LO: u32 = 32u;   // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
const CL_END: u32 = 128u;

// Long-piece phases (scratch state word 0).
const PH_START: u32 = 0u;
const PH_INIT: u32 = 1u;
const PH_PAIRS: u32 = 2u;
const PH_HEAPIFY: u32 = 3u;
const PH_MERGE: u32 = 4u;
const PH_DONE: u32 = 5u;
const PH_DIRECT: u32 = 6u;   // done: the whole piece is one token, written to tok_buf
// longs[i].w
const LONG_NEW: u32 = 0u;       // queued; its state words are not initialised yet
const LONG_STARTED: u32 = 2u;
const LONG_FINISHED: u32 = 1u;
const LONG_SEAM_FAILED: u32 = 4u;   // set by bpe_long_stitch: no shared token with the left window

override PATTERN: u32 = 0u;   // 0 gpt2/r50k, 1 cl100k, 2 o200k
// 1: bpe_pretok only marks pieces, tok_buf[start] = its length in bytes (vocabulary training,
// tokenizer_svc/training/gpu_corpus.py); 0: it encodes them
override MARK_PIECES: u32 = 0u;
// Long pieces are cut into windows of LONG_WINDOW bytes plus LONG_OVERLAP bytes of the next
// one (see "Long pieces" above). LONG_WINDOW > LONG_OVERLAP + the longest token.
override LONG_WINDOW: u32 = 384u;
override LONG_OVERLAP: u32 = 192u;
// bpe_digit_cuts looks back at most this many chunks for the start of a run of digits
override DIGIT_LOOKBACK: u32 = 4096u;

struct Params {
    n_bytes: u32,
    n_starts: u32,     // documents (or pieces for bpe_merge_pieces)
    n_chunks: u32,
    chunk: u32,        // bytes per chunk (<= 255)
    info_off: u32,     // word offsets into `vocab`
    bytes_off: u32,
    piece_off: u32,
    piece_mask: u32,
    pair_mask: u32,
    max_tok_len: u32,
    whole_piece: u32,  // 1: a piece that is itself a token is that token (tiktoken)
    budget: u32,       // loop iterations per invocation and dispatch (NONE: unlimited)
    lane_shift: u32,   // bpe_cuts, bpe_pretok: chunk c runs on invocation c << lane_shift, so
                       // a small call's chunks sit in separate subgroups (their divergent
                       // walks no longer serialise within one); the others idle
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
    count: u32,     // characters in the run (only compared with 2)
}

var<private> work: u32;
// bpe_short's arrays (indexed at run time, so they live in memory, not registers): private
// to the invocation, zero-filled once per dispatch; declared in bpe_short they were
// zero-filled for every piece (H200: pretok_merge 25.8 -> 15.9 ms per 67 MB call, gpt2)
var<private> short_ids: array<u32, SHORT_MAX>;
var<private> short_pri: array<u32, SHORT_MAX>;
var<private> short_mrg: array<u32, SHORT_MAX>;
var<private> steps: u32;   // bpe_long steps taken in this dispatch (counters[4]: progress)

fn touch_all() {
    _ = &text; _ = &starts; _ = &classes; _ = &vocab; _ = &pairs;
    _ = &cuts; _ = &tok_buf; _ = &longs; _ = &scratch; _ = &counters; _ = &p;
}

fn linear_index(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return workgroup_index(wg, nwg) * WG + lid;
}

// The chunk of invocation i under p.lane_shift (see Params), NONE for the idle ones.
fn spread_index(i: u32) -> u32 {
    if ((i & ((1u << p.lane_shift) - 1u)) != 0u) { return NONE; }
    return i >> p.lane_shift;
}

// ---- text and Unicode classes ------------------------------------------------------------

fn byte_at(i: u32) -> u32 {
    return (text[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

fn class_of(cp: u32) -> u32 {
    // code points 0-255 are stage 2's block 0 (unicode_table.two_level): one load, not two
    var block = 0u;
    if (cp >= 256u) { block = classes[min(cp >> 8u, STAGE1_WORDS - 1u)]; }
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
    work += 1u;
    for (var k = 0u; k < 3u; k += 1u) {
        work += 1u;
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

fn is_crlf(cp: u32) -> bool {
    return cp == 10u || cp == 13u;
}

// If i is the first character of its chunk, the chunk ends before `end` and all its
// characters have a bit of `all` (resp. none of the bits of `none`), the position after the
// chunk's last character; else NONE.
fn chunk_jump(i: u32, end: u32, all: u32, none: u32) -> u32 {
    let c = i / p.chunk;
    let next_chunk = (c + 1u) * p.chunk;
    if (next_chunk >= end) { return NONE; }
    let info = cuts[c];
    if (i != c * p.chunk + ((info.z >> 8u) & 0xffu)) { return NONE; }
    if (all != 0u && (info.z & all) == 0u) { return NONE; }
    if (none != 0u && ((info.w >> 8u) & none) != 0u) { return NONE; }
    return next_chunk + ((cuts[c + 1u].z >> 8u) & 0xffu);
}

fn run_while(i0: u32, end: u32, mask: u32) -> u32 {   // end of the run of chars in `mask`
    var i = i0;
    work += 1u;
    loop {
        work += 1u;
        let jump = chunk_jump(i, end, mask, 0u);
        if (jump != NONE) {
            i = jump;
            continue;
        }
        let c = ch_at(i, end);
        if ((c.cls & mask) == 0u) { break; }
        i += c.len;
    }
    return i;
}

fn run_other(i0: u32, end: u32) -> u32 {
    var i = i0;
    work += 1u;
    loop {
        work += 1u;
        let jump = chunk_jump(i, end, 0u, CL_L | CL_N | CL_S);
        if (jump != NONE) {
            i = jump;
            continue;
        }
        let c = ch_at(i, end);
        if (!is_other(c)) { break; }
        i += c.len;
    }
    return i;
}

fn run_bytes(i0: u32, end: u32, slash: bool) -> u32 {   // [\r\n]* or [\r\n/]*
    var i = i0;
    work += 1u;
    loop {
        work += 1u;
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
    work += 1u;
    loop {
        work += 1u;
        let jump = chunk_jump(i, end, CL_S, 0u);
        if (jump != NONE) {
            let c = i / p.chunk;
            let info = cuts[c].z;
            r.last = c * p.chunk + ((info >> 16u) & 0xffu);
            let crlf = (info >> 24u) & 0xffu;
            if (crlf != 0u) { r.crlf_end = c * p.chunk + crlf; }
            r.count += 2u;
            i = jump;
            continue;
        }
        let c = ch_at(i, end);
        if ((c.cls & CL_S) == 0u) { break; }
        r.last = i;
        if (is_crlf(c.cp)) { r.crlf_end = i + 1u; }
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

// ---- the three patterns: each returns the end of the piece that starts at p0 ---------------

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

// \p{N}{1,3} from a digit c0 at p0 (cl100k, o200k).
fn digit_group(p0: u32, c0: Ch, end: u32) -> u32 {
    var i = p0 + c0.len;
    work += 1u;
    for (var k = 0u; k < 2u; k += 1u) {
        work += 1u;
        let c = ch_at(i, end);
        if ((c.cls & CL_N) == 0u) { break; }
        i += c.len;
    }
    return i;
}

// ` ?[^\s\p{L}\p{N}]+` then `[\r\n]*` (cl100k) or `[\r\n/]*` (o200k, `slash`), from c0 at
// p0; NONE when neither c0 nor a space followed by one starts such a run.
fn other_run(p0: u32, c0: Ch, end: u32, slash: bool) -> u32 {
    var q = p0;
    var c = c0;
    if (c0.cp == 32u) {
        let c1 = ch_at(p0 + 1u, end);
        if (is_other(c1)) {
            q = p0 + 1u;
            c = c1;
        }
    }
    if (is_other(c)) { return run_bytes(run_other(q, end), end, slash); }
    return NONE;
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
    if (!is_crlf(c0.cp) && (c0.cls & CL_N) == 0u) {
        // possessive optional prefix: taken, then at least one letter must follow
        let c1 = ch_at(p0 + c0.len, end);
        if ((c1.cls & CL_L) != 0u) { return run_while(p0 + c0.len, end, CL_L); }
    }
    if ((c0.cls & CL_N) != 0u) { return digit_group(p0, c0, end); }
    let other = other_run(p0, c0, end, false);
    if (other != NONE) { return other; }
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
    work += 1u;
    loop {
        work += 1u;
        let jump = chunk_jump(i, end, CL_UP, 0u);
        if (jump != NONE) {
            let c = i / p.chunk;
            let lo_end = cuts[c].w & 0xffu;
            if (lo_end != 0xffu) { last_lo_end = c * p.chunk + lo_end; }
            i = jump;
            continue;
        }
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
    if (!is_crlf(c0.cp) && (c0.cls & (CL_L | CL_N)) == 0u) {
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
    if ((c0.cls & CL_N) != 0u) { return digit_group(p0, c0, end); }
    let other = other_run(p0, c0, end, true);
    if (other != NONE) { return other; }
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

// Is the position where `cur` starts provably the start of a piece? (rules in the header;
// mirrored by shaders/kernels/bpe/encode.py:cut_rule)
fn is_cut(prev: Ch, cur: Ch, at: u32, end: u32) -> bool {
    if ((cur.cls & CL_END) != 0u || (prev.cls & CL_END) != 0u) { return false; }
    if ((prev.cls & CL_L) != 0u) {                                              // L
        if (PATTERN == 2u) {
            let lu = (prev.cls & (CL_UP | CL_LO)) == CL_LO && (cur.cls & (CL_UP | CL_LO)) == CL_UP
                     && cur.cp != 69u && cur.cp != 76u;
            return ((cur.cls & (CL_L | CL_M)) == 0u && cur.cp != 39u) || lu;               // LU
        }
        return (cur.cls & CL_L) == 0u;
    }
    if ((prev.cls & CL_N) != 0u) { return (cur.cls & CL_N) == 0u; }             // D
    let cur_plain_space = (cur.cls & CL_S) != 0u && !is_crlf(cur.cp);
    if (is_other(prev)) {                                                       // O
        return prev.cp != 39u && ((cur.cls & CL_N) != 0u || cur_plain_space);
    }
    if (is_crlf(prev.cp)) {                                                     // NL
        if ((cur.cls & CL_S) == 0u && !(PATTERN == 2u && cur.cp == 47u)) { return true; }
    }
    if (cur_plain_space) {                                                      // W
        let nxt = ch_at(at + cur.len, end);
        return (nxt.cls & (CL_S | CL_END)) == 0u;
    }
    return false;
}

// Index of the document containing byte x: the last d < n_starts with starts[d] <= x.
fn doc_of(x: u32) -> u32 {
    var lo = 0u;
    var hi = p.n_starts;   // starts[hi] = n_bytes > x
    work += 1u;
    while (hi - lo > 1u) {
        work += 1u;
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
    work += 1u;
    loop {
        work += 1u;
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
    work += 1u;
    for (var k = 0u; k < n; k += 1u) {
        work += 1u;
        h = (h ^ byte_at(s + k)) * 16777619u;
    }
    var slot = h & p.piece_mask;
    work += 1u;
    loop {
        work += 1u;
        let base = p.piece_off + 2u * slot;
        let id = vocab[base + 1u];
        if (id == NONE) { return NONE; }
        if (vocab[base] == h && tok_len(id) == n) {
            let off = vocab[p.info_off + 2u * id];
            var same = true;
            work += 1u;
            for (var k = 0u; k < n; k += 1u) {
                work += 1u;
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

// tiktoken's algorithm in the invocation's arrays: repeatedly merge the lowest-priority pair,
// leftmost first.
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
    work += 1u;
    for (var k = 0u; k < n; k += 1u) {
        work += 1u;
        short_ids[k] = vocab[byte_at(s + k)];
    }
    work += 1u;
    for (var k = 0u; k + 1u < n; k += 1u) {
        work += 1u;
        let pm = pair_lookup(short_ids[k], short_ids[k + 1u]);
        short_pri[k] = pm.x;
        short_mrg[k] = pm.y;
    }
    var m = n;
    work += 1u;
    loop {
        work += 1u;
        var best = NONE;
        var best_pri = NONE;
        work += 1u;
        for (var k = 0u; k + 1u < m; k += 1u) {
            work += 1u;
            if (short_pri[k] < best_pri) {
                best_pri = short_pri[k];
                best = k;
            }
        }
        if (best == NONE) { break; }
        short_ids[best] = short_mrg[best];
        work += 1u;
        for (var k = best + 1u; k + 1u < m; k += 1u) {
            work += 1u;
            short_ids[k] = short_ids[k + 1u];
            short_pri[k] = short_pri[k + 1u];
            short_mrg[k] = short_mrg[k + 1u];
        }
        m -= 1u;
        if (best + 1u < m) {
            let pm = pair_lookup(short_ids[best], short_ids[best + 1u]);
            short_pri[best] = pm.x;
            short_mrg[best] = pm.y;
        }
        if (best > 0u) {
            let pm = pair_lookup(short_ids[best - 1u], short_ids[best]);
            short_pri[best - 1u] = pm.x;
            short_mrg[best - 1u] = pm.y;
        }
    }
    var pos = s;
    work += 1u;
    for (var k = 0u; k < m; k += 1u) {
        work += 1u;
        tok_buf[pos] = short_ids[k];
        pos += tok_len(short_ids[k]);
    }
}

fn encode_piece(s: u32, n: u32) {
    if (n <= SHORT_MAX) {
        bpe_short(s, n);
        return;
    }
    // Windows k = 0..m-1 cover [s + k W, s + (k+1) W + OVERLAP) (the last one to the piece's
    // end, at least OVERLAP long); a piece of at most W + OVERLAP bytes is one window.
    var m = 1u;
    if (n > LONG_WINDOW + LONG_OVERLAP) { m = (n - LONG_OVERLAP + LONG_WINDOW - 1u) / LONG_WINDOW; }
    let slot = atomicAdd(&counters[0], m);
    var base = atomicAdd(&counters[1],
                         m * STATE_WORDS + SCRATCH_PER_BYTE * (n + (m - 1u) * LONG_OVERLAP));
    work += 1u;
    for (var k = 0u; k < m; k += 1u) {
        work += 1u;
        let ws = s + k * LONG_WINDOW;
        var len = n - k * LONG_WINDOW;
        if (k + 1u < m) { len = LONG_WINDOW + LONG_OVERLAP; }
        longs[2u * (slot + k)] = vec4<u32>(ws, len, base, LONG_NEW);
        longs[2u * (slot + k) + 1u] = vec4<u32>(s, n, k, m);
        base += STATE_WORDS + SCRATCH_PER_BYTE * len;
    }
}

// Indexed binary min-heap of part starts keyed by (priority of the pair starting there, start).
// Its arrays live in `scratch` at the word offsets in Heap; the size is passed explicitly.
struct Heap {
    pri: u32,    // priority of the pair starting at each part (NONE: none)
    slots: u32,  // heap order: part starts
    idx: u32,    // slot of each part start in the heap (NONE: not in it)
}

fn heap_less(h: Heap, a: u32, b: u32) -> bool {
    let pa = scratch[h.pri + a];
    let pb = scratch[h.pri + b];
    return pa < pb || (pa == pb && a < b);
}

fn heap_put(h: Heap, slot: u32, pos: u32) {
    scratch[h.slots + slot] = pos;
    scratch[h.idx + pos] = slot;
}

fn sift_up(h: Heap, slot0: u32) {
    var slot = slot0;
    let pos = scratch[h.slots + slot];
    work += 1u;
    loop {
        work += 1u;
        if (slot == 0u) { break; }
        let parent = (slot - 1u) / 2u;
        let other = scratch[h.slots + parent];
        if (!heap_less(h, pos, other)) { break; }
        heap_put(h, slot, other);
        slot = parent;
    }
    heap_put(h, slot, pos);
}

fn sift_down(h: Heap, size: u32, slot0: u32) {
    var slot = slot0;
    let pos = scratch[h.slots + slot];
    work += 1u;
    loop {
        work += 1u;
        let left = 2u * slot + 1u;
        if (left >= size) { break; }
        var child = left;
        let right = left + 1u;
        if (right < size && heap_less(h, scratch[h.slots + right], scratch[h.slots + left])) {
            child = right;
        }
        let other = scratch[h.slots + child];
        if (!heap_less(h, other, pos)) { break; }
        heap_put(h, slot, other);
        slot = child;
    }
    heap_put(h, slot, pos);
}

// Set the priority of the pair starting at part `pos` (NONE: no pair), fix the heap,
// return its new size.
fn heap_set(h: Heap, size: u32, pos: u32, pri: u32) -> u32 {
    let slot = scratch[h.idx + pos];
    let old = scratch[h.pri + pos];
    scratch[h.pri + pos] = pri;
    if (slot == NONE) {
        if (pri == NONE) { return size; }
        heap_put(h, size, pos);
        sift_up(h, size);
        return size + 1u;
    }
    if (pri == NONE) {
        scratch[h.idx + pos] = NONE;
        let last = size - 1u;
        if (slot < last) {
            let moved = scratch[h.slots + last];
            heap_put(h, slot, moved);
            sift_up(h, slot);
            sift_down(h, last, scratch[h.idx + moved]);
        }
        return last;
    }
    if (pri < old) { sift_up(h, slot); } else { sift_down(h, size, slot); }
    return size;
}

// The same rule as bpe_short for the n bytes at text offset s (a window of a long piece), in
// O(n log n), resumable: parts are linked through the token lengths (next) and `prev`; the
// window's own `toks` array in scratch holds the part ids in place (id at a token's first
// byte, NONE elsewhere), so overlapping windows never write the same word.
// Returns true when the piece is finished.
fn bpe_long(s: u32, n: u32, base: u32, whole_ok: bool) -> bool {
    let prev = base + STATE_WORDS;
    let h = Heap(prev + n, prev + 2u * n, prev + 3u * n);
    let toks = prev + 4u * n;
    var phase = scratch[base];
    var k = scratch[base + 1u];
    var size = scratch[base + 2u];
    work += 1u;
    loop {
        work += 1u;
        // The first piece of an invocation always gets one step (work starts near 0), so
        // every dispatch with an unfinished piece makes progress.
        if (phase >= PH_DONE || work >= p.budget) { break; }
        steps += 1u;
        if (phase == PH_START) {
            phase = PH_INIT;
            k = 0u;
            if (whole_ok && p.whole_piece != 0u && n <= p.max_tok_len) {
                let whole = lookup_piece(s, n);
                if (whole != NONE) {
                    tok_buf[s] = whole;   // the rest of the piece is NONE (bpe_fill_none)
                    phase = PH_DIRECT;
                }
            }
        } else if (phase == PH_INIT) {
            work += 1u;
            scratch[toks + k] = vocab[byte_at(s + k)];
            scratch[prev + k] = k - 1u;   // NONE for k = 0
            scratch[h.idx + k] = NONE;
            k += 1u;
            if (k == n) {
                phase = PH_PAIRS;
                k = 0u;
                size = 0u;
            }
        } else if (phase == PH_PAIRS) {
            work += 1u;
            var pri = NONE;
            if (k + 1u < n) { pri = pair_lookup(scratch[toks + k], scratch[toks + k + 1u]).x; }
            scratch[h.pri + k] = pri;
            if (pri != NONE) {
                heap_put(h, size, k);
                size += 1u;
            }
            k += 1u;
            if (k == n) {
                phase = PH_HEAPIFY;
                k = size / 2u;   // sift down slots k-1 .. 0
            }
        } else if (phase == PH_HEAPIFY) {
            if (k == 0u) {
                phase = PH_MERGE;
            } else {
                k -= 1u;
                sift_down(h, size, k);
            }
        } else {   // PH_MERGE: one merge of the lowest (priority, start) pair
            if (size == 0u) {
                phase = PH_DONE;
                continue;
            }
            let i = scratch[h.slots];
            let ti = scratch[toks + i];
            let j = i + tok_len(ti);
            let tj = scratch[toks + j];
            let merged = pair_lookup(ti, tj).y;
            scratch[toks + i] = merged;
            scratch[toks + j] = NONE;
            size = heap_set(h, size, j, NONE);
            let nk = j + tok_len(tj);
            if (nk < n) {
                scratch[prev + nk] = i;
                size = heap_set(h, size, i, pair_lookup(merged, scratch[toks + nk]).x);
            } else {
                size = heap_set(h, size, i, NONE);
            }
            let l = scratch[prev + i];
            if (l != NONE) {
                size = heap_set(h, size, l, pair_lookup(scratch[toks + l], merged).x);
            }
        }
    }
    scratch[base] = phase;
    scratch[base + 1u] = k;
    scratch[base + 2u] = size;
    return phase >= PH_DONE;
}

fn merge_long_from(first: u32, stride: u32) {
    work = 0u;
    steps = 0u;
    let total = atomicLoad(&counters[0]);
    work += 1u;
    for (var i = first; i < total; i += stride) {
        let piece = longs[2u * i];
        if (piece.w == LONG_FINISHED) { continue; }   // in an earlier dispatch
        if (piece.w == LONG_NEW) {
            scratch[piece.z] = PH_START;
            scratch[piece.z + 1u] = 0u;
            scratch[piece.z + 2u] = 0u;
            longs[2u * i].w = LONG_STARTED;
        }
        if (bpe_long(piece.x, piece.y, piece.z, longs[2u * i + 1u].w == 1u)) {
            longs[2u * i].w = LONG_FINISHED;
        } else {
            atomicAdd(&counters[3], 1u);
        }
    }
    if (steps > 0u) { atomicAdd(&counters[4], steps); }
}

// --- KERNEL: bpe_fill_none ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<vec4<u32>>;
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
    // the counters start at zero here: the host writes nothing per call (a write is one more
    // GPU operation that a lone small request waits for)
    if (i < COUNTER_WORDS) { atomicStore(&counters[i], 0u); }
}

// --- KERNEL: bpe_utf8_check ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

// Is every document valid UTF-8 by Python's strict decoder (bytes.decode("utf-8"): no
// overlong form, surrogate U+D800-DFFF or code point above U+10FFFF, no stray continuation
// byte, no lead byte C0, C1 or F5-FF, no sequence cut off by its document's end)? Each
// document [starts[d], starts[d + 1]) is checked on its own. A byte is flagged when it is a
// lead byte whose sequence is not well formed inside its document, or a continuation byte
// that no lead byte of its document covers. The bytes before a document's first flagged byte
// are whole valid characters, and the decoder fails exactly there, so the least flagged
// byte is where the first invalid document stops being valid (Python's exc.start, counted
// from the start of the text). counters[6] = max of ~i over flagged bytes i (~ that least
// one; 0: every document is valid; i < 2^32 - 1). Run after bpe_fill_none (which zeroes the
// counters) and before bpe_cuts, which then finds no boundary in any chunk: the other
// kernels never read invalid text. Dispatch: one invocation per UTF8_BYTES bytes; ASCII
// words cost one load each.
fn utf8_len(b: u32) -> u32 {   // the sequence length a lead byte starts: 0 if none
    if (b < 0x80u) { return 1u; }
    if (b < 0xc2u) { return 0u; }   // continuation bytes, C0, C1 (overlong)
    if (b < 0xe0u) { return 2u; }
    if (b < 0xf0u) { return 3u; }
    if (b < 0xf5u) { return 4u; }
    return 0u;                      // F5-FF: above U+10FFFF
}

fn utf8_bad(i: u32, start: u32, end: u32) -> bool {   // byte i of document [start, end)
    let b = byte_at(i);
    if (b < 0x80u) { return false; }
    if ((b & 0xc0u) == 0x80u) {   // covered by the nearest lead byte before it (<= 3 back)?
        for (var k = 1u; k <= 3u; k += 1u) {
            if (i - start < k) { return true; }
            let c = byte_at(i - k);
            if ((c & 0xc0u) != 0x80u) { return k >= utf8_len(c); }
        }
        return true;
    }
    let n = utf8_len(b);
    if (n == 0u || n > end - i) { return true; }
    // the second byte's range excludes overlong forms (E0, F0), surrogates (ED) and code
    // points above U+10FFFF (F4)
    var lo = 0x80u;
    var hi = 0xbfu;
    if (b == 0xe0u) { lo = 0xa0u; }
    if (b == 0xedu) { hi = 0x9fu; }
    if (b == 0xf0u) { lo = 0x90u; }
    if (b == 0xf4u) { hi = 0x8fu; }
    let b1 = byte_at(i + 1u);
    if (b1 < lo || b1 > hi) { return true; }
    for (var k = 2u; k < n; k += 1u) {
        if ((byte_at(i + k) & 0xc0u) != 0x80u) { return true; }
    }
    return false;
}

@compute @workgroup_size(64)
fn bpe_utf8_check(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let lo = linear_index(wg, nwg, lid) * UTF8_BYTES;
    if (lo >= p.n_bytes) { return; }
    let w0 = lo >> 2u;
    let words = (p.n_bytes + 3u) >> 2u;   // the last one's bytes past n_bytes are zeros
    var high = 0u;
    for (var k = 0u; k < UTF8_BYTES / 4u; k += 1u) {
        if (w0 + k < words) { high |= text[w0 + k]; }
    }
    if ((high & 0x80808080u) == 0u) { return; }   // ASCII only
    let hi = min(lo + UTF8_BYTES, p.n_bytes);
    var d = doc_of(lo);
    for (var i = lo; i < hi; i += 1u) {
        while (starts[d + 1u] <= i) { d += 1u; }
        if (utf8_bad(i, starts[d], starts[d + 1u])) {
            atomicMax(&counters[UTF8_INVALID], ~i);
            return;
        }
    }
}

// --- KERNEL: bpe_cuts ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

// cuts[c] = (first boundary in the chunk or NONE, the same (bpe_pretok's resume position),
//            summary0 = AND of classes | first char offset << 8 | last char offset << 16 |
//                       (offset of its last \r/\n + 1, 0 if none) << 24,
//            summary1 = end offset of its last CL_LO char (255 if none) | OR of classes << 8 |
//                       characters starting in the chunk << 16)
@compute @workgroup_size(64)
fn bpe_cuts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let c = spread_index(linear_index(wg, nwg, lid));
    if (c >= p.n_chunks) { return; }
    if (atomicLoad(&counters[UTF8_INVALID]) != 0u) {   // invalid UTF-8 (bpe_utf8_check):
        cuts[c] = vec4<u32>(NONE, NONE, 0u, 0u);       // no boundary, no digits, no pieces
        return;
    }
    let lo = c * p.chunk;
    let hi = min(lo + p.chunk, p.n_bytes);
    var i = lo;
    work += 1u;
    while (i < hi && (byte_at(i) & 0xc0u) == 0x80u) { i += 1u; }
    var and_mask = 0xffu;
    var or_mask = 0u;
    let first = i - lo;
    var last = 0u;
    var crlf = 0u;
    var lo_end = 0xffu;
    var count = 0u;   // characters starting in the chunk
    var cut = NONE;
    if (i < hi) {
        var d = doc_of(i);
        var prev = Ch(NONE, 0u, CL_END);
        if (starts[d] < i) { prev = ch_before(i); }
        work += 1u;
        loop {
            if (i >= hi) { break; }
            work += 1u;
            while (starts[d + 1u] <= i) { d += 1u; }
            let cur = ch_at(i, starts[d + 1u]);
            if (cut == NONE && (starts[d] == i || is_cut(prev, cur, i, starts[d + 1u]))) {
                cut = i;
            }
            and_mask &= cur.cls;
            or_mask |= cur.cls;
            last = i - lo;
            if (is_crlf(cur.cp)) { crlf = i - lo + 1u; }
            if ((cur.cls & CL_LO) != 0u) { lo_end = i - lo + cur.len; }
            count += 1u;
            prev = cur;
            i += cur.len;
        }
    }
    cuts[c] = vec4<u32>(cut, cut, (and_mask & 0xffu) | (first << 8u) | (last << 16u) | (crlf << 24u),
                        lo_end | (or_mask << 8u) | (count << 16u));
}

// --- KERNEL: bpe_digit_cuts ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

// cl100k and o200k (PATTERN 1, 2), after bpe_cuts: no rule cuts a run of digits (rule D needs
// a non-digit after the digit), so without this one invocation walks a whole run piece by
// piece (65,536 "7"s: 21,846 pieces in a row, most of a 64 MB call's pre-tokenizer time).
// But \p{N}{1,3} pieces tile a run from its first digit (proof of rule D), so every third
// digit from the run's start begins a piece. A chunk without a cut whose characters are all
// digits finds its run's start by looking back over the chunks' summaries (at most
// DIGIT_LOOKBACK chunks; a longer run keeps its serial walk past that) and takes its first
// such digit as its cut. Only cuts[c].x/.y of its own chunk are written; the summaries
// (.z/.w) it reads are bpe_cuts'. The reference is shaders/kernels/bpe/cuts.py:digit_group_starts.
@compute @workgroup_size(64)
fn bpe_digit_cuts(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let c = spread_index(linear_index(wg, nwg, lid));
    if (PATTERN == 0u || c >= p.n_chunks || cuts[c].x != NONE) { return; }
    let z = cuts[c].z;
    let count = (cuts[c].w >> 16u) & 0xffu;
    if (count == 0u || (z & CL_N) == 0u) { return; }   // not a chunk of digits only
    let first = c * p.chunk + ((z >> 8u) & 0xffu);
    let doc_start = starts[doc_of(first)];
    var run = 0u;   // digits from the run's start to `first`
    var j = c;
    var back = 0u;
    work += 1u;
    loop {
        work += 1u;
        if (j == 0u || back == DIGIT_LOOKBACK) { return; }
        j -= 1u;
        back += 1u;
        let zj = cuts[j].z;
        let nj = (cuts[j].w >> 16u) & 0xffu;
        let fj = j * p.chunk + ((zj >> 8u) & 0xffu);
        if (nj == 0u) { return; }
        if (fj > doc_start && (zj & CL_N) != 0u) {   // the whole chunk is in the run
            run += nj;
            continue;
        }
        // the run starts in chunk j or right after it: count its trailing digits (of this
        // document only)
        var t = 0u;
        var i = fj;
        let hi = (j + 1u) * p.chunk;
        work += 1u;
        loop {
            work += 1u;
            if (i >= hi) { break; }
            let ch = ch_at(i, p.n_bytes);
            if (i < doc_start || (ch.cls & CL_N) == 0u) { t = 0u; } else { t += 1u; }
            i += ch.len;
        }
        run += t;
        break;
    }
    // the chunk's first digit at a multiple of 3 from the run's start
    let hi = min((c + 1u) * p.chunk, p.n_bytes);
    var q = first;
    work += 1u;
    loop {
        work += 1u;
        if (q >= hi) { return; }
        if (run % 3u == 0u) { break; }
        run += 1u;
        q += ch_at(q, p.n_bytes).len;
    }
    cuts[c].x = q;
    cuts[c].y = q;
}

// --- KERNEL: bpe_pretok ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

@compute @workgroup_size(64)
fn bpe_pretok(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    touch_all();
    work = 0u;
    let c = spread_index(linear_index(wg, nwg, lid));
    if (c >= p.n_chunks) { return; }
    let resume = cuts[c].y;
    if (resume == NONE) { return; }   // no boundary in this chunk, or segment finished
    // The segment ends at the first boundary of a later chunk. It is found lazily, looking
    // only at the chunks the matched pieces reach (chunk k is looked at once its start is
    // <= pos), so the search costs O(pieces' bytes / chunk), never the whole remaining text.
    var k = max(c + 1u, resume / p.chunk);
    var seg_end = NONE;
    var d = doc_of(resume);
    var pos = resume;
    var pieces = 0u;
    work += 1u;
    loop {
        work += 1u;
        while (seg_end == NONE && k < p.n_chunks && k * p.chunk <= pos) {
            work += 1u;
            seg_end = cuts[k].x;
            k += 1u;
        }
        if (seg_end == NONE && k >= p.n_chunks) { seg_end = p.n_bytes; }
        if (seg_end != NONE && pos >= seg_end) { break; }
        // Progress: at least one piece per dispatch before the budget may stop the segment.
        if (pieces > 0u && work >= p.budget) {
            cuts[c].y = pos;
            atomicAdd(&counters[3], 1u);
            atomicAdd(&counters[4], pieces);   // a finite budget only, as below
            return;
        }
        while (starts[d + 1u] <= pos) {
            work += 1u;
            d += 1u;
        }
        let e = match_piece(pos, starts[d + 1u]);
        if (e <= pos) { break; }   // a matcher that did not advance: counted as an overrun
        if (MARK_PIECES == 1u) {
            tok_buf[pos] = e - pos;
        } else {
            encode_piece(pos, e - pos);
        }
        pos = e;
        pieces += 1u;
    }
    cuts[c].y = NONE;
    if (p.budget != NONE) { atomicAdd(&counters[4], pieces); }   // progress is only read then
    if (pos != seg_end) { atomicAdd(&counters[2], 1u); }
}

// --- KERNEL: bpe_merge_pieces ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<vec4<u32>>;
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
@group(0) @binding(5) var<storage, read_write> cuts: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

@compute @workgroup_size(64)
fn bpe_merge_long(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    touch_all();
    merge_long_from(linear_index(wg, nwg, lid), nwg.x * nwg.y * WG);
}

// --- KERNEL: bpe_merge_long_sg ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

// One piece per subgroup (its lane 0): on llvmpipe a subgroup shares one loop limiter, so a
// lone active lane may spend the whole budget.
@compute @workgroup_size(64)
fn bpe_merge_long_sg(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(subgroup_invocation_id) lane: u32,
                     @builtin(subgroup_id) sg_id: u32,
                     @builtin(num_subgroups) sg_count: u32) {
    touch_all();
    if (lane != 0u) { return; }
    merge_long_from(workgroup_index(wg, nwg) * sg_count + sg_id, nwg.x * nwg.y * sg_count);
}

// --- KERNEL: bpe_merge_long_wg ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

// One workgroup merges one window at a time (workgroup-stride over the queued windows), the
// same rule as bpe_long (lowest priority, leftmost on ties) with the window's parts in
// workgroup memory instead of a heap in `scratch`: each merge is a min over the window's pair
// keys (priority << 10 | start: every lane scans n / 64 of them, subgroupMin, one atomicMin
// per subgroup), invocation 0 applies it, invocations 0 and 1 look up the two new pairs. A
// heap merge walks a chain of dependent global loads per merge on one invocation (H200, the
// 67 MB corpus: 15.6 ms of merge_long at 384 (+192) byte windows); here a merge costs a few
// barriers and two concurrent lookups. It takes only windows of at most LW_MAX bytes that
// no dispatch has started (LONG_NEW), leaving the rest (the driver's longer retry windows, a
// budget's leftovers) to bpe_merge_long, which runs after it and skips finished windows.
// Needs priorities < 2^22 (the host checks). Under a finite budget (software Vulkan) a
// workgroup takes a further window only while invocation 0's count is below it; a window is
// never left half done (at most ~13K counted iterations at LW_MAX).
// LW_MAX and LW_WG are overridden together for short windows (encode.py WG_SHORT_LONG_*):
// each merge is a chain of barriers and lookups, so a window's time is latency; arrays of
// 256 words (a third of the workgroup memory) let more windows run at once per SM (on the
// H200 the arrays' size was what counted: 32 or 64 invocations timed the same).
override LW_MAX: u32 = 768u;   // encode.py WG_LONG_MAX; at most 1024 (keys hold 10 bits)
override LW_WG: u32 = 64u;     // the workgroup's invocations
const LW_NO_PREV: u32 = 0xffffu;
var<workgroup> w_tok: array<u32, LW_MAX>;   // id of the part starting at k, NONE inside one
var<workgroup> w_mrg: array<u32, LW_MAX>;   // merged id of the pair starting at part k
var<workgroup> w_key: array<u32, LW_MAX>;   // priority << 10 | k of that pair, NONE if none
var<workgroup> w_lnk: array<u32, LW_MAX>;   // previous part start << 16 | next part start
var<workgroup> w_best: atomic<u32>;
var<workgroup> w_job: vec4<u32>;   // (start, length, scratch base, 0 skip / 1 merge / 2 stop)
var<workgroup> w_ctl: u32;

// (key, merged id) of the pair (a at position k, b), (NONE, NONE) if it never merges.
fn wg_pair(k: u32, a: u32, b: u32) -> vec2<u32> {
    let pm = pair_lookup(a, b);
    if (pm.x == NONE) { return vec2<u32>(NONE, NONE); }
    return vec2<u32>((pm.x << 10u) | k, pm.y);
}

@compute @workgroup_size(LW_WG)
fn bpe_merge_long_wg(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32,
                     @builtin(subgroup_invocation_id) lane: u32) {
    touch_all();
    work = 0u;
    if (lid == 0u) { w_ctl = atomicLoad(&counters[0]); }
    let total = workgroupUniformLoad(&w_ctl);
    var done = 0u;   // windows this workgroup merged (invocation 0's count)
    work += 1u;
    for (var j = workgroup_index(wg, nwg); j < total; j += nwg.x * nwg.y) {
        work += 1u;
        if (lid == 0u) {
            let win = longs[2u * j];
            var take = 0u;
            if (done > 0u && work >= p.budget) {
                take = 2u;
            } else if (win.w == LONG_NEW && win.y <= LW_MAX) {
                take = 1u;
                // a piece of one window that is itself a token is that token (bpe_long)
                if (longs[2u * j + 1u].w == 1u && p.whole_piece != 0u && win.y <= p.max_tok_len) {
                    let whole = lookup_piece(win.x, win.y);
                    if (whole != NONE) {
                        tok_buf[win.x] = whole;   // the rest of the piece is NONE (bpe_fill_none)
                        scratch[win.z] = PH_DIRECT;
                        longs[2u * j].w = LONG_FINISHED;
                        done += 1u;
                        take = 0u;
                    }
                }
            }
            w_job = vec4<u32>(win.x, win.y, win.z, take);
        }
        let job = workgroupUniformLoad(&w_job);
        if (job.w == 2u) { break; }
        if (job.w == 0u) { continue; }
        let s = job.x;
        let n = job.y;
        // parts start as single bytes, linked in order
        work += 1u;
        for (var k = lid; k < n; k += LW_WG) {
            work += 1u;
            w_tok[k] = vocab[byte_at(s + k)];
            w_lnk[k] = (select(k - 1u, LW_NO_PREV, k == 0u) << 16u) | (k + 1u);
        }
        workgroupBarrier();
        work += 1u;
        for (var k = lid; k < n; k += LW_WG) {
            work += 1u;
            var km = vec2<u32>(NONE, NONE);
            if (k + 1u < n) { km = wg_pair(k, w_tok[k], w_tok[k + 1u]); }
            w_key[k] = km.x;
            w_mrg[k] = km.y;
        }
        if (lid == 0u) { atomicStore(&w_best, NONE); }
        workgroupBarrier();
        work += 1u;
        loop {
            work += 1u;
            var m = NONE;
            work += 1u;
            for (var k = lid; k < n; k += LW_WG) {
                work += 1u;
                m = min(m, w_key[k]);
            }
            m = subgroupMin(m);
            if (lane == 0u && m != NONE) { atomicMin(&w_best, m); }
            workgroupBarrier();
            if (lid == 0u) {   // apply the merge of the lowest key: part i absorbs the next one
                let best = atomicLoad(&w_best);
                atomicStore(&w_best, NONE);
                w_ctl = best;
                if (best != NONE) {
                    let i = best & 1023u;
                    let r = w_lnk[i] & 0xffffu;
                    let after = w_lnk[r] & 0xffffu;
                    w_tok[i] = w_mrg[i];
                    w_tok[r] = NONE;
                    w_key[r] = NONE;
                    w_lnk[i] = (w_lnk[i] & 0xffff0000u) | after;
                    if (after < n) { w_lnk[after] = (i << 16u) | (w_lnk[after] & 0xffffu); }
                }
            }
            let best = workgroupUniformLoad(&w_ctl);
            if (best == NONE) { break; }
            let i = best & 1023u;
            if (lid == 0u) {   // the pair (i, the part after it)
                let after = w_lnk[i] & 0xffffu;
                var km = vec2<u32>(NONE, NONE);
                if (after < n) { km = wg_pair(i, w_tok[i], w_tok[after]); }
                w_key[i] = km.x;
                w_mrg[i] = km.y;
            } else if (lid == 1u) {   // the pair (the part before i, i)
                let l = w_lnk[i] >> 16u;
                if (l != LW_NO_PREV) {
                    let km = wg_pair(l, w_tok[l], w_tok[i]);
                    w_key[l] = km.x;
                    w_mrg[l] = km.y;
                }
            }
            workgroupBarrier();
        }
        // the window's tokens where bpe_long leaves them (its `toks`), for stitch and copy
        let toks = job.z + STATE_WORDS + 4u * n;
        work += 1u;
        for (var k = lid; k < n; k += LW_WG) {
            work += 1u;
            scratch[toks + k] = w_tok[k];
        }
        if (lid == 0u) {
            scratch[job.z] = PH_DONE;
            longs[2u * j].w = LONG_FINISHED;
            done += 1u;
        }
        workgroupBarrier();   // the arrays are reused by the next window
    }
    // progress (counters[4]) is read only under a finite budget
    if (lid == 0u && p.budget != NONE && done > 0u) { atomicAdd(&counters[4], done); }
}

// --- KERNEL: bpe_long_stitch ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

// Per window (grid-stride over the queued windows): its seam, the first position of the
// overlap with the window on its left where both windows' encodings hold a token with the
// same start and id (scratch state word 3; the piece's start for its first window). None:
// LONG_SEAM_FAILED and counters[5] += 1, and the driver merges that piece again with longer
// windows.
fn stitch_one(j: u32) {
    let win = longs[2u * j];
    let info = longs[2u * j + 1u];
    if (info.z == 0u) {
        scratch[win.z + 3u] = win.x;
        return;
    }
    let left = longs[2u * (j - 1u)];
    let toks = win.z + STATE_WORDS + 4u * win.y;
    let left_toks = left.z + STATE_WORDS + 4u * left.y;
    var seam = NONE;
    work += 1u;
    for (var x = win.x; x < left.x + left.y; x += 1u) {
        work += 1u;
        let t = scratch[toks + x - win.x];
        if (t != NONE && scratch[left_toks + x - left.x] == t) {
            seam = x;
            break;
        }
    }
    scratch[win.z + 3u] = seam;
    if (seam == NONE) {
        longs[2u * j].w = LONG_SEAM_FAILED;
        atomicAdd(&counters[5], 1u);
    }
}

@compute @workgroup_size(64)
fn bpe_long_stitch(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let total = atomicLoad(&counters[0]);
    work += 1u;
    for (var j = linear_index(wg, nwg, lid); j < total; j += nwg.x * nwg.y * WG) {
        work += 1u;
        stitch_one(j);
    }
}

// --- KERNEL: bpe_long_copy ---
@group(0) @binding(0) var<storage, read> text: array<u32>;
@group(0) @binding(1) var<storage, read> starts: array<u32>;
@group(0) @binding(2) var<storage, read> classes: array<u32>;
@group(0) @binding(3) var<storage, read> vocab: array<u32>;
@group(0) @binding(4) var<storage, read> pairs: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read_write> cuts: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read_write> tok_buf: array<u32>;
@group(0) @binding(7) var<storage, read_write> longs: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read_write> scratch: array<u32>;
@group(0) @binding(9) var<storage, read_write> counters: array<atomic<u32>>;
@group(0) @binding(10) var<uniform> p: Params;

// Per window (one workgroup, workgroup-stride over the queued windows): tok_buf[x] = the
// window's toks for x in [its seam, the next window's seam) (the piece's end for the last
// window). Skipped for a piece with a failed seam (the driver merges it again) and for a
// piece that is itself a token (done).
fn copy_one(j: u32, lid: u32) {
    let win = longs[2u * j];
    let info = longs[2u * j + 1u];
    if (scratch[win.z] == PH_DIRECT) { return; }
    let first = j - info.z;
    work += 1u;
    for (var k = 0u; k < info.w; k += 1u) {
        work += 1u;
        if (longs[2u * (first + k)].w == LONG_SEAM_FAILED) { return; }
    }
    let lo = scratch[win.z + 3u];
    var hi = win.x + win.y;
    if (info.z + 1u < info.w) { hi = scratch[longs[2u * (j + 1u)].z + 3u]; }
    let toks = win.z + STATE_WORDS + 4u * win.y;
    work += 1u;
    for (var x = lo + lid; x < hi; x += WG) {
        work += 1u;
        tok_buf[x] = scratch[toks + x - win.x];
    }
}

@compute @workgroup_size(64)
fn bpe_long_copy(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    touch_all();
    let total = atomicLoad(&counters[0]);
    work += 1u;
    for (var j = workgroup_index(wg, nwg); j < total; j += nwg.x * nwg.y) {
        work += 1u;
        copy_one(j, lid);
    }
}
