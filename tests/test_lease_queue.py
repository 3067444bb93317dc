"""Leases, the job queue and its fenced writes, against a real Redis server."""

from __future__ import annotations

import json
import time

import pytest

from trainer_svc.jobs import keys
from trainer_svc.jobs.queue import JobQueue, JobSpec, JobSpecError
from trainer_svc.jobs.lease import Heartbeat, Lease
from trainer_svc.jobs.redis_conn import connect

from .redis_helpers import RedisServer

pytestmark = pytest.mark.redis   # also run against $ISTANBUL_TEST_REDIS=system


def spec(**kw) -> JobSpec:
    return JobSpec(**{"dataset": "d", "model": "tiny", "steps": 10, **kw})


# ---- leases -------------------------------------------------------------------------------------

def test_lease_is_exclusive_and_only_its_owner_renews_or_releases(handle):
    a = Lease(handle, "j1", "worker-a", ttl_s=5)
    b = Lease(handle, "j1", "worker-b", ttl_s=5)
    assert a.acquire()
    assert not b.acquire()
    assert not b.renew() and not b.release()
    assert a.holder() == "worker-a"
    assert a.renew()
    assert a.release()
    assert a.holder() is None
    assert b.acquire() and b.holder() == "worker-b"


def test_expired_lease_can_be_taken_and_the_old_owner_notices(handle):
    a = Lease(handle, "j2", "worker-a", ttl_s=0.3)
    assert a.acquire()
    time.sleep(0.45)
    b = Lease(handle, "j2", "worker-b", ttl_s=5)
    assert b.acquire()
    beat = Heartbeat(a)
    assert not beat.beat()
    assert beat.lost.is_set() and "worker-b" in beat.lost_reason
    assert not a.release() and b.holder() == "worker-b"  # the late owner deletes nothing


def test_heartbeat_keeps_a_lease_alive_past_its_ttl(handle):
    a = Lease(handle, "j3", "worker-a", ttl_s=0.6)
    assert a.acquire()
    calls = []
    beat = Heartbeat(a, on_beat=[lambda: calls.append(1)]).start()
    try:
        time.sleep(1.5)
        assert not beat.lost.is_set()
        assert handle.text.pttl(keys.lease("j3")) > 0
        assert len(calls) >= 3
    finally:
        beat.stop()
    assert not Lease(handle, "j3", "worker-b", ttl_s=5).acquire()


def test_heartbeat_declares_the_lease_lost_when_redis_stays_away(tmp_path):
    srv = RedisServer(tmp_path / "r").start()
    try:
        h = connect(srv.url)
        lease = Lease(h, "j4", "worker-a", ttl_s=1.0)
        assert lease.acquire()
        beat = Heartbeat(lease, interval_s=0.1).start()
        srv.stop(kill=True)
        assert beat.lost.wait(10), "heartbeat never gave the lease up"
        assert "could not reach Redis" in beat.lost_reason
        beat.stop()
    finally:
        srv.stop()


# ---- the queue ----------------------------------------------------------------------------------

def test_submit_read_and_fenced_finish(handle):
    q = JobQueue(handle)
    job = q.submit(spec(), job_id="job-a")
    rec = q.get(job)
    assert rec.state == "queued" and rec.get_int("total_steps") == 10
    assert json.loads(rec.spec_json)["dataset"] == "d"
    [(entry, job_id)] = q.read_new("c1", block_ms=100)
    assert job_id == "job-a" and rec.raw["entry"] == entry
    assert q.read_new("c2", block_ms=50) == []          # delivered once

    # Without the lease nothing is written.
    assert q.fenced(job, "c1", hset={"state": "running"}) == 0
    assert q.get(job).state == "queued"
    lease = Lease(handle, job, "c1", ttl_s=10)
    assert lease.acquire()
    assert q.fenced(job, "c1", hset={"state": "running", "step": 3}, curve=[1, 2.5, 2, 2.25],
                    events=[["progress", json.dumps({"step": 2})]]) == 1
    assert q.get(job).state == "running" and q.loss_curve(job) == {1: 2.5, 2: 2.25}
    assert q.fenced(job, "c1", hset={"state": "done"}, ack=entry, release=True) == 1
    assert q.get(job).state == "done" and lease.holder() is None
    pending = handle.text.xpending(keys.JOBS_STREAM, keys.JOBS_GROUP)
    assert pending["pending"] == 0
    types = [t for _, t, _ in q.events(job)]
    assert types == ["submitted", "progress"]


def test_requeue_replaces_the_entry_atomically(handle):
    q = JobQueue(handle)
    job = q.submit(spec(), job_id="job-r")
    [(entry, _)] = q.read_new("c1", block_ms=100)
    Lease(handle, job, "c1", ttl_s=10).acquire()
    assert q.fenced(job, "c1", hset={"state": "queued"}, ack=entry, requeue=True, release=True)
    rec = q.get(job)
    assert rec.raw["entry"] != entry and rec.state == "queued"
    [(entry2, job_id)] = q.read_new("c2", block_ms=100)
    assert job_id == job and entry2 == rec.raw["entry"]
    assert handle.text.xpending(keys.JOBS_STREAM, keys.JOBS_GROUP)["pending"] == 1


def test_autoclaim_takes_only_idle_entries_and_touch_keeps_them_fresh(handle):
    q = JobQueue(handle)
    q.submit(spec(), job_id="job-x")
    [(entry, _)] = q.read_new("dead-worker", block_ms=100)
    assert q.autoclaim("c2", min_idle_ms=300) == []      # too fresh
    time.sleep(0.2)
    q.touch("dead-worker", entry)                        # what a live owner's heartbeat does
    time.sleep(0.2)
    assert q.autoclaim("c2", min_idle_ms=300) == []
    time.sleep(0.35)
    assert q.autoclaim("c2", min_idle_ms=300) == [(entry, "job-x")]
    detail = handle.text.xpending_range(keys.JOBS_STREAM, keys.JOBS_GROUP, "-", "+", 10)
    assert detail[0]["consumer"] == "c2"


def test_cancel_queued_and_running_jobs(handle):
    q = JobQueue(handle)
    queued = q.submit(spec(), job_id="job-q")
    assert q.cancel(queued) == "cancelled"
    assert q.get(queued).state == "cancelled"
    assert q.cancel(queued) == "cancelled"               # idempotent: already final

    running = q.submit(spec(), job_id="job-run")
    Lease(handle, running, "c1", ttl_s=10).acquire()
    q.fenced(running, "c1", hset={"state": "running"})
    assert q.cancel(running) == "cancel_requested"
    assert q.get(running).state == "running"
    assert q.fenced(running, "c1", hset={"step": 1}) == 2   # the owner hears about it
    with pytest.raises(KeyError):
        q.cancel("no-such-job")


def test_dead_letter_entry_and_counts(handle):
    q = JobQueue(handle)
    for i in range(3):
        q.submit(spec(), job_id=f"job-{i}")
    Lease(handle, "job-1", "c1", ttl_s=10).acquire()
    q.fenced("job-1", "c1", hset={"state": "failed", "error": "boom"},
             dead={"job": "job-1", "error": "boom", "failures": 3})
    assert q.counts_by_state() == {"queued": 2, "running": 0, "done": 0, "failed": 1,
                                   "cancelled": 0}
    [dead] = q.dead_letters()
    assert dead["job"] == "job-1" and dead["error"] == "boom"
    assert [r.id for r in q.list_jobs()] == ["job-2", "job-1", "job-0"]
    assert [r.id for r in q.list_jobs(state="failed")] == ["job-1"]


def test_duplicate_and_unsafe_job_ids_are_refused(handle):
    q = JobQueue(handle)
    q.submit(spec(), job_id="same")
    with pytest.raises(JobSpecError, match="already exists"):
        q.submit(spec(), job_id="same")
    for bad in ("../escape", "a/b", ".hidden", "", "x" * 101):
        with pytest.raises(JobSpecError, match="not allowed"):
            q.submit(spec(), job_id=bad)


@pytest.mark.parametrize("data, message", [
    ({"model": "tiny", "steps": 10}, "dataset: Field required"),
    ({"dataset": "d", "steps": 0}, "steps: Input should be greater than 0"),
    ({"dataset": "d", "steps": 5, "lr": float("nan")}, "lr: .*finite"),
    ({"dataset": "d", "steps": 5, "model": "huge"}, "unknown model preset 'huge'"),
    ({"dataset": "d", "steps": 5, "batchsize": 4}, "batchsize: Extra inputs are not permitted"),
    ({"dataset": "d", "steps": 5, "model_overrides": {"d_modl": 8}}, "unknown model field"),
    ({"dataset": "d", "steps": 5, "warmup": 9}, "warmup 9 exceeds steps 5"),
    ({"dataset": "../x", "steps": 5}, "dataset name"),
    ("{not json", "not valid JSON"),
])
def test_invalid_specs_name_every_problem(data, message):
    with pytest.raises(JobSpecError, match=message):
        JobSpec.parse(data if isinstance(data, str) else dict(data))
