// 04_rope.wgsl — rotary position embedding (rotate-half pairing, as Hugging Face Llama), in place.
//
//   rope   for every token (b, t), head h and pair i < D/2, with j = i + D/2,
//          (c, s) = table[pos_offset + t, i] and sign = +1 (forward) or -1 (backward):
//            x[.., i] <- x[.., i] * c - sign * x[.., j] * s
//            x[.., j] <- x[.., j] * c + sign * x[.., i] * s
//          The backward is the inverse rotation: it maps dy to dx in place.
//
// Layouts: x f32, element (b, t, h, d) at ((b*T + t) * token_stride + h*D + d): [B, T, H, D]
// contiguous when token_stride = H*D, or the q/k part of a fused [B, T, (H+2Hkv)*D] buffer
// (bind a view that starts at the part). table f32[T_max, D/2, 2] holding (cos, sin) pairs
// (ops.py: rope_table).
//
// rope_vec4 rotates four consecutive pairs per invocation with vec4 loads and stores of x
// and of the table (needs D % 8 == 0, token_stride % 4 == 0 and 16-byte-aligned views).
//
// Bindings (group 0): 0 table (read), 1 x (read_write), 2 Params.
// Dispatch: ceil(B*T*H*(D/2) / 256) workgroups of 256 (rope_vec4: ceil(B*T*H*(D/8) / 256))
// folded into 2-D beyond 65,535; one invocation per rotated pair (rope_vec4: per 4 pairs).

const EW: u32 = 256u;

struct Params {
    tokens: u32,       // B*T
    seq: u32,          // T
    heads: u32,
    half: u32,         // D/2
    token_stride: u32,
    pos_offset: u32,
    sign: f32,         // +1 forward, -1 backward
    _pad: u32,
}

// --- KERNEL: rope ---
@group(0) @binding(0) var<storage, read> table: array<vec2<f32>>;
@group(0) @binding(1) var<storage, read_write> xs: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn rope(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = workgroup_index(wg, nwg) * EW + lid;
    let per_token = p.heads * p.half;
    if (g >= p.tokens * per_token) { return; }
    let token = g / per_token;
    let rest = g % per_token;
    let h = rest / p.half;
    let i = rest % p.half;
    let pos = token % p.seq + p.pos_offset;
    let cs = table[pos * p.half + i];
    let s = p.sign * cs.y;
    let lo = token * p.token_stride + h * 2u * p.half + i;
    let hi = lo + p.half;
    let a = xs[lo];
    let b = xs[hi];
    xs[lo] = a * cs.x - b * s;
    xs[hi] = b * cs.x + a * s;
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
    let per_token = p.heads * half4;
    if (g >= p.tokens * per_token) { return; }
    let token = g / per_token;
    let rest = g % per_token;
    let h = rest / half4;
    let i4 = rest % half4;
    let pos = token % p.seq + p.pos_offset;
    let t0 = table[(pos * p.half) / 2u + 2u * i4];
    let t1 = table[(pos * p.half) / 2u + 2u * i4 + 1u];
    let c = vec4<f32>(t0.x, t0.z, t1.x, t1.z);
    let s = p.sign * vec4<f32>(t0.y, t0.w, t1.y, t1.w);
    let lo = (token * p.token_stride + h * 2u * p.half) / 4u + i4;
    let hi = lo + half4;
    let a = xs[lo];
    let b = xs[hi];
    xs[lo] = a * c - b * s;
    xs[hi] = b * c + a * s;
}
