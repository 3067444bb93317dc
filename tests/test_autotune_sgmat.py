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
