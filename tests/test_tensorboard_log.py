"""--tensorboard: `istanbul train` and the daemon write their scalars as TensorBoard event
files; read back here with TensorBoard's own reader (EventAccumulator)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("tensorboardX")
pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from istanbul.cli import main  # noqa: E402
from tests.model_helpers import byte_vocabulary, stdlib_text  # noqa: E402
from trainer_svc.jobs.daemon import Daemon, DaemonConfig  # noqa: E402
from trainer_svc.jobs.queue import JobQueue  # noqa: E402
from trainer_svc.training.tensorboard_log import EVAL_LOSS, TRAIN_TAGS, ScalarLog  # noqa: E402

from .daemon_helpers import make_dataset, submit, tiny_vocabulary  # noqa: E402
from .redis_helpers import REPO, istanbul_env  # noqa: E402


def read_scalars(logdir) -> dict[str, dict[int, float]]:
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})   # 0: keep every point
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def test_train_writes_every_scalar_of_every_step(tmp_path, capsys):
    vocab = byte_vocabulary(tmp_path / "letters.tiktoken", extra=100)
    text = tmp_path / "stdlib.py"
    text.write_text(stdlib_text(30_000), encoding="utf-8")
    logdir = tmp_path / "tb"
    code = main(["train", "--text", str(text), str(text), str(text), "--vocab", str(vocab),
                 "--model", "tiny", "--batch", "2", "--seq", "32", "--steps", "8",
                 "--eval-every", "4", "--eval-fraction", "0.3", "--log-every", "2",
                 "--tensorboard", str(logdir)])
    out = capsys.readouterr().out
    assert code == 0
    scalars = read_scalars(logdir)
    assert set(scalars) == set(TRAIN_TAGS.values()) | {EVAL_LOSS}
    for tag in TRAIN_TAGS.values():
        assert sorted(scalars[tag]) == list(range(1, 9)), tag
    printed = {int(s): float(v) for s, v in re.findall(r"step (\d+)/8 loss=([\d.]+)", out)}
    assert sorted(printed) == [2, 4, 6, 8]
    for step, loss in printed.items():
        assert scalars["train/loss"][step] == pytest.approx(loss, abs=1e-4)
    evals = {int(s): float(v) for s, v in re.findall(r"step (\d+)/8 eval_loss=([\d.]+)", out)}
    assert sorted(scalars[EVAL_LOSS]) == sorted(evals) == [4, 8]
    for step, loss in evals.items():
        assert scalars[EVAL_LOSS][step] == pytest.approx(loss, abs=1e-4)
    assert all(v == 1.0 for v in scalars["train/loss_scale"].values())   # fp32: no scaling
    assert all(v > 0 for v in scalars["train/tokens_per_s"].values())


def test_a_daemon_job_writes_what_it_reports_to_redis(handle, device, tmp_path):
    _, vocab = tiny_vocabulary(tmp_path / "vocab")
    make_dataset(handle, "docs", vocab, shard_tokens=2048)
    job = submit(handle, "docs", steps=6, eval_every=3, eval_batches=1)
    daemon = Daemon(handle, DaemonConfig(checkpoint_root=tmp_path / "ckpt", lease_ttl_s=5,
                                         poll_ms=100, exit_when_idle=True,
                                         tensorboard_dir=tmp_path / "tb"), device=device)
    assert daemon.run() == 0
    queue = JobQueue(handle)
    assert queue.get(job).state == "done"
    scalars = read_scalars(tmp_path / "tb" / job)
    curve, evals = queue.loss_curve(job), queue.eval_curve(job)
    assert sorted(scalars["train/loss"]) == sorted(curve) == list(range(1, 7))
    for step, loss in curve.items():      # the event files hold float32
        assert scalars["train/loss"][step] == pytest.approx(loss, rel=1e-6)
    assert scalars[EVAL_LOSS] == pytest.approx(evals, rel=1e-6) and sorted(evals) == [3, 6]
    progress = {d["step"]: d for _, kind, d in queue.events(job) if kind == "progress"}
    for name in ("lr", "grad_norm", "tokens_per_s"):
        assert scalars[TRAIN_TAGS[name]] == pytest.approx(
            {step: d[name] for step, d in progress.items()}, rel=1e-6), name


def test_a_resumed_run_keeps_one_value_per_step(tmp_path):
    """The steps after a checkpoint are recomputed on resume: an earlier attempt's values at
    those steps are hidden (purge_step), the ones before stay."""
    class Step:
        def __init__(self, step, loss):
            self.step, self.loss, self.lr, self.grad_norm = step, loss, 1e-3, 1.0
            self.tokens_per_s, self.loss_scale = 100.0, 1.0

    first = ScalarLog(tmp_path / "run")
    for step in range(1, 11):
        first.step(Step(step, 10.0 + step))
    first.close()
    resumed = ScalarLog(tmp_path / "run", purge_step=5)     # from the checkpoint of step 4
    for step in range(5, 8):
        resumed.step(Step(step, 20.0 + step))
    resumed.step(Step(8, float("nan")))                     # non-finite: left out
    resumed.close()
    losses = read_scalars(tmp_path / "run")["train/loss"]
    assert losses == {1: 11.0, 2: 12.0, 3: 13.0, 4: 14.0, 5: 25.0, 6: 26.0, 7: 27.0}


def test_without_the_extra_tensorboard_flags_name_it(tmp_path):
    code = ("import sys; sys.modules['tensorboardX'] = None\n"
            "from istanbul.cli import main; raise SystemExit(main(sys.argv[1:]))")
    for argv in (["train", "--text", "x.py", "--vocab", "gpt2", "--steps", "1", "--tensorboard",
                  str(tmp_path)],
                 ["trainer", "--checkpoints", str(tmp_path / "ck"), "--data-dir",
                  str(tmp_path / "redis"), "--tensorboard", str(tmp_path)]):
        done = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, text=True,
                              capture_output=True, env=istanbul_env(), timeout=120)
        assert done.returncode == 1, done.stderr
        assert ("--tensorboard (TensorBoard event files) needs tensorboardX, an optional extra "
                "that is not installed: pip install 'istanbul[tensorboard]'") in done.stderr
