"""What a user gets with default flags, on software Vulkan and on a described hardware GPU:
`istanbul serve`'s process layout, `train`/`submit`'s precision, the demo's run; and that the
CLI imports only what the chosen command runs."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from istanbul.errors import UserFacingError
from tokenizer_svc.service.sizing import AUTO, resolve_layout
from trainer_svc.training.precision import resolve_precision

REPO = Path(__file__).resolve().parents[1]


def layout(**kw):
    given = dict(workers=AUTO, gpu_processes=AUTO, keep_clock_s=AUTO, gpu_process="shared")
    given.update(kw)
    return resolve_layout(**given)


@pytest.mark.parametrize("cores, workers, processes, keep", [
    (16, 12, 2, 2.0), (64, 12, 2, 2.0), (8, 6, 1, 2.0), (4, 3, 1, 2.0), (2, 1, 1, 0.0),
    (1, 1, 1, 0.0)])
def test_serve_auto_on_a_hardware_gpu_uses_the_cores(cores, workers, processes, keep):
    got = layout(software=False, cores=cores)
    assert (got.workers, got.gpu_processes, got.keep_clock_s) == (workers, processes, keep)
    assert got.chosen == (f"--workers {workers}", f"--gpu-processes {processes}",
                          f"--gpu-keep-clock {keep:g}")
    line = got.describe(software=False, cores=cores)
    assert f"--workers {workers} --gpu-processes {processes}" in line
    assert f"a hardware GPU, {cores} cores" in line


@pytest.mark.parametrize("cores", [2, 16])
def test_serve_auto_on_software_vulkan_is_one_process(cores):
    got = layout(software=True, cores=cores)
    assert (got.workers, got.gpu_processes, got.keep_clock_s) == (1, 1, 0.0)
    assert "software Vulkan" in got.describe(software=True, cores=cores)


def test_serve_explicit_values_win_and_auto_fits_them():
    got = layout(workers=4, software=False, cores=16)        # the rest sized to 4 workers
    assert (got.workers, got.gpu_processes, got.keep_clock_s) == (4, 1, 2.0)
    assert got.chosen == ("--gpu-processes 1", "--gpu-keep-clock 2")
    got = layout(workers=12, gpu_process="per-worker", software=False, cores=16)
    assert (got.gpu_processes, got.keep_clock_s) == (1, 0.0)  # no shared process to keep
    got = layout(workers=12, gpu_processes=3, keep_clock_s=0.5, software=False, cores=16)
    assert (got.workers, got.gpu_processes, got.keep_clock_s, got.chosen) == (12, 3, 0.5, ())


def _serve_args(*argv):
    from tokenizer_svc.service.cli import register
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", "--vocab", "v.tiktoken", *argv])


def test_serve_flags_default_to_auto_and_resolve_on_this_machine():
    from tokenizer_svc.service.cli import config_from_args, resolve_auto_layout
    args = _serve_args()
    assert (args.workers, args.gpu_processes, args.gpu_keep_clock) == (AUTO, AUTO, AUTO)
    line = resolve_auto_layout(args)          # CI: software Vulkan
    assert (args.workers, args.gpu_processes, args.gpu_keep_clock) == (1, 1, 0.0)
    assert line.startswith("--workers 1 --gpu-processes 1 --gpu-keep-clock 0 (")
    assert config_from_args(_serve_args()).gpu_keep_clock_s == 0.0
    with pytest.raises(SystemExit):
        _serve_args("--workers", "many")


def test_serve_help_shows_the_auto_defaults():
    out = subprocess.run([sys.executable, "-m", "istanbul", "serve", "--help"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    flat = " ".join(out.split())
    for flag in ("--workers N|auto", "--gpu-processes G|auto", "--gpu-keep-clock SECONDS|auto"):
        assert flag in flat
    assert flat.count("auto (default):") >= 3


class DescribedDevice:
    """The features and subgroup-matrix configurations a real adapter reports."""

    def __init__(self, features, configs=()):
        self.features, self.subgroup_matrix_configs = set(features), list(configs)
        self.name = "described"

    def has(self, feature):
        return feature in self.features


H100_DAWN = DescribedDevice(
    {"shader-f16", "subgroups", "subgroup-matrix", "timestamp-query"},
    [{"m": 16, "n": 16, "k": 16, "component_type": "f16", "result_component_type": "f32",
      "min_subgroup_size": 32, "max_subgroup_size": 32}])
H100_WGPU_NATIVE = DescribedDevice({"shader-f16", "subgroups", "timestamp-query"})
NO_F16 = DescribedDevice({"subgroups"})


@pytest.mark.parametrize("device, requested, runs", [
    (H100_DAWN, "auto", "f16"), (H100_WGPU_NATIVE, "auto", "fp32"), (NO_F16, "auto", "fp32"),
    (H100_DAWN, "mixed", "mixed"), (H100_WGPU_NATIVE, "f16", "f16"), (NO_F16, "mixed", "fp32"),
    (NO_F16, "f16", "fp32"), (H100_DAWN, "fp32", "fp32")])
def test_precision_auto_picks_the_tensor_cores_where_they_are(device, requested, runs):
    assert resolve_precision(requested, device) == runs


def test_precision_auto_is_the_default_of_train_and_submit_and_the_trainer_resolves_it(device):
    from trainer_svc.cli_train import register as register_train
    from trainer_svc.jobs.queue import JobSpec
    from trainer_svc.model.config import ModelConfig
    from trainer_svc.training.trainer import TrainConfig, Trainer
    parser = argparse.ArgumentParser()
    register_train(parser.add_subparsers())
    assert parser.parse_args(["train", "--text", "a", "--steps", "1"]).precision == "auto"
    assert JobSpec(dataset="d", steps=1).precision == "auto"
    assert TrainConfig().precision == "auto"
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("bf16", device)
    with Trainer(ModelConfig.preset("tiny", 300), TrainConfig(batch=1, seq=8), device) as t:
        assert t.train_config.precision == resolve_precision("auto", device)


def _demo_args(*argv):
    from istanbul.demo import register
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["demo", *argv])


@pytest.mark.parametrize("software", [True, False])
def test_demo_defaults_fit_the_model_they_pick(software):
    """The GPU run once paired the tiny model (max_seq 256) with seq 512 and failed at
    submit; every default run must pass the job spec's own check."""
    from istanbul.demo import settings_for
    from trainer_svc.jobs.bridge import check_spec
    from trainer_svc.jobs.queue import JobSpec
    s = settings_for(_demo_args(), software)
    assert s["model"] == ("tiny" if software else "small")
    spec = JobSpec(dataset="demo", model=s["model"], steps=s["steps"], batch=s["batch"],
                   seq=s["seq"], lr=s["lr"], warmup=s["warmup"],
                   checkpoint_every=s["checkpoint_every"], eval_every=s["eval_every"])
    check_spec(spec, s["vocab_size"])
    for model in ("tiny", "small", "124m"):     # a smaller --model shortens the sequence
        s = settings_for(_demo_args("--model", model), software)
        check_spec(JobSpec(dataset="demo", model=model, steps=1, seq=s["seq"]),
                   s["vocab_size"])


def test_demo_refuses_a_sequence_longer_than_the_model_before_any_work(tmp_path):
    from istanbul.demo import settings_for
    with pytest.raises(UserFacingError, match="--seq 512 exceeds the tiny model's max_seq 256"):
        settings_for(_demo_args("--model", "tiny", "--seq", "512"), software=False)
    out = tmp_path / "demo"
    done = subprocess.run([sys.executable, "-m", "istanbul", "demo", "--out", str(out),
                           "--model", "tiny", "--seq", "512"], cwd=REPO, capture_output=True,
                          text=True, env=dict(os.environ, XDG_RUNTIME_DIR="/tmp"))
    assert done.returncode == 1 and "exceeds the tiny model's max_seq" in done.stderr
    assert not (out / "vocab").exists()


def test_demo_plot_keeps_matplotlibs_info_lines_out_of_the_output(tmp_path):
    """A first run of matplotlib (an empty config dir) logs "generated new fontManager" at
    INFO; the demo logs at INFO, so the plot must quiet matplotlib's logger."""
    pytest.importorskip("matplotlib")
    code = ("import logging, sys; from pathlib import Path\n"
            "logging.basicConfig(level=logging.INFO)\n"
            "from istanbul.demo import plot_loss_curve\n"
            "plot_loss_curve({1: 3.0, 2: 2.5, 3: 2.0}, {2: 2.7}, 't', Path(sys.argv[1]))\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "c.png")], cwd=REPO,
                          capture_output=True, text=True, check=True,
                          env=dict(os.environ, MPLCONFIGDIR=str(tmp_path / "mpl")))
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "mpl").is_dir()        # a fresh font cache was built in this run
    assert "INFO" not in done.stderr and "fontManager" not in done.stderr, done.stderr


HEAVY_FOR_A_PARSER = ("grpc", "grpc_health", "redis", "prometheus_client",
                      "tokenizer_svc.service.app", "trainer_svc.training.trainer", "torch")


@pytest.mark.parametrize("argv", [[], ["kernels", "list"], ["train", "--help"]])
def test_the_cli_imports_only_what_the_command_runs(argv):
    """Building the parser imports no server, queue or training stack, and `kernels list`
    runs without gRPC (a too-old grpcio once broke `istanbul kernels check`)."""
    code = ("import sys; from istanbul.cli import main, build_parser\n"
            "argv = sys.argv[1:]\n"
            "build_parser() if not argv else None\n"
            "try:\n    main(argv) if argv else None\n"
            "except SystemExit:\n    pass\n"
            f"heavy = [m for m in {HEAVY_FOR_A_PARSER!r} if m in sys.modules]\n"
            "print('HEAVY', heavy)\n")
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True,
                          text=True, env=dict(os.environ, XDG_RUNTIME_DIR="/tmp"))
    assert "HEAVY []" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
