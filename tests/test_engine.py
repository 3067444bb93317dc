"""The engine: enable lines, kernel splitting, grids, buffers, timing, the no-adapter error."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import wgpu

from istanbul.shaders import engine, source
from istanbul.shaders.engine import fold_grid


def test_enable_f16_only_with_shader_f16_and_never_subgroups():
    assert source.enable_lines({"shader-f16", "subgroup"}) == "enable f16;\n"
    assert source.enable_lines({"subgroup", "timestamp-query"}) == ""
    assert "subgroups" not in source.enable_lines({"shader-f16", "subgroup", "subgroup-barrier"})


def test_compose_puts_enable_lines_first_then_preamble_then_kernel():
    wgsl = source.load_file("infra.wgsl")
    text = source.compose({"shader-f16"}, wgsl, "scale")
    assert text.startswith("enable f16;\n")
    assert text.index("fn wg_sum") < text.index("fn scale(")
    assert "fn axpy(" not in text  # only this kernel's section
    assert not source.compose({"subgroup"}, wgsl, "scale").startswith("enable")


def test_kernel_files_must_not_carry_enable_lines():
    with pytest.raises(source.ShaderSourceError, match="enable"):
        source.split_kernels("enable f16;\n// --- KERNEL: a ---\nfn a() {}\n")


def test_split_kernels_header_and_sections():
    text = ("// header\nconst K: u32 = 1u;\n"
            "// --- KERNEL: first ---\nfn first() {}\n"
            "//   ---   KERNEL:   second   ---\nfn second() {}\n")
    header, kernels = source.split_kernels(text)
    assert "const K" in header
    assert list(kernels) == ["first", "second"]
    assert "fn first" in kernels["first"] and "fn second" not in kernels["first"]
    with pytest.raises(source.ShaderSourceError, match="twice"):
        source.split_kernels("// --- KERNEL: a ---\n// --- KERNEL: a ---\n")
    with pytest.raises(source.ShaderSourceError, match="marker"):
        source.split_kernels("fn lonely() {}\n")


@pytest.mark.parametrize("count", [1, 2, 255, 65535, 65536, 65537, 131071, 4_000_000,
                                   65535 * 65535])
def test_fold_grid_covers_count_within_limits(count):
    x, y, z = fold_grid(count)
    assert z == 1 and 1 <= x <= 65535 and 1 <= y <= 65535
    assert x * y >= count
    assert x * (y - 1) < count  # no wasted row


def test_fold_grid_rejects_bad_counts():
    with pytest.raises(ValueError):
        fold_grid(0)
    with pytest.raises(ValueError):
        fold_grid(65535 * 65535 + 1)


def test_dispatch_above_65535_workgroups_reaches_every_element(device):
    n = 65535 * 256 + 3 * 256 + 7  # 65,539 workgroups: folded into 2-D, ragged last one
    y = device.zeros(n, np.float32)
    device.run(device.kernel("infra.wgsl", "fill"), [y, device.uniform("IIfI", n, 0, 2.5, 0)],
               -(-n // 256))
    out = device.download(y)
    assert out.shape == (n,)
    assert np.all(out == 2.5)


@pytest.mark.parametrize("n", [1, 255, 256, 257, 1000])
def test_odd_sizes_touch_exactly_n_elements(device, n):
    guard = np.full(n + 64, -1.0, np.float32)
    y = device.upload(guard)
    device.run(device.kernel("infra.wgsl", "fill"), [y, device.uniform("IIfI", n, 0, 1.0, 0)],
               -(-n // 256))
    out = device.download(y)
    assert np.all(out[:n] == 1.0) and np.all(out[n:] == -1.0)


def test_sub_range_binding_writes_only_its_range(device):
    align = device.limits["min-storage-buffer-offset-alignment"]
    per = align // 4
    buf = device.upload(np.zeros(4 * per, np.float32))
    view = buf.elements(per, per)
    device.run(device.kernel("infra.wgsl", "fill"), [view, device.uniform("IIfI", per, 0, 7.0, 0)], 1)
    out = device.download(buf)
    assert np.all(out[per:2 * per] == 7.0)
    assert np.all(out[:per] == 0) and np.all(out[2 * per:] == 0)
    with pytest.raises(ValueError, match="alignment"):
        buf.view(4, 16)
    with pytest.raises(ValueError, match="outside"):
        buf.view(0, buf.nbytes + align)


def test_upload_download_round_trip_odd_byte_counts(device):
    for arr in (np.arange(3, dtype=np.uint8), np.arange(5, dtype=np.float16),
                np.arange(7, dtype=np.int32).reshape(7, 1)):
        assert np.array_equal(device.download(device.upload(arr)), arr)


def test_zero_clears_buffer(device):
    buf = device.upload(np.ones(100, np.float32))
    device.zero(buf)
    assert not device.download(buf).any()


def test_work_done_says_when_earlier_work_has_finished_without_blocking(device):
    """Device.work_done: False may come while the GPU works, True once the work submitted
    before it has finished (its result is there), and its fence buffer is reused after."""
    import time
    _, y = _axpy_recorded(device, 1 << 16, 20)
    done = device.work_done()
    deadline = time.monotonic() + 60
    while not done():
        assert time.monotonic() < deadline
    assert done()                       # stays True (its fence went back once)
    fences = list(device._fences)
    assert len(fences) >= 1
    again = device.work_done()          # takes a fence that went back: no new buffer
    assert len(device._fences) == len(fences) - 1
    while not again():
        assert time.monotonic() < deadline
    assert len(device._fences) == len(fences)
    assert np.all(device.download(y) == 20.0)


def test_wait_for_polls_a_hardware_device_then_blocks(device, monkeypatch):
    """Device.wait_for: on a hardware adapter it polls (the adapter passed off as one kind
    and the other) until the map is done, or until poll_s runs out and the blocking wait takes
    over; the data are right either way; a software adapter never polls."""
    import dataclasses
    data = np.arange(4 << 20, dtype=np.uint32)   # 16 MB: the copy is still running at the map
    src = device.upload(data)
    polls = []
    real_poll = device.raw._poll
    monkeypatch.setattr(device.raw, "_poll", lambda *a: (polls.append(1), real_poll(*a)))

    def mapped(poll_s):
        """(the data read back, whether the map was still pending when wait_for began)."""
        staging = device.raw.create_buffer(size=data.nbytes, usage=wgpu.BufferUsage.MAP_READ |
                                           wgpu.BufferUsage.COPY_DST)
        encoder = device.raw.create_command_encoder()
        encoder.copy_buffer_to_buffer(src.raw, 0, staging, 0, data.nbytes)
        device.queue.submit([encoder.finish()])
        promise = staging.map_async("READ", 0, data.nbytes)
        pending = promise._state == "pending"
        device.wait_for(promise, poll_s)
        got = np.frombuffer(staging.read_mapped(0, data.nbytes), np.uint32).copy()
        staging.unmap()
        return got, pending

    monkeypatch.setattr(device, "info", dataclasses.replace(device.info, adapter_type="CPU"))
    got, _ = mapped(60.0)
    assert (got == data).all() and not polls                 # software: no poll
    monkeypatch.setattr(device, "info", dataclasses.replace(device.info,
                                                            adapter_type="DiscreteGPU"))
    pending_seen = False
    for _ in range(5):    # a map already settled at wait_for needs no poll: try a pending one
        before = len(polls)
        got, pending = mapped(60.0)
        assert (got == data).all()
        assert len(polls) > before or not pending             # polled until done
        pending_seen |= pending
    if not pending_seen:
        pytest.skip("every copy had finished before wait_for began: nothing to poll for")
    got, _ = mapped(1e-9)
    assert (got == data).all()                                # poll time out: blocked


def _axpy_recorded(device, n: int, times: int):
    """y += 1.0 * x over n ones, `times` dispatches in one recording: (the recorder, y)."""
    x = device.upload(np.ones(n, np.float32))
    y = device.upload(np.zeros(n, np.float32))
    axpy = device.kernel("infra.wgsl", "axpy")
    params = device.uniform("IIfI", n, 0, 1.0, 0)
    with device.record() as rec:
        for _ in range(times):
            rec.dispatch(axpy, [x, y, params], -(-n // 256))
    return rec, y


def test_recorder_batches_dispatches_in_one_submit(device):
    rec, y = _axpy_recorded(device, 1000, 10)
    assert rec.dispatch_count == 10
    assert np.all(device.download(y) == 10.0)


def test_gpu_timestamps_give_positive_times(device):
    n = 1 << 16
    x, y = device.empty(n), device.empty(n)
    params = device.uniform("IIfI", n, 0, 0.0, 0)
    copy = device.kernel("infra.wgsl", "copy")
    with device.record(timing=True) as rec:
        rec.dispatch(copy, [x, y, params], n // 256, label="a")
        rec.dispatch(copy, [y, x, params], n // 256, label="b")
    assert [label for label, _ in rec.gpu_times] == ["a", "b"]
    assert all(0 < t < 10 for _, t in rec.gpu_times)


def test_pipeline_cache_keyed_by_constants(device):
    a = device.kernel("infra.wgsl", "reduce_rows", {"WG": 64})
    assert device.kernel("infra.wgsl", "reduce_rows", {"WG": 64}) is a
    assert device.kernel("infra.wgsl", "reduce_rows", {"WG": 128}) is not a


def test_compile_error_names_file_and_kernel(device, tmp_path, monkeypatch):
    with pytest.raises(engine.ShaderCompileError, match="infra.wgsl:scale"):
        device.kernel("infra.wgsl", "scale", {"NO_SUCH_OVERRIDE": 1})
    with pytest.raises(source.ShaderSourceError, match="no kernel"):
        device.kernel("infra.wgsl", "missing")


def test_no_vulkan_adapter_gives_one_clear_error():
    env = dict(os.environ, VK_DRIVER_FILES="/nonexistent/icd.json",
               VK_ICD_FILENAMES="/nonexistent/icd.json", ISTANBUL_ADAPTER="")
    proc = subprocess.run([sys.executable, "-m", "istanbul", "devices"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "mesa-vulkan-drivers" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_adapter_choice_by_index_and_name(device):
    from istanbul.shaders.adapters import NoAdapterError, choose_adapter
    info, _ = choose_adapter("0")
    assert info.index == 0
    info2, _ = choose_adapter(info.name[:5])
    assert info2.name == info.name
    with pytest.raises(NoAdapterError, match="out of range"):
        choose_adapter("99")
    with pytest.raises(NoAdapterError, match="no adapter name contains"):
        choose_adapter("no-such-gpu-name")


def test_params_cache_returns_same_buffer_for_same_values(device):
    a = device.params("IIf", 3, 4, 1.5)
    assert device.params("IIf", 3, 4, 1.5) is a
    assert device.params("IIf", 3, 4, 2.5) is not a


def test_time_gpu_warms_up_for_a_minimum_time(device):
    """time_gpu keeps warming up for min_warmup_s after the first run (which may compile),
    and runs only the counted warm-up when min_warmup_s is 0."""
    import time
    from istanbul.shaders.kernels.elementwise import ops as basic
    buf = device.empty(1024, np.float32)
    calls = []

    def encode(rec):
        calls.append(1)
        basic.fill(rec, buf, 1024, 1.0)

    start = time.perf_counter()
    device.time_gpu(encode, repeats=2, warmup=1, min_warmup_s=0.2)
    assert time.perf_counter() - start >= 0.2 and len(calls) > 3
    calls.clear()
    device.time_gpu(encode, repeats=2, warmup=1, min_warmup_s=0.0)
    assert len(calls) == 3
