"""The tuner covers the tensor-core matmuls (`*_sgmat` keys: the f16 training step's
products): their candidates are subgroup-matrix configurations, each computes the product
exactly (split K too), the winner goes into the adapter's cache and the op then runs it.

Runs on a GPU with f16 subgroup matrices, or on lavapipe under Dawn with them emulated
(shaders/sgmat_emulation.py; CI's Dawn step runs this file). Under wgpu-native the emulated
kernels take lavapipe's old LLVM more than ten minutes to compile: skipped there."""

from __future__ import annotations

import numpy as np
import pytest

from istanbul.shaders import autotune, tuned_cache
from istanbul.shaders.kernels.matmul import ops as linear


@pytest.fixture(scope="module")
def tc_device():
    from istanbul.shaders.engine import Device
    dev = Device(None, emulate_subgroup_matrix=True)
    if not linear.has_tensor_cores(dev):
        pytest.skip(f"{dev.name}: no f16 subgroup matrices, real or emulated")
    if dev.emulated_features and tuned_cache._webgpu(dev) != "dawn":
        pytest.skip("emulated subgroup matrices are checked under Dawn here (naga's module "
                    "compiles for over ten minutes on lavapipe's LLVM 15)")
    return dev


def test_the_tensor_core_keys_are_offered_only_where_they_run(tc_device, device):
    assert set(linear.SGMAT_KEYS) <= set(autotune.matmul_keys(tc_device))
    if not linear.has_tensor_cores(device):
        assert not set(linear.SGMAT_KEYS) & set(autotune.matmul_keys(device))


def test_every_candidate_computes_the_product_and_the_winner_is_used(tc_device, cache_dir):
    """dW += dY^T X at a thin shape (split K offered): integer inputs, so f16 operands and
    f32 sums are exact and every candidate must give the product bit for bit."""
    M, N, K = 64, 64, 512
    candidates = linear.sgmat_candidate_configs(tc_device, "tn", M, N, K)
    assert candidates and all(str(c).startswith("sg") for c in candidates)
    assert {c.splits for c in candidates} >= {1, 2, 4}        # K // 4 keeps four slices
    assert all(K // c.splits >= 4 * c.bk for c in candidates)
    rng = np.random.default_rng(3)
    dy = rng.integers(-2, 3, (K, M)).astype(np.float32)
    x = rng.integers(-2, 3, (K, N)).astype(np.float32)
    start = rng.integers(-4, 5, (M, N)).astype(np.float32)
    want = start + dy.T @ x
    a, b = tc_device.upload(dy), tc_device.upload(x)
    for cfg in candidates:
        out = tc_device.upload(start)
        with tc_device.record() as rec:
            linear.matmul(rec, a, b, out, M, N, K, layout="tn", accumulate=True,
                          config=str(cfg))
        assert np.array_equal(tc_device.download(out), want), cfg

    entry = autotune.tune_matmul(tc_device, "tn_sgmat", M, N, K, mode="accumulate")
    assert entry["default"] == str(linear.default_sgmat_config(tc_device, "tn", M, N, K))
    assert set(entry["candidates"]) == {entry["default"]} | {str(c) for c in candidates}
    assert entry["config"] in entry["candidates"] and entry["us"] > 0
    assert all(t is None or t >= entry["us"] for t in entry["candidates"].values())
    tuned_cache.save(tc_device, {f"matmul/tn_sgmat/{M}x{N}x{K}": entry})
    chosen = linear.plan(tc_device, "tn", M, N, K, operands=(a, b, tc_device.zeros((M, N))),
                         tensor_cores=True)
    assert chosen.kernel == "matmul_tn_sgmat" and str(chosen.config) == entry["config"]
    out = tc_device.upload(start)
    with tc_device.record() as rec:
        linear.matmul(rec, a, b, out, M, N, K, layout="tn", accumulate=True,
                      tensor_cores=True)
    assert np.array_equal(tc_device.download(out), want)


@pytest.mark.parametrize("layout", ["nt", "nn", "tn"])
def test_deep_slices_compute_the_product(tc_device, layout):
    """Slices of BK 64 (a configuration the kernel takes, though the tuner offers BK 32 only:
    SGMAT_SLICES), with and without split K, in every layout: integer inputs, so the product
    is exact. 2x2 tiles so a 64-deep stage fits lavapipe's 32 KiB."""
    M, N, K = 96, 80, 512        # ragged tiles at both edges
    rng = np.random.default_rng(5)
    a_shape = (K, M) if layout == "tn" else (M, K)
    b_shape = (N, K) if layout == "nt" else (K, N)
    a = rng.integers(-2, 3, a_shape).astype(np.float32)
    b = rng.integers(-2, 3, b_shape).astype(np.float32)
    want = (a.T if layout == "tn" else a) @ (b.T if layout == "nt" else b)
    for text in ("sg2x2-t2x2-k64-p8-s1-b1", "sg2x2-t2x2-k64-p8-s2-b1"):
        cfg = linear.SgmatConfig.parse(text)
        assert not cfg.problems(tc_device, layout), cfg.problems(tc_device, layout)
        out = tc_device.zeros((M, N))
        with tc_device.record() as rec:
            linear.matmul(rec, tc_device.upload(a), tc_device.upload(b), out, M, N, K,
                          layout=layout, config=text)
        assert np.array_equal(tc_device.download(out), want), (layout, text)


@pytest.mark.parametrize("layout", ["nt", "nn", "tn"])
def test_raster_bands_cover_every_tile_once(tc_device, layout):
    """Workgroups taking C's tiles in bands of row blocks ("-g3": 5 row blocks, so the last
    band has 2; "-g8": one band of all) compute the same product as the dispatch's own order,
    split K too: every tile written once, none twice (accumulate would show it). Integer
    inputs, so the product is exact."""
    M, N, K = 300, 144, 256      # 5 row blocks (the last ragged) by 3 column blocks of 64
    rng = np.random.default_rng(7)
    a_shape = (K, M) if layout == "tn" else (M, K)
    b_shape = (N, K) if layout == "nt" else (K, N)
    a = rng.integers(-2, 3, a_shape).astype(np.float32)
    b = rng.integers(-2, 3, b_shape).astype(np.float32)
    start = rng.integers(-4, 5, (M, N)).astype(np.float32)
    want = start + (a.T if layout == "tn" else a) @ (b.T if layout == "nt" else b)
    for text in ("sg2x2-t2x2-k32-p8-s1-b1-g3", "sg2x2-t2x2-k32-p8-s2-b1-g3",
                 "sg2x2-t2x2-k32-p8-s1-b1-g8"):
        cfg = linear.SgmatConfig.parse(text)
        assert cfg.template_params(layout)["GROUP"] == cfg.group > 1
        out = tc_device.upload(start)
        with tc_device.record() as rec:
            linear.matmul(rec, tc_device.upload(a), tc_device.upload(b), out, M, N, K,
                          layout=layout, accumulate=True, config=text)
        assert np.array_equal(tc_device.download(out), want), (layout, text)


@pytest.mark.parametrize("layout,a16,b16", [("nt", True, True), ("nn", True, True),
                                            ("nn", False, True), ("tn", True, False),
                                            ("tn", False, True)])
def test_sixteen_byte_f16_reads_compute_the_product(tc_device, layout, a16, b16):
    """"-v16": f16 operands read 8 halves at a time, ragged tiles at both edges, split K too:
    the same exact product (integer inputs) as the 8-byte reads. A row of 4 mod 8 halves
    cannot be read so: the plan runs the configuration without it, still exact."""
    rng = np.random.default_rng(11)
    for M, N, K, wide in ((104, 88, 256, True), (100, 92, 252, False)):
        a_shape = (K, M) if layout == "tn" else (M, K)
        b_shape = (N, K) if layout == "nt" else (K, N)
        a = rng.integers(-2, 3, a_shape).astype(np.float32)
        b = rng.integers(-2, 3, b_shape).astype(np.float32)
        want = (a.T if layout == "tn" else a) @ (b.T if layout == "nt" else b)
        A = tc_device.upload(a.astype(np.float16) if a16 else a)
        B = tc_device.upload(b.astype(np.float16) if b16 else b)
        for text in ("sg2x2-t2x2-k32-p8-s1-b1-v16", "sg2x2-t2x2-k32-p8-s2-b1-v16"):
            out = tc_device.zeros((M, N))
            chosen = linear.plan(tc_device, layout, M, N, K, b_dtype=B.dtype, a_dtype=A.dtype,
                                 operands=(A, B, out), config=text)
            assert chosen.config.load16 is wide, (M, N, K)
            params = chosen.config.template_params(layout, a16, b16)
            assert (params["WIDE_A"], params["WIDE_B"]) == (wide and a16, wide and b16)
            with tc_device.record() as rec:
                linear.matmul(rec, A, B, out, M, N, K, layout=layout, config=text)
            assert np.array_equal(tc_device.download(out), want), (layout, text, M, N, K)


def test_the_attention_backward_width_is_tuned_and_the_winner_used(tc_device, cache_dir,
                                                                     monkeypatch):
    """The tensor-core backward's widths (dq_sgmat, dkv_sgmat: 64 or 128 rows a workgroup)
    are tuner candidates where they fit; a cached width is what the op then runs (outputs
    the same bits as the base kernels'), a width given to backward() overrides the cache, and a
    cached width that does not fit is ignored. Small tiles so 128 rows fit lavapipe."""
    from istanbul.shaders.kernels.attention import ops as attention
    monkeypatch.setattr(attention, "SGMAT2_TILES", {"BK": 16, "BQ2": 16})
    B, T, H, Hkv, D = 1, 150, 2, 1, 16
    assert {"dq_sgmat", "dkv_sgmat"} <= set(autotune.attention_keys(tc_device))
    for kernel in ("dq", "dkv"):
        assert attention.wide_candidates(tc_device, D, kernel) == ["base", "w8", "w4x2"]
        entry = autotune.tune_attention_width(tc_device, f"{kernel}_sgmat", B, T, H, Hkv, D)
        assert entry["default"] == "base" and set(entry["candidates"]) == {"base", "w8", "w4x2"}
        assert all(t is not None and t > 0 for t in entry["candidates"].values())
        assert entry["config"] in entry["candidates"]

    rng = np.random.default_rng(5)
    strides = {"q_stride": attention.head_major(T, H, D),
               "kv_stride": attention.head_major(T, Hkv, D)}
    q = tc_device.upload(rng.standard_normal((B, H, T, D), dtype=np.float32), dtype=np.float16)
    k, v = (tc_device.upload(rng.standard_normal((B, Hkv, T, D), dtype=np.float32),
                             dtype=np.float16) for _ in range(2))
    do = tc_device.upload(rng.standard_normal((B, T, H, D), dtype=np.float32))
    o, lse = tc_device.empty((B, T, H, D)), tc_device.empty((B, H, T))
    with tc_device.record() as rec:
        attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D, config="sgmat", **strides)

    def backward(**kwargs):
        grads = [tc_device.empty((B, H, T, D)), tc_device.empty((B, Hkv, T, D)),
                 tc_device.empty((B, Hkv, T, D))]
        with tc_device.record(timing=True) as rec:
            attention.backward(rec, q, k, v, o, do, lse, *grads, B, T, H, Hkv, D,
                               tensor_cores=True, **strides, **kwargs)
        return {label for label, _ in rec.gpu_times}, [tc_device.download(g) for g in grads]

    labels, default = backward()   # nothing tuned: "w8", where it fits
    assert set(attention.SGMAT2_WIDE.values()) <= labels
    tuned_cache.save(tc_device, {f"attention/dq_sgmat/{T}x{D}": {"config": "base"},
                                 f"attention/dkv_sgmat/{T}x{D}": {"config": "base"}})
    tuned_cache.forget()
    labels, base = backward()
    assert {"attention_backward_dq_sgmat2", "attention_backward_dkv_sgmat2"} <= labels
    assert all(np.array_equal(a, b) for a, b in zip(default, base))
    tuned_cache.save(tc_device, {f"attention/dq_sgmat/{T}x{D}": {"config": "w4x2"},
                                 f"attention/dkv_sgmat/{T}x{D}": {"config": "w8"}})
    tuned_cache.forget()
    labels, wide = backward()
    assert set(attention.SGMAT2_WIDE.values()) <= labels
    assert all(np.array_equal(a, b) for a, b in zip(wide, base))
    labels, _ = backward(sgmat_tiles={"dkv": "base"})
    assert {"attention_backward_dq_sgmat2w", "attention_backward_dkv_sgmat2"} <= labels
    # a cached width whose kernel does not fit this device's workgroup memory is ignored
    monkeypatch.setattr(attention, "SGMAT2_TILES", {"BK": 32, "BQ2": 32})
    tuned_cache.save(tc_device, {f"attention/dkv_sgmat/{T}x64": {"config": "w8"}})
    fits = attention.sgmat2_bytes("dkv", attention.sgmat2_params(64, dkv="w8")) <= \
        attention.workgroup_storage(tc_device)
    assert ("w8" in attention.wide_candidates(tc_device, 64, "dkv")) == fits
    assert attention.chosen_widths(tc_device, T, 64, None).get("dkv") == ("w8" if fits else None)
    # knobs the wide kernels do not have keep the base kernels
    assert "dkv" not in attention.chosen_widths(tc_device, T, 16, {"qorder": "down"})
