"""The two things the dashboard's buttons do to a job: cancel it, and put it back on the queue.

    cancel(queue, JOB)     # as `istanbul cancel`: JobQueue.cancel
    requeue(queue, JOB)    # a failed or cancelled job -> queued, as a new stream entry

Re-queueing is one Lua script, like every other change of a job's state (trainer_svc/jobs/queue.py):
only a job in a final state other than `done` is re-queued (a running job has a daemon that
owns it; a done job has nothing left to train — submit a new one). The job keeps its id,
spec, attempts and curve; its error moves to `last_error`, `failures` starts again from 0
(the next max_failures attempts are the ones this re-queue pays for), a cancel request is
withdrawn, and a new entry goes onto the jobs stream with a `requeued` event. The daemon that
takes it resumes from the job's newest checkpoint that verifies, as after any re-queue; an
older entry of the same job still in the stream is recognised as stale (the job hash names
the new entry) and dropped.
"""

from __future__ import annotations

import time

from trainer_svc.jobs import keys
from trainer_svc.jobs.queue import JobQueue, event

REQUEUE_LUA = """
-- KEYS: job hash, events, jobs stream ; ARGV: job id, now, event json, events maxlen
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return false end
if state ~= 'failed' and state ~= 'cancelled' then return state end
local err = redis.call('HGET', KEYS[1], 'error')
if err and err ~= '' then redis.call('HSET', KEYS[1], 'last_error', err) end
redis.call('HDEL', KEYS[1], 'cancel_requested', 'finished_at')
redis.call('HSET', KEYS[1], 'state', 'queued', 'error', '', 'owner', '', 'failures', '0',
           'updated_at', ARGV[2])
local entry = redis.call('XADD', KEYS[3], '*', 'job', ARGV[1])
redis.call('HSET', KEYS[1], 'entry', entry)
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'type', 'requeued', 'data', ARGV[3])
return 'queued'
"""


class NoSuchJob(KeyError):
    pass


def cancel(queue: JobQueue, job_id: str) -> str:
    """'cancelled' (it was queued), 'cancel_requested' (running: its daemon stops it after the
    current step and a checkpoint) or the final state it already had. NoSuchJob."""
    try:
        return queue.cancel(job_id)
    except KeyError:
        raise NoSuchJob(job_id) from None


def requeue(queue: JobQueue, job_id: str, reason: str = "re-queued from the dashboard") -> str:
    """'queued', or the state that kept the job from being re-queued. NoSuchJob."""
    queue.ensure_group()
    result = queue.handle.script(REQUEUE_LUA)(
        keys=[keys.job(job_id), keys.job_events(job_id), keys.JOBS_STREAM],
        args=[job_id, repr(time.time()), event("requeued", reason=reason)[1],
              queue.events_maxlen])
    if result is None:
        raise NoSuchJob(job_id)
    return result
