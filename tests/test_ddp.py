"""Data parallel training over real rank processes: Gloo on loopback, each rank its own wgpu
device (lavapipe here: every rank on the software adapter), the real tiny model.

Tolerances, and why: two ranks each sum b = B/2 rows' token losses and gradients, and the
all-reduce adds the two halves; one rank sums all B rows in one accumulation. The terms are
the same, their order is not, so the results differ by fp32 rounding: relative 1e-7 per
addition, up to ~1e-6 of the largest gradient over a few hundred terms (we allow 1e-5 of
max |g|). AdamW divides by sqrt(v), so a gradient element near zero turns a rounding
difference into a visible but lr-bounded weight difference: after 3 steps at lr 1e-3 we allow
2e-5 absolute (measured: 2.4e-6). The ranks among themselves agree to the bit (sha256).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from trainer_svc.training.trainer import TrainConfig, Trainer

from .model_helpers import tiny_config

pytest.importorskip("torch.distributed")


@pytest.fixture(scope="module")
def device():
    from istanbul.shaders import default_device
    return default_device()


def _adapters(world: int = 2) -> list[str]:
    """One GPU per rank where the machine has enough, else every rank on the tests' device
    (lavapipe on CI; the one GPU of a one-GPU machine)."""
    from istanbul_errors import UserFacingError
    from istanbul.shaders import default_device
    from trainer_svc.distributed.launch import rank_adapters
    try:
        return rank_adapters(world)
    except UserFacingError:
        return [str(default_device().info.index)] * world


def _launch(world: int = 2):
    from trainer_svc.distributed.launch import launch_group
    return launch_group(world, _adapters(world))


def test_two_ranks_give_the_loss_gradients_and_weights_of_one_rank_on_the_full_batch(device):
    from trainer_svc.distributed.data_parallel import DataParallelTrainer, rank_train_config
    cfg = tiny_config()
    tc = TrainConfig(batch=4, seq=32, grad_accum=2, precision="fp32", warmup=0, lr=1e-3)
    single = Trainer(cfg, tc, device)
    initial = single.parameters()
    group, ranks = _launch(2)
    # small buckets: several all-reduces per step, the last one ragged
    dp = DataParallelTrainer(Trainer(cfg, rank_train_config(tc, 2), device), group, tc,
                             on_close=ranks.stop, bucket_bytes=100_000)
    try:
        assert len(dp.sync.buckets(dp.layout.total)) >= 3
        assert dp.layout.total % dp.sync.bucket_elements
        assert np.array_equal(dp.parameters(), initial)
        rng = np.random.default_rng(7)
        seen = set()
        for step in range(3):
            batch = rng.integers(0, cfg.vocab_size, (2, 4, 33))
            full_loss, full_grads = single.loss_and_gradients(batch)
            one, two = single.step(batch), dp.step(batch)
            assert two.step == one.step == step + 1 and not two.skipped
            assert two.tokens == one.tokens == 2 * 4 * 32
            assert two.loss == pytest.approx(one.loss, rel=1e-6)
            assert one.loss == pytest.approx(full_loss, rel=1e-12)
            # the averaged gradients are still in rank 0's gradient buffer after the update
            model = dp.local.model
            averaged = dp.layout.unpack(model.dev.download(model.grads))
            scale = max(float(np.abs(g).max()) for g in full_grads.values())
            for name, g in full_grads.items():
                np.testing.assert_allclose(averaged[name], g, rtol=0, atol=1e-5 * scale,
                                           err_msg=name)
            np.testing.assert_allclose(dp.parameters(), single.parameters(), rtol=0, atol=2e-5)
            hashes = dp.rank_hashes()
            assert len(hashes) == 2 and len(set(hashes)) == 1
            seen.add(hashes[0])
        assert len(seen) == 3                      # the weights moved every step
        assert not np.array_equal(dp.parameters(), initial)
        assert dp.tokens_seen == 3 * 256
        # the held-out loss: the mean of the ranks' halves is the whole batch's
        held = rng.integers(0, cfg.vocab_size, (4, 33))
        assert dp.evaluate(held) == pytest.approx(single.evaluate(held), rel=1e-6)
    finally:
        dp.close()
        single.close()
    assert all(code == 0 for _, code in ranks.dead()) and len(ranks.dead()) == 1


def test_the_hash_check_catches_ranks_whose_weights_differ(device):
    from trainer_svc.distributed.data_parallel import DataParallelTrainer, rank_train_config
    from trainer_svc.distributed.group import RankFailed
    cfg = tiny_config()
    tc = TrainConfig(batch=2, seq=16, precision="fp32", warmup=0)
    group, ranks = _launch(2)
    dp = DataParallelTrainer(Trainer(cfg, rank_train_config(tc, 2), device), group, tc,
                             on_close=ranks.stop)
    try:
        params = dp.parameters()
        params[5] += 1e-3                           # rank 0 alone
        dp.local.model.set_parameters(params)
        with pytest.raises(RankFailed, match="weights differ"):
            dp.rank_hashes()
        with pytest.raises(RankFailed, match="broken"):   # no more commands to a broken group
            dp.step(np.zeros((2, 17), np.uint32))
    finally:
        dp.close()


def test_a_batch_that_does_not_split_over_the_gpus_is_refused():
    from trainer_svc.distributed.data_parallel import rank_train_config
    from trainer_svc.jobs.queue import JobSpec, JobSpecError
    with pytest.raises(JobSpecError, match="batch 6 does not divide by gpus 4"):
        JobSpec.parse({"dataset": "d", "steps": 10, "batch": 6, "gpus": 4})
    with pytest.raises(ValueError, match="multiple of the number of GPUs"):
        rank_train_config(TrainConfig(batch=6), 4)
    assert JobSpec.parse({"dataset": "d", "steps": 10, "batch": 8, "gpus": 4}).gpus == 4


def test_a_failed_collective_waits_briefly_for_the_dead_peers_exit_status(tmp_path):
    """A killed peer's sockets close before its exit status is readable: the description of
    the failure waits for it instead of saying nothing about the dead rank."""
    import subprocess
    from trainer_svc.distributed.launch import RankProcesses
    log = tmp_path / "rank1.log"
    log.write_text("opening the device\n")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5); exit(3)"])
    ranks = RankProcesses([proc], [log], None)
    try:
        assert ranks.describe() == ""                      # still running
        start = time.monotonic()
        text = ranks.describe_failure(grace_s=30)
        assert text.startswith("rank 1 process exit code 3") and "opening the device" in text
        assert time.monotonic() - start < 10
        assert ranks.describe_failure(grace_s=30) == text  # already dead: no wait
    finally:
        ranks.stop(timeout=5)


def test_a_rank_that_cannot_start_fails_the_launch_with_its_own_error():
    from trainer_svc.distributed.group import RankFailed
    from trainer_svc.distributed.launch import launch_group
    start = time.monotonic()
    # this worker's problem, not the job's: retried (maybe by a trainer that has the GPU)
    with pytest.raises(RankFailed, match="rank 1 could not start: NoAdapterError.*999"):
        launch_group(2, ["0", "999"])
    assert time.monotonic() - start < 60


def test_a_ranks_bad_input_error_fails_the_job_and_others_are_retried():
    from trainer_svc.distributed.group import RankFailed, RankGroup, report_error
    from trainer_svc.jobs.failures import JobInputError
    group = RankGroup.create(0, 1, store=RankGroup.host_store(1))
    try:
        assert isinstance(group.failure("all-reduce failed"), RankFailed)
        report_error(group.store, 0, JobInputError("model does not fit: lower the batch"))
        failure = group.failure("all-reduce failed")
        assert isinstance(failure, JobInputError)
        assert "rank 0 failed: JobInputError: model does not fit" in str(failure)
    finally:
        group.close()


# ---- the daemon: one job over a group of two ranks ---------------------------------------

def _worker_pids(parent: int) -> list[int]:
    """Rank processes (python -m trainer_svc.distributed.worker) started by `parent`."""
    found = []
    for task in Path(f"/proc/{parent}/task").iterdir():
        try:   # a thread may end between the listing and the read
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in children:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"trainer_svc.distributed.worker" in cmd:
                found.append(int(pid))
    return found


def _exited(pid: int) -> bool:
    """The process is gone or a zombie (exited, not yet reaped by its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _tensors_equal(a: Path, b: Path) -> bool:
    from safetensors.numpy import load_file
    x, y = load_file(str(a)), load_file(str(b))
    return x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)


@pytest.mark.slow
@pytest.mark.redis
def test_daemon_group_survives_a_dead_rank_and_restarts_from_the_last_checkpoint(
        redis_server, tmp_path):
    from trainer_svc.jobs.queue import JobQueue
    from trainer_svc.jobs.redis_conn import connect
    from .daemon_helpers import DaemonProcess, make_dataset, submit, tiny_vocabulary, wait_for

    handle = connect(redis_server.url)
    handle.text.flushdb()
    vocab_path, vocab = tiny_vocabulary(tmp_path / "vocab")
    make_dataset(handle, "text", vocab, vocab_path=vocab_path)
    queue = JobQueue(handle)
    spec = dict(steps=40, checkpoint_every=10, gpus=2, precision="fp32")
    root = tmp_path / "ckpt"
    daemon = DaemonProcess(redis_server.url, root, tmp_path / "daemon.log", "--gpus", "2",
                           "--adapters", ",".join(_adapters()), "--lease-ttl", "5")
    try:
        clean = submit(handle, "text", job_id="clean", **spec)
        wait_for(lambda: (queue.get(clean).state == "done"), 300, what="the clean job")
        killed = submit(handle, "text", job_id="killed", **spec)
        wait_for(lambda: queue.get(killed).get_int("step") >= 13, 300,
                 what="the second job to pass step 13")
        pids = _worker_pids(daemon.pid)
        assert len(pids) == 1, daemon.output()
        os.kill(pids[0], signal.SIGKILL)           # rank 1 dies mid-run
        wait_for(lambda: queue.get(killed).state in ("done", "failed"), 300,
                 what="the killed job to end")
        rec = queue.get(killed)
        assert rec.state == "done" and rec.get_int("step") == 40, (rec.raw, daemon.output())
        assert rec.get_int("failures") == 0 and rec.get_int("attempts") == 2
        assert queue.dead_letters() == []
        events = [(k, d) for _, k, d in queue.events(killed)]
        requeued = [d for k, d in events if k == "requeued"]
        assert len(requeued) == 1 and "rank 1 process killed by SIGKILL" in \
            requeued[0]["reason"], requeued
        resumed = [d for k, d in events if k == "resumed"]
        assert len(resumed) == 1 and resumed[0]["step"] in (10, 20), resumed
        # the restarted group recomputed the steps after its checkpoint exactly: the final
        # weights and moments are the uninterrupted job's, bit for bit
        for name in ("model.safetensors", "optimizer.safetensors"):
            assert _tensors_equal(root / "killed" / "latest" / name,
                                  root / "clean" / "latest" / name), name
        curve = queue.loss_curve(killed)
        assert sorted(curve) == list(range(1, 41))
        # every rank process of both jobs reaped: the daemon records the outcome first and
        # then closes the run, so the last rank may still be exiting when "done" is visible
        wait_for(lambda: _worker_pids(daemon.pid) == [], 60,
                 what="the rank processes to be reaped")
    finally:
        daemon.stop()
        handle.close()


@pytest.mark.slow
@pytest.mark.redis
def test_a_group_job_waits_for_a_trainer_with_enough_gpus_and_is_taken_over_when_rank_0_dies(
        redis_server, tmp_path):
    from trainer_svc.jobs.queue import JobQueue
    from trainer_svc.jobs.redis_conn import connect
    from .daemon_helpers import DaemonProcess, make_dataset, submit, tiny_vocabulary, wait_for

    handle = connect(redis_server.url)
    handle.text.flushdb()
    vocab_path, vocab = tiny_vocabulary(tmp_path / "vocab")
    make_dataset(handle, "text", vocab, vocab_path=vocab_path)
    queue = JobQueue(handle)
    root = tmp_path / "ckpt"
    started = []

    def daemon(*args):
        d = DaemonProcess(redis_server.url, root, tmp_path / f"daemon{len(started)}.log",
                          "--lease-ttl", "2", *args)
        started.append(d)
        return d

    def events(kind):
        return [d for _, k, d in queue.events(job) if k == kind]

    try:
        job = submit(handle, "text", job_id="group", steps=40, checkpoint_every=10, gpus=2)
        small = daemon()                                   # one GPU: hands the job back
        wait_for(lambda: events("requeued"), 120, what="the one-GPU trainer to re-queue")
        assert "asks for 2 GPUs" in events("requeued")[0]["reason"]
        small.signal(signal.SIGTERM)
        assert small.wait(60) == 0, small.output()
        assert queue.get(job).get_int("failures") == 0

        first = daemon("--gpus", "2", "--adapters", ",".join(_adapters()))
        wait_for(lambda: queue.get(job).get_int("step") >= 13, 300, what="step 13")
        ranks = _worker_pids(first.pid)
        assert len(ranks) == 1
        first.signal(signal.SIGKILL)                       # rank 0 dies
        assert first.wait(30) == -signal.SIGKILL
        # its rank process notices (its stdin pipe closes) and exits: no orphan holds a GPU
        wait_for(lambda: _exited(ranks[0]), 30, what="the orphaned rank to exit")

        second = daemon("--gpus", "2", "--adapters", ",".join(_adapters()),
                        "--exit-when-idle")
        assert second.wait(300) == 0, second.output()
        rec = queue.get(job)
        assert rec.state == "done" and rec.get_int("step") == 40, rec.raw
        assert rec.get_int("failures") == 0
        assert len(events("takeover")) == 1 and len(events("resumed")) == 1
        assert sorted(queue.loss_curve(job)) == list(range(1, 41))
        assert queue.dead_letters() == []
    finally:
        for d in started:
            d.stop()
        handle.close()


# ---- the command line ---------------------------------------------------------------------

def test_gpus_options_are_checked_before_anything_starts(tmp_path):
    from istanbul.cli import build_parser
    from trainer_svc.cli_jobs import build_spec_dict
    from trainer_svc.jobs.queue import JobSpec, JobSpecError
    from .test_cli import istanbul, without
    submit = build_parser().parse_args(["submit", "--dataset", "d", "--steps", "9",
                                        "--batch", "8", "--gpus", "4"])
    assert JobSpec.parse(build_spec_dict(submit)).gpus == 4
    odd = build_parser().parse_args(["submit", "--dataset", "d", "--steps", "9", "--batch",
                                     "8", "--gpus", "3"])
    with pytest.raises(JobSpecError, match="batch 8 does not divide by gpus 3"):
        JobSpec.parse(build_spec_dict(odd))

    ckpt = str(tmp_path / "ckpt")
    done = istanbul(tmp_path, "trainer", "--checkpoints", ckpt, "--gpus", "2", "--adapter", "0")
    assert done.returncode != 0 and "use --adapters A,B,..." in done.stderr, done.stderr
    done = istanbul(tmp_path, "trainer", "--checkpoints", ckpt, "--adapters", "0,1")
    assert done.returncode != 0 and "--adapters is for --gpus N > 1" in done.stderr
    done = istanbul(tmp_path, "trainer", "--checkpoints", ckpt, "--gpus", "2", "--adapters",
                    "0")
    assert done.returncode != 0 and "names 1 adapter(s) for 2 GPUs" in done.stderr
    done = istanbul(tmp_path, python=without("torch", "trainer", "--checkpoints", ckpt,
                                             "--gpus", "2"))
    assert done.returncode != 0 and "pip install 'istanbul[ddp]'" in done.stderr, done.stderr
