"""Causal GQA attention on the real device: ladder cases, tile choice, bad input."""

from __future__ import annotations

import types

import numpy as np
import pytest

from tests.subgroup_matrix_stub import stub_subgroup_matrices
from istanbul.shaders.kernels.attention import ops as attention


@pytest.mark.parametrize("storage", [32768, 49152])   # lavapipe, H200
@pytest.mark.parametrize("D", [4, 6, 16, 64, 128, 256])
@pytest.mark.parametrize("kernel", ["forward", "dq", "dkv"])
def test_tiles_fit_workgroup_memory_and_thread_limits(storage, D, kernel):
    dev = types.SimpleNamespace(limits={"max-compute-workgroup-storage-size": storage,
                                        "max-compute-invocations-per-workgroup": 1024})
    c = attention.choose_tiles(dev, D, kernel)
    rows = c["BKV"] if kernel == "dkv" else c["BQ"]
    other = c["BQ"] if kernel == "dkv" else c["BKV"]
    tpr = c["WG"] // rows
    assert c["HD"] == D and D % tpr == 0 and D // tpr <= attention.MAX_COLS
    assert other % tpr == 0 and other // tpr <= attention.MAX_ROWS and c["WG"] <= 256
    assert attention._floats(kernel, rows, other, D) * 4 <= storage - 1024


def test_future_keys_do_not_leak_into_the_past(device):
    # Changing the last token's k and v must not change any earlier output.
    rng = np.random.default_rng(11)
    B, T, H, Hkv, D = 1, 45, 2, 1, 16
    q = rng.standard_normal((B, T, H, D)).astype(np.float32)
    k = rng.standard_normal((B, T, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((B, T, Hkv, D)).astype(np.float32)
    outs = []
    for _ in range(2):
        o, lse = device.empty((B, T, H, D)), device.empty((B, H, T))
        with device.record() as rec:
            attention.forward(rec, device.upload(q), device.upload(k), device.upload(v), o, lse,
                              B, T, H, Hkv, D)
        outs.append(device.download(o))
        k[:, -1] += 5.0
        v[:, -1] -= 3.0
    assert np.array_equal(outs[0][:, :-1], outs[1][:, :-1])
    assert not np.allclose(outs[0][:, -1], outs[1][:, -1])


def test_bad_shapes_are_refused(device):
    buf = device.empty(4096)
    with device.record() as rec:
        with pytest.raises(ValueError, match="not a multiple of Hkv"):
            attention.forward(rec, buf, buf, buf, buf, buf, 1, 2, 3, 2, 8)
        with pytest.raises(ValueError, match="head dim 520 is too large"):
            attention.forward(rec, buf, buf, buf, buf, buf, 1, 1, 1, 1, 520)
        with pytest.raises(ValueError, match="lse holds"):
            attention.forward(rec, buf, buf, buf, buf, device.empty(3), 1, 4, 1, 1, 8)


def test_prep_lanes_are_a_power_of_two_within_a_row():
    assert [attention.prep_lanes(D) for D in (4, 8, 12, 64, 80, 128, 256)] == \
        [1, 2, 2, 16, 16, 32, 32]


PREP_SHAPES = [   # (B, T, H, D, o layout): odd B*T*H (a partial last workgroup), every lane
    (1, 5, 3, 64, "rows"),   # count (D 4: one lane; 12, 80: lanes with one vec4 fewer)
    (3, 37, 5, 64, "head_major"),
    (2, 9, 3, 12, "padded"),
    (1, 7, 3, 4, "rows"),
    (2, 11, 3, 80, "head_major"),
    (1, 13, 3, 256, "padded"),
]


@pytest.mark.parametrize("f16", [False, True], ids=["vec4", "vec4_f16"])
@pytest.mark.parametrize("B,T,H,D,layout", PREP_SHAPES)
def test_backward_prep_vec4_matches_numpy(device, B, T, H, D, layout, f16):
    """dvec[b,h,t] = sum_d do*o and (_f16) do16 = f16(do) at o's elements, nothing written
    elsewhere (dispatched like attention.backward does; the _f16 kernel stores f16 bits
    through u32 pairs, so it runs without shader-f16 too)."""
    s = {"rows": attention.token_rows(T, D, H * D),
         "padded": attention.token_rows(T, D, H * D + 8),
         "head_major": attention.head_major(T, H, D)}[layout]
    n = (B - 1) * s.batch + (T - 1) * s.token + (H - 1) * s.head + D
    idx = (np.arange(B)[:, None, None, None] * s.batch
           + np.arange(T)[None, :, None, None] * s.token
           + np.arange(H)[None, None, :, None] * s.head + np.arange(D))   # [B, T, H, D]
    rng = np.random.default_rng(B * 1000 + T * 10 + D)
    o, do = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
    want = np.einsum("bthd,bthd->bht", o[idx].astype(np.float64), do[idx].astype(np.float64))
    sentinel = np.float32(7.0)
    dvec = device.upload(np.full(B * H * T + 64, sentinel, np.float32))
    params = attention._params(device, B, T, H, H, (s, s, s), 1.0)
    lanes = attention.prep_lanes(D)
    res = [device.upload(o), device.upload(do), dvec, params]
    name = "attention_backward_prep_vec4"
    if f16:
        do16 = device.empty(n + (n % 2), np.float16)   # zeroed
        res.insert(3, do16)
        name += "_f16"
    kern = device.kernel(attention.FILE, name, {"HD": D, "PREP_LANES": lanes})
    with device.record() as rec:
        rec.dispatch(kern, res, attention.ceil_div(B * T * H, 256 // lanes))
    got = device.download(dvec)
    tol = 1e-5 * np.einsum("bthd->bht", np.abs(o[idx] * do[idx])) + 1e-6
    assert np.all(np.abs(got[:B * H * T].reshape(B, H, T) - want) <= tol)
    assert np.all(got[B * H * T:] == sentinel)
    if f16:
        bits = device.download(do16).view(np.uint16)[:n]
        expect = np.zeros(n, np.uint16)
        expect[idx] = do[idx].astype(np.float16).view(np.uint16)
        assert np.array_equal(bits, expect)


@pytest.mark.parametrize("storage", [32768, 49152])   # lavapipe, H200
@pytest.mark.parametrize("D", [4, 8, 16, 32, 64, 128])
@pytest.mark.parametrize("kernel", ["forward", "dq", "dkv"])
def test_tiled_defaults_fit_and_prefer_big_blocks(storage, D, kernel, monkeypatch):
    monkeypatch.setenv("ISTANBUL_AUTOTUNE", "0")   # the defaults, whatever is cached
    dev = types.SimpleNamespace(limits={"max-compute-workgroup-storage-size": storage,
                                        "max-compute-invocations-per-workgroup": 1024})
    tiles = attention.choose_tiled(dev, kernel, 1024, D)
    if tiles is None:   # nothing fits: the general kernel runs (D = 128 in 32 KiB)
        assert D == 128 and storage == 32768
        assert attention.choose_tiles(dev, D, kernel)
        return
    rows, cols = tiles
    assert not attention.tiled_problems(dev, kernel, rows, cols, D)
    assert attention.tiled_bytes(kernel, rows, cols, D) <= storage - 1024
    if D == 64 and storage == 49152:   # the 124M model's head dim on the H200
        assert tiles == {"forward": (64, 32), "dq": (32, 32), "dkv": (32, 32)}[kernel]


def test_tiled_kernels_run_by_default_and_general_ones_otherwise(device, monkeypatch):
    labels = []
    from istanbul.shaders.engine import Recorder
    original = Recorder.dispatch

    def spy(self, kernel, resources, workgroups, label=""):
        labels.append(label or kernel.name)
        return original(self, kernel, resources, workgroups, label)
    monkeypatch.setattr(Recorder, "dispatch", spy)
    for D, want in ((16, "attention_forward_tiled"), (6, "attention_forward")):
        buf = device.empty(2 * 8 * 2 * D)
        lse = device.empty(2 * 2 * 8)
        labels.clear()
        with device.record() as rec:
            attention.forward(rec, buf, buf, buf, device.empty(2 * 8 * 2 * D), lse,
                              2, 8, 2, 2, D)
        assert labels == [want]


def test_bad_tiled_configs_are_refused(device):
    buf = device.empty(4096)
    with device.record() as rec:
        with pytest.raises(ValueError, match="ROWSxCOLS"):
            attention.forward(rec, buf, buf, buf, buf, buf, 1, 4, 1, 1, 16, config="big")
        with pytest.raises(ValueError, match="column tile dividing"):
            attention.forward(rec, buf, buf, buf, buf, buf, 1, 4, 1, 1, 16, config="16x12")
        with pytest.raises(ValueError, match="multiples of 4"):
            attention.forward(rec, buf, buf, buf, buf, buf, 1, 4, 1, 1, 6, config="16x8")
        with pytest.raises(ValueError, match="workgroup memory"):
            attention.backward(rec, buf, buf, buf, buf, buf, buf, buf, buf, buf, 1, 4, 1, 1,
                               64, config_dq="128x64")
        with pytest.raises(ValueError, match="ROWSxCOLS"):   # unknown suffix
            attention.forward(rec, buf, buf, buf, buf, buf, 1, 4, 1, 1, 16, config="16x8-fast")
        with pytest.raises(ValueError, match="ROWSxCOLS"):   # a retired kernel
            attention.backward(rec, buf, buf, buf, buf, buf, buf, buf, buf, buf, 1, 4, 1, 1,
                               64, config_dq="64x16-db")


STAGED = {k: attention.SGMAT_KERNELS[k] for k in ("forward", "dq", "dkv")}
V2 = {k: attention.SGMAT2_KERNELS[k] for k in ("dq", "dkv")}


def test_tensor_core_attention_plan():
    """What tensor_cores asks for (ops.sgmat_plan): True (alias "sgmat2-backward") = the
    staged forward without robustness (the f32 forward with it) and the sgmat2 backward;
    "staged" the old pair (f32 forward, staged backward); the retired sgmat2 forward
    ("sgmat2") is refused with the reason."""
    names = attention.sgmat_kernel_names
    assert names(True, robustness=False) == {"forward": STAGED["forward"], "dq": V2["dq"],
                                             "dkv": V2["dkv"]}
    assert names(True, robustness=True) == {"forward": None, "dq": V2["dq"], "dkv": V2["dkv"]}
    for robust in (False, True):
        assert names(False, robust) == {"forward": None, "dq": None, "dkv": None}
        assert names("staged", robust) == {"forward": None, "dq": STAGED["dq"],
                                           "dkv": STAGED["dkv"]}
        assert names("sgmat2-backward", robust) == names(True, robust)
    assert attention.sgmat_version(True) == "sgmat2-backward"
    assert attention.sgmat_version("staged") == "staged"
    with pytest.raises(ValueError, match="tensor_cores"):
        attention.sgmat_version("fast")
    with pytest.raises(ValueError, match="sgmat2 forward is retired"):
        attention.sgmat_version("sgmat2")


class _PlanDevice:
    """The real device with a chosen robustness; kernels are their names (nothing compiles)."""

    def __init__(self, real, robustness):
        self._real, self.robustness = real, robustness

    def __getattr__(self, name):
        return getattr(self._real, name)

    def kernel(self, file, name, *args, **kwargs):
        return name


class _LabelRecorder:
    def __init__(self, dev):
        self.device, self.labels = dev, []

    def dispatch(self, kernel, resources, grid, label=None):
        self.labels.append(label)


PREP = "attention_backward_prep_vec4"   # vec4-ready layouts take the vec4 prep kernel


def _v2_backward(dev, T: int, D: int) -> list[str]:
    """The sgmat2 dQ and dK/dV kernels backward() runs on `dev`: the wide ones where they
    fit its workgroup memory (an H200: 48 KiB), else the 64-row ones (lavapipe: 32 KiB)."""
    params = attention.sgmat2_params(D, **attention.chosen_widths(dev, T, D, None))
    return [attention.sgmat2_backward_kernel(k, params)[0] for k in ("dq", "dkv")]


@pytest.mark.parametrize("robust", [False, True])
def test_tensor_core_attention_dispatches_the_plan(device, monkeypatch, robust):
    """forward/backward dispatch what sgmat_plan says (uses_tensor_cores forced on: no
    subgroup matrices here)."""
    monkeypatch.setattr(attention, "uses_tensor_cores", lambda *a, **k: True)
    dev = _PlanDevice(device, robust)
    B, T, H, Hkv, D = 1, 64, 2, 1, 64
    q, o, do, dq = (device.empty((B, T, H, D)) for _ in range(4))
    k, v, dk, dv = (device.empty((B, T, Hkv, D)) for _ in range(4))
    lse = device.empty((B, H, T))

    def run(tensor_cores):
        rec = _LabelRecorder(dev)
        attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D, tensor_cores=tensor_cores)
        attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H, Hkv, D,
                           tensor_cores=tensor_cores)
        return rec.labels

    f32_forward = {attention.TILED_KERNELS["forward"], "attention_forward"}
    v2 = _v2_backward(dev, T, D)
    got = run(True)
    assert got[1:] == [PREP, *v2]
    assert (got[0] == STAGED["forward"]) if not robust else (got[0] in f32_forward)
    got = run("staged")
    assert got[0] in f32_forward
    assert got[1:] == [PREP, STAGED["dq"], STAGED["dkv"]]
    assert run("sgmat2-backward") == run(True)
    with pytest.raises(ValueError, match="retired"):
        run("sgmat2")


@pytest.mark.parametrize("robust", [False, True])
def test_f16_operands_take_the_tensor_core_kernels_or_a_clear_error(device, monkeypatch, robust):
    """f16 q, k, v (the trainer's head-major copies): the tensor-core forward and backward
    with the f16-input kernels and the prep that writes do16; wherever the f32 kernels would
    run instead (robustness on for the forward, tensor cores off, pinned tiles), a ValueError
    naming the reason. takes_f16_operands says exactly when the trainer may store them."""
    monkeypatch.setattr(attention, "uses_tensor_cores", lambda *a, **k: True)
    dev = _PlanDevice(device, robust)
    B, T, H, Hkv, D = 1, 64, 2, 1, 64
    q = device.empty((B, T, H, D), np.float16)
    k, v = (device.empty((B, T, Hkv, D), np.float16) for _ in range(2))
    o, do, dq = (device.empty((B, T, H, D)) for _ in range(3))
    dk, dv = (device.empty((B, T, Hkv, D)) for _ in range(2))
    lse = device.empty((B, H, T))
    strides = (attention.token_rows(T, D, H * D), attention.token_rows(T, D, Hkv * D),
               attention.token_rows(T, D, H * D))
    v2 = _v2_backward(dev, T, D)
    rec = _LabelRecorder(dev)
    attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H, Hkv, D, tensor_cores=True)
    assert rec.labels == [PREP + "_f16", *v2]
    rec = _LabelRecorder(dev)
    attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H, Hkv, D,
                       tensor_cores="staged")
    assert rec.labels == [PREP + "_f16", STAGED["dq"], STAGED["dkv"]]
    rec = _LabelRecorder(dev)
    attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D, config="sgmat")
    assert rec.labels == [STAGED["forward"]]
    assert attention.takes_f16_operands(dev, True, D, strides) is (not robust)
    assert not attention.takes_f16_operands(dev, "staged", D, strides)
    assert not attention.takes_f16_operands(dev, False, D, strides)
    if robust:   # the f32 forward runs there
        with pytest.raises(ValueError, match="f16 q, k, v need the tensor-core forward"):
            attention.forward(_LabelRecorder(dev), q, k, v, o, lse, B, T, H, Hkv, D,
                              tensor_cores=True)
    else:
        rec = _LabelRecorder(dev)
        attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D, tensor_cores=True)
        assert rec.labels == [STAGED["forward"]]
    for kwargs in ({"tensor_cores": False}, {"tensor_cores": True, "config_dq": "32x32"}):
        with pytest.raises(ValueError, match="f16 q, k, v need the tensor-core backward"):
            attention.backward(_LabelRecorder(dev), q, k, v, o, do, lse, dq, dk, dv, B, T, H,
                               Hkv, D, **kwargs)
    with pytest.raises(ValueError, match="f16 q, k, v need the tensor-core forward"):
        attention.forward(_LabelRecorder(dev), q, k, v, o, lse, B, T, H, Hkv, D)
    with pytest.raises(ValueError, match="share one dtype"):
        attention.forward(_LabelRecorder(dev), q, device.empty((B, T, Hkv, D)), v, o, lse,
                          B, T, H, Hkv, D, config="sgmat")
    with pytest.raises(ValueError, match="do has dtype float16"):   # do stays f32
        attention.backward(_LabelRecorder(dev), q, k, v, o, device.empty((B, T, H, D),
                           np.float16), lse, dq, dk, dv, B, T, H, Hkv, D, tensor_cores=True)


def test_f16_operand_kernels_differ_only_in_their_input_type():
    """f16 inputs change the q, k, v, do bindings' element type and the two functions that
    read them (widen, narrow), nothing else of a kernel: 8-byte vec2<u32> elements, their
    bits cast to vec4<f16>."""
    import re
    elem = "vec2<u32>"

    def normalised(code, elem):
        code = re.sub(r"^fn (widen|narrow)\(.*$", "", code, flags=re.M)
        return re.sub(r"((?:q|k|v|do)_in): array<" + re.escape(elem) + ">;", r"\1: ROW;", code)
    for kernel in ("dq", "dkv"):
        f32 = _sgmat2_code(64, {}, {}, kernel)
        f16 = _sgmat2_code(64, {"f16_inputs": True}, {}, kernel)
        assert f32 != f16 and f"var<storage, read> q_in: array<{elem}>;" in f16
        assert normalised(f16, elem) == normalised(f32, "vec4<f32>"), kernel
        assert "bitcast<vec4<f16>>(x)" in f16


# ---- 05_attention_sgmat2.wgsl's experiment knobs (issue 21; dev/tensor_core_matmul/results/h200/sgmat/
# round5_sgmat2_variants.md): every pad and read order of the dQ and dK/dV kernels must
# expand, fit the H200's 48 KiB at head dims 16/32/64, and pass the local compiler with the
# subgroup-matrix calls stubbed out (neither lavapipe nor naga has subgroup matrices; the
# rest of the kernel is checked by the compiler here).

SGMAT2_KNOBS = [{"pad": pad, "order": order} for pad in (0, 4, 8, 16)
                for order in ("spread", "contig", "swizzle")]
SGMAT2_TILES = ({}, {"BK": 16, "BQ2": 16})


def _sgmat2_code(D, knobs, tiles, kernel, features=("shader-f16", "subgroup", "subgroup-matrix"),
                 compiler="tint"):
    from istanbul.shaders import source
    return source.compose(set(features), source.load_file(attention.FILE_SGMAT2),
                          attention.SGMAT2_KERNELS[kernel],
                          params=attention.sgmat2_params(D, **knobs, **tiles), compiler=compiler)


def _u32(expr: str, consts: dict) -> int:
    import re
    py = re.sub(r"\b(\d+)u\b", r"\1", expr).replace("/", "//")
    return int(eval(py, {"max": max, "min": min, "__builtins__": {}}, dict(consts)))


def _workgroup_bytes(code: str) -> int:
    """Bytes of the workgroup variables the kernel file declares (not the preamble's), read
    from the expanded WGSL: u32 constants evaluated, arrays of f16/f32/u32."""
    import re
    own = code.split(f"// ---- {attention.FILE_SGMAT2} ----", 1)[1]
    consts = {}
    for m in re.finditer(r"^const (\w+): u32 = ([^;]+);", own, re.M):
        consts[m.group(1)] = _u32(m.group(2), consts)
    size = {"f16": 2, "f32": 4, "u32": 4}
    total = 0
    for m in re.finditer(r"^var<workgroup> \w+: (?:array<(\w+), ([^;]+)>|(\w+));", own, re.M):
        total += size[m.group(1)] * _u32(m.group(2), consts) if m.group(1) else size[m.group(3)]
    return total


@pytest.mark.parametrize("knobs", SGMAT2_KNOBS, ids=lambda k: f"pad{k['pad']}-{k['order']}")
def test_sgmat2_variants_expand_and_fit_48_kib(knobs):
    for D in (16, 32, 64):
        for tiles in SGMAT2_TILES:
            params = attention.sgmat2_params(D, **knobs, **tiles)
            for kernel in ("dq", "dkv"):
                code = _sgmat2_code(D, knobs, tiles, kernel)
                got = _workgroup_bytes(code)
                assert got == attention.sgmat2_bytes(kernel, params), (D, tiles, kernel)
                assert got <= attention.SGMAT2_WORKGROUP_BYTES == 48 * 1024, (D, tiles, kernel)
                assert "{{" not in code and "@if" not in code
            # dK/dV shares k/v's array with p/ds only where it must (pads 8, 16 at D 64)
            assert params["KV_IN_P"] == (D == 64 and not tiles and knobs["pad"] >= 8)


@pytest.mark.parametrize("wide", ["w8", "w4x2", "w4"])
def test_sgmat2_wide_backward_expands_and_fits_48_kib(wide):
    """The wide dQ and dK/dV kernels at head dims 16/32/64 and both tiles: the bytes ops.py
    counts are the kernels', within the H200's 48 KiB; their grids follow their rows a
    workgroup."""
    from istanbul.shaders import source
    nsg, kr = attention.SGMAT2_WIDE_SHAPES[wide]
    for D in (16, 32, 64):
        for tiles in ({}, {"BK": 16, "BQ2": 16}):
            params = attention.sgmat2_params(D, dq=wide, dkv=wide, **tiles)
            for kernel in ("dq", "dkv"):
                name, rows = attention.sgmat2_backward_kernel(kernel, params)
                assert (name, rows) == (attention.SGMAT2_WIDE[kernel], 16 * nsg * kr)
                code = source.compose({"shader-f16", "subgroup", "subgroup-matrix"},
                                      source.load_file(attention.FILE_SGMAT2), name,
                                      params=params, compiler="tint")
                got = _workgroup_bytes(code)
                assert got == attention.sgmat2_bytes(kernel, params) <= 48 * 1024, (D, tiles)
                assert "{{" not in code and "@if" not in code
    base = attention.sgmat2_params(64, dq="base", dkv="base")
    for kernel in ("dq", "dkv"):
        assert attention.sgmat2_backward_kernel(kernel, base) == (
            attention.SGMAT2_KERNELS[kernel], 64)


def test_sgmat2_wide_knobs_check_their_values():
    p = attention.sgmat2_params(64, dq="w4x2", dkv="w8")
    assert (p["DQ"], p["DKV"]) == ("w4x2", "w8")
    assert attention.sgmat2_params(64)["DKV"] == "base"
    with pytest.raises(ValueError, match="dkv 'w3'"):
        attention.sgmat2_params(64, dkv="w3")
    with pytest.raises(ValueError, match="dq"):
        attention.sgmat2_params(64, dq="wide")
    with pytest.raises(ValueError, match="qorder"):
        attention.sgmat2_params(64, dkv="w8", qorder="down")
    with pytest.raises(ValueError, match="spread"):
        attention.sgmat2_params(64, dq="w8", order="contig")


def test_sgmat2_wide_backward_matches_the_shipped_kernels_bit_for_bit():
    """The wide dQ and dK/dV kernels sum the same products in the same order as the 64-row
    ones: their outputs are the same bits (GQA, head-major and token rows, several tiles of
    each kind, a ragged last tile). Runs where f16 subgroup matrices run, or emulated under
    Dawn (CI's Dawn step; under wgpu-native the emulated kernels compile for minutes)."""
    from istanbul.shaders import tuned_cache
    from istanbul.shaders.engine import Device
    from istanbul.shaders.kernels.case_support import run_launch
    from istanbul.shaders.kernels.attention import cases
    dev = Device(None, emulate_subgroup_matrix=True)
    if not attention.has_tensor_cores(dev):
        pytest.skip(f"{dev.name}: no f16 subgroup matrices, real or emulated")
    if dev.emulated_features and tuned_cache._webgpu(dev) != "dawn":
        pytest.skip("emulated subgroup matrices are checked under Dawn here")
    rng = np.random.default_rng(1)
    shapes = {"wide_hm": (2, 300, 4, 2, 32, "head_major", 1.0),
              "wide_rows": (1, 150, 4, 1, 16, "rows", 1.0)}
    small = {"BQ2": 16, "BK": 16}   # lavapipe's 32 KiB
    for name, shape in shapes.items():
        cases.SHAPES[name] = shape
        try:
            inp = cases.make_inputs(rng, name)
        finally:
            del cases.SHAPES[name]
        outs = {w: run_launch(dev, cases.sgmat2_backward_launch(
                    dev, inp, sgmat_tiles={"dq": w, "dkv": w, **small}))
                for w in ("base", "w8", "w4x2")}
        for w in ("w8", "w4x2"):
            for key in ("dq", "dk", "dv"):
                assert np.array_equal(np.asarray(outs[w][key]), np.asarray(outs["base"][key])), \
                    (name, w, key)


def test_sgmat2_defaults_are_the_reviewed_kernel():
    p = attention.sgmat2_params(64)
    assert p == {"HD": 64, "DT": 4, "BK": 32, "BQ2": 32, "SPAD": 4, "SPREAD": True,
                 "SWIZZLE": False, "KV_IN_P": False, "Q_DESC": False,
                 "DQ": "base", "QNSG": 4, "QKR": 1, "DKV": "base", "NSG": 4, "KR": 1,
                 "IN4": "vec4<f32>", "F16_BITS": False}
    with pytest.raises(ValueError, match="multiple of 4"):
        attention.sgmat2_params(64, pad=6)
    with pytest.raises(ValueError, match="order"):
        attention.sgmat2_params(64, order="rows")
    with pytest.raises(ValueError, match="unknown knobs"):
        attention.sgmat2_params(64, BKQ=16)
    for retired in ({"fold": "every"}, {"BKF": 32}):   # the retired forward's knobs
        with pytest.raises(ValueError, match="unknown knobs"):
            attention.sgmat2_params(64, **retired)
    with pytest.raises(ValueError, match="qorder"):
        attention.sgmat2_params(64, qorder="sideways")


def test_sgmat2_qorder_changes_only_dkv():
    """qorder="down" (opt-in) reorders dK/dV's query tiles; dQ is the same kernel, and the
    default is the measured ascending order."""
    assert _sgmat2_code(64, {"qorder": "down"}, {}, "dq") == _sgmat2_code(64, {}, {}, "dq")
    up, down = _sgmat2_code(64, {}, {}, "dkv"), _sgmat2_code(64, {"qorder": "down"}, {}, "dkv")
    assert "for (var qt = first; qt < tiles; qt++)" in up and "n_done" not in up
    assert "let qt = tiles - 1u - n_done;" in down


@pytest.mark.parametrize("D", [16, 32, 64])
def test_sgmat2_variants_pass_the_compiler_with_subgroup_matrices_stubbed(device, D):
    if not (device.has("shader-f16") and device.has("subgroup")):
        pytest.skip("needs shader-f16 and subgroups")
    for knobs in SGMAT2_KNOBS:
        for kernel in ("dq", "dkv"):
            code = stub_subgroup_matrices(_sgmat2_code(
                D, knobs, {}, kernel, features=device.features,
                compiler=device.backend.compiler))
            try:   # the module only: most variants pass lavapipe's 32 KiB of workgroup memory
                device.raw.create_shader_module(label=f"sgmat2 stub {knobs}", code=code)
            except Exception as exc:
                raise AssertionError(f"D {D} {knobs} {kernel}: {exc}") from None


@pytest.mark.parametrize("D", [16, 32, 64])
def test_sgmat2_wide_kernels_pass_the_compiler_with_subgroup_matrices_stubbed(device, D):
    """The wide dQ and dK/dV kernels, every width and both tiles, through this backend's own
    compiler (naga under wgpu-native, Tint under Dawn) with the matrices stubbed."""
    from istanbul.shaders import source
    if not (device.has("shader-f16") and device.has("subgroup")):
        pytest.skip("needs shader-f16 and subgroups")
    for wide in ("w8", "w4x2", "w4"):
        for tiles in ({}, {"BK": 16, "BQ2": 16}):
            params = attention.sgmat2_params(D, dq=wide, dkv=wide, **tiles)
            for kernel in ("dq", "dkv"):
                code = stub_subgroup_matrices(source.compose(
                    set(device.features), source.load_file(attention.FILE_SGMAT2),
                    attention.SGMAT2_WIDE[kernel], params=params,
                    compiler=device.backend.compiler))
                try:
                    device.raw.create_shader_module(label=f"wide stub {wide}", code=code)
                except Exception as exc:
                    raise AssertionError(f"D {D} {wide} {tiles} {kernel}: {exc}") from None


def test_sgmat2_stub_check_catches_errors(device):
    if not (device.has("shader-f16") and device.has("subgroup")):
        pytest.skip("needs shader-f16 and subgroups")
    code = stub_subgroup_matrices(_sgmat2_code(16, {}, {}, "dq", features=device.features,
                                                compiler=device.backend.compiler))
    assert "let srow = row * SSQ;" in code
    with pytest.raises(Exception):
        device.raw.create_shader_module(code=code.replace("let srow = row * SSQ;",
                                                          "let srow = row * SSQ_;"))


@pytest.mark.parametrize("D", [16, 32, 64])
def test_sgmat_kernels_pass_the_compiler_with_subgroup_matrices_stubbed(device, D):
    """05_attention_sgmat.wgsl's forward and its staged dQ and dK/dV, f32 and (Tint) f16
    inputs, through this backend's own compiler (naga under wgpu-native, Tint under Dawn),
    the matrices stubbed: a compile check of every head dim on a CPU, where the emulated
    ladder runs only what fits lavapipe's 32 KiB (the forward at D 16)."""
    from istanbul.shaders import source
    from tests.subgroup_matrix_stub import for_compiler
    if not (device.has("shader-f16") and device.has("subgroup")):
        pytest.skip("needs shader-f16 and subgroups")
    compiler = device.backend.compiler
    # f16 inputs are read as bits and bitcast to f16 vectors (widen, narrow), which naga
    # cannot do: those builds are Tint's only
    for f16_in in (False, True) if compiler == "tint" else (False,):
        for kernel in ("forward", "dq", "dkv"):
            code = stub_subgroup_matrices(source.compose(
                set(device.features), source.load_file(attention.FILE_SGMAT),
                attention.SGMAT_KERNELS[kernel], params=attention.sgmat_params(D, f16_in),
                compiler=compiler))
            try:
                device.raw.create_shader_module(label=f"sgmat stub {kernel}",
                                                code=for_compiler(code, compiler))
            except Exception as exc:
                raise AssertionError(f"D {D} f16 {f16_in} {kernel}: {exc}") from None
