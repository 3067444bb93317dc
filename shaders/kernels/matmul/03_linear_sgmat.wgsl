// 03_linear_sgmat.wgsl — the tensor-core matmuls: subgroup matrices (Dawn's
// chromium_experimental_subgroup_matrix, f16 x f16 -> f32), the same products and epilogues as
// 03_linear_tiled.wgsl (shaders/kernels/matmul/ops.py picks them with tensor_cores=True).
//
//   matmul_nt_sgmat       C[M,N] = alpha * A[M,K]   @ B[N,K]^T   (Linear forward)
//   matmul_nn_sgmat       C[M,N] = alpha * A[M,K]   @ B[K,N]     (Linear dX = dy @ W)
//   matmul_tn_sgmat       C[M,N] = alpha * A[K,M]^T @ B[K,N]     (Linear dW = dy^T @ x)
//   matmul_nt_w16_sgmat   as matmul_nt_sgmat, B the f16 weight mirror
//   matmul_nn_w16_sgmat   as matmul_nn_sgmat, B the f16 weight mirror
//   matmul_tn_w16_sgmat   as matmul_tn_sgmat, B an f16 activation (f16 precision's h, h2, s)
//   matmul_<layout>_a16[_w16]_sgmat   the same with A in f16 (e.g. the LM head's dlogits,
//                         which the cross-entropy writes in f16 for them): half A's bytes,
//                         no rounding while staging
//
// Numerics: both operands are rounded to f16 when staged, products accumulate in f32 over all
// of K (or of a K split), alpha scales the f32 sum. The forward (nt) clamps A to f16's range
// (+-65504, as the packed-f16 kernel); nn/tn do not, so a gradient that overflows f16 becomes
// inf and the optimizer's NaN/Inf guard skips the step (dynamic loss scaling).
//
// A template (shaders/wgsl_expand.py), parameters: SGR x SGC subgroups per workgroup, each
// owning TI x TJ result tiles of 16 x 16 (so BM = 16 SGR TI, BN = 16 SGC TJ), BK (the K slice
// staged per step, a multiple of 16), PAD (16-byte slots, 8 halves each, added to each staged
// row: spreads the tile loads over banks; the config's "-p8" counts halves), LA / LB
// (staging slots of A / B per invocation per slice, the last round partial where a slice has
// fewer: WHOLE_A / WHOLE_B), KSTEPS (BK / 16), AHEAD, DIRECT, SINGLE (below; STAGES follows
// from it), CLAMP_A (the forward clamps an f32 A to f16's range), A16 (the _a16 kernels: A
// is f16), A_MAJOR / B_MAJOR (row_major or col_major: how the layout's staged tiles are read),
// GROUP (row blocks per raster band: the order in which workgroups take C's tiles, raster()),
// WIDE_A / WIDE_B (an f16 A / B bound as array<vec4<u32>> and read 8 halves at a time, one
// bounds check per slot: only where its rows and leading dimension are multiples of 8 halves,
// so a slot is never partly outside the matrix; ops.plan drops "-v16" elsewhere).
// Subgroup size 32 (Dawn's f16 configurations on NVIDIA say so; the op checks).
//
// Staging: each slot is 8 consecutive halves along an operand's contiguous dimension, read
// as two vec4 (f32, rounded to f16 once here; or the f16 rows' bits, as vec2<u32>), each
// zero outside the matrix, and written as ONE vec4<u32> (16-byte) workgroup store, in the
// orientation it was read in, into one of two stages (As: [m][k] rows of BK / 8 + PAD slots,
// or [k][m] rows of BM / 8 + PAD for tn; Bs: [n][k] for nt, [k][n] otherwise). The
// subgroup-matrix loads read them with the template form subgroupMatrixLoad<T, row_major |
// col_major>(&As, offset, stride), offset and stride in slots (Tint loads no other form from
// an array of vectors; Vulkan wants strides of a multiple of 16 bytes, which slots are).
// (Before issue 49 the stage was array<f16> written by four 2-byte stores per vec4.) The
// next slice's global loads go into registers before this slice's multiplies and into the
// other stage after them: one barrier per slice. Matrix arguments derive from
// @builtin(subgroup_id) (they must be subgroup-uniform).
// SINGLE ("-b1", STAGES 1): one stage, rewritten after a second barrier once every subgroup
// has read it. Half the workgroup memory, so a slice of BK 32 fits 128 x 256 tiles. On the
// H200 that won at every 124M product (round 11, dev/tensor_core_matmul/README.md): the two-stage
// kernels stalled on their loads at each slice (more slices in flight, fewer staging stores or
// bytes changed nothing; taking the loads out did); twice the multiplies between barriers and
// more subgroups per SM (half the workgroup memory) hide them.
// AHEAD (1 or 2): slices in flight in registers. 1: the next slice's loads are issued before
// this slice's multiplies, so one slice of multiplies hides their latency; 2: two register
// sets, the loads of slice s + 2 are issued at slice s (the slice loop written out in pairs,
// so each set keeps its registers: no copies that would wait for the loads).
// Epilogue (DIRECT): where the workgroup's whole tile of C is inside the matrix and alpha is
// 1 (every call of the model), the accumulators start from C (accumulate) or R (residual)
// and each subgroup stores its tiles straight to C with subgroupMatrixStore: no workgroup
// memory, no barriers. Elsewhere (ragged edges, alpha != 1; and every tile without DIRECT),
// each result tile goes through the subgroup's 16 x 16 f32 slot of Cs, from where the
// subgroup's 32 lanes write it with bounds checks and the mode (0 store, 1 accumulate,
// 2 residual), two barriers per tile. Split-K as 03_linear_tiled.wgsl (partial z at
// z * c_split; the partials are stored, mode 0).
// Layout requirements as the tiled kernels: contiguous and leading dimensions multiples of
// 4, operands 16-byte aligned (8-byte for f16 B); the two reads of a slot are bounds-checked
// apart, so a row of 4 mod 8 halves needs nothing more.
// Bindings (group 0): 0 A (read, vec4<f32>; for _a16 vec2<u32>, 4 halves' bits, or vec4<u32>
// with WIDE_A), 1 B (read, vec4<f32>; for _w16 vec2<u32>, or vec4<u32> with WIDE_B), 2 R
// (read, vec4<f32>; f32 with DIRECT), 3 C (read_write, vec4<f32>; f32 with DIRECT: the
// element type subgroupMatrixStore needs), 4 Params (uniform).
// Dispatch: (ceil(N / BN), ceil(M / BM), splits) workgroups of 32 SGR SGC invocations.

const SGR: u32 = {{SGR}}u;
const SGC: u32 = {{SGC}}u;
const BM: u32 = 16u * SGR * {{TI}}u;
const BN: u32 = 16u * SGC * {{TJ}}u;
const BK: u32 = {{BK}}u;
const GROUP: u32 = {{GROUP}}u;                          // row blocks per raster band (raster)
const WG: u32 = 32u * SGR * SGC;
const ROW_A: u32 = select(BK, BM, A_KMAJOR);          // halves per staged row of A, unpadded
const ROW_B: u32 = select(BK, BN, B_KMAJOR);
const SA: u32 = ROW_A / 8u + {{PAD}}u;                 // vec4<u32> slots (8 halves) per row
const SB: u32 = ROW_B / 8u + {{PAD}}u;
const STAGE_A: u32 = select(BM, BK, A_KMAJOR) * SA;    // slots per stage
const STAGE_B: u32 = select(BN, BK, B_KMAJOR) * SB;
const SLOTS_A: u32 = BM * BK / 8u;                     // 8-half slots of a slice
const SLOTS_B: u32 = BN * BK / 8u;
const WHOLE_A: bool = SLOTS_A % WG == 0u;              // every invocation fills all LA slots
const WHOLE_B: bool = SLOTS_B % WG == 0u;              // (else the last round is partial)

struct Params {
    m: u32,
    n: u32,
    k: u32,
    mode: u32,     // 0 store, 1 accumulate, 2 residual
    alpha: f32,
    lda: u32,
    ldb: u32,
    ldc: u32,
    k_split: u32,  // K per split (multiple of BK)
    c_split: u32,  // elements between the partial products of consecutive splits
    _pad0: u32,
    _pad1: u32,
}

// @if SINGLE
const STAGES: u32 = 1u;   // one stage, two barriers a slice
// @else
const STAGES: u32 = 2u;   // double-buffered
// @endif
// 8 halves per element (16 bytes: one store per slot; the matrix loads count offsets and
// strides in these elements, and Vulkan wants strides that are multiples of 16 bytes)
var<workgroup> As: array<vec4<u32>, STAGES * STAGE_A>;
var<workgroup> Bs: array<vec4<u32>, STAGES * STAGE_B>;
var<workgroup> Cs: array<f32, 256u * SGR * SGC>;

// Four halves as their bits (the staged form). naga cannot bitcast f16 vectors, so its
// compile check (tests/subgroup_matrix_stub.py) swaps this body; the kernels run under Tint.
fn half_bits(v: vec4<f16>) -> vec2<u32> { return bitcast<vec2<u32>>(v); }

// Global slot t of this invocation's share of the A slice at k0: 8 consecutive halves along
// A's contiguous dimension, two vec4 reads each zero outside the matrix, rounded to f16
// (A16: its f16 bits as stored). The f32 path keeps the form of before the f16 A (values
// assigned inside the bounds checks: a version that returned from inside them ran the
// forward (nt) 2x slower on the H200).
fn fetch_a(t: u32, lid: u32, m0: u32, k0: u32, k_end: u32) -> vec4<u32> {
    let i = lid + t * WG;
// @if A16
    var v0 = vec2<u32>();
    var v1 = vec2<u32>();
// @else
    var v0 = vec4<f32>();
    var v1 = vec4<f32>();
// @endif
// @if WIDE_A
    var w = vec4<u32>();
// @endif
    if (WHOLE_A || i < SLOTS_A) {
        if (A_KMAJOR) {
            let k = k0 + i / (BM / 8u);
            let m = m0 + 8u * (i % (BM / 8u));
            let at = (k * p.lda + m) / 4u;
// @if WIDE_A
            if (k < k_end && m < p.m) { w = a_in[at / 2u]; }
// @else
            if (k < k_end && m < p.m) { v0 = a_in[at]; }
            if (k < k_end && m + 4u < p.m) { v1 = a_in[at + 1u]; }
// @endif
        } else {
            let m = m0 + i / (BK / 8u);
            let k = k0 + 8u * (i % (BK / 8u));
            let at = (m * p.lda + k) / 4u;
// @if WIDE_A
            if (m < p.m && k < k_end) { w = a_in[at / 2u]; }
// @else
            if (m < p.m && k < k_end) { v0 = a_in[at]; }
            if (m < p.m && k + 4u < k_end) { v1 = a_in[at + 1u]; }
// @endif
        }
    }
// @if WIDE_A
    return w;
// @else
// @if A16
    return vec4<u32>(v0, v1);
// @else
// @if CLAMP_A
    v0 = clamp(v0, vec4<f32>(-65504.0), vec4<f32>(65504.0));
    v1 = clamp(v1, vec4<f32>(-65504.0), vec4<f32>(65504.0));
// @endif
    return vec4<u32>(half_bits(vec4<f16>(v0)), half_bits(vec4<f16>(v1)));
// @endif
// @endif
}

fn fetch_b(t: u32, lid: u32, n0: u32, k0: u32, k_end: u32) -> vec4<u32> {
    let i = lid + t * WG;
// @if WIDE_B
    var w = vec4<u32>();
// @else
    var v0 = vec2<u32>();
    var v1 = vec2<u32>();
// @endif
    if (WHOLE_B || i < SLOTS_B) {
        if (B_KMAJOR) {
            let k = k0 + i / (BN / 8u);
            let n = n0 + 8u * (i % (BN / 8u));
            let at = (k * p.ldb + n) / 4u;
// @if WIDE_B
            if (k < k_end && n < p.n) { w = b_in[at / 2u]; }
// @else
            if (k < k_end && n < p.n) { v0 = load_b4(at); }
            if (k < k_end && n + 4u < p.n) { v1 = load_b4(at + 1u); }
// @endif
        } else {
            let n = n0 + i / (BK / 8u);
            let k = k0 + 8u * (i % (BK / 8u));
            let at = (n * p.ldb + k) / 4u;
// @if WIDE_B
            if (n < p.n && k < k_end) { w = b_in[at / 2u]; }
// @else
            if (n < p.n && k < k_end) { v0 = load_b4(at); }
            if (n < p.n && k + 4u < k_end) { v1 = load_b4(at + 1u); }
// @endif
        }
    }
// @if WIDE_B
    return w;
// @else
    return vec4<u32>(v0, v1);
// @endif
}

// Slot t into stage `stage`, in the orientation it was read in: one 16-byte store.
fn stash_a(t: u32, lid: u32, stage: u32, v: vec4<u32>) {
    let i = lid + t * WG;
    if (WHOLE_A || i < SLOTS_A) {
        As[stage * STAGE_A + (i / (ROW_A / 8u)) * SA + i % (ROW_A / 8u)] = v;
    }
}

fn stash_b(t: u32, lid: u32, stage: u32, v: vec4<u32>) {
    let i = lid + t * WG;
    if (WHOLE_B || i < SLOTS_B) {
        Bs[stage * STAGE_B + (i / (ROW_B / 8u)) * SB + i % (ROW_B / 8u)] = v;
    }
}

// Slot offset of the staged 16 x 16 tile whose first element is A's (row m, column k), m
// and k multiples of 16 (so the tile starts a slot), as the matrix loads count offsets.
fn a_at(stage: u32, m: u32, k: u32) -> u32 {
    if (A_KMAJOR) { return stage * STAGE_A + k * SA + m / 8u; }
    return stage * STAGE_A + m * SA + k / 8u;
}

fn b_at(stage: u32, k: u32, n: u32) -> u32 {
    if (B_KMAJOR) { return stage * STAGE_B + k * SB + n / 8u; }
    return stage * STAGE_B + n * SB + k / 8u;
}

// Write the result tile the subgroup just put in its Cs slot to rows r0.., columns c0.. of C.
fn write_tile(sg: u32, lane: u32, r0: u32, c0: u32, split: u32) {
    workgroupBarrier();
    for (var e = 0u; e < 2u; e++) {   // @unroll
        let idx = lane + 32u * e;      // vec4 e of the lane: row idx / 4, columns 4 (idx % 4)..
        let r = idx / 4u;
        let q = 4u * (idx % 4u);
        let row = r0 + r;
        let col = c0 + q;
        if (row < p.m && col < p.n) {
            let s = sg * 256u + r * 16u + q;
            let v = p.alpha * vec4<f32>(Cs[s], Cs[s + 1u], Cs[s + 2u], Cs[s + 3u]);
// @if DIRECT
            let o = split * p.c_split + row * p.ldc + col;   // C and R as f32 elements
            var base = vec4<f32>();
            if (p.mode == 1u) {
                base = vec4<f32>(c_out[o], c_out[o + 1u], c_out[o + 2u], c_out[o + 3u]);
            } else if (p.mode == 2u) {
                base = vec4<f32>(residual[o], residual[o + 1u], residual[o + 2u], residual[o + 3u]);
            }
            let w = base + v;
            c_out[o] = w.x;
            c_out[o + 1u] = w.y;
            c_out[o + 2u] = w.z;
            c_out[o + 3u] = w.w;
// @else
            let o = (split * p.c_split + row * p.ldc + col) / 4u;
            if (p.mode == 1u) {
                c_out[o] = c_out[o] + v;
            } else if (p.mode == 2u) {
                c_out[o] = residual[o] + v;
            } else {
                c_out[o] = v;
            }
// @endif
        }
    }
    workgroupBarrier();
}

// The workgroup's (column block, row block) of C. GROUP 1: the dispatch's own order (x, the
// column block, fastest). GROUP > 1: consecutive workgroups walk bands of GROUP row blocks
// column block by column block (the last band may have fewer rows), so the workgroups in
// flight read a few row blocks of A and a few column blocks of B, which stay in L2, instead
// of one row block of A and a whole row's worth of B (the LM head's B, 77 MB, exceeds L2).
fn raster(wg: vec2<u32>, n: vec2<u32>) -> vec2<u32> {
    if (GROUP <= 1u) { return wg; }
    let band = GROUP * n.x;
    let id = wg.y * n.x + wg.x;
    let first = (id / band) * GROUP;
    let rows = min(n.y - first, GROUP);
    let r = id % band;
    return vec2<u32>(r / rows, first + r % rows);
}

fn tile_body(wg_id: vec3<u32>, nwg: vec3<u32>, lid: u32, sg: u32, lane: u32) {
    let wg = vec3<u32>(raster(wg_id.xy, nwg.xy), wg_id.z);
    let sr = sg / SGC;
    let sc = sg % SGC;
    let m0 = wg.y * BM;
    let n0 = wg.x * BN;
    let k_begin = wg.z * p.k_split;
    let k_end = min(p.k, k_begin + p.k_split);
    let slices = (k_end - k_begin + BK - 1u) / BK;
    let am = sr * (BM / SGR);   // this subgroup's first row and column in the tile
    let bn = sc * (BN / SGC);
    var c: array<subgroup_matrix_result<f32, 16, 16>, {{TI}} * {{TJ}}>;
// @if DIRECT
    // the whole tile inside C and alpha 1: accumulate from C or R, store straight to C
    let direct = p.alpha == 1.0 && m0 + BM <= p.m && n0 + BN <= p.n;
    if (direct && p.mode != 0u) {
        for (var i = 0u; i < {{TI}}u; i++) {   // @unroll
            for (var j = 0u; j < {{TJ}}u; j++) {   // @unroll
                let o = wg.z * p.c_split + (m0 + am + 16u * i) * p.ldc + n0 + bn + 16u * j;
                if (p.mode == 1u) {
                    c[i * {{TJ}}u + j] = subgroupMatrixLoad<subgroup_matrix_result<f32, 16, 16>>(&c_out, o, false, p.ldc);
                } else {
                    c[i * {{TJ}}u + j] = subgroupMatrixLoad<subgroup_matrix_result<f32, 16, 16>>(&residual, o, false, p.ldc);
                }
            }
        }
    }
// @endif
    // register set h holds the slices s with s % AHEAD == h between their loads and stashes
    var ra: array<array<vec4<u32>, {{LA}}>, {{AHEAD}}>;
    var rb: array<array<vec4<u32>, {{LB}}>, {{AHEAD}}>;
    for (var h = 0u; h < {{AHEAD}}u; h++) {   // @unroll
        for (var t = 0u; t < {{LA}}u; t++) {   // @unroll
            ra[h][t] = fetch_a(t, lid, m0, k_begin + h * BK, k_end);
        }
        for (var t = 0u; t < {{LB}}u; t++) {   // @unroll
            rb[h][t] = fetch_b(t, lid, n0, k_begin + h * BK, k_end);
        }
    }
    for (var t = 0u; t < {{LA}}u; t++) {   // @unroll
        stash_a(t, lid, 0u, ra[0][t]);
    }
    for (var t = 0u; t < {{LB}}u; t++) {   // @unroll
        stash_b(t, lid, 0u, rb[0][t]);
    }
    workgroupBarrier();

    for (var s0 = 0u; s0 < slices; s0 += {{AHEAD}}u) {
        for (var h = 0u; h < {{AHEAD}}u; h++) {   // @unroll
            let s = s0 + h;
            if (s < slices) {
                let stage = s % STAGES;
                {   // slice s + AHEAD's loads land while the multiplies below run (zeros past
                    // the end); its set was stashed at the previous slice
                    let k_next = k_begin + (s + {{AHEAD}}u) * BK;
                    for (var t = 0u; t < {{LA}}u; t++) {   // @unroll
                        ra[h][t] = fetch_a(t, lid, m0, k_next, k_end);
                    }
                    for (var t = 0u; t < {{LB}}u; t++) {   // @unroll
                        rb[h][t] = fetch_b(t, lid, n0, k_next, k_end);
                    }
                }
                for (var kk = 0u; kk < {{KSTEPS}}u; kk++) {   // @unroll
                    let ks = 16u * kk;
                    var a: array<subgroup_matrix_left<f16, 16, 16>, {{TI}}>;    // @let
                    var b: array<subgroup_matrix_right<f16, 16, 16>, {{TJ}}>;   // @let
                    for (var i = 0u; i < {{TI}}u; i++) {   // @unroll
                        a[i] = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, {{A_MAJOR}}>(&As, a_at(stage, am + 16u * i, ks), SA);
                    }
                    for (var j = 0u; j < {{TJ}}u; j++) {   // @unroll
                        b[j] = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, {{B_MAJOR}}>(&Bs, b_at(stage, ks, bn + 16u * j), SB);
                    }
                    for (var i = 0u; i < {{TI}}u; i++) {   // @unroll
                        for (var j = 0u; j < {{TJ}}u; j++) {   // @unroll
                            c[i * {{TJ}}u + j] = subgroupMatrixMultiplyAccumulate(a[i], b[j], c[i * {{TJ}}u + j]);
                        }
                    }
                }
                {   // slice s + 1 into the other stage, last read before the previous barrier
                    // (one stage: into this one, once every subgroup has read it)
                    let next = (s + 1u) % STAGES;
// @if SINGLE
                    workgroupBarrier();
// @endif
                    for (var t = 0u; t < {{LA}}u; t++) {   // @unroll
                        stash_a(t, lid, next, ra[(h + 1u) % {{AHEAD}}u][t]);
                    }
                    for (var t = 0u; t < {{LB}}u; t++) {   // @unroll
                        stash_b(t, lid, next, rb[(h + 1u) % {{AHEAD}}u][t]);
                    }
                }
                workgroupBarrier();
            }
        }
    }

// @if DIRECT
    if (direct) {
        for (var i = 0u; i < {{TI}}u; i++) {   // @unroll
            for (var j = 0u; j < {{TJ}}u; j++) {   // @unroll
                subgroupMatrixStore(&c_out, wg.z * p.c_split + (m0 + am + 16u * i) * p.ldc + n0 + bn + 16u * j, c[i * {{TJ}}u + j], false, p.ldc);
            }
        }
        return;
    }
// @endif
    for (var i = 0u; i < {{TI}}u; i++) {   // @unroll
        for (var j = 0u; j < {{TJ}}u; j++) {   // @unroll
            subgroupMatrixStore(&Cs, sg * 256u, c[i * {{TJ}}u + j], false, 16u);
            write_tile(sg, lane, m0 + am + 16u * i, n0 + bn + 16u * j, wg.z);
        }
    }
}

// --- KERNEL: matmul_nt_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = false;   // B[N,K]
fn load_b4(i: u32) -> vec2<u32> { return half_bits(vec4<f16>(clamp(b_in[i], vec4<f32>(-65504.0), vec4<f32>(65504.0)))); }

@compute @workgroup_size(WG)
fn matmul_nt_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32,
                   @builtin(subgroup_id) sg: u32,
                   @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, nwg, lid, sg, lane);
}

// --- KERNEL: matmul_nn_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = true;    // B[K,N]
fn load_b4(i: u32) -> vec2<u32> { return half_bits(vec4<f16>(b_in[i])); }

@compute @workgroup_size(WG)
fn matmul_nn_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32,
                   @builtin(subgroup_id) sg: u32,
                   @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, nwg, lid, sg, lane);
}

// --- KERNEL: matmul_tn_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = true;    // A[K,M]
const B_KMAJOR: bool = true;    // B[K,N]
fn load_b4(i: u32) -> vec2<u32> { return half_bits(vec4<f16>(b_in[i])); }

@compute @workgroup_size(WG)
fn matmul_tn_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                   @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32,
                   @builtin(subgroup_id) sg: u32,
                   @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, nwg, lid, sg, lane);
}

// --- KERNEL: matmul_tn_w16_sgmat ---
// B in f16: the trainer's f16 activations (h, h2, s) in the weight gradients dW = dy^T x
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
// @if WIDE_B
@group(0) @binding(1) var<storage, read> b_in: array<vec4<u32>>;   // 8 halves' bits
// @else
@group(0) @binding(1) var<storage, read> b_in: array<vec2<u32>>;
// @endif
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = true;    // A[K,M]
const B_KMAJOR: bool = true;    // B[K,N] in f16
// @if WIDE_B
// (fetch_b reads 8 halves' bits at once)
// @else
fn load_b4(i: u32) -> vec2<u32> { return b_in[i]; }   // the f16 bits as stored
// @endif

@compute @workgroup_size(WG)
fn matmul_tn_w16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32,
                       @builtin(subgroup_id) sg: u32,
                       @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, nwg, lid, sg, lane);
}

// --- KERNEL: matmul_nt_w16_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
// @if WIDE_B
@group(0) @binding(1) var<storage, read> b_in: array<vec4<u32>>;   // 8 halves' bits
// @else
@group(0) @binding(1) var<storage, read> b_in: array<vec2<u32>>;
// @endif
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = false;   // B[N,K] in f16
// @if WIDE_B
// (fetch_b reads 8 halves' bits at once)
// @else
fn load_b4(i: u32) -> vec2<u32> { return b_in[i]; }   // the f16 bits as stored
// @endif

@compute @workgroup_size(WG)
fn matmul_nt_w16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32,
                       @builtin(subgroup_id) sg: u32,
                       @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, nwg, lid, sg, lane);
}

// --- KERNEL: matmul_nn_w16_sgmat ---
@group(0) @binding(0) var<storage, read> a_in: array<vec4<f32>>;
// @if WIDE_B
@group(0) @binding(1) var<storage, read> b_in: array<vec4<u32>>;   // 8 halves' bits
// @else
@group(0) @binding(1) var<storage, read> b_in: array<vec2<u32>>;
// @endif
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = true;    // B[K,N] in f16
// @if WIDE_B
// (fetch_b reads 8 halves' bits at once)
// @else
fn load_b4(i: u32) -> vec2<u32> { return b_in[i]; }   // the f16 bits as stored
// @endif

@compute @workgroup_size(WG)
fn matmul_nn_w16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32,
                       @builtin(subgroup_id) sg: u32,
                       @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, nwg, lid, sg, lane);
}

// --- KERNEL: matmul_nt_a16_sgmat ---
// @if WIDE_A
@group(0) @binding(0) var<storage, read> a_in: array<vec4<u32>>;   // 8 halves' bits
// @else
@group(0) @binding(0) var<storage, read> a_in: array<vec2<u32>>;
// @endif
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = false;   // B[N,K]
fn load_b4(i: u32) -> vec2<u32> { return half_bits(vec4<f16>(clamp(b_in[i], vec4<f32>(-65504.0), vec4<f32>(65504.0)))); }

@compute @workgroup_size(WG)
fn matmul_nt_a16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, nwg, lid, sg, lane);
}

// --- KERNEL: matmul_nn_a16_sgmat ---
// @if WIDE_A
@group(0) @binding(0) var<storage, read> a_in: array<vec4<u32>>;   // 8 halves' bits
// @else
@group(0) @binding(0) var<storage, read> a_in: array<vec2<u32>>;
// @endif
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = true;    // B[K,N]
fn load_b4(i: u32) -> vec2<u32> { return half_bits(vec4<f16>(b_in[i])); }

@compute @workgroup_size(WG)
fn matmul_nn_a16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, nwg, lid, sg, lane);
}

// --- KERNEL: matmul_tn_a16_sgmat ---
// @if WIDE_A
@group(0) @binding(0) var<storage, read> a_in: array<vec4<u32>>;   // 8 halves' bits
// @else
@group(0) @binding(0) var<storage, read> a_in: array<vec2<u32>>;
// @endif
@group(0) @binding(1) var<storage, read> b_in: array<vec4<f32>>;
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = true;    // A[K,M]
const B_KMAJOR: bool = true;    // B[K,N]
fn load_b4(i: u32) -> vec2<u32> { return half_bits(vec4<f16>(b_in[i])); }

@compute @workgroup_size(WG)
fn matmul_tn_a16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, nwg, lid, sg, lane);
}

// --- KERNEL: matmul_nt_a16_w16_sgmat ---
// @if WIDE_A
@group(0) @binding(0) var<storage, read> a_in: array<vec4<u32>>;   // 8 halves' bits
// @else
@group(0) @binding(0) var<storage, read> a_in: array<vec2<u32>>;
// @endif
// @if WIDE_B
@group(0) @binding(1) var<storage, read> b_in: array<vec4<u32>>;   // 8 halves' bits
// @else
@group(0) @binding(1) var<storage, read> b_in: array<vec2<u32>>;
// @endif
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = false;   // B[N,K] in f16
// @if WIDE_B
// (fetch_b reads 8 halves' bits at once)
// @else
fn load_b4(i: u32) -> vec2<u32> { return b_in[i]; }   // the f16 bits as stored
// @endif

@compute @workgroup_size(WG)
fn matmul_nt_a16_w16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, nwg, lid, sg, lane);
}

// --- KERNEL: matmul_nn_a16_w16_sgmat ---
// @if WIDE_A
@group(0) @binding(0) var<storage, read> a_in: array<vec4<u32>>;   // 8 halves' bits
// @else
@group(0) @binding(0) var<storage, read> a_in: array<vec2<u32>>;
// @endif
// @if WIDE_B
@group(0) @binding(1) var<storage, read> b_in: array<vec4<u32>>;   // 8 halves' bits
// @else
@group(0) @binding(1) var<storage, read> b_in: array<vec2<u32>>;
// @endif
// @if DIRECT
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_out: array<f32>;
// @else
@group(0) @binding(2) var<storage, read> residual: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> c_out: array<vec4<f32>>;
// @endif
@group(0) @binding(4) var<uniform> p: Params;
const A_KMAJOR: bool = false;   // A[M,K]
const B_KMAJOR: bool = true;    // B[K,N] in f16
// @if WIDE_B
// (fetch_b reads 8 halves' bits at once)
// @else
fn load_b4(i: u32) -> vec2<u32> { return b_in[i]; }   // the f16 bits as stored
// @endif

@compute @workgroup_size(WG)
fn matmul_nn_a16_w16_sgmat(@builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32) {
    tile_body(wg, nwg, lid, sg, lane);
}
