"""The verification ladder itself: failing rungs fail, the CLI's table and JSON, the roofline.

Every registered case climbs the ladder in tests/test_kernel_ladder.py."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from istanbul.shaders import ladder
from istanbul.shaders.ladder import KernelCase, Launch, check_case, load_cases


@pytest.mark.parametrize("wg", [32, 64, 256, 1024])
def test_back_to_back_reductions_are_race_free(device, wg):
    # Many rows with data whose sum and max differ wildly: a race on the shared slots
    # would hand the max reduction a partial sum (or the reverse).
    rng = np.random.default_rng(wg)
    x = rng.standard_normal((200, 3 * wg + 5)).astype(np.float32) * 1000
    x[:, 7] = 1e6  # max is unmistakable
    from istanbul.shaders.kernels.elementwise.cases import _rows_launch
    for _ in range(5):
        run = _rows_launch(device, {"x": x}, wg)
        with device.record() as rec:
            run.encode(rec)
        out = run.read()["sum_max"]
        np.testing.assert_allclose(out[:, 0], x.astype(np.float64).sum(1), rtol=1e-5, atol=1.0)
        assert np.array_equal(out[:, 1], x.max(1))


def _broken_scale_case():
    from istanbul.shaders.kernels.elementwise.cases import FILE

    def launch(dev, inp):
        n = inp["x"].size
        x, y = dev.upload(inp["x"]), dev.empty(n)
        p = dev.uniform("IIfI", n, 0, 2.0, 0)
        k = dev.kernel(FILE, "scale")
        return Launch(lambda rec: rec.dispatch(k, [x, y, p], -(-n // 256)),
                      lambda: {"y": dev.download(y)})
    return KernelCase(name="broken_scale", family="test", precision="f32",
                      kernels=[(FILE, "scale")],
                      inputs=lambda rng, v: {"x": rng.standard_normal(1000).astype(np.float32)},
                      launch=launch, reference=lambda inp: {"y": 2.001 * inp["x"]})


def test_a_wrong_kernel_fails_the_correct_rung(device):
    results = check_case(device, _broken_scale_case())
    correct = [r for r in results if r.rung == "correct"][0]
    assert correct.ok is False and "psnr" in correct.detail


def test_a_kernel_that_does_not_compile_fails_the_compile_rung(device):
    case = _broken_scale_case()
    case.kernels = [("infra.wgsl", "scale", {"NOT_AN_OVERRIDE": 3})]
    results = check_case(device, case)
    assert results[0].rung == "compile" and results[0].ok is False


def test_missing_feature_skips_with_reason(device):
    case = _broken_scale_case()
    case.requires = ("no-such-feature",)
    (r,) = check_case(device, case)
    assert r.ok is None and "no-such-feature" in r.detail


def test_cli_check_writes_json_and_exit_code(tmp_path):
    out = tmp_path / "check.json"
    proc = subprocess.run([sys.executable, "-m", "istanbul", "kernels", "check", "--kernel",
                           "scale", "--kernel", "reduce_rows_wg64", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "scale" in proc.stdout and "correct" in proc.stdout
    data = json.loads(out.read_text())
    assert {r["rung"] for r in data["results"]} >= {"compile", "run", "correct"}
    assert data["device"]["adapter"]


def test_cli_check_unknown_kernel_is_an_error():
    proc = subprocess.run([sys.executable, "-m", "istanbul", "kernels", "check", "--kernel",
                           "no_such_kernel"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "no kernel case matches" in proc.stderr


def test_metrics_thresholds():
    from istanbul.shaders import metrics as M
    ref = np.linspace(-1, 1, 1000).astype(np.float32)
    m = M.compare(ref + 1e-7, ref)
    assert M.passes(m, "f32")[0]
    assert not M.passes(M.compare(ref + 1e-2, ref), "f32")[0]
    assert M.passes(M.compare(ref.astype(np.float16).astype(np.float32), ref), "f16")[0]
    nan_ref = np.array([np.nan, 1.0], np.float32)
    assert not M.passes(M.compare(np.array([0.0, 1.0], np.float32), nan_ref), "f32")[0]
    assert M.passes(M.compare(np.array([np.nan, 1.0], np.float32), nan_ref), "f32")[0]
    zero = np.zeros(5, np.float32)  # an all-zero reference: absolute closeness decides
    assert M.passes(M.compare(zero + 3e-7, zero), "f32")[0]
    assert not M.passes(M.compare(zero + 1e-3, zero), "f32")[0]
    assert M.passes(M.compare(zero, zero), "f32")[0]
    ints = np.arange(10)
    assert not M.passes(M.compare(ints + (ints == 3), ints), "exact")[0]


def test_a_later_variant_with_the_wrong_shape_fails_the_correct_rung(device):
    case = _broken_scale_case()
    case.variants = ("random", "short")
    case.inputs = lambda rng, v: {"x": rng.standard_normal(1000).astype(np.float32), "v": v}
    # the second variant's reference is one element short: the rung must fail, not crash
    case.reference = lambda inp: {"y": 2.0 * (inp["x"] if inp["v"] == "random" else inp["x"][:-1])}
    results = check_case(device, case)
    correct = [r for r in results if r.rung == "correct"][0]
    assert correct.ok is False and "short/y: shape" in correct.detail


def test_bench_times_a_self_submitting_launch_by_its_reported_gpu_time(device):
    # the BPE cases run GpuEncoder.encode_docs, which submits and reads back itself: the
    # bench rung must time what the launch reports, not its (empty) recording
    from istanbul.shaders.kernels.elementwise.cases import FILE
    calls = []

    def launch(dev, inp):
        n = inp["x"].size
        x, y = dev.upload(inp["x"]), dev.empty(n)
        k, p = dev.kernel(FILE, "scale"), dev.uniform("IIfI", n, 0, 2.0, 0)

        def encode(rec):
            assert rec.dispatch_count == 0
            dev.run(k, [x, y, p], -(-n // 256))
            calls.append(len(calls))
        return Launch(encode, lambda: {"y": dev.download(y)},
                      gpu_seconds=lambda: 1e-3 * (1 + calls[-1]))
    case = KernelCase(name="self_submitting_scale", family="test", precision="f32",
                      kernels=[(FILE, "scale")], launch=launch,
                      inputs=lambda rng, v: {"x": rng.standard_normal(64).astype(np.float32)},
                      reference=lambda inp: {"y": 2.0 * inp["x"]},
                      bytes=lambda inp: 8.0 * inp["x"].size)
    assert all(r.ok is not False for r in check_case(device, case))
    calls.clear()
    roof = ladder.Roofline(copy_gbs=100.0, fma_tflops={"f32": 1.0})
    row = ladder.bench_case(device, case, roof, repeats=3)
    # warm-up run(s) first, then three timed: the median of the timed runs' reported times
    warmup = len(calls) - 3
    assert row["us"] == pytest.approx(1e3 * (warmup + 2)), (row, calls)
    assert row["gbs"] == pytest.approx(8.0 * 64 / (row["us"] * 1e-6) / 1e9)


def test_a_family_folders_case_must_name_that_family(tmp_path, monkeypatch):
    # shaders/kernels/<family>/cases.py registers cases of <family> only: `--kernel rmsnorm`
    # and the layout test rely on the folder and the family being the same name
    package = tmp_path / "fake_house" / "rmsnorm"
    package.mkdir(parents=True)
    (tmp_path / "fake_house" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "cases.py").write_text(
        "from istanbul.shaders.ladder import KernelCase, register\n"
        "register(KernelCase(name='misfiled_case', family='rope', precision='f32', kernels=[],"
        " inputs=None, launch=None, reference=None))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(ladder, "case_modules", lambda: ["fake_house.rmsnorm.cases"])
    monkeypatch.setattr(ladder, "_REGISTRY", {})
    with pytest.raises(ValueError, match="'misfiled_case' says family 'rope'; a family "
                       "folder's cases belong to that family \\('rmsnorm'\\)"):
        ladder.load_cases()


def test_max_variants_checks_only_the_first_ones(device):
    case = load_cases()["copy_rows"]
    results = check_case(device, case, max_variants=1)
    correct = next(r for r in results if r.rung == "correct")
    assert correct.ok and correct.detail.startswith("1 variant(s)")
    assert len(case.variants) > 1
