"""The matmul family on the real device: every ladder case, plus the edges the model relies on."""

from __future__ import annotations

import numpy as np
import pytest

from istanbul.shaders.kernels.matmul import ops as linear


def test_weight_as_sub_range_of_one_parameter_buffer(device):
    # The model binds each weight as a view into one parameter buffer (and its f16 mirror).
    rng = np.random.default_rng(1)
    align = device.limits["min-storage-buffer-offset-alignment"]
    start = 3 * align  # elements; a multiple of the alignment in both f32 and f16 bytes
    M, N, K = 9, 17, 24
    params = rng.standard_normal(start + N * K + 50).astype(np.float32)
    w = params[start:start + N * K].reshape(N, K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    buf, mirror = device.upload(params), device.upload(params.astype(np.float16))
    xb, y32, y16 = device.upload(x), device.empty((M, N)), device.empty((M, N))
    with device.record() as rec:
        linear.matmul_nt(rec, xb, buf.elements(start, N * K), y32, M, N, K)
        linear.matmul_nt(rec, xb, mirror.elements(start, N * K), y16, M, N, K)
    np.testing.assert_allclose(device.download(y32), x.astype(np.float64) @ w.T,
                               rtol=1e-5, atol=1e-5)
    w16 = w.astype(np.float16).astype(np.float64)
    np.testing.assert_allclose(device.download(y16), x.astype(np.float64) @ w16.T,
                               rtol=1e-5, atol=1e-5)


def test_accumulate_adds_each_micro_batch(device):
    rng = np.random.default_rng(2)
    dy = rng.standard_normal((2, 40, 12)).astype(np.float32)
    x = rng.standard_normal((2, 40, 7)).astype(np.float32)
    dw = device.zeros((12, 7))
    with device.record() as rec:
        for i in range(2):
            linear.matmul_tn(rec, device.upload(dy[i]), device.upload(x[i]), dw, 12, 7, 40,
                             accumulate=True)
    want = sum(dy[i].astype(np.float64).T @ x[i] for i in range(2))
    np.testing.assert_allclose(device.download(dw), want, rtol=1e-5, atol=1e-4)


def test_bad_operands_are_named(device):
    a, b, c = device.empty(10), device.empty(12), device.empty(4)
    with device.record() as rec:
        with pytest.raises(ValueError, match="matmul_nt: a holds 10"):
            linear.matmul_nt(rec, a, b, c, 2, 2, 6)
        with pytest.raises(ValueError, match="out holds 4"):
            linear.matmul_nn(rec, a, b, c, 2, 3, 4)
        with pytest.raises(ValueError, match="M must be >= 1"):
            linear.matmul_tn(rec, a, b, c, 0, 2, 2)
        with pytest.raises(ValueError, match="exclusive"):
            linear.matmul_nt(rec, a, b, c, 1, 1, 1, accumulate=True, residual=b)
        with pytest.raises(ValueError, match="f16_math"):
            linear.matmul_nt(rec, a, b, c, 1, 1, 1, f16_math=True)
        with pytest.raises(ValueError, match="dtype"):
            linear.matmul_nt(rec, device.empty(4, np.uint32), b, c, 1, 1, 1)
        with pytest.raises(ValueError, match="multiples of 8"):
            linear.matmul_nt(rec, a, b, c, 1, 1, 1, tiles=(12, 64, 16))
        with pytest.raises(ValueError, match="workgroup memory"):
            linear.matmul_nt(rec, a, b, c, 1, 1, 1, tiles=(128, 128, 64))


def test_ops_pick_the_tiled_kernels_by_default(device, monkeypatch):
    # The shapes the model uses (multiples of 4, contiguous) run the fast path (the
    # expanded 03_linear_tiled.wgsl); shapes that cannot be read as vec4 fall back to the
    # general kernels.
    for layout in ("nt", "nn", "tn"):
        chosen = linear.plan(device, layout, 64, 96, 128)
        assert chosen.path == "tiled" and chosen.kernel == f"matmul_{layout}_tiled"
        assert chosen.file == linear.FILE_TILED
        assert linear.plan(device, layout, 64, 96, 45).path == ("tiled" if layout == "tn"
                                                                else "general")
    assert linear.plan(device, "nt", 64, 96, 128, b_dtype=np.float16).kernel == \
        "matmul_nt_w16_tiled"
    assert linear.plan(device, "nt", 64, 96, 128, ldc=98).path == "general"
    assert linear.plan(device, "nn", 64, 96, 128, tiles=(32, 32, 16)).path == "general"


def test_tiled_config_errors_are_clear(device):
    a, b, c = device.empty(16), device.empty(16), device.empty(16)
    with device.record() as rec:
        with pytest.raises(ValueError, match="multiples of 4"):
            linear.matmul_nt(rec, a, b, c, 3, 4, 3, config="32x32x8-4x4-s1")
        with pytest.raises(ValueError, match="BMxBNxBK"):
            linear.matmul_nt(rec, a, b, c, 3, 4, 4, config="big")
        with pytest.raises(ValueError, match="TM and TN"):
            linear.matmul_nt(rec, a, b, c, 3, 4, 4, config="32x32x8-2x2-s1")
        with pytest.raises(ValueError, match="workgroup memory"):
            linear.matmul_nt(rec, a, b, c, 3, 4, 4, config="256x256x64-8x8-s1")
        with pytest.raises(ValueError, match="not both"):
            linear.matmul_nt(rec, a, b, c, 3, 4, 4, config="32x32x8-4x4-s1", tiles=(32, 32, 8))


def test_split_k_partials_past_a_binding_are_refused_or_fewer(device, monkeypatch):
    """Split-K partials (splits x M x N f32) must fit one storage binding: a pinned config is
    a clear error before anything is allocated, and a tuned entry (looked up by the nearest
    tuned shape, maybe a smaller one) runs with fewer splits. The H200's sweep once bound a
    3.3 GB scratch, and every split-K call after it failed."""
    from istanbul.shaders import tuned_cache
    limit = int(device.limits.get("max-storage-buffer-binding-size", 1 << 27))
    M, N, K = 64, 64, 1024
    monkeypatch.setitem(device.limits, "max-storage-buffer-binding-size", 3 * M * N * 4)
    a, b, c = device.zeros((M, K)), device.zeros((N, K)), device.zeros((M, N))
    with device.record() as rec:
        with pytest.raises(ValueError, match="4 partial products of 64 x 64 take 65536 bytes"):
            linear.matmul_nt(rec, a, b, c, M, N, K, config="32x32x16-4x4-s4")
    monkeypatch.setattr(tuned_cache, "lookup", lambda *args: "32x32x16-4x4-s4")
    assert linear.choose_config(device, "nt", np.float32, False, M, N, K).splits == 3
    monkeypatch.setitem(device.limits, "max-storage-buffer-binding-size", limit)
    assert linear.choose_config(device, "nt", np.float32, False, M, N, K).splits == 4


def test_split_k_is_deterministic_and_matches_one_split(device):
    # dW of a thin shape: four K-splits summed in a fixed order give the same bits every
    # run, and agree with the unsplit product to f32 rounding.
    rng = np.random.default_rng(5)
    M, N, K = 40, 36, 1000
    dy, x = rng.standard_normal((K, M), np.float32), rng.standard_normal((K, N), np.float32)
    a, b = device.upload(dy), device.upload(x)
    outs = []
    for cfg in ("32x32x16-4x4-s4", "32x32x16-4x4-s4", "32x32x16-4x4-s1"):
        c = device.upload(np.ones((M, N), np.float32))
        with device.record() as rec:
            linear.matmul_tn(rec, a, b, c, M, N, K, accumulate=True, config=cfg)
        outs.append(device.download(c))
    assert np.array_equal(outs[0], outs[1])
    want = 1.0 + dy.astype(np.float64).T @ x
    np.testing.assert_allclose(outs[0], want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(outs[2], want, rtol=1e-5, atol=1e-4)


def test_split_k_partials_never_leak_between_calls(device):
    # Two split-K products recorded back to back share the scratch partials buffer: the
    # second must not see the first's partials (different shapes, same recording).
    rng = np.random.default_rng(6)
    shapes = [(24, 20, 600), (8, 12, 256)]
    bufs, wants = [], []
    for M, N, K in shapes:
        A, B = rng.standard_normal((K, M), np.float32), rng.standard_normal((K, N), np.float32)
        bufs.append((device.upload(A), device.upload(B), device.empty((M, N))))
        wants.append(A.astype(np.float64).T @ B)
    with device.record() as rec:
        for (M, N, K), (a, b, c) in zip(shapes, bufs):
            linear.matmul_tn(rec, a, b, c, M, N, K, config="32x32x8-4x4-s3")
    for (a, b, c), want in zip(bufs, wants):
        np.testing.assert_allclose(device.download(c), want, rtol=1e-5, atol=1e-4)


def test_f16_math_is_the_callers_choice(device, monkeypatch):
    # f16-weight forward products multiply in f32 unless the caller asks for packed f16
    # (the model passes its config's f16_math); no environment switch inside the op.
    if not device.has("shader-f16"):
        pytest.skip("device lacks shader-f16 (the packed-f16 kernel needs it)")
    from istanbul.shaders.engine import Recorder
    labels = []
    original = Recorder.dispatch

    def spy(self, kernel, resources, workgroups, label=""):
        labels.append(label or kernel.name)
        return original(self, kernel, resources, workgroups, label)
    monkeypatch.setattr(Recorder, "dispatch", spy)
    monkeypatch.setenv("ISTANBUL_F16_MATH", "1")   # ignored: not read by the op
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 32)).astype(np.float32)
    w = (0.1 * rng.standard_normal((16, 32))).astype(np.float16)
    xb, wb, y = device.upload(x), device.upload(w), device.empty((8, 16))
    for f16_math, want in ((False, "matmul_nt_w16_tiled"), (True, "matmul_nt_h16_tiled")):
        labels.clear()
        with device.record() as rec:
            linear.matmul_nt(rec, xb, wb, y, 8, 16, 32, f16_math=f16_math)
        assert labels == [want]
        np.testing.assert_allclose(device.download(y), x.astype(np.float64) @ w.T.astype(
            np.float64), rtol=2e-2, atol=2e-2)


def test_sgmat_config_spellings_round_trip():
    from istanbul.shaders.kernels.matmul import ops as lin
    old = lin.SgmatConfig.parse("sg4x2-t4x4-k16-p8-s1")
    assert (old.ahead, old.direct) == (1, False)
    new = lin.SgmatConfig.parse("sg4x4-t2x2-k16-p8-s8-a2-d")
    assert (new.sgr, new.sgc, new.ti, new.splits, new.ahead, new.direct) == (4, 4, 2, 8, 2, True)
    for text in ("sg4x2-t4x4-k16-p8-s1", "sg2x2-t4x4-k16-p8-s2-a2", "sg2x2-t4x4-k16-p8-s1-d",
                 "sg4x2-t4x4-k32-p8-s1-b1", "sg4x4-t2x2-k32-p8-s4-a2-d-b1",
                 "sg4x4-t4x2-k32-p8-s1-b1-g8"):
        assert str(lin.SgmatConfig.parse(text)) == text
    assert lin.SgmatConfig.parse("sg4x4-t4x2-k32-p8-s1-b1-g8").template_params("nt")["GROUP"] == 8
    assert lin.SgmatConfig.parse("sg4x4-t4x2-k32-p8-s1-b1").group == 1
    single = lin.SgmatConfig.parse("sg4x2-t4x4-k32-p8-s1-b1")
    assert single.single and single.template_params("nt")["SINGLE"]
    # one stage of 256 x 40 + 128 x 40 f16 and the result slots: 48 KiB holds it
    assert single.workgroup_bytes("nt") == 2 * (256 + 128) * 40 + 4 * 256 * 8 <= 48 * 1024 - 1024
    params = new.template_params("tn")
    assert params["AHEAD"] == 2 and params["DIRECT"] is True


def test_an_f16_a_runs_only_on_the_tensor_core_kernels(device, monkeypatch):
    # the LM head's f16 dlogits feed matmul_nn / matmul_tn as A; anywhere without the
    # tensor-core path that is a clear error, never a silent reinterpretation of the bytes
    if not device.has("shader-f16"):
        pytest.skip("device lacks shader-f16")
    a16 = device.upload(np.ones((64, 64), np.float16))
    b, out = device.upload(np.ones((64, 64), np.float32)), device.empty((64, 64))
    refused = [{}, {"tiles": (32, 32, 16)}]
    if linear.has_tensor_cores(device):   # the H200 under Dawn: it runs, and right
        with device.record() as rec:
            linear.matmul_nn(rec, a16, b, out, 64, 64, 64, tensor_cores=True)
        np.testing.assert_array_equal(device.download(out), np.full((64, 64), 64.0))
    else:
        refused.append({"tensor_cores": True})
    for kwargs in refused:
        with pytest.raises(ValueError, match="f16 A"):
            with device.record() as rec:
                linear.matmul_nn(rec, a16, b, out, 64, 64, 64, **kwargs)
    # where the device has them, the plan names the _a16 kernel (and its source reads f16 A)
    from istanbul.shaders import source
    monkeypatch.setattr(linear, "has_tensor_cores", lambda dev: True)
    w16 = device.upload(np.ones((64, 64), np.float16))
    chosen = linear.plan(device, "nn", 64, 64, 64, b_dtype=np.float16, a_dtype=np.float16,
                         operands=(a16, w16, out), tensor_cores=True)
    assert chosen.kernel == "matmul_nn_a16_w16_sgmat"
    chosen = linear.plan(device, "tn", 64, 64, 64, a_dtype=np.float16,
                         operands=(a16, b, out), tensor_cores=True)
    assert chosen.kernel == "matmul_tn_a16_sgmat"
    code = source.compose(("shader-f16", "subgroup-matrix"), source.load_file(linear.FILE_SGMAT),
                          chosen.kernel, params=chosen.config.template_params("tn", True),
                          compiler="tint")
    assert "var<storage, read> a_in: array<vec2<u32>>;" in code   # f16 read as its bits
    assert "v0 = a_in[at];" in code   # staged as its bits, no conversion
    assert "var<workgroup> As: array<vec4<u32>," in code   # 8 halves per 16-byte slot


def test_sgmat_staging_slots_pad_and_layouts(device, monkeypatch):
    """16-byte staging (issue 49): slots of 8 halves per invocation (a partial last round
    where a slice has fewer slots than invocations), PAD in halves in the config and in slots
    in the kernel, the template loads' majors by layout; and no new layout requirement: rows
    of 4 mod 8 halves (two bounds-checked vec4 reads per slot) still take the tensor cores."""
    half = linear.SgmatConfig.parse("sg4x4-t2x2-k16-p8-s1")     # 256 slots, 512 invocations
    assert half.slots() == (1, 1) and half.loads() == (1.0, 1.0)
    assert linear.SgmatConfig.parse("sg4x4-t2x4-k32-p8-s1-b1").slots() == (1, 2)
    assert linear.SgmatConfig.parse("sg2x2-t2x2-k32-p0-s1").template_params("nn")["PAD"] == 0
    majors = {lay: (half.template_params(lay)["A_MAJOR"], half.template_params(lay)["B_MAJOR"])
              for lay in ("nt", "nn", "tn")}
    assert majors == {"nt": ("row_major", "col_major"), "nn": ("row_major", "row_major"),
                      "tn": ("col_major", "row_major")}
    assert half.template_params("nt")["PAD"] == 1
    monkeypatch.setattr(linear, "has_tensor_cores", lambda dev: True)
    assert any("multiple of 8 halves" in p
               for p in linear.SgmatConfig.parse("sg2x2-t2x2-k32-p4-s1").problems(device, "nt"))
    M, N, K = 68, 132, 44
    ops = (device.upload(np.ones((M, K), np.float32)), device.upload(np.ones((N, K), np.float32)),
           device.upload(np.zeros((M, N), np.float32)))
    chosen = linear.plan(device, "nt", M, N, K, operands=ops, tensor_cores=True)
    assert chosen.file == linear.FILE_SGMAT and chosen.kernel == "matmul_nt_sgmat"


def test_tn_takes_an_f16_b_only_on_the_tensor_core_kernels(device, monkeypatch):
    """dW = dy^T x with x an f16 activation (f16 precision): matmul_tn_w16_sgmat, tuned like
    tn; anywhere else a clear error, never a silent f32 read of f16 bits."""
    dy = device.upload(np.ones((64, 64), np.float32))
    x16 = device.upload(np.ones((64, 64), np.float16))
    out = device.zeros((64, 64))
    for kwargs in ({}, {"tensor_cores": False}, {"tiles": (8, 8, 8)}):
        with pytest.raises(ValueError, match="f16 B"):
            with device.record() as rec:
                linear.matmul_tn(rec, dy, x16, out, 64, 64, 64, **kwargs)
    if not linear.has_tensor_cores(device):
        with pytest.raises(ValueError, match="f16 B"):
            with device.record() as rec:
                linear.matmul_tn(rec, dy, x16, out, 64, 64, 64, tensor_cores=True)
    monkeypatch.setattr(linear, "has_tensor_cores", lambda dev: True)
    from istanbul.shaders import tuned_cache
    keys = []
    monkeypatch.setattr(tuned_cache, "lookup", lambda dev, op, key, shape: keys.append(key))
    chosen = linear.plan(device, "tn", 64, 64, 64, b_dtype=np.float16,
                         operands=(dy, x16, out), tensor_cores=True)
    assert chosen.kernel == "matmul_tn_w16_sgmat"
    assert keys == ["tn_sgmat"]   # the tn tuned configurations


SGMAT_STUB_CONFIGS = ("sg2x2-t4x4-k32-p8-s1", "sg4x2-t4x4-k16-p8-s1-a2",
                      "sg4x4-t2x2-k16-p8-s8-a2-d", "sg4x2-t4x4-k32-p8-s1-b1-g8",
                      "sg4x4-t2x2-k32-p8-s1-a2-d-b1-v16")


def test_tensor_core_matmuls_pass_the_compiler_with_subgroup_matrices_stubbed(device):
    """Every entry point of 03_linear_sgmat.wgsl (f32 and f16 A, f32 and f16 B, f16 read as
    their bits, 4 or 8 halves a read), staged and straight stores, one and two slices in
    flight, raster bands, 16-byte staging slots with the template-form matrix loads: what
    is not a subgroup-matrix call compiles
    here, under naga and (CI's second run) Tint. The H100/H200 are the only places the
    kernels compile whole. naga cannot bitcast f16 vectors, so under naga the kernel's
    half_bits helper is swapped for pack2x16float (tests/subgroup_matrix_stub.for_compiler);
    the tensor-core kernels only ever compile under Tint (subgroup matrices are Dawn's)."""
    if not (device.has("shader-f16") and device.has("subgroup")):
        pytest.skip("needs shader-f16 and subgroups")
    from istanbul.shaders import source
    from tests.subgroup_matrix_stub import for_compiler, stub_subgroup_matrices
    wgsl = source.load_file(linear.FILE_SGMAT)
    assert len(wgsl.kernels) == 11
    compiler = device.backend.compiler
    for config in SGMAT_STUB_CONFIGS:
        cfg = linear.SgmatConfig.parse(config)
        for name in wgsl.kernels:
            params = cfg.template_params(name.split("_")[1], "_a16" in name, "_w16" in name)
            code = for_compiler(stub_subgroup_matrices(source.compose(
                device.features, wgsl, name, params=params, compiler=compiler)), compiler)
            assert "var<workgroup> As: array<vec4<u32>," in code
            if "_a16" in name or "_w16" in name:   # f16 read as its bits, 8 or 4 halves a read
                assert ("array<vec4<u32>>;   // 8 halves' bits" in code) is cfg.load16
                assert ("array<vec2<u32>>;" in code) is not cfg.load16
            try:
                device.raw.create_shader_module(label=f"sgmat stub {name}", code=code)
            except Exception as exc:
                raise AssertionError(f"{name} [{config}]: {exc}") from None


def test_the_matmul_stub_check_catches_errors(device):
    if not (device.has("shader-f16") and device.has("subgroup")):
        pytest.skip("needs shader-f16 and subgroups")
    from istanbul.shaders import source
    from tests.subgroup_matrix_stub import for_compiler, stub_subgroup_matrices
    cfg = linear.SgmatConfig.parse(SGMAT_STUB_CONFIGS[0])
    compiler = device.backend.compiler
    code = for_compiler(stub_subgroup_matrices(source.compose(
        device.features, source.load_file(linear.FILE_SGMAT), "matmul_nn_a16_sgmat",
        params=cfg.template_params("nn", True), compiler=compiler)), compiler)
    assert "var v0 = vec2<u32>();" in code
    device.raw.create_shader_module(code=code)
    with pytest.raises(Exception):   # f16 bits (vec2<u32>) into an f32 staging variable
        device.raw.create_shader_module(code=code.replace("var v0 = vec2<u32>();",
                                                          "var v0 = vec4<f32>();"))
