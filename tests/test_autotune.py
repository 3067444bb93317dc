"""The tuning cache (shaders/tuned_cache.py): lookup order, nearest-shape fallback; the tuner
(shaders/autotune.py) and the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from istanbul.shaders import autotune, tuned_cache
from istanbul.shaders.kernels.matmul import ops as linear


def _write(device, path, entries):
    tuned_cache.save(device, entries, path / (tuned_cache.adapter_key(device) + ".json"))


def test_cached_config_is_used_exactly_and_for_near_shapes(device, cache_dir):
    default = linear.plan(device, "nt", 256, 256, 256).config
    tuned = "32x32x8-4x4-s1" if str(default) != "32x32x8-4x4-s1" else "64x64x8-4x4-s1"
    _write(device, cache_dir, {"matmul/nt/256x256x256": {"config": tuned, "us": 1.0}})
    assert str(linear.plan(device, "nt", 256, 256, 256).config) == tuned
    assert str(linear.plan(device, "nt", 300, 200, 256).config) == tuned      # nearest
    assert str(linear.plan(device, "nt", 8192, 256, 256).config) == str(        # too far
        linear.default_config(device, "nt", 8192, 256, 256))
    assert str(linear.plan(device, "nn", 256, 256, 256).config) != tuned or \
        str(linear.default_config(device, "nn", 256, 256, 256)) == tuned     # other kernel
    os.environ["ISTANBUL_AUTOTUNE"] = "0"
    try:
        assert str(linear.plan(device, "nt", 256, 256, 256).config) == str(default)
    finally:
        del os.environ["ISTANBUL_AUTOTUNE"]


def test_a_broken_or_impossible_cache_entry_falls_back(device, cache_dir):
    _write(device, cache_dir, {"matmul/nt/64x64x64": {"config": "1024x1024x64-8x8-s1"},
                               "matmul/nn/64x64x64": {"config": "garbage"}})
    assert not linear.plan(device, "nt", 64, 64, 64).config.problems(device)
    with pytest.warns(UserWarning, match="'garbage' is not of the form"):   # said, not hidden
        assert not linear.plan(device, "nn", 64, 64, 64).config.problems(device)
    (cache_dir / (tuned_cache.adapter_key(device) + ".json")).write_text("{not json")
    tuned_cache.forget()
    assert linear.plan(device, "nt", 64, 64, 64).path == "tiled"


def test_each_webgpu_implementation_has_its_cache_and_borrows_the_others(device, cache_dir):
    """A configuration tuned under wgpu-native serves Dawn until Dawn is tuned (and back):
    naga and Tint rank configurations differently, so the implementation's own entry wins."""
    import types
    other = "dawn" if device.info.webgpu == "wgpu" else "wgpu"
    assert tuned_cache.adapter_key(device).endswith("-" + device.info.webgpu)
    twin = types.SimpleNamespace(info=types.SimpleNamespace(
        name=device.info.name, backend=device.info.backend, driver=device.info.driver,
        webgpu=other))
    assert tuned_cache.adapter_key(twin) == tuned_cache.adapter_key(device, other)
    default = str(linear.plan(device, "nt", 256, 256, 256).config)
    mine, theirs = ("32x32x8-4x4-s1", "64x64x8-4x4-s1") if default != "32x32x8-4x4-s1" \
        else ("64x64x8-4x4-s1", "16x16x8-2x2-s1")
    tuned_cache.save(twin, {"matmul/nt/256x256x256": {"config": theirs, "us": 1.0}})
    assert (cache_dir / (tuned_cache.adapter_key(device, other) + ".json")).exists()
    assert str(linear.plan(device, "nt", 256, 256, 256).config) == theirs      # borrowed
    assert str(linear.plan(device, "nt", 300, 200, 256).config) == theirs      # nearest too
    tuned_cache.save(device, {"matmul/nt/512x512x512": {"config": mine, "us": 1.0}})
    # this implementation's nearest entry wins over the other's exact one
    assert str(linear.plan(device, "nt", 256, 256, 256).config) == mine
    assert tuned_cache.lookup(twin, "matmul", "nt", (256, 256, 256)) == theirs


def test_a_cache_written_before_keys_named_the_implementation_is_wgpu_native_s(device,
                                                                              cache_dir):
    default = str(linear.plan(device, "nt", 256, 256, 256).config)
    tuned = "32x32x8-4x4-s1" if default != "32x32x8-4x4-s1" else "64x64x8-4x4-s1"
    legacy = tuned_cache.adapter_key(device).rsplit("-", 1)[0] + ".json"
    tuned_cache.save(device, {"matmul/nt/256x256x256": {"config": tuned, "us": 1.0}},
                     cache_dir / legacy)
    # wgpu-native reads it as its own; Dawn borrows it
    assert tuned_cache.lookup(device, "matmul", "nt", (256, 256, 256)) == tuned


def test_tuner_times_candidates_and_the_winner_is_correct(device, cache_dir):
    entry = autotune.tune_matmul(device, "tn", 64, 32, 128, mode="accumulate")
    assert entry["config"] in entry["candidates"] and entry["us"] > 0
    assert all(t is None or t >= entry["us"] for t in entry["candidates"].values())
    path = tuned_cache.save(device, {"matmul/tn/64x32x128": entry})
    assert path.parent == cache_dir
    assert str(linear.plan(device, "tn", 64, 32, 128).config) == entry["config"]
    rng = np.random.default_rng(0)
    dy, x = rng.standard_normal((128, 64), np.float32), rng.standard_normal((128, 32), np.float32)
    out = device.empty((64, 32))
    with device.record() as rec:
        linear.matmul_tn(rec, device.upload(dy), device.upload(x), out, 64, 32, 128)
    np.testing.assert_allclose(device.download(out), dy.astype(np.float64).T @ x, rtol=1e-5,
                               atol=1e-4)


@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_a_fastest_candidate_that_computes_a_wrong_product_is_not_the_winner(device, layout):
    """The tuner checks its winner against numpy (check_matmul) before it keeps it: a
    candidate timed fastest that drops the last K slice, or stores the product in the wrong
    place, is timed as inf and the next fastest (right) one wins."""
    M, N, K = 40, 24, 96
    a, b = autotune.matmul_host_operands(layout, False, M, N, K, np.random.default_rng(2))
    a_buf, b_buf, out = device.upload(a), device.upload(b), device.zeros((M, N))
    short_a = device.upload(a[:K - 16] if layout == "tn" else np.ascontiguousarray(a[:, :K - 16]))
    short_b = device.upload(b[:K - 16] if layout == "tn" else np.ascontiguousarray(b[:, :K - 16]))
    tmp = device.zeros((M, N))

    def encode_for(name):
        def encode(rec):
            if name == "lost_slice":
                linear.matmul(rec, short_a, short_b, out, M, N, K - 16, layout=layout,
                              accumulate=layout == "tn")
            elif name == "shifted_rows":
                linear.matmul(rec, a_buf, b_buf, tmp, M, N, K, layout=layout)
                rec.copy(tmp, out, (M - 1) * N * 4, dst_offset=N * 4)   # row r lands at r + 1
            else:
                linear.matmul(rec, a_buf, b_buf, out, M, N, K, layout=layout,
                              accumulate=layout == "tn")
        return encode

    for wrong in ("lost_slice", "shifted_rows"):
        times = {wrong: 1e-6, "right": 2e-6, "slow": 3e-6}
        failed = autotune._drop_wrong_winners(device, times, encode_for, a, b, out, layout,
                                              M, N, f16_operands=False)
        assert set(failed) == {wrong} and not failed[wrong]["ok"]
        assert times[wrong] == float("inf") and times["right"] == 2e-6
        assert autotune.entry_from_times(times)["config"] == "right"
    right = autotune.check_matmul(device, encode_for("right"), a, b, out, layout, M, N,
                                  f16_operands=False)
    assert right["ok"] and 0 in right["rows"] and M - 1 in right["rows"]


def test_cli_tune_writes_cache_and_table(tmp_path, cache_dir):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "istanbul", "kernels", "tune", "--preset",
                           "tiny", "--key", "nn", "--no-attention", "--out", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, ISTANBUL_AUTOTUNE_DIR=str(cache_dir)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = (out / "autotune.md").read_text()
    assert "| matmul | nn |" in table
    caches = list(cache_dir.glob("*.json"))
    assert len(caches) == 1
    entries = json.loads(caches[0].read_text())["entries"]
    assert entries and all(k.startswith("matmul/nn/") for k in entries)
    assert (out / caches[0].name).is_file()


def test_cli_tune_rejects_unknown_key(cache_dir):
    proc = subprocess.run([sys.executable, "-m", "istanbul", "kernels", "tune", "--key", "xx",
                           "--no-save"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "unknown or unsupported matmul key" in proc.stderr


def test_attention_tuning_picks_a_tile_the_op_then_uses(device, cache_dir):
    from istanbul.shaders.kernels.attention import ops as attention
    entry = autotune.tune_attention(device, "forward", B=1, T=32, H=2, Hkv=1, D=16)
    assert entry["config"] in entry["candidates"]
    tuned_cache.save(device, {"attention/forward/32x16": entry})
    rows, cols = attention.choose_config(device, "forward", 32, 16)
    assert attention.format_config(rows, cols) == entry["config"]


def test_tuner_offers_folds_for_f16_math_and_the_cache_reads_them(device, cache_dir):
    if not device.has("shader-f16"):
        pytest.skip("device lacks shader-f16 (the packed-f16 kernels need it)")
    h16 = [str(c) for c in linear.candidate_configs(device, "nt_h16", 512, 512, 512)]
    assert any(c.endswith("-fold32") for c in h16) and any("-fold" not in c for c in h16)
    assert not any("-fold" in str(c)
                   for c in linear.candidate_configs(device, "nt", 512, 512, 512))
    entry = autotune.tune_matmul(device, "nt_h16", 64, 64, 64)
    assert entry["config"] in entry["candidates"]
    _write(device, cache_dir, {"matmul/nt_h16/256x256x256": {"config": "64x64x32-4x4-s1-fold32"},
                               "matmul/nt/256x256x256": {"config": "64x64x16-4x4-s1-f64-dot"}})
    chosen = linear.plan(device, "nt", 256, 256, 256, b_dtype=np.float16, f16_math=True)
    assert chosen.kernel == "matmul_nt_h16_tiled"
    assert str(chosen.config) == "64x64x32-4x4-s1-fold32"
    with pytest.warns(UserWarning, match="ignoring the tuned entry"):   # unreadable: the default
        assert linear.plan(device, "nt", 256, 256, 256).config == linear.default_config(
            device, "nt", 256, 256, 256)


def test_tuned_shapes_follow_the_model_presets(monkeypatch):
    from trainer_svc.model.config import PRESETS
    from trainer_svc.model.tuning_shapes import model_attention, model_dims
    assert model_dims("124m") == dict(d=768, kv=768, ffn=2048, vocab=50304,
                                               tokens=8 * 1024, fused_qkv=True)
    # the trainer's products: q|k|v in one (8192 x 2304 x 768), each in three layouts
    shapes = autotune.linear_shapes(**model_dims("124m"))
    assert ("nt", 8192, 2304, 768, "store") in shapes and len(shapes) == 3 * 5
    assert ("tn", 2304, 768, 8192, "accumulate") in shapes
    apart = autotune.linear_shapes(**dict(model_dims("124m"), kv=256,
                                          fused_qkv=False))   # q shares o's shape
    assert ("nt", 8192, 256, 768, "store") in apart and len(apart) == 3 * 5
    assert model_attention("tiny") == dict(B=2, T=64, H=4, Hkv=2, D=16)
    # a preset's shape is read from the preset, not from a copy
    monkeypatch.setitem(PRESETS, "small", dict(PRESETS["small"], d_model=512, n_heads=8,
                                               n_kv_heads=2))
    assert model_dims("small", tokens=256) == dict(d=512, kv=128, ffn=1024,
                                                            vocab=50304, tokens=256,
                                                            fused_qkv=True)
    with pytest.raises(ValueError, match="unknown preset 'huge'; choose one of 124m, small, tiny"):
        model_dims("huge")


def test_devices_lists_the_tuning_cache_files_in_lookup_order(device, cache_dir):
    tuned_cache.save(device, {"matmul/nt/64x64x64": {"config": "32x32x8-4x4-s1", "us": 1.0}})
    mine = cache_dir / (tuned_cache.adapter_key(device) + ".json")
    env = dict(os.environ, ISTANBUL_AUTOTUNE_DIR=str(cache_dir))
    proc = subprocess.run([sys.executable, "-m", "istanbul", "devices", "--backend",
                           device.info.webgpu], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"tuning cache: {mine} (1 entries)" in proc.stdout, proc.stdout
