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

from trainer_svc.checkpoint import CheckpointManager, verify_checkpoint
from trainer_svc.jobs import JobQueue
from trainer_svc.redis_conn import connect

from .daemon_helpers import (DaemonProcess, debris_in, job_state, make_dataset, submit,
                             tiny_vocabulary, wait_for)

pytestmark = pytest.mark.slow

SEED = int(os.environ.get("ISTANBUL_TEST_CHAOS_SEED", "18"))   # another seed: another plan
STEPS, EVERY, KEEP = 36, 4, 2
FAULT_POINTS = ("files_written", "manifest_written", "renamed")


@pytest.fixture
def handle(redis_server, tmp_path):
    vocab_path, vocab = tiny_vocabulary(tmp_path / "vocab")
    h = connect(redis_server.url)
    h.text.flushdb()
    make_dataset(h, "text", vocab, vocab_path=vocab_path, shard_tokens=4096)
    yield h
    h.close()


def chaos_plan(rng: random.Random) -> list[tuple[str, int]]:
    """The lives of the daemons, in order: ("fault:POINT", step) kills inside the checkpoint
    of `step` at POINT; ("kill", step) is a kill -9 from outside once the job passed `step`
    (plus a random delay); ("redis", step) restarts Redis once the job passed `step`, then
    kills that daemon a little later."""
    checkpoints = list(range(EVERY, STEPS, EVERY))
    a, b, c = sorted(rng.sample(checkpoints[1:-1], 3))
    return [(f"fault:{rng.choice(FAULT_POINTS)}", a),
            ("kill", a + rng.randint(1, EVERY - 1)),
            ("redis", b - EVERY + 1),          # then killed before checkpoint b
            (f"fault:{rng.choice(FAULT_POINTS)}", b),
            ("kill", c + rng.randint(0, EVERY - 1)),
            (f"fault:{rng.choice(FAULT_POINTS)}", STEPS)]      # inside the final checkpoint


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
    plan = chaos_plan(rng)
    print(f"chaos plan (seed {SEED}): {plan}")
    for kind, at in plan:
        if kind.startswith("fault:"):
            d = daemon(fault=f"{kind[6:]}@{at}")
            assert d.wait(120) == -signal.SIGKILL, d.output()
            assert f"killing this process at {kind[6:]} of step {at}" in d.output()
            continue
        d = daemon()
        wait_for(lambda: step_of(d) >= at, 120, interval=0.05, what=f"step {at} before {kind}")
        if kind == "redis":
            redis_server.restart(down_s=rng.uniform(0.2, 0.8), kill=True)
            # the daemon waits Redis out (or loses its lease and takes the job back)
            wait_for(lambda: step_of(d) >= at + 2, 120, interval=0.05,
                     what="training after the Redis restart")
        time.sleep(rng.uniform(0.0, 0.15))
        d.signal(signal.SIGKILL)
        assert d.wait(60) == -signal.SIGKILL
    last = daemon("--exit-when-idle")
    assert last.wait(120) == 0, last.output()
    assert time.monotonic() - started < 150

    rec = queue.get("chaos")
    assert rec.state == "done" and rec.get_int("step") == STEPS, rec.raw
    assert rec.get_int("failures") == 0                  # every life made progress
    assert rec.get_int("attempts") >= len(plan) + 1
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
