"""The core promise, with real daemon processes (`python -m trainer_svc`), a real Redis server
and the real tiny model: a job is never lost when its worker is killed, never runs twice at
once, and no step is skipped or duplicated across a takeover (steps after the last checkpoint
are recomputed identically)."""

from __future__ import annotations

import math
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from trainer_svc.training.checkpoint import verify_checkpoint
from trainer_svc.jobs.queue import JobQueue
from trainer_svc.jobs.redis_conn import connect

from .daemon_helpers import (DaemonProcess, debris_in, make_dataset, submit, tiny_vocabulary,
                             wait_for)
from .redis_helpers import free_port

pytestmark = pytest.mark.slow

TTL = "2"   # lease seconds: a dead worker's job is taken over within ~2 TTL


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return tiny_vocabulary(tmp_path_factory.mktemp("vocab"))


@pytest.fixture
def handle(redis_server, vocab):
    h = connect(redis_server.url)
    h.text.flushdb()
    make_dataset(h, "text", vocab[1], vocab_path=vocab[0], shard_tokens=4096)
    yield h
    h.close()


@pytest.fixture
def daemons(redis_server, tmp_path):
    started: list[DaemonProcess] = []

    def start(*args: str, ttl: str = TTL, env: dict | None = None) -> DaemonProcess:
        d = DaemonProcess(redis_server.url, tmp_path / "ckpt",
                          tmp_path / f"daemon{len(started)}.log", "--lease-ttl", ttl, *args,
                          env=env)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def progress_by_attempt(queue: JobQueue, job: str) -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = {}
    for _, kind, data in queue.events(job):
        if kind == "progress":
            steps = out.setdefault(data["attempt"], {})
            assert data["step"] not in steps, f"attempt {data['attempt']} repeated a step"
            steps[data["step"]] = data["loss"]
    return out


def step_of(queue: JobQueue, job: str) -> int:
    rec = queue.get(job)
    return rec.get_int("step") if rec else 0


def test_kill_9_mid_job_second_daemon_takes_over_without_skipping_or_duplicating(
        handle, daemons, tmp_path):
    queue = JobQueue(handle)
    job = submit(handle, "text", job_id="killed", steps=40, checkpoint_every=10)
    first = daemons()
    wait_for(lambda: step_of(queue, job) >= 13, 240, what="the first daemon to pass step 13")
    first.signal(signal.SIGKILL)
    assert first.wait(30) == -signal.SIGKILL
    killed_at = step_of(queue, job)
    assert queue.get(job).state == "running"             # nobody has told Redis anything

    second = daemons("--exit-when-idle")
    assert second.wait(300) == 0, second.output()
    rec = queue.get(job)
    assert rec.state == "done" and rec.get_int("step") == 40, rec.raw
    assert rec.get_int("attempts") == 2
    assert rec.get_int("failures") == 0        # the killed worker had made progress

    runs = progress_by_attempt(queue, job)
    first_steps, second_steps = runs[1], runs[2]
    resumed = [d for _, k, d in queue.events(job) if k == "resumed"]
    assert len(resumed) == 1
    checkpoint_step = resumed[0]["step"]
    # The newest checkpoint the first daemon wrote (it may have written one more after its
    # last progress reached Redis).
    assert checkpoint_step % 10 == 0 and 10 <= 10 * (killed_at // 10) <= checkpoint_step \
        <= killed_at + 1
    assert Path(resumed[0]["checkpoint"]).name == f"step_{checkpoint_step:08d}"
    # The second run starts right after the checkpoint and goes to the end ...
    assert sorted(second_steps) == list(range(checkpoint_step + 1, 41))
    # ... together the runs cover every step; none of the first run's steps is missing.
    assert sorted(first_steps) == list(range(1, max(first_steps) + 1))
    assert max(first_steps) >= killed_at
    # Steps after the checkpoint were recomputed identically (same data, same RNG): the loss
    # curve continues as if nothing had happened.
    overlap = sorted(set(first_steps) & set(second_steps))
    assert overlap == list(range(checkpoint_step + 1, max(first_steps) + 1))
    assert overlap or killed_at % 10 == 0
    for step in overlap:
        assert math.isclose(first_steps[step], second_steps[step], rel_tol=1e-5), step
    curve = queue.loss_curve(job)
    assert sorted(curve) == list(range(1, 41))
    assert all(math.isfinite(v) for v in curve.values())
    early, late = sum(curve[s] for s in range(1, 6)), sum(curve[s] for s in range(36, 41))
    assert late < early                                  # it learned something
    kinds = [k for _, k, _ in queue.events(job)]
    assert kinds.count("takeover") == 1 and kinds[-1] == "done"
    ckpt_dir = tmp_path / "ckpt" / job
    assert (ckpt_dir / "latest").resolve().name == "step_00000040"
    verify_checkpoint(ckpt_dir / "step_00000040")


def test_sigterm_checkpoints_and_requeues_then_another_daemon_continues(handle, daemons):
    queue = JobQueue(handle)
    job = submit(handle, "text", job_id="termed", steps=30, checkpoint_every=100)
    first = daemons()
    wait_for(lambda: step_of(queue, job) >= 6, 240, what="step 6")
    first.signal(signal.SIGTERM)
    assert first.wait(60) == 0, first.output()
    rec = queue.get(job)
    stopped_at = rec.get_int("step")
    assert rec.state == "queued" and rec.raw["checkpoint"].endswith(f"step_{stopped_at:08d}")
    assert rec.get_int("failures") == 0

    second = daemons("--exit-when-idle")
    assert second.wait(300) == 0, second.output()
    rec = queue.get(job)
    assert rec.state == "done" and rec.get_int("step") == 30 and rec.get_int("failures") == 0
    runs = progress_by_attempt(queue, job)
    assert sorted(runs[1]) == list(range(1, stopped_at + 1))
    assert sorted(runs[2]) == list(range(stopped_at + 1, 31))   # nothing recomputed


def test_redis_restarts_mid_job_are_survived(handle, daemons, redis_server):
    queue = JobQueue(handle)
    job = submit(handle, "text", job_id="restarts", steps=40, checkpoint_every=5)
    ttl = 4.0   # renewed every 1.3 s, so a 1 s outage ends before the lease can expire
    daemon = daemons("--exit-when-idle", ttl=str(ttl))
    wait_for(lambda: step_of(queue, job) >= 5, 240, what="step 5")
    # A short restart (shorter than the lease): the daemon keeps training and catches up.
    redis_server.restart(down_s=1.0, kill=True)
    wait_for(lambda: step_of(queue, job) >= 12, 240, what="step 12 after the first restart")
    # A long outage (longer than the lease): the daemon must give the job up, then take it
    # back from its last checkpoint once Redis is back.
    redis_server.stop(kill=True)
    time.sleep(ttl * 2.5)
    redis_server.start()
    assert daemon.wait(300) == 0, daemon.output()
    rec = queue.get(job)
    assert rec.state == "done" and rec.get_int("step") == 40, rec.raw
    curve = queue.loss_curve(job)
    assert sorted(curve) == list(range(1, 41))
    runs = progress_by_attempt(queue, job)
    assert len(runs) == 2 and rec.get_int("attempts") == 2    # given up once, taken back once
    covered = set().union(*(set(r) for r in runs.values()))
    assert covered == set(range(1, 41))
    assert "lost the lease" in daemon.output()


def test_two_daemons_four_jobs_each_runs_exactly_once(handle, daemons, tmp_path):
    queue = JobQueue(handle)
    port = free_port()
    a = daemons("--metrics-port", str(port), "--metrics-host", "127.0.0.1")
    b = daemons()
    for d in (a, b):   # both polling before the jobs arrive, so both get some
        wait_for(lambda: "checkpoints in" in d.output(), 120, what="a daemon to start")
    jobs = [submit(handle, "text", job_id=f"job{k}", steps=8, checkpoint_every=4, seed=k,
                   grad_accum=1 + k % 2) for k in range(4)]
    scraped = wait_for(lambda: _scrape(port, "istanbul_trainer_steps_total"), 240,
                       what="metrics with steps")
    wait_for(lambda: all(queue.get(j).state == "done" for j in jobs), 300, what="all jobs done")
    for d in (a, b):
        d.signal(signal.SIGTERM)
        assert d.wait(60) == 0, d.output()
    owners = set()
    for job in jobs:
        rec = queue.get(job)
        assert rec.state == "done" and rec.get_int("attempts") == 1, rec.raw
        kinds = [k for _, k, _ in queue.events(job)]
        assert kinds.count("started") == 1 and kinds.count("takeover") == 0
        runs = progress_by_attempt(queue, job)
        assert list(runs) == [1] and sorted(runs[1]) == list(range(1, 9))
        owners.add(next(d["owner"] for _, k, d in queue.events(job) if k == "started"))
        assert sorted(p.name for p in (tmp_path / "ckpt" / job).glob("step_*")) == \
            ["step_00000004", "step_00000008"]
    assert len(owners) == 2, "both daemons should have taken jobs"
    assert queue.get("job1").get_int("tokens") == 8 * 2 * 4 * 32     # 2 micro-batches a step
    assert "istanbul_trainer_queue_depth" in scraped
    assert "istanbul_trainer_tokens_total" in scraped
    assert "istanbul_trainer_step_seconds_bucket" in scraped
    assert 'istanbul_trainer_jobs{state=' in scraped


def test_cancel_a_running_job_then_the_daemon_goes_on(handle, daemons, redis_server, capsys,
                                                      tmp_path):
    from istanbul.cli import main
    queue = JobQueue(handle)
    long_job = submit(handle, "text", job_id="long", steps=500, checkpoint_every=1000)
    daemon = daemons("--exit-when-idle")
    wait_for(lambda: step_of(queue, long_job) >= 3, 240, what="step 3")
    next_job = submit(handle, "text", job_id="next", steps=3)
    assert main(["cancel", long_job, "--wait", "--redis", redis_server.url]) == 0
    out = capsys.readouterr().out
    assert "cancel requested" in out and "long: cancelled" in out
    assert daemon.wait(300) == 0, daemon.output()
    rec = queue.get(long_job)
    stopped = rec.get_int("step")
    assert rec.state == "cancelled" and 3 <= stopped < 500
    assert Path(rec.raw["checkpoint"]).name == f"step_{stopped:08d}"   # progress kept
    verify_checkpoint(tmp_path / "ckpt" / long_job / f"step_{stopped:08d}")
    assert queue.get(next_job).state == "done"


def _scrape(port: int, needle: str) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(needle) and float(line.split()[-1]) > 0:
            return text
    return None


def test_idle_daemon_exits_on_sigterm_and_bad_redis_is_a_clear_error(redis_server, daemons,
                                                                    tmp_path):
    import subprocess
    import sys
    from .redis_helpers import REPO, istanbul_env
    idle = daemons()
    wait_for(lambda: "trainer " in idle.output() and "checkpoints in" in idle.output(), 120,
             what="the daemon to start")
    idle.signal(signal.SIGTERM)
    assert idle.wait(20) == 0
    assert "stopped after 0 job(s)" in idle.output()
    dead = f"redis://127.0.0.1:{free_port()}/0"
    out = subprocess.run([sys.executable, "-m", "trainer_svc", "--checkpoints",
                          str(tmp_path / "c"), "--redis", dead], cwd=REPO, env=istanbul_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "cannot reach Redis at redis://127.0.0.1" in out.stderr


def crash_until_settled(daemons, fault: str, limit: int = 8) -> list[int]:
    """Daemons one after another (each killing itself at the checkpoint fault points in
    `fault`) until one exits by itself; their exit codes."""
    codes = []
    for _ in range(limit):
        # a 3 s lease: with 1 s, CI's two busy cores once starved a worker's heartbeat thread
        # past its lease; the worker stopped (fenced, as it must) and took the job over itself,
        # an attempt more than the crashes this test counts
        d = daemons("--exit-when-idle", "--max-failures", "2", ttl="3",
                    env={"ISTANBUL_TEST_CHECKPOINT_FAULT": fault})
        codes.append(d.wait(300))
        if codes[-1] != -signal.SIGKILL:
            assert codes[-1] == 0, d.output()
            return codes
    raise AssertionError(f"still crashing after {limit} daemons: {codes}")


def test_crashes_after_progress_never_count_but_a_crash_loop_is_dead_lettered(handle, daemons,
                                                                              tmp_path):
    queue = JobQueue(handle)
    # Each worker dies right after its checkpoint landed (3, 6, 9), having made progress:
    # with --max-failures 2 the job still finishes, and no crash is counted.
    job = submit(handle, "text", job_id="crashy", steps=12, checkpoint_every=3)
    codes = crash_until_settled(daemons, "renamed@3,renamed@6,renamed@9")
    assert codes == [-signal.SIGKILL] * 3 + [0]
    rec = queue.get(job)
    assert rec.state == "done" and rec.get_int("step") == 12, rec.raw
    assert rec.get_int("failures") == 0 and rec.get_int("attempts") == 4
    takeovers = [d for _, k, d in queue.events(job) if k == "takeover"]
    assert [d["failures"] for d in takeovers] == [0, 0, 0]
    assert all("not counted as a failure" in d["reason"] for d in takeovers)
    assert sorted(queue.loss_curve(job)) == list(range(1, 13))
    assert debris_in(tmp_path / "ckpt" / job) == []

    # Every worker dies writing the same checkpoint and gets no further than the one before
    # it: after the first crash that is a failure streak, dead-lettered at the limit, with
    # the same count in the job, its dead letter and the message.
    job = submit(handle, "text", job_id="loop", steps=6, checkpoint_every=3)
    codes = crash_until_settled(daemons, "files_written@3")
    assert codes == [-signal.SIGKILL] * 3 + [0]
    rec = queue.get(job)
    assert rec.state == "failed" and rec.get_int("failures") == 2, rec.raw
    assert "stopped 2 times in a row without progress (limit 2)" in rec.raw["error"]
    [dead] = [d for d in queue.dead_letters() if d["job"] == job]
    assert dead["failures"] == "2" and dead["error"] == rec.raw["error"]
    assert [d["failures"] for _, k, d in queue.events(job) if k == "takeover"] == [0, 1, 2]
    assert debris_in(tmp_path / "ckpt" / job) == []   # even the attempt that dead-letters it
