"""The subgroup-matrix emulation (shaders/sgmat_emulation.py) against numpy: loads from
workgroup and storage arrays in both majors, offsets and strides, the multiply-accumulate
from f16 operands into f32, stores in both majors that touch nothing else, and the emulated
subgroup's shuffle. On a GPU with real subgroup matrices the same kernel runs unemulated
against the same reference, which checks that the emulation means what the extension means."""

from __future__ import annotations

import numpy as np
import pytest

from istanbul.shaders import sgmat_emulation, source
from istanbul.shaders.engine import Device
from istanbul.shaders.kernels.op_support import has_tensor_cores

KERNEL = """
@group(0) @binding(0) var<storage, read> ab: array<f32>;          // A (32 x 16), then B
@group(0) @binding(1) var<storage, read> c_in: array<f32>;        // accumulators, stride 20
@group(0) @binding(2) var<storage, read_write> out: array<f32>;   // results, column-major
@group(0) @binding(3) var<storage, read_write> shuffled: array<f32>;
var<workgroup> As: array<f16, 512>;
var<workgroup> Bs: array<f16, 512>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    for (var i = lid; i < 512u; i += 64u) {
        As[i] = f16(ab[i]);
        Bs[i] = f16(ab[512u + i]);
    }
    workgroupBarrier();
    // subgroup sg: rows 16 sg.. of A (row-major, stride 16); B column-major, stride 32, at
    // column offset 16 sg; its accumulator row-major from storage at 2 sg, stride 20 (the
    // H200 misreads an f32 matrix loaded from storage at an odd offset: session 19's
    // dev/tensor_core_matmul/sgmat_offset_probe.py; even offsets and any store offset are right there)
    let l = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&As, sg * 256u, false, 16u);
    let r = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>>(&Bs, sg * 16u, true, 32u);
    var acc = subgroupMatrixLoad<subgroup_matrix_result<f32, 16, 16>>(&c_in, sg * 2u, false, 20u);
    acc = subgroupMatrixMultiplyAccumulate(l, r, acc);
    subgroupMatrixStore(&out, sg * 400u + 1u, acc, true, 24u);
    shuffled[lid] = subgroupShuffleXor(0.5 * f32(lid) + f32(lane), 5u);
}
"""


def _expected(ab, c_in, out0, acc_offset: int = 2, store_offset: int = 1):
    """numpy's results of KERNEL, its accumulator at sg * acc_offset and its store at
    sg * 400 + store_offset (dev/tensor_core_matmul/sgmat_offset_probe.py varies both)."""
    a16 = ab[:512].astype(np.float16).astype(np.float32)
    b16 = ab[512:].astype(np.float16).astype(np.float32)
    out = out0.copy()
    for sg in range(2):
        left = a16[sg * 256:(sg + 1) * 256].reshape(16, 16)
        right = np.array([[b16[sg * 16 + n * 32 + k] for n in range(16)] for k in range(16)])
        acc = np.array([[c_in[sg * acc_offset + i * 20 + j] for j in range(16)]
                        for i in range(16)])
        res = acc.astype(np.float64) + left.astype(np.float64) @ right.astype(np.float64)
        for i in range(16):
            for j in range(16):
                out[sg * 400 + store_offset + j * 24 + i] = res[i, j]
    lid = np.arange(64)
    src = (lid & ~31) | ((lid & 31) ^ 5)
    shuffled = 0.5 * src + (src & 31)
    return out, shuffled


@pytest.fixture(scope="module")
def matrix_device():
    dev = Device(None, emulate_subgroup_matrix=True)
    if not has_tensor_cores(dev):
        pytest.skip(f"{dev.name}: neither subgroup matrices nor shader-f16 to emulate them")
    return dev


def test_matrix_ops_match_numpy(matrix_device):
    dev = matrix_device
    rng = np.random.default_rng(3)
    ab = rng.standard_normal(1024).astype(np.float32)
    c_in = rng.standard_normal(400).astype(np.float32)
    out0 = np.full(800, -7.0, np.float32)   # what the stores must leave alone
    bufs = [dev.upload(ab), dev.upload(c_in), dev.upload(out0), dev.zeros(64)]
    kernel = dev.kernel_from_source("emulation_test", KERNEL, "main")
    with dev.record() as rec:
        rec.dispatch(kernel, bufs, 1)
    out, shuffled = dev.download(bufs[2]), dev.download(bufs[3])
    want_out, want_shuffled = _expected(ab, c_in, out0)
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(shuffled, want_shuffled.astype(np.float32))


def test_odd_offset_result_loads_read_nan(matrix_device):
    """The H200 misreads an f32 result matrix loaded at an odd element offset; the emulation
    makes such a load NaN so that no kernel doing it passes the ladder on a CPU."""
    dev = matrix_device
    if not dev.emulated_features:
        pytest.skip(f"{dev.name} has real subgroup matrices (the probe measures them)")
    rng = np.random.default_rng(4)
    ab = rng.standard_normal(1024).astype(np.float32)
    c_in = rng.standard_normal(400).astype(np.float32)
    out0 = np.full(800, -7.0, np.float32)
    odd = KERNEL.replace("(&c_in, sg * 2u, false, 20u)", "(&c_in, sg * 3u, false, 20u)")
    assert odd != KERNEL
    bufs = [dev.upload(ab), dev.upload(c_in), dev.upload(out0), dev.zeros(64)]
    with dev.record() as rec:
        rec.dispatch(dev.kernel_from_source("emulation_odd", odd, "main"), bufs, 1)
    out = dev.download(bufs[2])
    want, _ = _expected(ab, c_in, out0, acc_offset=3)
    first, second = np.zeros(800, bool), np.zeros(800, bool)
    for j in range(16):   # the two subgroups' stored columns
        first[1 + j * 24:1 + j * 24 + 16] = True
        second[401 + j * 24:401 + j * 24 + 16] = True
    np.testing.assert_allclose(out[first], want[first], rtol=1e-5, atol=1e-5)  # offset 0
    assert np.isnan(out[second]).all()                                            # offset 3
    untouched = ~(first | second)
    np.testing.assert_array_equal(out[untouched], out0[untouched])


def test_emulated_device_says_so(matrix_device):
    dev = matrix_device
    if not dev.emulated_features:
        pytest.skip(f"{dev.name} has real subgroup matrices")
    assert dev.has("subgroup-matrix")
    assert dev.subgroup_matrix_configs[0]["emulated"] is True
    # modules without subgroup matrices are composed exactly as on the plain device
    plain = Device(None, emulate_subgroup_matrix=False)
    assert not plain.emulated_features
    assert "subgroup-matrix" not in plain.features or not plain.emulated_features
    text = source.load_file("infra.wgsl")
    assert dev._compose(text, "scale") == plain._compose(text, "scale")


def test_unsupported_constructs_are_refused():
    code = ("enable chromium_experimental_subgroup_matrix;\n"
            "var<workgroup> t: array<f16, 512>;\n"
            "@compute @workgroup_size(32)\nfn main() {\n"
            "    let m = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&t[4], 0u, "
            "false, 16u);\n}\n")
    with pytest.raises(sgmat_emulation.EmulationError, match="only &name"):
        sgmat_emulation.emulate(code)
    two_d = code.replace("@workgroup_size(32)", "@workgroup_size(32, 2)").replace("&t[4]", "&t")
    with pytest.raises(sgmat_emulation.EmulationError, match="1-D workgroups"):
        sgmat_emulation.emulate(two_d)
    other = two_d.replace("(32, 2)", "(32)").replace("let m =", "let s = subgroupAdd(1.0);\n"
                                                     "    let m =")
    with pytest.raises(sgmat_emulation.EmulationError, match="subgroupAdd"):
        sgmat_emulation.emulate(other)


# The template-form loads (subgroupMatrixLoad<T, row_major|col_major>(&p, offset, stride)) from
# workgroup tiles of vec4<u32>, 8 halves an element, offset and stride counted in elements (16
# bytes), as 03_linear_sgmat.wgsl stages its operands: element (r, c) of a row-major matrix at
# half 8 offset + 8 r stride + c, of a column-major one at 8 offset + 8 c stride + r.
VEC4_KERNEL = """
@group(0) @binding(0) var<storage, read> halves: array<f32>;      // 1024 values, rounded to f16
@group(0) @binding(1) var<storage, read_write> out: array<f32>;   // 4 products of 16 x 16
var<workgroup> T: array<vec4<u32>, 128>;

fn bits(x: f32, y: f32) -> u32 { return pack2x16float(vec2<f32>(f32(f16(x)), f32(f16(y)))); }

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32) {
    for (var e = lid; e < 128u; e += 64u) {
        let h = 8u * e;
        T[e] = vec4<u32>(bits(halves[h], halves[h + 1u]), bits(halves[h + 2u], halves[h + 3u]),
                         bits(halves[h + 4u], halves[h + 5u]), bits(halves[h + 6u], halves[h + 7u]));
    }
    workgroupBarrier();
    // row-major left, column-major right, padded strides, offsets by subgroup
    let l1 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, row_major>(&T, 1u + 3u * sg, 5u);
    let r1 = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, col_major>(&T, 70u + 2u * sg, 3u);
    let c1 = subgroupMatrixMultiplyAccumulate(l1, r1, subgroup_matrix_result<f32, 16, 16>());
    subgroupMatrixStore(&out, sg * 256u, c1, false, 16u);
    // column-major left, row-major right
    let l2 = subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, col_major>(&T, 10u + sg, 4u);
    let r2 = subgroupMatrixLoad<subgroup_matrix_right<f16, 16, 16>, row_major>(&T, 30u + sg, 5u);
    let c2 = subgroupMatrixMultiplyAccumulate(l2, r2, subgroup_matrix_result<f32, 16, 16>());
    subgroupMatrixStore(&out, 512u + sg * 256u, c2, false, 16u);
}
"""


def _vec4_matrix(h, offset, stride, col_major):
    """The 16 x 16 matrix at `offset` of an array of 8-half elements (see VEC4_KERNEL)."""
    r, c = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    at = 8 * (offset + c * stride) + r if col_major else 8 * (offset + r * stride) + c
    return h[at]


def test_template_loads_from_vec4_tiles_match_numpy(matrix_device):
    dev = matrix_device
    rng = np.random.default_rng(5)
    halves = rng.standard_normal(1024).astype(np.float32)
    bufs = [dev.upload(halves), dev.upload(np.full(1024, -7.0, np.float32))]
    with dev.record() as rec:
        rec.dispatch(dev.kernel_from_source("emulation_vec4", VEC4_KERNEL, "main"), bufs, 1)
    out = dev.download(bufs[1]).reshape(4, 16, 16)
    h = halves.astype(np.float16).astype(np.float64)
    for sg in range(2):
        want1 = (_vec4_matrix(h, 1 + 3 * sg, 5, False)
                 @ _vec4_matrix(h, 70 + 2 * sg, 3, True))
        want2 = _vec4_matrix(h, 10 + sg, 4, True) @ _vec4_matrix(h, 30 + sg, 5, False)
        np.testing.assert_allclose(out[sg], want1, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out[2 + sg], want2, rtol=1e-5, atol=1e-5)


def test_vec4_tiles_take_only_the_template_form():
    """Tint compiles no bool-argument load from an array of vectors, and none of an f32
    matrix from 8-half elements: the emulation refuses both rather than pass them."""
    head = ("enable chromium_experimental_subgroup_matrix;\n"
            "var<workgroup> t: array<vec4<u32>, 64>;\n"
            "@compute @workgroup_size(32)\nfn main() {\n    let m = ")
    ok = head + ("subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>, col_major>(&t, 0u, "
                 "3u);\n}\n")
    assert "sgm_load_SgmLeft_f16_16x16_t_cm(0u, 3u)" in sgmat_emulation.emulate(ok)
    bool_form = head + ("subgroupMatrixLoad<subgroup_matrix_left<f16, 16, 16>>(&t, 0u, false, "
                        "3u);\n}\n")
    with pytest.raises(sgmat_emulation.EmulationError, match="only the template form"):
        sgmat_emulation.emulate(bool_form)
    result = head + ("subgroupMatrixLoad<subgroup_matrix_result<f32, 16, 16>, row_major>(&t, "
                     "0u, 3u);\n}\n")
    with pytest.raises(sgmat_emulation.EmulationError, match="only the template form"):
        sgmat_emulation.emulate(result)
    vec2 = ok.replace("array<vec4<u32>, 64>", "array<vec2<u32>, 64>")
    with pytest.raises(sgmat_emulation.EmulationError, match="vec2<u32>"):
        sgmat_emulation.emulate(vec2)
