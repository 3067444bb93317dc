// 06_activations.wgsl — SwiGLU and GELU (tanh approximation), forward and backward.
//
//   swiglu_forward[_vec4]    h[r,c] = silu(g) * u           g = gu[r*ld + c], u = gu[r*ld + up + c]
//   swiglu_forward_vec4_f16  swiglu_forward_vec4 with h f16: the tensor-core matmul (W2) reads
//                            h as f16, rounding an f32 A to f16 when staging anyway, so an f16 h
//                            gives it the same values at half the bytes. f32 math, one store
//                            clamped to +-65504, rounded to nearest, NaN kept (as cast_f32_f16)
//   swiglu_backward[_vec4]   dgu[.. g] = dh * u * silu'(g),  dgu[.. u] = dh * silu(g)
//   gelu_forward[_vec4]      y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))   (GPT-2's GELU)
//   gelu_backward[_vec4]     dx = dy * gelu'(x)
//
// silu(g) = g * sigmoid(g); silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g).
// Layouts: SwiGLU reads gate and up from one buffer gu: row r's gate at r*ld, its up at
// r*ld + up (the fused [rows, 2F] output of one matmul with ld = 2F, up = F; or two
// [rows, F] halves with ld = F, up = rows*F); h and dh are f32[rows, F] (h f16 in
// _vec4_f16); dgu is laid out like gu. GELU: x, y, dy, dx f32[n]. The _vec4 kernels count F,
// ld, up (or n) in vec4s.
// Saturation is handled without Inf/NaN for any finite input (|x| up to 3e38).
//
// Bindings (group 0): swiglu_forward 0 gu, 1 h (rw; array<vec2<u32>> in _vec4_f16, each
// element the f16 bits of a vec4), 2 Params; swiglu_backward 0 gu, 1 dh, 2 dgu (rw), 3 Params;
// gelu_forward 0 x, 1 y (rw), 2 Params; gelu_backward 0 x, 1 dy, 2 dx (rw), 3 Params.
// Dispatch: ceil(count / 256) workgroups of 256 (count = rows*F or n, in Elems), folded into
// 2-D beyond 65,535; one invocation per Elem.

const EW: u32 = 256u;
const GELU_K: f32 = 0.7978845608028654;   // sqrt(2/pi)
const GELU_C: f32 = 0.044715;

struct Params {
    rows: u32,
    width: u32,   // F (SwiGLU) or n (GELU), in Elems
    ld: u32,
    up: u32,
}

fn flat_index(wg: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return workgroup_index(wg, nwg) * EW + lid;
}

fn sigmoid(x: Elem) -> Elem {
    return Elem(1.0) / (Elem(1.0) + exp(-x));   // exp overflow gives 1/inf = 0: no NaN
}

// tanh without overflow: e = exp(-2|u|) lies in (0, 1].
fn safe_tanh(u: Elem) -> Elem {
    let e = exp(-2.0 * abs(u));
    return sign(u) * (Elem(1.0) - e) / (Elem(1.0) + e);
}

fn gelu(x: Elem) -> Elem {
    let xc = clamp(x, Elem(-20.0), Elem(20.0));   // tanh has saturated well before |x| = 20
    return 0.5 * x * (Elem(1.0) + safe_tanh(GELU_K * (xc + GELU_C * xc * xc * xc)));
}

fn gelu_grad(x: Elem) -> Elem {
    let xc = clamp(x, Elem(-20.0), Elem(20.0));
    let t = safe_tanh(GELU_K * (xc + GELU_C * xc * xc * xc));
    let dt = GELU_K * (Elem(1.0) + 3.0 * GELU_C * xc * xc);
    return 0.5 * (Elem(1.0) + t) + 0.5 * xc * (Elem(1.0) - t * t) * dt;
}

// Where row r's gate of Elem i (r = i / F) lies in gu (its up is p.up further on).
fn gate_index(i: u32) -> u32 { return (i / p.width) * p.ld + i % p.width; }

// h = silu(g) * u (the f32 or vec4 swiglu_forward kernels, before any conversion).
fn swiglu(g: Elem, u: Elem) -> Elem { return g * sigmoid(g) * u; }

// --- KERNEL: swiglu_forward ---
alias Elem = f32;
@group(0) @binding(0) var<storage, read> gu: array<Elem>;
@group(0) @binding(1) var<storage, read_write> h_out: array<Elem>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn swiglu_forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i >= p.rows * p.width) { return; }
    let base = gate_index(i);
    h_out[i] = swiglu(gu[base], gu[base + p.up]);
}

// --- KERNEL: swiglu_forward_vec4 ---
alias Elem = vec4<f32>;
@group(0) @binding(0) var<storage, read> gu: array<Elem>;
@group(0) @binding(1) var<storage, read_write> h_out: array<Elem>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn swiglu_forward_vec4(@builtin(workgroup_id) wg: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i >= p.rows * p.width) { return; }
    let base = gate_index(i);
    h_out[i] = swiglu(gu[base], gu[base + p.up]);
}

// --- KERNEL: swiglu_forward_vec4_f16 ---
alias Elem = vec4<f32>;
@group(0) @binding(0) var<storage, read> gu: array<Elem>;
@group(0) @binding(1) var<storage, read_write> h_out: array<vec2<u32>>;   // f16[rows, F]
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn swiglu_forward_vec4_f16(@builtin(workgroup_id) wg: vec3<u32>,
                           @builtin(num_workgroups) nwg: vec3<u32>,
                           @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i >= p.rows * p.width) { return; }
    let base = gate_index(i);
    h_out[i] = f16_bits(swiglu(gu[base], gu[base + p.up]));
}

// --- KERNEL: swiglu_backward ---
alias Elem = f32;
@group(0) @binding(0) var<storage, read> gu: array<Elem>;
@group(0) @binding(1) var<storage, read> dh: array<Elem>;
@group(0) @binding(2) var<storage, read_write> dgu: array<Elem>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn swiglu_backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i >= p.rows * p.width) { return; }
    let base = (i / p.width) * p.ld + i % p.width;
    let g = gu[base];
    let u = gu[base + p.up];
    let s = sigmoid(g);
    let d = dh[i];
    dgu[base] = d * u * s * (Elem(1.0) + g * (Elem(1.0) - s));
    dgu[base + p.up] = d * g * s;
}

// --- KERNEL: swiglu_backward_vec4 ---
alias Elem = vec4<f32>;
@group(0) @binding(0) var<storage, read> gu: array<Elem>;
@group(0) @binding(1) var<storage, read> dh: array<Elem>;
@group(0) @binding(2) var<storage, read_write> dgu: array<Elem>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn swiglu_backward_vec4(@builtin(workgroup_id) wg: vec3<u32>,
                        @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i >= p.rows * p.width) { return; }
    let base = (i / p.width) * p.ld + i % p.width;
    let g = gu[base];
    let u = gu[base + p.up];
    let s = sigmoid(g);
    let d = dh[i];
    dgu[base] = d * u * s * (Elem(1.0) + g * (Elem(1.0) - s));
    dgu[base + p.up] = d * g * s;
}

// --- KERNEL: gelu_forward ---
alias Elem = f32;
@group(0) @binding(0) var<storage, read> x_in: array<Elem>;
@group(0) @binding(1) var<storage, read_write> y_out: array<Elem>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn gelu_forward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i < p.width) { y_out[i] = gelu(x_in[i]); }
}

// --- KERNEL: gelu_forward_vec4 ---
alias Elem = vec4<f32>;
@group(0) @binding(0) var<storage, read> x_in: array<Elem>;
@group(0) @binding(1) var<storage, read_write> y_out: array<Elem>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn gelu_forward_vec4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i < p.width) { y_out[i] = gelu(x_in[i]); }
}

// --- KERNEL: gelu_backward ---
alias Elem = f32;
@group(0) @binding(0) var<storage, read> x_in: array<Elem>;
@group(0) @binding(1) var<storage, read> dy: array<Elem>;
@group(0) @binding(2) var<storage, read_write> dx: array<Elem>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn gelu_backward(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i < p.width) { dx[i] = dy[i] * gelu_grad(x_in[i]); }
}

// --- KERNEL: gelu_backward_vec4 ---
alias Elem = vec4<f32>;
@group(0) @binding(0) var<storage, read> x_in: array<Elem>;
@group(0) @binding(1) var<storage, read> dy: array<Elem>;
@group(0) @binding(2) var<storage, read_write> dx: array<Elem>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(EW)
fn gelu_backward_vec4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wg, nwg, lid);
    if (i < p.width) { dx[i] = dy[i] * gelu_grad(x_in[i]); }
}
