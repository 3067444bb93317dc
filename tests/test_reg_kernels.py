"""The fast matmul and attention kernels ("named-register" kernels): one loop-form template
per tiling (03_linear_tiled.wgsl, 05_attention_tiled.wgsl), expanded by shaders/wgsl_expand.py
when a kernel is made.

The expansion of every configuration the ops can run is the kernel the H200 was tuned and
measured with: the same declarations and statements as the generated kernels of 02206db
(tests/data/expansion_baseline.json, written by dev/compare_trees/expansion_baseline.py from git), and
every configuration of the committed H200 cache and of the defaults is one of them.
"""

from __future__ import annotations

import importlib.util
import json
import re
import types
from pathlib import Path

import numpy as np
import pytest

from istanbul.shaders import source, wgsl_expand
from istanbul.shaders.engine import Recorder
from istanbul.shaders.kernels.attention import ops as attention
from istanbul.shaders.kernels.matmul import ops as linear

REPO = Path(__file__).resolve().parents[1]
BASELINE = json.loads((REPO / "tests" / "data" / "expansion_baseline.json").read_text())
TUNED_FILES = {impl: json.loads((REPO / "shaders" / "tuned" / f"nvidia-h200-vulkan-{impl}.json")
                                .read_text()) for impl in ("wgpu", "dawn")}
TUNED = {"entries": {**TUNED_FILES["wgpu"]["entries"], **TUNED_FILES["dawn"]["entries"]}}
H200 = types.SimpleNamespace(
    limits={"max-compute-workgroup-storage-size": 49152,
            "max-compute-invocations-per-workgroup": 1024,
            "max-storage-buffer-binding-size": 2 << 30},
    info=types.SimpleNamespace(is_software=False), has=lambda feature: True,
    name="NVIDIA H200 (stand-in)",
    subgroup_matrix_configs=({"component_type": "f16", "result_component_type": "f32", "m": 16,
                              "n": 16, "k": 16, "min_subgroup_size": 32,
                              "max_subgroup_size": 32},))
KEYS = {"nt": ("nt", np.float32, False), "nn": ("nn", np.float32, False),
        "tn": ("tn", np.float32, False), "nt_w16": ("nt", np.float16, False),
        "nn_w16": ("nn", np.float16, False), "nt_h16": ("nt", np.float16, True)}


def _baseline_tool():
    spec = importlib.util.spec_from_file_location("expansion_baseline",
                                                  REPO / "dev" / "compare_trees" / "expansion_baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _matmul_label(key: str, cfg: linear.MatmulConfig) -> str:
    if key == "nt_h16":
        return f"matmul_nt_h16_{cfg.tm}x{cfg.tn}_fold{cfg.fold_steps}"
    return f"matmul_{key}_{cfg.tm}x{cfg.tn}"


def _matmul_module(key: str, cfg: linear.MatmulConfig) -> tuple[str, str]:
    layout, b_dtype, f16_math = KEYS[key]
    file, kernel = linear.tiled_kernel_name(layout, b_dtype, f16_math)
    return source.compose(set(), source.load_file(file), kernel,
                          params=cfg.template_params(f16_math)), kernel


H200_TILES = {"forward": (64, 32), "dq": (64, 16), "dkv": (32, 32)}   # the tuned cache's


def _attention_module(kernel: str) -> tuple[str, str]:
    name = attention.TILED_KERNELS[kernel]
    params = attention.template_params(*H200_TILES[kernel], 64)
    return source.compose(set(), source.load_file(attention.FILE_TILED), name,
                          params=params), name


def _every_matmul_config():
    for key in KEYS:
        for tm in (4, 8):
            for tn in (4, 8):
                folds = (16, 32) if key == "nt_h16" else (0,)
                for fold in folds:
                    yield key, linear.MatmulConfig(64, 64, 32, tm, tn, 1, fold)


@pytest.fixture
def labels(monkeypatch):
    seen = []
    original = Recorder.dispatch

    def spy(self, kernel, resources, workgroups, label=""):
        seen.append(label or kernel.name)
        return original(self, kernel, resources, workgroups, label)
    monkeypatch.setattr(Recorder, "dispatch", spy)
    return seen


# ---- the expansions are the measured kernels ---------------------------------------------

def test_every_expansion_matches_the_kernel_generated_at_02206db():
    tool = _baseline_tool()
    want = BASELINE["fingerprints"]
    seen = set()
    for key, cfg in _every_matmul_config():
        label = _matmul_label(key, cfg)
        module, kernel = _matmul_module(key, cfg)
        assert tool.fingerprint(module, kernel) == want[label], (
            f"{label}: the expansion differs from the kernel measured on the H200; see "
            f"python dev/compare_trees/expansion_baseline.py --diff {label}")
        seen.add(label)
    for kernel in ("forward", "dq", "dkv"):
        module, name = _attention_module(kernel)
        assert tool.fingerprint(module, name) == want[name], name
        seen.add(name)
    assert seen == set(want)


def test_the_comparison_sees_a_one_token_change():
    tool = _baseline_tool()
    wgsl = source.load_file(attention.FILE_TILED)
    name = attention.TILED_KERNELS["dq"]
    section = wgsl.kernels[name]
    for old, new in (("dp[i][j] - dvec[i]", "dp[i][j] + dvec[i]"),
                     ("workgroupBarrier();   // every read", "// every read")):
        assert old in section
        changed = source.WgslFile(wgsl.path, wgsl.header,
                                  {**wgsl.kernels, name: section.replace(old, new, 1)})
        module = source.compose(set(), changed, name,
                                params=attention.template_params(*H200_TILES["dq"], 64))
        assert tool.fingerprint(module, name) != BASELINE["fingerprints"][name], old


def test_expanded_kernels_hold_no_private_arrays_or_template_syntax():
    # the point of the expansion: function-scope arrays end up in local memory on NVIDIA
    modules = [_matmul_module(k, c)[0] for k, c in _every_matmul_config()]
    modules += [_attention_module(k)[0] for k in ("forward", "dq", "dkv")]
    for text in modules:
        assert "// @if" not in text and "// @endif" not in text
        text = re.sub(r"//[^\n]*", "", text)
        assert "{{" not in text and "@unroll" not in text and "@let" not in text
        arrays = [ln for ln in text.splitlines() if re.search(r"^\s+(var|let)\b.*array<", ln)]
        assert not arrays, arrays[:3]


def test_h200_tuned_and_default_configurations_are_fingerprinted_kernels():
    labels = set(BASELINE["fingerprints"])
    # each committed file holds what was tuned under its implementation: tensor-core kernels
    # only exist under Dawn
    for impl, data in TUNED_FILES.items():
        assert data["webgpu"] == impl and data["adapter_key"] == f"nvidia-h200-vulkan-{impl}"
        assert all(("_sgmat/" in name) == (impl == "dawn") for name in data["entries"]), impl
    for name, entry in TUNED["entries"].items():
        op, key, shape = name.split("/")
        dims = tuple(int(s) for s in shape.split("x"))
        if op == "matmul" and key.endswith("_sgmat"):   # tensor-core configurations
            layout = key[:2]
            cfg = linear.SgmatConfig.parse(entry["config"])
            assert str(cfg) == entry["config"], name
            assert not cfg.problems(H200, layout), (name, cfg.problems(H200, layout))
            assert entry["us"] == min(entry["candidates"].values()), name
            continue
        if op == "matmul":
            layout, b_dtype, f16_math = KEYS[key]
            for text in (entry["config"], entry["default"]):
                cfg = linear.MatmulConfig.parse(text)
                assert not cfg.problems(H200, f16_math), (name, text)
                assert _matmul_label(key, cfg) in labels, (name, text)
            default = linear.default_config(H200, key, *dims)
            assert _matmul_label(key, default) in labels
        else:
            rows, cols = attention.parse_config(entry["config"])
            assert (rows, cols) == H200_TILES[key], name
            assert not attention.tiled_problems(H200, key, rows, cols, dims[1]), name
            default = attention.TILED_DEFAULTS[key][0]
            assert attention.template_params(*default, 64) == \
                attention.template_params(rows, cols, 64)   # PF 16: the fingerprinted one
    # the candidates are today's kernels only: a retired variant leaves with its timings
    assert not [c for e in TUNED["entries"].values() for c in e["candidates"] if "retired" in c]


# ---- configuration strings ---------------------------------------------------------------

def test_config_strings_explain_themselves():
    cfg = linear.MatmulConfig.parse("128x128x32-8x8-s1-fold32")
    assert cfg.fold == 32 and str(cfg) == "128x128x32-8x8-s1-fold32"
    for other in ("128x128x32-8x8-s1-f32", "128x128x16-8x8-s1-loop"):
        with pytest.raises(ValueError, match="BMxBNxBK-TMxTN-sS"):
            linear.MatmulConfig.parse(other)
    assert attention.parse_config("64x32") == (64, 32)
    with pytest.raises(ValueError, match="ROWSxCOLS"):
        attention.parse_config("64x32-pf")
    with pytest.raises(ValueError, match="ROWSxCOLS"):
        attention.parse_config("64x32-fast")
    problems = linear.MatmulConfig.parse("64x64x8-4x4-s1").problems(H200, f16_math=True)
    assert any("FOLD 8" in p for p in problems)
    assert linear.MatmulConfig.parse("64x64x16-4x4-s1-fold16").problems(H200) == [
        "-fold16: a fold applies to the packed-f16 kernel only (f16_math=True)"]


def test_tuned_entries_that_do_not_parse_fall_back_with_a_warning(monkeypatch):
    from istanbul.shaders import tuned_cache
    monkeypatch.setattr(tuned_cache, "lookup", lambda *a, **k: "32x16-db")
    with pytest.warns(UserWarning, match="ignoring the tuned entry attention/forward.*ROWSxCOLS"):
        assert attention.choose_config(H200, "forward", 1024, 64) == \
            attention.TILED_DEFAULTS["forward"][0]
    monkeypatch.setattr(tuned_cache, "lookup", lambda *a, **k: "128x64x32-8x4-s1-f64-dot")
    with pytest.warns(UserWarning, match="ignoring the tuned entry matmul/.*BMxBNxBK"):
        cfg = linear.choose_config(H200, "nt", np.float16, True, 8192, 768, 768)
    assert cfg == linear.default_config(H200, "nt_h16", 8192, 768, 768)


# ---- the kernels compute the right sums --------------------------------------------------

def test_every_register_block_computes_a_split_accumulating_product(device, labels,
                                                                   monkeypatch):
    # A ragged, split, accumulating dW product with every register block; BK 12 leaves a
    # slice remainder. Runs of 2 written-out k-steps (UNROLL_K, a probe option) compute the
    # same sums in the same order: bit-identical.
    rng = np.random.default_rng(5)
    M, N, K = 36, 44, 200
    a = rng.standard_normal((K, M)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    c0 = rng.standard_normal((M, N)).astype(np.float32)
    want = c0.astype(np.float64) + 0.5 * a.T.astype(np.float64) @ b
    ab, bb = device.upload(a), device.upload(b)
    for block, bk in (("8x8", 8), ("8x4", 12), ("4x8", 8), ("4x4", 12)):
        got = []
        for unroll in (1, 2):
            monkeypatch.setattr(linear, "UNROLL_K", unroll)
            c = device.upload(c0)
            labels.clear()
            with device.record() as rec:
                linear.matmul_tn(rec, ab, bb, c, M, N, K, accumulate=True, alpha=0.5,
                                 config=f"32x32x{bk}-{block}-s2")
            assert labels[0] == "matmul_tn_tiled"
            got.append(device.download(c))
        np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4)
        assert np.array_equal(got[0], got[1]), block


def test_packed_f16_folds_agree_with_float64(device, labels):
    if not device.has("shader-f16"):
        pytest.skip("needs shader-f16")
    rng = np.random.default_rng(7)
    M, N, K = 64, 96, 256
    a = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float16)
    want = a.astype(np.float16).astype(np.float64) @ w.astype(np.float64).T
    ab, wb = device.upload(a), device.upload(w)
    for cfg in ("64x64x16-8x8-s1", "64x32x32-8x4-s1-fold32", "32x64x32-4x8-s2"):
        out = device.zeros((M, N))
        labels.clear()
        with device.record() as rec:
            linear.matmul_nt(rec, ab, wb, out, M, N, K, f16_math=True, config=cfg)
        assert labels[0] == "matmul_nt_h16_tiled"
        got = device.download(out)
        assert np.abs(got - want).max() / np.abs(want).max() < 3e-3, cfg


def test_matmul_reads_no_environment_switch(device, monkeypatch, labels):
    monkeypatch.setenv("ISTANBUL_F16_MATH", "1")
    monkeypatch.setenv("ISTANBUL_LOOP_KERNELS", "1")
    x, w = device.upload(np.ones((8, 32), np.float32)), device.upload(np.ones((16, 32),
                                                                              np.float16))
    y = device.zeros((8, 16))
    with device.record() as rec:
        linear.matmul_nt(rec, x, w, y, 8, 16, 32)
    assert labels == ["matmul_nt_w16_tiled"]
    np.testing.assert_array_equal(device.download(y), 32.0)


@pytest.mark.parametrize("tiles", [{"forward": "16x8", "dq": "8x8", "dkv": "16x8"},
                                   {"forward": "4x8", "dq": "4x8", "dkv": "4x8"}])
def test_attention_template_options_compute_the_same_bits(device, monkeypatch, labels, tiles):
    # UNROLL_D/UNROLL_N only write the same iterations out in another form (runs of 4: what
    # runs; runs of 2; plain loops), and without prefetch (the form for tiles that would
    # need more than 32 prefetch registers) each tile is staged after a barrier instead:
    # the same sums in the same order, bit-identical forward and backward. The 4x8 tiles
    # at D 32 use 32 prefetch registers per operand.
    rng = np.random.default_rng(11)
    B, T, H, Hkv, D = 1, 40, 2, 1, 32
    q, k, v, do = (device.upload(rng.standard_normal((B, T, h, D)).astype(np.float32))
                   for h in (H, Hkv, Hkv, H))
    assert attention.template_params(4, 8, 32)["PF"] == 32
    got = []
    for unroll, prefetch in ((4, (16, 32)), (2, (16, 32)), (1, (16, 32)), (4, ())):
        monkeypatch.setattr(attention, "UNROLL_D", unroll)
        monkeypatch.setattr(attention, "UNROLL_N", unroll)
        monkeypatch.setattr(attention, "PREFETCH_REGS", prefetch)
        out = [device.zeros((B, T, H, D)), device.zeros((B, H, T)), device.zeros((B, T, H, D)),
               device.zeros((B, T, Hkv, D)), device.zeros((B, T, Hkv, D))]
        o, lse, dq, dk, dv = out
        labels.clear()
        with device.record() as rec:
            attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D, config=tiles["forward"])
            attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H, Hkv, D,
                               config_dq=tiles["dq"], config_dkv=tiles["dkv"])
        assert [x for x in labels if "tiled" in x] == [
            "attention_forward_tiled", "attention_backward_dq_tiled",
            "attention_backward_dkv_tiled"]
        got.append([device.download(x) for x in out])
    for other in got[1:]:
        for name, a, b in zip(("o", "lse", "dq", "dk", "dv"), got[0], other):
            assert np.array_equal(a, b), name


# ---- the expansion pass ------------------------------------------------------------------

def test_expansion_pass_unrolls_names_and_folds():
    text = """fn f(x: vec4<f32>) -> vec4<f32> {
    var c: array<vec4<f32>, {{N}}u>;
    var a: array<vec4<f32>, 2u>;   // @let
    for (var g = 0u; g < 2u; g++) {   // @unroll
        a[g] = x * f32(g + 1u);
    }
    for (var i = 0u; i < {{N}}u; i++) {   // @unroll
        if (i == 0u || LIMIT > i) {
            c[i] = fma(vec4<f32>(a[i % 2u][i]), x, c[i]);
        }
    }
// @if BIG
    return c[0] + c[1];
// @else
    return c[0];
// @endif
}"""
    out = wgsl_expand.expand(text, {"N": 3, "BIG": True})
    assert "var c0 = vec4<f32>();" in out and "var c2 = vec4<f32>();" in out
    assert "let a0 = x * f32(0u + 1u);" in out and "let a1 = x * f32(1u + 1u);" in out
    assert "c0 = fma(vec4<f32>(a0.x), x, c0);" in out
    assert "if (LIMIT > 1u) {" in out and "if (LIMIT > 0u)" not in out
    assert "c2 = fma(vec4<f32>(a0.z), x, c2);" in out
    assert "return c0 + c1;" in out and "return c0;" not in out
    runs = wgsl_expand.expand("for (var n = 0u; n < B; n++) {   // @unroll 2\n"
                              "    s += v[n];\n}", {})
    assert "for (; n + 2u <= B; n += 2u) {" in runs and "s += v[(n + 1u)];" in runs
    assert wgsl_expand.expand("for (var n = 0u; n < B; n++) {   // @unroll 1\n}", {}) == \
        "for (var n = 0u; n < B; n++) {\n}"


def test_expansion_errors_name_the_problem():
    with pytest.raises(wgsl_expand.TemplateError, match=r"\{\{TM\}\} has no parameter"):
        wgsl_expand.expand("let x = {{TM}}u;", {"TN": 4})
    with pytest.raises(wgsl_expand.TemplateError, match="not constant: mark the loop"):
        wgsl_expand.expand("fn f(i: u32) {\n    var c: array<f32, 4u>;\n    c[i] = 1.0;\n}", {})
    with pytest.raises(wgsl_expand.TemplateError, match="needs constant bounds"):
        wgsl_expand.expand("for (var i = 0u; i < n; i++) {   // @unroll\n}", {})
    with pytest.raises(wgsl_expand.TemplateError, match="needs the parameter H16"):
        wgsl_expand.expand("// @if H16\n// @endif", {})


def test_family_folders_hold_the_kernel_files():
    # a family's WGSL is found by its unique file name or as family/file.wgsl
    assert source.find_file("03_linear_tiled.wgsl") == \
        REPO / "shaders" / "kernels" / "matmul" / "03_linear_tiled.wgsl"
    assert source.find_file("attention/05_attention_decode.wgsl").parent.name == "attention"
    with pytest.raises(source.ShaderSourceError, match="no WGSL file 'nope.wgsl'"):
        source.find_file("nope.wgsl")
    for family in ("matmul", "attention"):
        folder = REPO / "shaders" / "kernels" / family
        assert {"__init__.py", "ops.py", "reference.py", "cases.py"} <= {
            p.name for p in folder.iterdir()}
