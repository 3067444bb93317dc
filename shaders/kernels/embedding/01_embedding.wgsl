// 01_embedding.wgsl — token embedding lookup and its gradient.
//
//   embedding_forward[_vec4]    out[t, :] = table[ids[t], :]; zeros when ids[t] >= vocab
//   embedding_backward[_vec4]   dtable[id, :] += sum over tokens t with ids[t] == id of dout[t, :]
//
// Layouts: ids u32[tokens]; table, dtable f32[vocab, dim]; out, dout f32[tokens, dim].
// The _vec4 kernels bind the f32 rows as vec4<f32> (dim % 4 == 0); `dim` in Params then counts
// vec4s.
//
// The backward is deterministic and atomic-free: the host sorts token positions by id
// (ops.py: backward_plan) into `plan`:
//   plan[0] = U, the number of distinct ids
//   plan[1 .. 1+tokens)            token positions, stably sorted by id
//   plan[1+tokens .. 2+tokens+U)   segment starts into that list (U + 1 offsets)
// and one workgroup per (column chunk, segment) sums its tokens' rows in position order.
// The two kernels of each pair differ only in the alias Elem (f32 or vec4<f32>).
//
// Bindings (group 0):
//   forward:  0 ids (read), 1 table (read), 2 out (read_write), 3 Params
//   backward: 0 plan (read), 1 ids (read), 2 dout (read), 3 dtable (read_write), 4 Params
// Dispatch: forward (ceil(dim / EW), tokens) workgroups; backward (ceil(dim / EW), tokens);
// EW = 64 invocations per workgroup, one element each. More than 65,535 rows: the op folds
// the row count into (y, z) and row_index() recovers it.

const EW: u32 = 64u;

struct Params {
    tokens: u32,
    dim: u32,     // row length in Elems
    vocab: u32,
    _pad: u32,
}

// Row of the dispatch: grid y folded into (y, z) by the op when tokens > 65,535.
fn row_index(wg: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wg.y + wg.z * nwg.y;
}

// --- KERNEL: embedding_forward ---
alias Elem = f32;
@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read> table: array<Elem>;
@group(0) @binding(2) var<storage, read_write> emb_out: array<Elem>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn embedding_forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let t = row_index(wg, nwg);
    let c = wg.x * EW + lid;
    if (t >= p.tokens || c >= p.dim) { return; }
    let id = ids[t];
    var v = Elem();
    if (id < p.vocab) { v = table[id * p.dim + c]; }
    emb_out[t * p.dim + c] = v;
}

// --- KERNEL: embedding_forward_vec4 ---
alias Elem = vec4<f32>;
@group(0) @binding(0) var<storage, read> ids: array<u32>;
@group(0) @binding(1) var<storage, read> table: array<Elem>;
@group(0) @binding(2) var<storage, read_write> emb_out: array<Elem>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn embedding_forward_vec4(@builtin(workgroup_id) wg: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
    let t = row_index(wg, nwg);
    let c = wg.x * EW + lid;
    if (t >= p.tokens || c >= p.dim) { return; }
    let id = ids[t];
    var v = Elem();
    if (id < p.vocab) { v = table[id * p.dim + c]; }
    emb_out[t * p.dim + c] = v;
}

// --- KERNEL: embedding_backward ---
alias Elem = f32;
@group(0) @binding(0) var<storage, read> plan: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> grad_out: array<Elem>;
@group(0) @binding(3) var<storage, read_write> dtable: array<Elem>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn embedding_backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let s = row_index(wg, nwg);
    let c = wg.x * EW + lid;
    if (s >= plan[0] || c >= p.dim) { return; }
    let starts = 1u + p.tokens;
    let first = plan[starts + s];
    let last = plan[starts + s + 1u];
    let id = ids[plan[1u + first]];
    if (id >= p.vocab) { return; }
    var acc = Elem();
    for (var j = first; j < last; j++) {
        acc += grad_out[plan[1u + j] * p.dim + c];
    }
    let i = id * p.dim + c;
    dtable[i] = dtable[i] + acc;
}

// --- KERNEL: embedding_backward_vec4 ---
alias Elem = vec4<f32>;
@group(0) @binding(0) var<storage, read> plan: array<u32>;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> grad_out: array<Elem>;
@group(0) @binding(3) var<storage, read_write> dtable: array<Elem>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn embedding_backward_vec4(@builtin(workgroup_id) wg: vec3<u32>,
                           @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let s = row_index(wg, nwg);
    let c = wg.x * EW + lid;
    if (s >= plan[0] || c >= p.dim) { return; }
    let starts = 1u + p.tokens;
    let first = plan[starts + s];
    let last = plan[starts + s + 1u];
    let id = ids[plan[1u + first]];
    if (id >= p.vocab) { return; }
    var acc = Elem();
    for (var j = first; j < last; j++) {
        acc += grad_out[plan[1u + j] * p.dim + c];
    }
    let i = id * p.dim + c;
    dtable[i] = dtable[i] + acc;
}
