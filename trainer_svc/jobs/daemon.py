"""The training daemon: claim a job, own it through a lease, train it, report, repeat.

    daemon = Daemon(connect(url), DaemonConfig(checkpoint_root=Path("ckpt")))
    daemon.run()                                   # until SIGTERM / SIGINT

One loop iteration:
 1. take over an orphan: XAUTOCLAIM pending entries idle for a lease TTL (their worker stopped
    renewing); run one only if its lease is gone;
 2. else read a new entry (XREADGROUP, blocking up to a second);
 3. acquire the job's lease (SET NX PX) — without it the job is not touched — and start the
    heartbeat, which renews the lease, keeps the entry's idle time at zero and notices cancels;
 4. validate the job (spec and its size bounds, checkpoint path inside ROOT, dataset, shards,
    vocabulary), remove the debris of killed checkpoint writers in ROOT/JOB/, resume from the
    newest checkpoint there that verifies and loads or initialise, and train: every step's
    progress goes to the job hash and its events stream (buffered while Redis is away), a
    checkpoint every `checkpoint_every` steps and at the end (its rename fenced by the lease);
    cancel and SIGTERM are looked for between steps and between evaluation batches;
 5. finish through one fenced Lua call that writes the final state, acknowledges the entry and
    releases the lease together: done; cancelled; failed (deterministic errors at once, see
    `failures.py`; others after `max_failures` attempts in a row without progress) with a
    dead-letter entry; or re-queued (SIGTERM, or a failure below the limit) as a new entry.

A job with `gpus: N` > 1 runs on a trainer started with `--gpus` >= N (others re-queue it):
this process is rank 0 and holds the lease, N-1 rank processes are started for the attempt
and stopped with it (`distributed/`); a dead rank fails the step like any transient error,
and the next attempt starts a fresh group from the last checkpoint.

Failure accounting: the job hash keeps `high_step`, the furthest step any attempt reached, and
`start_high_step`, its value when the current attempt started. An attempt that ends in an
error, or whose worker is found dead by the next one, counts as a failure only if it never
got past `start_high_step`; one that did resets `failures` to 0. So crashes of a job that
advances never dead-letter it, and a job that crashes at the same place every time does.

Guarantees: an entry is acknowledged only together with a final state or a re-queue, so a job
is never lost; only the lease holder trains or writes, so a job never runs twice at once; a
taken-over job resumes from its last checkpoint's step and data position, so no step is skipped
and the ones after that checkpoint are recomputed identically. Errors in a job never stop the
daemon; a Redis outage is waited out with backoff.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import redis

from ..data import datasets
from ..training.checkpoint import prune_debris
from .failures import JobInputError, is_deterministic
from .queue import JobQueue, JobRecord, JobSpec, check_job_id, check_vocab_size, event
from .lease import Heartbeat, Lease, lease_holder, owner_token
from .metrics import DaemonMetrics
from .redis_conn import REDIS_DOWN, Backoff, RedisHandle
from ..data.shards import ShardError

log = logging.getLogger(__name__)

LOG_EVERY_S = 30.0   # a progress line in the daemon's log (Redis has every step)
CANCEL_POLL_S = 0.5  # how often a running job looks for a cancel request between flushes


class LeaseLost(Exception):
    """This worker no longer owns the job: stop touching it (another worker may have it)."""


class Interrupted(Exception):
    """SIGTERM: checkpoint, hand the job back to the queue, exit."""


class NotEnoughGpus(Exception):
    """The job asks for more GPUs than this trainer drives: back to the queue, for another."""


class TooManyFailures(Exception):
    """The job has failed (or killed its workers) max_failures times in a row without making
    progress: dead-letter it."""

    def __init__(self, message: str, failures: int):
        super().__init__(message)
        self.failures = failures


@dataclass
class DaemonConfig:
    checkpoint_root: Path
    lease_ttl_s: float = 30.0
    max_failures: int = 3
    poll_ms: int = 1000
    publish_every_s: float = 0.0        # 0: progress to Redis after every step
    max_skipped_steps: int = 5          # consecutive non-finite-gradient steps before failing
    exit_when_idle: bool = False        # stop once no job is waiting (tests, demo)
    max_jobs: int | None = None         # stop after this many jobs (tests)
    gpus: int = 1                       # ranks this trainer can run one job on
    rank_adapters: tuple = ()           # with gpus > 1: the adapter of each rank
    tensorboard_dir: Path | None = None  # --tensorboard: each job's scalars in DIR/JOB
    consumer: str = field(default_factory=owner_token)


def resolve_job_dir(root: Path, job_id: str) -> Path:
    """ROOT/JOB, refusing any job id or link that would put checkpoints outside ROOT."""
    try:
        check_job_id(job_id)
    except JobInputError as exc:
        raise JobInputError(f"checkpoint path for job {job_id!r} would escape the checkpoint "
                            f"root {root}: {exc}") from None
    root = root.resolve()
    target = (root / job_id).resolve()
    if target.parent != root:
        raise JobInputError(f"checkpoint path {root / job_id} resolves to {target}, outside the "
                            f"checkpoint root {root}; remove that link")
    return target


class Progress:
    """Writes a job's progress through the fenced script, buffering while Redis is away."""

    def __init__(self, queue: JobQueue, job_id: str, owner: str, every_s: float):
        self.queue, self.job_id, self.owner, self.every_s = queue, job_id, owner, every_s
        self.hset: dict = {}
        self.events: deque = deque()
        self.curve: list = []
        self.cancel_requested = False
        self._last_flush = 0.0
        self._retry_at = 0.0        # after a failed write, training does not wait on Redis

    def add(self, hset: dict | None = None, ev: list | None = None, curve=None) -> None:
        if hset:
            self.hset.update(hset)
        if ev:
            self.events.append(ev)
        if curve:
            self.curve.extend(curve)

    def flush(self, force: bool = False) -> bool:
        """True when everything buffered reached Redis. Raises LeaseLost."""
        if not (self.hset or self.events or self.curve):
            return True
        now = time.monotonic()
        if not force and (now - self._last_flush < self.every_s or now < self._retry_at):
            return False
        try:
            reply = self.queue.fenced(self.job_id, self.owner, hset=self.hset,
                                      events=list(self.events), curve=self.curve)
        except REDIS_DOWN as exc:
            log.warning("job %s: progress kept locally (%d events), Redis unreachable (%s)",
                        self.job_id, len(self.events), exc)
            self._retry_at = time.monotonic() + 2.0
            return False
        if not reply:
            raise LeaseLost("the lease was gone when writing progress")
        self.cancel_requested = self.cancel_requested or reply == 2
        self.hset, self.curve = {}, []
        self.events.clear()
        self._last_flush = time.monotonic()
        return True


class Daemon:
    def __init__(self, handle: RedisHandle, config: DaemonConfig, device=None,
                 metrics: DaemonMetrics | None = None):
        self.handle, self.config = handle, config
        self.queue = JobQueue(handle)
        self.device = device
        self.metrics = metrics or DaemonMetrics(self.queue)
        self.stop_event = threading.Event()
        self.jobs_run = 0
        self.sick = ""                      # why this worker stopped taking jobs
        self.consumer = config.consumer
        config.checkpoint_root.mkdir(parents=True, exist_ok=True)

    # ---- the loop ----------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        def on_signal(signum, _frame):
            if not self.stop_event.is_set():
                log.info("%s: finishing the current step, checkpointing and exiting",
                         signal.Signals(signum).name)
            self.stop_event.set()
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def run(self) -> int:
        """Serve jobs until stopped; returns the exit code."""
        log.info("trainer %s: checkpoints in %s, Redis %s", self.consumer,
                 self.config.checkpoint_root, self.handle.location)
        backoff = Backoff()
        while not self.stop_event.is_set():
            try:
                ran = self.poll_once()
                backoff.reset()
                self.metrics.redis_up.set(1)
            except REDIS_DOWN as exc:
                self.metrics.redis_up.set(0)
                delay = backoff.next_delay()
                log.warning("Redis unreachable (%s); retrying in %.1f s", exc, delay)
                self.stop_event.wait(delay)
                try:
                    self.handle.revive()
                except Exception as revive_exc:  # the embedded server could not start (yet)
                    log.warning("could not restart the embedded Redis: %s", revive_exc)
                continue
            except Exception:  # never let one bad iteration end the daemon
                log.exception("unexpected error in the daemon loop; continuing")
                self.stop_event.wait(1.0)
                continue
            if self.config.max_jobs is not None and self.jobs_run >= self.config.max_jobs:
                break
            if self.sick:
                log.error("this worker is broken (%s): it stops taking jobs and leaves them to "
                          "other workers", self.sick)
                return 3
            if not ran and self.config.exit_when_idle and self._queue_idle():
                log.info("no job waiting; exiting (--exit-when-idle)")
                break
        log.info("trainer %s stopped after %d job(s)", self.consumer, self.jobs_run)
        return 0

    def launch_ranks(self, world: int):
        """(group, rank processes) for a job on `world` of this trainer's GPUs; this process
        is rank 0 on `self.device` (rank_adapters[0])."""
        from ..distributed.launch import launch_group, rank_adapters
        if world > self.config.gpus:
            raise NotEnoughGpus(f"the job asks for {world} GPUs, this trainer has "
                                f"{self.config.gpus}")
        adapters = list(self.config.rank_adapters) or rank_adapters(self.config.gpus)
        return launch_group(world, adapters[:world])

    def _queue_idle(self) -> bool:
        counts = self.queue.counts_by_state()
        return counts.get("queued", 0) == 0 and counts.get("running", 0) == 0

    def poll_once(self) -> bool:
        """Run at most one job; True when one was run (to any outcome)."""
        ttl_ms = int(self.config.lease_ttl_s * 1000)
        try:
            for entry_id, job_id in self.queue.autoclaim(self.consumer, ttl_ms):
                if self._take(entry_id, job_id, reclaimed=True):
                    return True
            for entry_id, job_id in self.queue.read_new(self.consumer, self.config.poll_ms):
                if self._take(entry_id, job_id, reclaimed=False):
                    return True
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            # First start, or Redis lost its data: (re)create the stream and the group.
            self.queue.ensure_group()
        return False

    def _take(self, entry_id: str, job_id: str | None, reclaimed: bool) -> bool:
        if not job_id:
            log.warning("stream entry %s names no job; acknowledging it", entry_id)
            self.queue.ack(entry_id)
            return False
        if reclaimed and lease_holder(self.handle, job_id):
            # Its worker is alive (the entry only looked idle); leave the job alone.
            return False
        lease = Lease(self.handle, job_id, self.consumer, self.config.lease_ttl_s)
        if not lease.acquire():
            # Another worker holds the lease. The entry stays pending; if that worker dies,
            # XAUTOCLAIM brings the entry back once the lease has expired.
            return False
        record = self.queue.get(job_id)
        if record is None:
            log.warning("stream entry %s names job %r that has no hash; dropping it",
                        entry_id, job_id)
            self.queue.ack(entry_id)
            lease.release()
            return False
        if record.final or record.raw.get("entry", entry_id) != entry_id:
            # Finished already, or a stale duplicate of a re-queued job.
            self.queue.ack(entry_id)
            lease.release()
            return False
        self.jobs_run += 1
        attempt = JobAttempt(self, entry_id, record, lease, reclaimed)
        attempt.run()
        if attempt.unexpected_error:
            # The job's fault, or this worker's? A worker whose disk or GPU fails a simple
            # check would fail every job it touches: better to stop.
            self.sick = self.self_check() or ""
        return True

    def self_check(self) -> str | None:
        """What is wrong with this worker (None when its disk and GPU work)."""
        probe = self.config.checkpoint_root / f".probe-{os.getpid()}"
        try:
            probe.write_bytes(b"istanbul")
            ok = probe.read_bytes() == b"istanbul"
            probe.unlink()
            if not ok:
                return f"checkpoint root {self.config.checkpoint_root} returned other bytes"
        except OSError as exc:
            return f"checkpoint root {self.config.checkpoint_root} is not writable ({exc})"
        if self.device is not None:
            try:
                data = np.arange(1024, dtype=np.float32)
                back = self.device.download(self.device.upload(data))
                if not np.array_equal(np.asarray(back).ravel()[:1024], data):
                    return "the GPU returned other data than was uploaded"
            except Exception as exc:  # a lost device raises whatever wgpu raises
                return f"the GPU does not work ({type(exc).__name__}: {exc})"
        return None


def adapter_label(device) -> str:
    """'NVIDIA H200 (DiscreteGPU)' or 'llvmpipe ... (software Vulkan)', for `istanbul status`."""
    info = getattr(device, "info", None)
    if info is None:
        return ""
    return f"{info.name} ({'software Vulkan' if info.is_software else info.adapter_type})"


class JobAttempt:
    """One worker's attempt at one job, from lease to final state."""

    def __init__(self, daemon: Daemon, entry_id: str, record: JobRecord, lease: Lease,
                 reclaimed: bool):
        self.daemon, self.entry_id, self.record, self.lease = daemon, entry_id, record, lease
        self.queue, self.config, self.metrics = daemon.queue, daemon.config, daemon.metrics
        self.job_id = record.id
        self.owner = daemon.consumer
        self.reclaimed = reclaimed
        self.attempt = record.get_int("attempts") + 1
        self.progress = Progress(self.queue, self.job_id, self.owner, self.config.publish_every_s)
        self.heartbeat = Heartbeat(lease, on_beat=[self._touch_entry, self._poll_cancel])
        self.cancel = threading.Event()     # a cancel request seen (heartbeat or poll)
        self.unexpected_error = False
        # Progress, for failure accounting: the furthest step any attempt had reached when
        # this one started, and the furthest this one has reached.
        self.start_high = self.high_step = record.get_int("high_step")
        self.failures = record.get_int("failures")
        self._last_log = time.monotonic()
        self._last_cancel_poll = 0.0
        self.training_run = None            # the open run (closed when the attempt ends)
        self.scalars = None                 # with --tensorboard: the job's ScalarLog

    def _touch_entry(self) -> None:
        self.queue.touch(self.owner, self.entry_id)

    def _poll_cancel(self) -> None:
        if self.queue.cancel_requested(self.job_id):
            self.cancel.set()

    def _cancel_seen(self) -> bool:
        """A cancel request, looked up at most every CANCEL_POLL_S (progress may be written
        rarely, and the heartbeat beats only every TTL/3)."""
        if self.progress.cancel_requested:
            self.cancel.set()
        now = time.monotonic()
        if not self.cancel.is_set() and now - self._last_cancel_poll >= CANCEL_POLL_S:
            self._last_cancel_poll = now
            try:
                self._poll_cancel()
            except REDIS_DOWN:
                pass                  # the next poll or flush will see it
        return self.cancel.is_set()

    def _stop_requested(self) -> bool:
        """Anything that must end the current step's work early: a lost lease, SIGTERM, a
        cancel (checked between evaluation batches)."""
        return (self.heartbeat.lost.is_set() or self.daemon.stop_event.is_set()
                or self._cancel_seen())

    def _fence(self) -> None:
        """Right before a checkpoint lands: confirm the lease, so a worker that lost it (paused,
        cut off) never puts a checkpoint in place next to the new owner's."""
        if not self.heartbeat.beat() and self.heartbeat.lost.is_set():
            raise LeaseLost(self.heartbeat.lost_reason)

    # ---- outcome handling --------------------------------------------------------------------

    def run(self) -> None:
        self.heartbeat.start()
        try:
            outcome = self._attempt()
            log.info("job %s: %s", self.job_id, outcome)
        except LeaseLost as exc:
            self.metrics.lease_lost.inc()
            log.warning("job %s: stopped, lease lost (%s); not touching it any more",
                        self.job_id, self.heartbeat.lost_reason or exc)
        except Interrupted:
            self._requeue("the daemon was stopped (SIGTERM); re-queued", failed=False)
        except NotEnoughGpus as exc:
            log.info("job %s: %s", self.job_id, exc)
            self._requeue(str(exc), failed=False)
            self.daemon.stop_event.wait(1.0)   # let a bigger trainer read it first
        except REDIS_DOWN as exc:  # not the job's fault: hand it back once Redis answers
            log.warning("job %s: Redis unreachable while preparing the job (%s)", self.job_id,
                        exc)
            self._requeue(f"Redis was unreachable ({exc}); re-queued", failed=False)
        except TooManyFailures as exc:
            self._fail(str(exc), permanent=False, failures=exc.failures)
        except Exception as exc:
            if is_deterministic(exc):   # bad input: the same error on every retry
                self._fail(str(exc), permanent=True, failures=self.failures + 1)
            else:                       # a bug, a GPU error, a full disk: maybe the next works
                self._retry_or_fail(exc)
        finally:
            self._close_run()
            self.heartbeat.stop()
            self.metrics.forget_job(self.job_id)

    def _close_run(self) -> None:
        """Free the GPU memory and stop a data-parallel job's rank processes."""
        run, self.training_run = self.training_run, None
        scalars, self.scalars = self.scalars, None
        if scalars is not None:
            scalars.close()
        if run is not None:
            try:
                run.close()
            except Exception:  # noqa: BLE001 - the outcome is recorded already
                log.exception("job %s: closing the run", self.job_id)

    def _retry_or_fail(self, exc: Exception) -> None:
        log.exception("job %s: attempt %d failed", self.job_id, self.attempt)
        self.unexpected_error = True
        message = f"{type(exc).__name__}: {exc}"
        if self.high_step > self.start_high:
            # It got further than any attempt before it: not a failure streak, start anew.
            self._requeue(f"attempt {self.attempt} failed at step {self.high_step} after "
                          f"progress from step {self.start_high} ({message}); retrying, not "
                          "counted as a failure", failed=True, failures=0)
            return
        failures = self.failures + 1
        limit = self._max_failures()
        if failures >= limit:
            self._fail(f"failed {failures} times in a row without progress (limit {limit}); "
                       f"last error: {message}", permanent=False, failures=failures)
        else:
            self._requeue(f"attempt {self.attempt} failed ({message}); retrying (failure "
                          f"{failures} of {limit})", failed=True, failures=failures)

    def _max_failures(self) -> int:
        try:
            spec = JobSpec.parse(self.record.spec_json)
            return spec.max_failures or self.config.max_failures
        except JobInputError:
            return self.config.max_failures

    def _final_write(self, **ops) -> bool:
        """A fenced write that must happen: waits out a Redis outage while the lease holds."""
        backoff = Backoff()
        while True:
            if self.heartbeat.lost.is_set():
                raise LeaseLost(self.heartbeat.lost_reason)
            try:
                self.progress.flush(force=True)
                if self.queue.fenced(self.job_id, self.owner, **ops):
                    return True
                raise LeaseLost("the lease was gone when writing the final state")
            except REDIS_DOWN as exc:
                log.warning("job %s: waiting for Redis to write the final state (%s)",
                            self.job_id, exc)
                backoff.sleep()

    def _finish(self, state: str, message: str, extra: dict | None = None) -> None:
        now = time.time()
        hset = {"state": state, "finished_at": now, "updated_at": now, "owner": "",
                **(extra or {})}
        try:
            self._final_write(hset=hset, events=[event(state, message=message,
                                                       attempt=self.attempt, **(extra or {}))],
                              ack=self.entry_id, release=True)
        except LeaseLost as exc:
            log.warning("job %s: could not record %s: %s", self.job_id, state, exc)
            return
        self.metrics.finished.labels(outcome=state).inc()

    def _fail(self, error: str, permanent: bool, failures: int) -> None:
        """Final state `failed` + a dead-letter entry; `failures` is stored and reported as is,
        so the job hash, the dead letter and the message agree."""
        log.error("job %s failed: %s", self.job_id, error)
        now = time.time()
        try:
            self._final_write(
                hset={"state": "failed", "error": error, "failures": failures, "owner": "",
                      "finished_at": now, "updated_at": now},
                events=[event("failed", error=error, attempt=self.attempt, permanent=permanent)],
                dead={"job": self.job_id, "error": error, "failures": failures,
                      "reason": "bad input" if permanent else "too many failures",
                      "at": now},
                ack=self.entry_id, release=True)
        except LeaseLost as exc:
            log.warning("job %s: could not record the failure: %s", self.job_id, exc)
            return
        self.metrics.finished.labels(outcome="failed").inc()

    def _requeue(self, reason: str, failed: bool, failures: int | None = None) -> None:
        hset = {"state": "queued", "owner": "", "updated_at": time.time()}
        if failed:
            hset.update(failures=failures, last_error=reason)
        try:
            self._final_write(hset=hset, events=[event("requeued", reason=reason,
                                                       attempt=self.attempt)],
                              ack=self.entry_id, requeue=True, release=True)
        except LeaseLost as exc:
            log.warning("job %s: could not re-queue: %s", self.job_id, exc)
            return
        self.metrics.finished.labels(outcome="requeued").inc()

    # ---- the attempt ---------------------------------------------------------------------------

    def _attempt(self) -> str:
        rec = self.record
        takeover = self.reclaimed and rec.state == "running"
        start = {"state": "running", "owner": self.owner, "attempts": self.attempt,
                 "started_at": time.time(), "updated_at": time.time(), "error": "",
                 "start_high_step": self.start_high,
                 "adapter": adapter_label(self.daemon.device)}
        if takeover:
            self.metrics.takeovers.inc()
            # The previous worker died. Its crash counts as a failure only if it made no
            # progress: it never got past the furthest step reached before it started.
            progressed = self.start_high > rec.get_int("start_high_step")
            self.failures = 0 if progressed else self.failures + 1
            reason = (f"worker {rec.raw.get('owner') or '?'} stopped while running the job "
                      f"(its lease expired)" + (f" after progress to step {self.start_high}; "
                                                "not counted as a failure" if progressed
                                                else ", without progress"))
            start.update(failures=self.failures, last_error=reason)
            self.progress.add(ev=event("takeover", previous_owner=rec.raw.get("owner"),
                                       reason=reason, attempt=self.attempt,
                                       failures=self.failures))
        log.info("job %s: attempt %d%s", self.job_id, self.attempt,
                 " (taking over from a worker that stopped)" if takeover else "")
        self.progress.add(hset=start, ev=event("started", owner=self.owner, attempt=self.attempt,
                                                 takeover=takeover))
        self.progress.flush(force=True)
        self._remove_debris()                # whatever this attempt ends in
        if rec.raw.get("cancel_requested") == "1" or self.progress.cancel_requested:
            self._finish("cancelled", "cancelled before it started")
            return "cancelled before start"

        spec = JobSpec.parse(rec.spec_json, origin=f"job {self.job_id} spec")
        if spec.gpus > self.config.gpus:
            raise NotEnoughGpus(f"the job asks for {spec.gpus} GPUs and this trainer drives "
                                f"{self.config.gpus} (start one with --gpus {spec.gpus}); "
                                "re-queued for another trainer")
        limit = spec.max_failures or self.config.max_failures
        if takeover and self.failures >= limit:
            raise TooManyFailures(f"the job's workers stopped {self.failures} times in a row "
                                  f"without progress (limit {limit}); last: "
                                  f"{rec.raw.get('last_error')}", self.failures)
        job_dir = resolve_job_dir(self.config.checkpoint_root, self.job_id)
        job_dir.mkdir(parents=True, exist_ok=True)   # an unusable directory fails early
        run = self._open(spec, job_dir)
        log.info("job %s: model %s, %s precision%s", self.job_id, spec.model,
                 run.trainer.train_config.precision,
                 " (auto)" if spec.precision == "auto" else "")
        return self._train(spec, run)

    def _remove_debris(self) -> None:
        """We hold the lease: whatever a killed writer left in the job's folder is debris (a
        writer that lost the lease but still runs is stopped by its fence before it can rename
        anything). Only this job's folder; a bad job id is reported later, as its error."""
        try:
            job_dir = resolve_job_dir(self.config.checkpoint_root, self.job_id)
        except JobInputError:
            return
        removed = prune_debris(job_dir)
        if removed:
            self.progress.add(ev=event("debris_removed", names=removed, attempt=self.attempt))

    def _open(self, spec: JobSpec, job_dir: Path):
        from .bridge import open_run   # the training core loads only when a job needs it
        handle = self.daemon.handle
        try:
            info = datasets.get_dataset(handle, spec.dataset)
        except datasets.DatasetError as exc:
            raise JobInputError(str(exc)) from None
        check_vocab_size(spec, info.n_vocab)
        expected = self.record.raw.get("vocab_hash") or spec.vocab_hash or ""
        if not info.vocab_hash.startswith(expected):
            raise JobInputError(
                f"dataset {spec.dataset!r} was tokenized with vocabulary {info.vocab_hash[:16]}, "
                f"but the job expects {expected[:16]}; prepare the data with the job's "
                "vocabulary or resubmit")
        vocab_hash = info.vocab_hash
        shards = []
        for index in range(info.shards):
            try:
                shards.append(datasets.load_shard(handle, info, index, n_vocab=info.n_vocab,
                                                  vocab_hash=vocab_hash))
            except ShardError as exc:
                raise JobInputError(f"bad shard: {exc}") from None
            if self.heartbeat.lost.is_set():
                raise LeaseLost(self.heartbeat.lost_reason)
        eval_shards = self._eval_shards(spec, info) if spec.eval_every else None
        vocab_file = self._vocab_file(spec.dataset, info, job_dir)
        run = open_run(spec, self.job_id, shards, job_dir, self.daemon.device,
                       n_vocab=info.n_vocab, vocab_hash=vocab_hash, vocab_file=vocab_file,
                       eot=info.eot_id, eval_shards=eval_shards,
                       launch_ranks=self.daemon.launch_ranks if spec.gpus > 1 else None)
        self.training_run = run
        run.manager.fence = self._fence
        run.manager.apply_retention()     # a writer killed before its pruning left extra ones
        for path, reason in run.manager.skipped:
            self.progress.add(ev=event("checkpoint_skipped", checkpoint=str(path),
                                       reason=reason, attempt=self.attempt))
        if run.resumed_from is not None:
            self.progress.add(ev=event("resumed", checkpoint=str(run.resumed_from),
                                       step=run.step_count, attempt=self.attempt))
            # The checkpoint knows the losses of the steps before it: a worker killed after
            # its checkpoint landed but before its progress reached Redis leaves no hole.
            losses = list(run.trainer.recent_losses)
            first = run.step_count - len(losses) + 1
            self.progress.add(curve=[x for k, loss in enumerate(losses)
                                     for x in (first + k, float(loss))])
        return run

    def _eval_shards(self, spec: JobSpec, info) -> list | None:
        """The shards of spec.eval_dataset (same vocabulary), or None: held-out documents."""
        if spec.eval_dataset is None:
            return None
        try:
            other = datasets.get_dataset(self.daemon.handle, spec.eval_dataset)
            if other.vocab_hash != info.vocab_hash:
                raise JobInputError(f"eval dataset {spec.eval_dataset!r} was tokenized with "
                                    f"another vocabulary than {spec.dataset!r}")
            return [datasets.load_shard(self.daemon.handle, other, i, n_vocab=other.n_vocab,
                                        vocab_hash=other.vocab_hash)
                    for i in range(other.shards)]
        except datasets.DatasetError as exc:
            raise JobInputError(f"eval dataset: {exc}") from None
        except ShardError as exc:
            raise JobInputError(f"eval dataset: bad shard: {exc}") from None

    def _vocab_file(self, name: str, info, job_dir: Path) -> Path | None:
        """Write the dataset's vocabulary next to the checkpoints (they copy it in)."""
        if not info.vocab_files:
            return None
        files = datasets.vocabulary_files(self.daemon.handle, name)
        target = job_dir / "vocab"
        target.mkdir(parents=True, exist_ok=True)
        for file_name, data in files.items():
            if "/" in file_name or file_name.startswith("."):
                raise JobInputError(f"dataset {name!r}: vocabulary file name {file_name!r} "
                                    "is not a plain file name")
            (target / file_name).write_bytes(data)
        main = target / min(files, key=len)
        from tokenizer_svc.vocab import VocabularyError, load_vocabulary
        try:   # a broken file would fail every checkpoint: refuse it before training
            load_vocabulary(str(main))
        except VocabularyError as exc:
            raise JobInputError(f"dataset {name!r}: its stored vocabulary is unusable: {exc}; "
                                "prepare the dataset again with --vocab") from None
        return main

    def _train(self, spec: JobSpec, run) -> str:
        total = spec.steps
        ema_seconds = None
        skipped_in_a_row = 0
        last_saved = run.step_count if run.resumed_from is not None else -1
        self.progress.add(hset={"total_steps": total, "step": run.step_count,
                                "tokens": run.tokens_seen})
        self._open_scalars(run)
        while run.step_count < total:
            if self._check_stop(run, last_saved):
                return f"cancelled at step {run.step_count}"
            metrics = run.train_step()
            if not math.isfinite(metrics.loss):
                raise JobInputError(
                    f"loss is {metrics.loss} (not finite) at step {run.step_count + 1} with "
                    f"learning rate {metrics.lr:.3g}; the run diverged. Lower lr or raise "
                    f"warmup and resubmit; the last good checkpoint is "
                    f"{run.checkpoint_paths()[-1] if run.checkpoint_paths() else 'none'}")
            if metrics.skipped and metrics.scale_backoff:   # f16: the loss scale halved
                self.progress.add(ev=event("loss_scale_backoff", step=run.step_count + 1,
                                           scale=metrics.loss_scale / 2))
                if self.scalars is not None:
                    self.scalars.loss_scale_backoff(run.step_count + 1, metrics.loss_scale / 2)
                continue
            if metrics.skipped:
                skipped_in_a_row += 1
                self.progress.add(ev=event("skipped", step=run.step_count + 1,
                                           grad_norm=_finite_or_none(metrics.grad_norm)))
                if skipped_in_a_row > self.config.max_skipped_steps:
                    raise JobInputError(
                        f"the run diverged: {skipped_in_a_row} steps in a row had non-finite "
                        f"gradients (at step {run.step_count + 1}, learning rate "
                        f"{metrics.lr:.3g}; those updates were skipped). Lower lr, raise "
                        "warmup or enable grad_clip and resubmit")
                continue
            skipped_in_a_row = 0
            ema_seconds = metrics.seconds if ema_seconds is None else \
                0.9 * ema_seconds + 0.1 * metrics.seconds
            self._report(run, metrics, total, ema_seconds)
            if spec.eval_every and run.step_count % spec.eval_every == 0:
                self.progress.flush()        # the step is visible before a long evaluation
                eval_loss = run.evaluate(should_stop=self._stop_requested)
                if eval_loss is None:        # stopped half-way: cancel, SIGTERM, lost lease
                    continue
                self.metrics.observe_eval(self.job_id, eval_loss)
                if self.scalars is not None:
                    self.scalars.eval(run.step_count, eval_loss)
                self.progress.add(hset={"eval_loss": eval_loss},
                                  curve=[f"eval:{run.step_count}", float(eval_loss)],
                                  ev=event("eval", step=run.step_count, loss=eval_loss,
                                           attempt=self.attempt))
            if run.step_count % spec.checkpoint_every == 0 and run.step_count < total:
                self._checkpoint(run)
                last_saved = run.step_count
            self.progress.flush()
            if self.heartbeat.lost.is_set():
                raise LeaseLost(self.heartbeat.lost_reason)
        if last_saved != run.step_count:
            self._checkpoint(run)
        self._finish("done", f"trained {total} steps",
                     {"step": run.step_count, "tokens": run.tokens_seen})
        return f"done at step {run.step_count}"

    def _open_scalars(self, run) -> None:
        """--tensorboard: the job's scalars in DIR/JOB, the steps after the one this attempt
        starts from hidden from earlier attempts (purge_step). A log that cannot be opened
        costs a warning, never the job."""
        root = self.config.tensorboard_dir
        if root is None:
            return
        from ..training.tensorboard_log import ScalarLog
        try:
            self.scalars = ScalarLog(resolve_job_dir(Path(root), self.job_id),
                                     purge_step=run.step_count + 1)
        except OSError as exc:
            log.warning("job %s: no TensorBoard scalars: cannot write %s (%s)", self.job_id,
                        Path(root) / self.job_id, exc)

    def _check_stop(self, run, last_saved: int) -> bool:
        """Raise for a lost lease or SIGTERM; True when the job was cancelled (and recorded)."""
        if self.heartbeat.lost.is_set():
            raise LeaseLost(self.heartbeat.lost_reason)
        if self.daemon.stop_event.is_set():
            if run.step_count != last_saved and run.step_count > 0:
                self._checkpoint(run)
            raise Interrupted()
        if self._cancel_seen():
            if run.step_count != last_saved and run.step_count > 0:
                self._checkpoint(run)
            self._finish("cancelled", f"cancelled at step {run.step_count}",
                         {"step": run.step_count})
            return True
        return False

    def _checkpoint(self, run) -> None:
        # The step's progress first: a crash after the checkpoint lands loses nothing.
        self.progress.flush(force=True)
        # Confirm the lease right before writing, so a worker that lost it writes nothing.
        if not self.heartbeat.beat() and self.heartbeat.lost.is_set():
            raise LeaseLost(self.heartbeat.lost_reason)
        path = run.save()
        paths = run.checkpoint_paths()
        self.progress.add(hset={"checkpoint": str(path), "checkpoints": paths},
                          ev=event("checkpoint", step=run.step_count, path=str(path),
                                   attempt=self.attempt))
        self.progress.flush(force=True)

    def _report(self, run, metrics, total: int, ema_seconds: float) -> None:
        step = run.step_count
        self.high_step = max(self.high_step, step)
        eta = (total - step) * ema_seconds
        if time.monotonic() - self._last_log >= LOG_EVERY_S or step == total:
            self._last_log = time.monotonic()
            log.info("job %s: step %d/%d loss %.4f %.0f tok/s ETA %.0f s", self.job_id, step,
                     total, metrics.loss, metrics.tokens_per_s, eta)
        self.metrics.observe_step(self.job_id, metrics)
        if self.scalars is not None:
            self.scalars.step(metrics, step)
        self.progress.add(
            hset={"step": step, "loss": float(metrics.loss), "lr": float(metrics.lr),
                  "grad_norm": _finite_or_none(metrics.grad_norm) or 0.0,
                  "tokens": run.tokens_seen, "tokens_per_s": float(metrics.tokens_per_s),
                  "step_seconds": float(metrics.seconds), "eta_s": float(eta),
                  "high_step": self.high_step, "updated_at": time.time()},
            ev=event("progress", step=step, loss=float(metrics.loss), lr=float(metrics.lr),
                     grad_norm=_finite_or_none(metrics.grad_norm),
                     tokens_per_s=float(metrics.tokens_per_s), seconds=float(metrics.seconds),
                     tokens=run.tokens_seen, eta_s=float(eta), attempt=self.attempt,
                     owner=self.owner),
            curve=[step, float(metrics.loss)])


def _finite_or_none(x) -> float | None:
    x = float(x)
    return x if np.isfinite(x) else None
