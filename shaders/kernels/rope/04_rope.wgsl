// 04_rope.wgsl — rotary position embedding (rotate-half pairing, as Hugging Face Llama).
//
//   rope   for every token (b, t), head h and pair i < D/2, with j = i + D/2,
//          (c, s) = table[pos_offset + t, i] and sign = +1 (forward) or -1 (backward):
//            y[.., i] = x[.., i] * c - sign * x[.., j] * s
//            y[.., j] = x[.., j] * c + sign * x[.., i] * s
//          The backward is the inverse rotation: it maps dy to dx.
//   rope, rope_vec4           in place (y is x)
//   rope_out, rope_vec4_out   x (read) -> y (written), each in its own layout: e.g. q from
//                             its part of the fused qkv rows into head-major [B, H, T, D]
//   rope_vec4_out_f16         rope_vec4_out with y f16 (needs shader-f16): the tensor-core
//                             attention loads f16 tiles of q and k, half the bytes of f32.
//                             Computed in f32 and converted once at the store, rounding to
//                             nearest; beyond the f16 range it clamps to +-65504 (as the
//                             cast_f32_f16 kernels: an overflow stays finite, not Inf) and
//                             NaN stays NaN
//
// Layouts: x f32 and y f32 (f16 in rope_vec4_out_f16), element (b, t, h, d) at
// b*batch + t*token + h*head + d with their own (token, head, batch) strides: [B, T, H, D]
// contiguous (token H*D, head D), the q/k part of a fused [B, T, (H+2Hkv)*D] buffer (token
// (H+2Hkv)*D; bind a view that starts at the part), or head-major [B, H, T, D] (token D,
// head T*D). table f32[T_max, D/2, 2] holding (cos, sin) pairs (ops.py: rope_table).
//
// The vec4 kernels rotate four consecutive pairs per invocation with vec4 loads and stores
// of x, y and the table (need D % 8 == 0, every stride % 4 == 0 and 16-byte-aligned views).
//
// Bindings (group 0): 0 table (read), 1 x (read_write in place, read otherwise),
// [2 y (read_write; array<vec4<f16>> in rope_vec4_out_f16),] then Params.
// Dispatch: ceil(B*T*H*(D/2) / 256) workgroups of 256 (vec4: ceil(B*T*H*(D/8) / 256))
// folded into 2-D beyond 65,535; one invocation per rotated pair (vec4: per 4 pairs).

const EW: u32 = 256u;

struct Params {
    tokens: u32,       // B*T
    seq: u32,          // T
    heads: u32,
    half: u32,         // D/2
    pos_offset: u32,
    sign: f32,         // +1 forward, -1 backward
    x_token: u32,      // strides of x and y, in elements
    x_head: u32,
    x_batch: u32,
    y_token: u32,
    y_head: u32,
    y_batch: u32,
}

// The work item of invocation g: (token, head, pair or group of 4 pairs); `per_head` pairs
// (scalar) or groups (vec4) per head.
struct Item {
    token: u32,
    h: u32,
    i: u32,
}

fn item(g: u32, per_head: u32) -> Item {
    let per_token = p.heads * per_head;
    let rest = g % per_token;
    return Item(g / per_token, rest / per_head, rest % per_head);
}

// Elements from the start of x (y) to head h of token `token`.
fn x_row(token: u32, h: u32) -> u32 {
    return (token / p.seq) * p.x_batch + (token % p.seq) * p.x_token + h * p.x_head;
}

fn y_row(token: u32, h: u32) -> u32 {
    return (token / p.seq) * p.y_batch + (token % p.seq) * p.y_token + h * p.y_head;
}

// The position whose angles rotate `token`; the table rows are D/2 (cos, sin) pairs.
fn position(token: u32) -> u32 { return token % p.seq + p.pos_offset; }

// cos and sign * sin of four pairs from two vec4 table entries of (c, s, c, s)
fn angles4(t0: vec4<f32>, t1: vec4<f32>) -> array<vec4<f32>, 2> {
    return array<vec4<f32>, 2>(vec4<f32>(t0.x, t0.z, t1.x, t1.z),
                               p.sign * vec4<f32>(t0.y, t0.w, t1.y, t1.w));
}

// Where rope_vec4_out[_f16]'s invocation g works, all in vec4s: the two table entries from
// `at`, x's pair groups at src and src + half4, y's at dst and dst + half4; nothing unless
// `live` (g past the last group: only indices are computed, nothing is loaded).
struct Out4 {
    live: bool,
    half4: u32,
    at: u32,
    src: u32,
    dst: u32,
}

fn out4(g: u32) -> Out4 {
    let half4 = p.half / 4u;
    let it = item(g, half4);
    return Out4(g < p.tokens * p.heads * half4, half4,
                (position(it.token) * p.half) / 2u + 2u * it.i,
                x_row(it.token, it.h) / 4u + it.i, y_row(it.token, it.h) / 4u + it.i);
}

// Four pairs (a, b) rotated by the angles of table entries t0, t1: (y[.., i], y[.., j]).
fn rotate4(t0: vec4<f32>, t1: vec4<f32>, a: vec4<f32>, b: vec4<f32>) -> array<vec4<f32>, 2> {
    let cs = angles4(t0, t1);
    return array<vec4<f32>, 2>(a * cs[0] - b * cs[1], b * cs[0] + a * cs[1]);
}

// --- KERNEL: rope ---
@group(0) @binding(0) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read_write> xs: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn rope(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = workgroup_index(wg, nwg) * EW + lid;
    if (g >= p.tokens * p.heads * p.half) { return; }
    let it = item(g, p.half);
    let cs = table[position(it.token) * p.half + it.i] * vec2<f32>(1.0, p.sign);
    let lo = x_row(it.token, it.h) + it.i;
    let a = xs[lo];
    let b = xs[lo + p.half];
    xs[lo] = a * cs.x - b * cs.y;
    xs[lo + p.half] = b * cs.x + a * cs.y;
}

// --- KERNEL: rope_out ---
@group(0) @binding(0) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read> xs: array<f32>;
@group(0) @binding(2) var<storage, read_write> ys: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn rope_out(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let g = workgroup_index(wg, nwg) * EW + lid;
    if (g >= p.tokens * p.heads * p.half) { return; }
    let it = item(g, p.half);
    let cs = table[position(it.token) * p.half + it.i] * vec2<f32>(1.0, p.sign);
    let src = x_row(it.token, it.h) + it.i;
    let dst = y_row(it.token, it.h) + it.i;
    let a = xs[src];
    let b = xs[src + p.half];
    ys[dst] = a * cs.x - b * cs.y;
    ys[dst + p.half] = b * cs.x + a * cs.y;
}

// --- KERNEL: rope_vec4 ---
@group(0) @binding(0) var<storage, read> table: array<vec4<f32>>;   // (c, s, c, s) per 2 pairs
@group(0) @binding(1) var<storage, read_write> xs: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn rope_vec4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let g = workgroup_index(wg, nwg) * EW + lid;
    let half4 = p.half / 4u;
    if (g >= p.tokens * p.heads * half4) { return; }
    let it = item(g, half4);
    let at = (position(it.token) * p.half) / 2u + 2u * it.i;
    let cs = angles4(table[at], table[at + 1u]);
    let lo = x_row(it.token, it.h) / 4u + it.i;
    let a = xs[lo];
    let b = xs[lo + half4];
    xs[lo] = a * cs[0] - b * cs[1];
    xs[lo + half4] = b * cs[0] + a * cs[1];
}

// --- KERNEL: rope_vec4_out ---
@group(0) @binding(0) var<storage, read> table: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> xs: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> ys: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn rope_vec4_out(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let w = out4(workgroup_index(wg, nwg) * EW + lid);
    if (!w.live) { return; }
    let y = rotate4(table[w.at], table[w.at + 1u], xs[w.src], xs[w.src + w.half4]);
    ys[w.dst] = y[0];
    ys[w.dst + w.half4] = y[1];
}

// --- KERNEL: rope_vec4_out_f16 ---
@group(0) @binding(0) var<storage, read> table: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> xs: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> ys: array<vec4<f16>>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn rope_vec4_out_f16(@builtin(workgroup_id) wg: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let w = out4(workgroup_index(wg, nwg) * EW + lid);
    if (!w.live) { return; }
    let y = rotate4(table[w.at], table[w.at + 1u], xs[w.src], xs[w.src + w.half4]);
    ys[w.dst] = vec4<f16>(f16_range(y[0]));
    ys[w.dst + w.half4] = vec4<f16>(f16_range(y[1]));
}
