"""WebGPU backends (wgpu-native / Dawn), enable lines per compiler, and the binding hazards
the engine refuses on both (WebGPU's rules: no overlapping writable views of one buffer, no
buffer bound writable and read-only in one dispatch)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from istanbul.shaders import backends, source
from istanbul.shaders.engine import BindingHazardError, Device, views_overlap


def _dawn_device():
    """A Dawn device on this machine, or skip saying why there is none."""
    if not backends.dawn_installed():
        pytest.skip("wgpudawn is not installed (pip install 'istanbul[dawn]')")
    from istanbul.shaders.adapters import NoAdapterError
    try:
        return Device(backend="dawn")
    except NoAdapterError as exc:
        pytest.skip(f"Dawn has no adapter here (scripts/dawn_lavapipe.sh provides one): {exc}")


# ---- choosing a backend -----------------------------------------------------------------------

def test_requested_backend_from_argument_then_environment(monkeypatch):
    from istanbul.shaders.settings import SettingError
    monkeypatch.delenv("ISTANBUL_BACKEND", raising=False)
    assert backends.requested(None) == "auto"
    monkeypatch.setenv("ISTANBUL_BACKEND", "Dawn")
    assert backends.requested(None) == "dawn"
    assert backends.requested("wgpu") == "wgpu"
    with pytest.raises(backends.BackendError, match=r"--backend is 'vulkan'; use one of auto"):
        backends.requested("vulkan")
    monkeypatch.setenv("ISTANBUL_BACKEND", "metal")
    with pytest.raises(SettingError, match=r"\$ISTANBUL_BACKEND is 'metal'; use one of auto"):
        backends.requested(None)


def test_bad_backend_is_one_clear_cli_error():
    env = dict(os.environ, ISTANBUL_BACKEND="metal")
    proc = subprocess.run([sys.executable, "-m", "istanbul", "devices"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "$ISTANBUL_BACKEND is 'metal'; use one of auto, wgpu, dawn" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_dawn_without_wgpudawn_says_how_to_install(monkeypatch):
    monkeypatch.setattr(backends, "dawn_installed", lambda: False)
    with pytest.raises(backends.BackendError, match=r"pip install 'istanbul\[dawn\]'"):
        backends.load("dawn")
    # auto quietly takes wgpu-native when Dawn is absent
    from istanbul.shaders.adapters import choose_adapter
    info, _ = choose_adapter(None, "auto")
    assert info.webgpu == "wgpu"


def test_unknown_dawn_toggle_is_named(monkeypatch):
    if not backends.dawn_installed():
        pytest.skip("wgpudawn is not installed")
    monkeypatch.setenv("ISTANBUL_DAWN_TOGGLES", "disable_robustness, no_such_toggle")
    with pytest.raises(backends.BackendError, match="ISTANBUL_DAWN_TOGGLES .* no_such_toggle;"):
        backends.load("dawn")


def test_feature_names_map_both_ways():
    dawn = backends.Backend("dawn", "tint", api=None)
    names = dawn.canonical(["subgroups", "shader-f16", "chromium-experimental-subgroup-matrix"])
    assert names == {"subgroup", "shader-f16", "subgroup-matrix"}
    assert sorted(dawn.native(["subgroup", "timestamp-query"])) == ["subgroups", "timestamp-query"]
    wgpu = backends.Backend("wgpu", "naga", api=None)
    assert wgpu.canonical(["subgroup"]) == {"subgroup"}


def test_f16_subgroup_matrices_decide_auto():
    f16 = {"component_type": "f16", "result_component_type": "f32", "m": 16, "n": 16, "k": 16}
    int8 = {"component_type": "u8", "result_component_type": "u32", "m": 16, "n": 16, "k": 32}
    assert backends.has_f16_subgroup_matrices([int8, f16])
    assert not backends.has_f16_subgroup_matrices([int8])
    assert not backends.has_f16_subgroup_matrices(())


def test_missing_dawn_icd_file_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("ISTANBUL_DAWN_ICD", str(tmp_path / "nope.json"))
    with pytest.raises(backends.BackendError, match="nope.json"):
        backends.dawn_icd()


# ---- enable lines per compiler ---------------------------------------------------------------

def test_enable_lines_per_compiler():
    feats = {"shader-f16", "subgroup", "subgroup-matrix"}
    assert source.enable_lines(feats, "naga") == "enable f16;\n"
    tint = source.enable_lines(feats, "tint").splitlines()
    assert tint == ["enable f16;", "enable subgroups;",
                    "enable chromium_experimental_subgroup_matrix;"]
    assert source.enable_lines({"subgroup"}, "tint") == "enable subgroups;\n"
    assert source.enable_lines({"timestamp-query"}, "tint") == ""
    with pytest.raises(ValueError, match="unknown shader compiler"):
        source.enable_lines(feats, "fxc")


def test_binding_declarations_are_read_from_the_module():
    found = source.bindings("""
        @group(0) @binding(0) var<storage, read> x: array<f32>;
        @binding(1) @group(0) var<storage, read_write> y: array<f32>;
        @group(0) @binding(2) var<storage> z: array<f32>;
        @group(0) @binding(3) var<uniform> p: Params;
        @group(1) @binding(0) var<storage, read_write> other: array<f32>;""")
    assert {i: (b.name, b.writable) for i, b in found.items()} == {
        0: ("x", False), 1: ("y", True), 2: ("z", False), 3: ("p", False)}


# ---- binding hazards: refused on every backend ---------------------------------------------

def _cache_write(device, k_cache, v_cache, k, v, T=4, D=8):
    from istanbul.shaders.kernels.attention import decode
    with device.record() as rec:
        decode.cache_write(rec, k, v, k_cache, v_cache, 1, T, 1, D, pos=0, t_max=T)


def test_overlapping_writable_views_are_refused(device):
    k, v = device.upload(np.ones(32, np.float32)), device.upload(np.ones(32, np.float32))
    align = device.limits["min-storage-buffer-offset-alignment"] // 4
    both = device.zeros(align + 32)
    with pytest.raises(BindingHazardError,
                       match=r"kv_cache_write.*bindings 2 \(k_cache.*3 \(v_cache.*overlapping "
                             r"writable ranges"):
        _cache_write(device, both.elements(0, align + 32), both.elements(align, 32), k, v)


def test_writable_and_read_only_views_of_one_buffer_are_refused(device):
    buf = device.upload(np.arange(4096, dtype=np.float32))
    align = device.limits["min-storage-buffer-offset-alignment"] // 4
    y = device.empty(100)
    with pytest.raises(BindingHazardError, match=r"infra.wgsl:scale.*one writable and one "
                                                 r"read-only"):
        device.run(device.kernel("infra.wgsl", "scale"),
                   [buf.elements(0, 100), buf.elements(4 * align, 100),
                    device.uniform("IIfI", 100, 0, 2.0, 0)], 1)
    device.run(device.kernel("infra.wgsl", "scale"),   # separate buffers: fine
               [buf.elements(0, 100), y, device.uniform("IIfI", 100, 0, 2.0, 0)], 1)
    np.testing.assert_array_equal(device.download(y), 2 * np.arange(100, dtype=np.float32))


def test_disjoint_writable_views_of_one_buffer_are_allowed(device):
    rng = np.random.default_rng(0)
    k, v = (device.upload(rng.standard_normal(32).astype(np.float32)) for _ in range(2))
    align = max(device.limits["min-storage-buffer-offset-alignment"] // 4, 32)
    both = device.zeros(2 * align)
    _cache_write(device, both.elements(0, 32), both.elements(align, 32), k, v)
    out = device.download(both)
    np.testing.assert_array_equal(out[:32], device.download(k))
    np.testing.assert_array_equal(out[align:align + 32], device.download(v))


def test_views_overlap(device):
    buf = device.zeros(1024)
    other = device.zeros(1024)
    align = device.limits["min-storage-buffer-offset-alignment"] // 4
    assert views_overlap(buf, buf.elements(align, 10))
    assert not views_overlap(buf.elements(0, align), buf.elements(align, 10))
    assert views_overlap(buf.elements(0, align + 1), buf.elements(align, 10))
    assert not views_overlap(buf, other)


def test_fused_attention_backward_binds_no_overlapping_writable_views(device):
    """dq/dk/dv as interleaved views of one fused buffer (the model's layout) must give the
    same gradients as separate buffers, with no hazard raised."""
    from istanbul.shaders.kernels.attention import ops as attention
    B, T, H, Hkv, D = 1, 9, 2, 1, 16
    width = (H + 2 * Hkv) * D
    rng = np.random.default_rng(1)
    qkv = device.upload(rng.standard_normal(B * T * width).astype(np.float32) * 0.5)
    n = B * T * width
    parts = lambda buf: (buf.elements(0, n), buf.elements(H * D, n - H * D),  # noqa: E731
                         buf.elements((H + Hkv) * D, n - (H + Hkv) * D))
    align = device.limits["min-storage-buffer-offset-alignment"] // 4
    if (H * D) % align:
        pytest.skip(f"fused views need offsets aligned to {align} floats")
    q, k, v = parts(qkv)
    o, lse = device.empty((B, T, H, D)), device.empty((B, H, T))
    do = device.upload(rng.standard_normal(B * T * H * D).astype(np.float32))
    fused = device.zeros(n)
    dq, dk, dv = parts(fused)
    strides = {"q_stride": width, "kv_stride": width}
    with device.record() as rec:
        attention.forward(rec, q, k, v, o, lse, B, T, H, Hkv, D, **strides)
        attention.backward(rec, q, k, v, o, do, lse, dq, dk, dv, B, T, H, Hkv, D, **strides)
    sep = [device.zeros(n) for _ in range(3)]
    with device.record() as rec:
        attention.backward(rec, q, k, v, o, do, lse, sep[0], sep[1].elements(H * D, n - H * D),
                           sep[2].elements((H + Hkv) * D, n - (H + Hkv) * D), B, T, H, Hkv, D,
                           **strides)
    got = device.download(fused).reshape(B * T, width)
    want = [device.download(s).reshape(B * T, width) for s in sep]
    np.testing.assert_array_equal(got[:, :H * D], want[0][:, :H * D])
    np.testing.assert_array_equal(got[:, H * D:(H + Hkv) * D], want[1][:, H * D:(H + Hkv) * D])
    np.testing.assert_array_equal(got[:, (H + Hkv) * D:], want[2][:, (H + Hkv) * D:])
    assert np.abs(got).max() > 0


# ---- Dawn ------------------------------------------------------------------------------------

def test_dawn_device_runs_a_subgroup_kernel_with_engine_feature_names():
    dev = _dawn_device()
    assert dev.info.webgpu == "dawn" and dev.backend.compiler == "tint"
    assert "subgroup" in dev.features and "subgroups" not in dev.features
    x = np.random.default_rng(2).standard_normal((5, 300)).astype(np.float32)
    xb, y = dev.upload(x), dev.empty(10)
    dev.run(dev.kernel("infra.wgsl", "reduce_rows", {"WG": 64}),
            [xb, y, dev.uniform("IIfI", 5, 300, 0.0, 0)], 5)
    out = dev.download(y).reshape(5, 2)
    np.testing.assert_allclose(out[:, 0], x.sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(out[:, 1], x.max(1))
    # the same hazard check as on wgpu-native, before Dawn's own validation
    with pytest.raises(BindingHazardError):
        dev.run(dev.kernel("infra.wgsl", "scale"),
                [xb, xb, dev.uniform("IIfI", 10, 0, 1.0, 0)], 1)


def test_auto_takes_wgpu_without_f16_subgroup_matrices():
    dev = _dawn_device()
    from istanbul.shaders.adapters import choose_adapter
    info, _ = choose_adapter(None, "auto")
    expected = "dawn" if backends.has_f16_subgroup_matrices(dev.subgroup_matrix_configs) \
        else "wgpu"
    assert info.webgpu == expected


def test_subgroup_matrix_ceiling_only_with_the_feature(device):
    from istanbul.shaders.ladder import Roofline, measure_subgroup_matrix
    if not device.has("subgroup-matrix"):
        assert measure_subgroup_matrix(device) == {}
    roof = Roofline(copy_gbs=100.0, fma_tflops={"vec4f32": 30.0, "vec4f32_chains4": 60.0,
                                                "vec4f16": 70.0},
                    matrix_tflops={"f16_f32_16x16x16": 700.0})
    assert roof.peak("f32") == 60.0 and roof.peak("f16") == 70.0
    assert roof.peak("subgroup-matrix") == 700.0
    assert Roofline(1.0, {"f32": 2.0}).peak("subgroup-matrix") == 2.0


def test_devices_command_lists_backend_features_and_matrix_configs():
    if not backends.dawn_installed():
        pytest.skip("wgpudawn is not installed")
    env = dict(os.environ, ISTANBUL_BACKEND="")
    proc = subprocess.run([sys.executable, "-m", "istanbul", "devices", "--backend", "dawn"],
                          env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode and "Dawn found no Vulkan adapter" in proc.stderr:
        pytest.skip("Dawn has no adapter here")
    assert proc.returncode == 0, proc.stderr
    assert "backend: dawn (tint)" in proc.stdout
    assert "subgroup-matrix configs:" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "istanbul", "devices", "--json"],
                          env=env, capture_output=True, text=True, timeout=120)
    listed = json.loads(proc.stdout)
    assert {"wgpu", "dawn"} <= {a["webgpu"] for a in listed}
    assert all("subgroup_matrix_configs" in a for a in listed)


def test_backend_flag_overrides_the_environment_for_the_command():
    env = dict(os.environ, ISTANBUL_BACKEND="dawn")
    proc = subprocess.run([sys.executable, "-m", "istanbul", "kernels", "check", "--backend",
                           "wgpu", "--kernel", "copy_rows"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].endswith("; wgpu)")
    assert "# 1 kernel(s), 0 failed rung(s)" in proc.stdout


def test_dawn_robustness_follows_the_caller_unless_the_environment_says(monkeypatch):
    from istanbul.shaders import backends as b
    from istanbul.shaders.settings import SettingError
    monkeypatch.delenv("ISTANBUL_DAWN_ROBUSTNESS", raising=False)
    assert b.dawn_robustness(True) and not b.dawn_robustness(False)
    monkeypatch.setenv("ISTANBUL_DAWN_ROBUSTNESS", "on")
    assert b.dawn_robustness(False)
    monkeypatch.setenv("ISTANBUL_DAWN_ROBUSTNESS", "off")
    assert not b.dawn_robustness(True)
    monkeypatch.setenv("ISTANBUL_DAWN_ROBUSTNESS", "maybe")
    with pytest.raises(SettingError, match=r"\$ISTANBUL_DAWN_ROBUSTNESS is 'maybe'"):
        b.dawn_robustness(True)


def test_default_devices_share_one_device_where_robustness_is_no_switch(device):
    """default_device asked for with robustness on and off: one device where the backend is
    not Dawn (robustness is Dawn's switch alone; the tokenizer asks for it off, tests and
    CLIs on), two under Dawn, each with what it asked for."""
    from istanbul.shaders.engine import default_device
    on, off = default_device(robustness=True), default_device(robustness=False)
    assert on is device and default_device(robustness=False) is off
    from istanbul.shaders.backends import dawn_robustness
    if device.backend.name == "dawn":
        assert off is not on
        assert (on.robustness, off.robustness) == (dawn_robustness(True), dawn_robustness(False))
    else:
        assert off is on
