"""Causal GQA attention on the real device: ladder cases, tile choice, bad input."""

from __future__ import annotations

import types

import numpy as np
import pytest

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
        with pytest.raises(ValueError, match="retired -db"):   # a retired kernel
            attention.backward(rec, buf, buf, buf, buf, buf, buf, buf, buf, buf, 1, 4, 1, 1,
                               64, config_dq="64x16-db")


def test_sgmat2_attention_is_refused_without_robustness():
    """The experimental sgmat2 kernels were wrong on the H200 with Dawn's robustness off (the
    trainer's default; dev/RESULTS.md): a device without robustness refuses them with a clear
    error instead of returning wrong outputs. (Under wgpu-native every device counts as robust;
    the CI's Dawn pass runs this with a real robustness-off device.)"""
    from istanbul.shaders.engine import default_device
    dev = default_device(robustness=False)
    if dev.robustness:
        pytest.skip(f"backend {dev.backend.name}: no robustness toggle to turn off")
    with pytest.raises(ValueError, match="without Dawn's robustness"):
        attention._sgmat2_kernel(dev, "forward", 64)
