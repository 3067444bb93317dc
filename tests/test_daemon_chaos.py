"""Chaos: one job through real daemon processes that are killed (SIGKILL) at seeded random
moments, some of them inside checkpoint writes, with a Redis restart (kill -9) in the middle.
The job must end done at its full step count with the loss curve of an uninterrupted run of
the same spec, final weights and optimizer state bit-identical to it, and no debris left in
its checkpoint folder. Bounded: a few tiny-model steps per life, about a minute on lavapipe.
"""

from __future__ import annotations

import os
import random
import signal
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from trainer_svc.training.checkpoint import CheckpointManager, verify_checkpoint
from trainer_svc.jobs.queue import JobQueue
from trainer_svc.jobs.redis_conn import connect

from .daemon_helpers import (DaemonProcess, debris_in, job_state, make_dataset, submit,
                             tiny_vocabulary, wait_for)

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("ISTANBUL_TEST_CHAOS_SEED", "18"))   # another seed: another plan
STEPS, EVERY, KEEP = 48, 4, 2
FAULT_POINTS = ("files_written", "manifest_written", "renamed")


@pytest.fixture
def handle(redis_server, tmp_path):
    vocab_path, vocab = tiny_vocabulary(tmp_path / "vocab")
    h = connect(redis_server.url)
    h.text.flushdb()
    make_dataset(h, "text", vocab, vocab_path=vocab_path, shard_tokens=4096)
    yield h
    h.close()


# The lives of the daemons, in order. Each kills its daemon at a moment drawn when the life
# starts, so that it comes after everything the lives before it did: "fault" dies inside the
# checkpoint write of one of the next two checkpoints (at a random point of the write),
# "kill" is a kill -9 from outside a few steps past the furthest step reached so far (plus a
# random delay), "redis" restarts Redis (kill -9) a few steps further and then kills its
# daemon; the last fault is inside the final checkpoint.
LIVES = ("fault", "kill", "redis", "fault", "kill", "final")


def test_kill_9_anywhere_and_a_redis_restart_change_nothing(handle, redis_server, tmp_path):
    queue = JobQueue(handle)
    root = tmp_path / "ckpt"
    lives: list[DaemonProcess] = []

    def daemon(*args: str, fault: str | None = None) -> DaemonProcess:
        env = {"ISTANBUL_TEST_CHECKPOINT_FAULT": fault} if fault else None
        lives.append(DaemonProcess(redis_server.url, root, tmp_path / f"daemon{len(lives)}.log",
                                   "--lease-ttl", "1.5", "--max-failures", "2", *args,
                                   env=env))
        return lives[-1]

    try:
        run_the_chaos(queue, redis_server, root, daemon)
    finally:
        for d in lives:
            d.stop()


def run_the_chaos(queue: JobQueue, redis_server, root, daemon) -> None:
    def step_of(d: DaemonProcess) -> int:
        """The job's step while `d` owns it (0 before: the hash still shows the last life's)."""
        state = job_state(queue, "chaos")
        return int(state.get("step") or 0) if f":{d.pid}:" in state.get("owner", "") else 0

    spec = dict(steps=STEPS, checkpoint_every=EVERY, keep_last=KEEP, eval_every=EVERY)
    submit(queue.handle, "text", job_id="calm", **spec)
    calm = daemon("--exit-when-idle")
    assert calm.wait(120) == 0, calm.output()
    submit(queue.handle, "text", job_id="chaos", **spec)

    rng = random.Random(SEED)
    started = time.monotonic()
    happened = []
    for life in LIVES:
        high = int(job_state(queue, "chaos").get("high_step") or 0)
        if life in ("fault", "final"):
            landed = [s for s, _ in CheckpointManager(root / "chaos").checkpoints()]
            resume = max(landed, default=0)
            at = STEPS if life == "final" else resume + EVERY * rng.randint(1, 2)
            point = rng.choice(FAULT_POINTS)
            happened.append(f"kill at {point} of checkpoint {at}")
            d = daemon(fault=f"{point}@{at}")
            assert d.wait(120) == -signal.SIGKILL, d.output()
            assert f"killing this process at {point} of step {at}" in d.output()
            continue
        at = high + rng.randint(1, EVERY)
        d = daemon()
        wait_for(lambda: step_of(d) >= at, 120, interval=0.02, what=f"step {at} ({life})")
        if life == "redis":
            happened.append(f"Redis kill -9 at step {at}")
            redis_server.restart(down_s=rng.uniform(0.2, 0.8), kill=True)
            # the daemon waits Redis out (or loses its lease and takes the job back)
            at += 2
            wait_for(lambda: step_of(d) >= at, 120, interval=0.02,
                     what="training after the Redis restart")
        time.sleep(rng.uniform(0.0, 0.1))
        d.signal(signal.SIGKILL)
        assert d.wait(60) == -signal.SIGKILL
        happened.append(f"kill -9 past step {at}")
    print(f"chaos (seed {SEED}): {'; '.join(happened)}")
    last = daemon("--exit-when-idle")
    assert last.wait(120) == 0, last.output()
    assert time.monotonic() - started < 180

    rec = queue.get("chaos")
    assert rec.state == "done" and rec.get_int("step") == STEPS, rec.raw
    assert rec.get_int("failures") == 0                  # every life made progress
    assert rec.get_int("attempts") >= len(LIVES) + 1
    calm_curve, chaos_curve = queue.loss_curve("calm"), queue.loss_curve("chaos")
    assert sorted(chaos_curve) == list(range(1, STEPS + 1))
    assert chaos_curve == calm_curve                     # exactly, step by step
    assert queue.get("chaos").raw["eval_loss"] == queue.get("calm").raw["eval_loss"]

    final = {}
    for job in ("calm", "chaos"):
        path = root / job / f"step_{STEPS:08d}"
        verify_checkpoint(path)
        final[job] = {**load_file(str(path / "model.safetensors")),
                      **load_file(str(path / "optimizer.safetensors"))}
        assert debris_in(root / job) == []
        steps = [s for s, _ in CheckpointManager(root / job).checkpoints()]
        assert steps == [STEPS - EVERY, STEPS]            # retention: keep_last only
        assert sorted(p.name for p in (root / job).iterdir()) == \
            sorted(["latest", "vocab", *(f"step_{s:08d}" for s in steps)])
    assert final["calm"].keys() == final["chaos"].keys()
    for name, value in final["calm"].items():
        assert np.array_equal(value, final["chaos"][name]), name   # bit for bit
