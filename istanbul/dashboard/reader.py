"""What the dashboard shows, read from Redis exactly as the daemon and the CLI wrote it
(`trainer_svc/jobs/keys.py` lists the keys); nothing here writes.

    reader = Reader(connect(url))
    reader.snapshot()               # the queue, the newest jobs, dead letters, datasets, daemons
    detail = reader.job_detail(JOB) # one job: its hash, spec, curves, checkpoints, events
    reader.job_update(JOB, detail["last_event_id"])   # what happened since

A job's status on the page refines its `state` with its lease (`istanbul:lease:JOB`):
    queued         waiting for a daemon           leased    a daemon took its lease, starting
    running        trained under a live lease     stalled   'running' but the lease expired: its
                                                            daemon died; taken over after the TTL
    done | cancelled | failed                     dead-lettered   failed, with an entry in
                                                                   istanbul:jobs:dead
Daemons: the consumers of the `trainers` group (XINFO CONSUMERS) seen within ALIVE_S; a
daemon reads the stream every second when idle and touches its entry every lease TTL / 3 when
busy. Its GPU is the `adapter` of the job it runs (the daemon writes no other record of it).
Series: the training and held-out loss come from the curve hash (every step); learning rate,
grad norm and tokens/s from the `progress` events, the newest MAX_EVENTS of them.
"""

from __future__ import annotations

import json
import time

from trainer_svc.jobs import keys
from trainer_svc.data.datasets import list_datasets
from trainer_svc.jobs.queue import JobQueue, JobRecord

ALIVE_S = 60.0            # a daemon seen by Redis within this is alive
GONE_SHOWN_S = 3600.0     # daemons gone for less than this are still listed (as gone)
MAX_JOBS = 200            # newest jobs in the snapshot
MAX_EVENTS = 20_000       # newest events read for a job's lr, grad norm and tokens/s series
RECENT_EVENTS = 25        # events listed under a job (other than per-step progress)
DEAD_SHOWN = 50           # newest dead letters listed
STATUSES = ("queued", "leased", "running", "stalled", "done", "failed", "dead-lettered",
            "cancelled")
SERIES = ("lr", "grad_norm", "tokens_per_s")
# Events after which a job's header (state, checkpoints, errors) is sent again in full.
RELOAD_EVENTS = frozenset({"resumed"})


def job_status(state: str, leased: bool, dead_lettered: bool) -> str:
    """The page's status of a job (see the module docstring)."""
    if state == "queued":
        return "leased" if leased else "queued"
    if state == "running":
        return "running" if leased else "stalled"
    if state == "failed" and dead_lettered:
        return "dead-lettered"
    return state


class Reader:
    """Reads for the dashboard through one RedisHandle (thread-safe: redis-py's pool)."""

    def __init__(self, handle, checkpoints=None):
        self.handle = handle
        self.queue = JobQueue(handle)
        self.checkpoints = checkpoints          # a CheckpointInspector, or None: paths only

    @property
    def r(self):
        return self.handle.text

    # ---- the overview ----------------------------------------------------------------------

    def snapshot(self) -> dict:
        entries = self.r.xrange(keys.DEAD_LETTER)
        dead_ids = {fields.get("job") for _, fields in entries}
        dead_shown = [dict(fields, entry=entry_id)
                      for entry_id, fields in entries[::-1][:DEAD_SHOWN]]
        jobs, counts = self._jobs(dead_ids)
        datasets = [{"name": d.name, "state": d.state, "shards": d.shards, "tokens": d.tokens,
                     "documents": d.documents, "n_vocab": d.n_vocab,
                     "vocab_name": d.vocab_name, "vocab_hash": d.vocab_hash[:12],
                     "tokenizer": d.tokenizer, "created_at": d.created_at}
                    for d in list_datasets(self.handle)]
        return {"counts": counts, "jobs": jobs, "dead_letters": dead_shown,
                "datasets": datasets, "daemons": self.daemons(jobs), "redis":
                self.handle.location, "time": time.time()}

    def _jobs(self, dead_ids: set) -> tuple[list[dict], dict]:
        """The newest MAX_JOBS jobs as rows, and every job counted by status."""
        ids = self.r.zrevrange(keys.JOBS_INDEX, 0, -1)
        pipe = self.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.hget(keys.job(job_id), "state")
            pipe.exists(keys.lease(job_id))
        replies = pipe.execute()
        counts = dict.fromkeys(STATUSES, 0)
        for job_id, state, leased in zip(ids, replies[0::2], replies[1::2]):
            if state:
                status = job_status(state, bool(leased), job_id in dead_ids)
                counts[status] = counts.get(status, 0) + 1
        shown = ids[:MAX_JOBS]
        pipe = self.r.pipeline(transaction=False)
        for job_id in shown:
            pipe.hgetall(keys.job(job_id))
            pipe.pttl(keys.lease(job_id))
        replies = pipe.execute()
        rows = [self._row(JobRecord(raw), ttl_ms, dead_ids)
                for raw, ttl_ms in zip(replies[0::2], replies[1::2]) if raw]
        return rows, counts

    def _row(self, rec: JobRecord, ttl_ms: int, dead_ids: set) -> dict:
        leased = ttl_ms is not None and ttl_ms >= 0
        row = {"id": rec.id, "state": rec.state,
               "status": job_status(rec.state, leased, rec.id in dead_ids),
               "lease_ttl_s": ttl_ms / 1000 if leased else None}
        for name in ("step", "total_steps", "attempts", "failures", "tokens"):
            row[name] = rec.get_int(name)
        for name in ("loss", "eval_loss", "tokens_per_s", "eta_s", "lr", "grad_norm",
                     "created_at", "updated_at", "finished_at"):
            row[name] = rec.get_float(name)
        for name in ("owner", "adapter", "dataset", "model", "error", "last_error"):
            row[name] = rec.raw.get(name) or None
        row["cancel_requested"] = rec.raw.get("cancel_requested") == "1"
        return row

    def daemons(self, jobs: list[dict]) -> list[dict]:
        """The trainers group's consumers seen within GONE_SHOWN_S, newest first."""
        try:
            consumers = self.r.xinfo_consumers(keys.JOBS_STREAM, keys.JOBS_GROUP)
        except Exception as exc:   # no stream or group yet: no daemon ever started
            if "no such key" in str(exc).lower() or "nogroup" in str(exc).lower():
                return []
            raise
        running = {}
        for job in jobs:
            if job["owner"] and job["state"] == "running":
                running.setdefault(job["owner"], []).append(job)
        out = []
        for c in consumers:
            idle_s = int(c.get("idle", 0)) / 1000
            if idle_s > GONE_SHOWN_S:
                continue
            own = running.get(c["name"], [])
            out.append({"name": c["name"], "idle_s": idle_s, "alive": idle_s <= ALIVE_S,
                        "pending": int(c.get("pending", 0)),
                        "jobs": [j["id"] for j in own],
                        "adapter": next((j["adapter"] for j in own if j["adapter"]), None)})
        return sorted(out, key=lambda d: (not d["alive"], d["idle_s"]))

    # ---- one job -----------------------------------------------------------------------------

    def job_summary(self, job_id: str) -> dict | None:
        """The job hash, typed (JobRecord.to_dict), with status, lease and checkpoints."""
        rec = self.queue.get(job_id)
        if rec is None:
            return None
        data = rec.to_dict()
        ttl_ms = self.r.pttl(keys.lease(job_id))
        leased = ttl_ms is not None and ttl_ms >= 0
        dead = rec.state == "failed" and any(
            f.get("job") == job_id for _, f in self.r.xrevrange(keys.DEAD_LETTER, count=1000))
        data["status"] = job_status(rec.state, leased, dead)
        data["lease"] = {"holder": self.r.get(keys.lease(job_id)),
                         "ttl_s": ttl_ms / 1000} if leased else None
        data["checkpoints"] = [self._checkpoint(path) for path in rec.checkpoints]
        return data

    def _checkpoint(self, path: str) -> dict:
        if self.checkpoints is None:
            return {"path": path}
        return self.checkpoints.describe(path)

    def job_detail(self, job_id: str) -> dict | None:
        """Everything the job's panel draws; None when there is no such job."""
        summary = self.job_summary(job_id)
        if summary is None:
            return None
        items = self.r.xrevrange(keys.job_events(job_id), count=MAX_EVENTS)[::-1]
        events = [_event(i, f) for i, f in items]
        series = {name: {} for name in SERIES}
        backoffs, skipped = [], 0
        for ev in events:
            _collect(ev, series, backoffs)
            skipped += ev["type"] == "skipped"
        return {"job": summary, "spec": summary.pop("spec"),
                "loss": _pairs(self.queue.loss_curve(job_id)),
                "eval_loss": _pairs(self.queue.eval_curve(job_id)),
                "series": {name: _pairs(values) for name, values in series.items()},
                "loss_scale_backoffs": backoffs, "skipped_steps": skipped,
                "events": [ev for ev in events if ev["type"] != "progress"][-RECENT_EVENTS:],
                "last_event_id": events[-1]["id"] if events else "0-0"}

    def job_update(self, job_id: str, after: str) -> dict | None:
        """What is new since event `after`: points to append, the events (but per-step
        progress: the points carry it), the job's summary, and `reload` when the panel must be
        drawn anew (a resume rewrote the curve). None when the job is gone."""
        summary = self.job_summary(job_id)
        if summary is None:
            return None
        summary.pop("spec")
        items = self.r.xrange(keys.job_events(job_id), min=f"({after}" if after != "0-0"
                              else "-", count=MAX_EVENTS)
        events = [_event(i, f) for i, f in items]
        series = {name: {} for name in SERIES}
        loss, evals, backoffs, skipped = {}, {}, [], 0
        for ev in events:
            _collect(ev, series, backoffs)
            data, kind = ev["data"], ev["type"]
            skipped += kind == "skipped"
            if kind == "progress" and _number(data.get("loss")) is not None:
                loss[int(data["step"])] = float(data["loss"])
            elif kind == "eval" and _number(data.get("loss")) is not None:
                evals[int(data["step"])] = float(data["loss"])
        return {"job": summary, "loss": _pairs(loss), "eval_loss": _pairs(evals),
                "series": {name: _pairs(values) for name, values in series.items()},
                "loss_scale_backoffs": backoffs, "skipped_steps": skipped,
                "events": [ev for ev in events if ev["type"] != "progress"],
                "reload": any(ev["type"] in RELOAD_EVENTS for ev in events),
                "last_event_id": events[-1]["id"] if events else after}


def _event(event_id: str, fields: dict) -> dict:
    try:
        data = json.loads(fields.get("data", "{}"))
    except ValueError:
        data = {}
    return {"id": event_id, "type": fields.get("type", ""),
            "data": data if isinstance(data, dict) else {}}


def _number(value) -> float | None:
    try:
        return float(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _collect(ev: dict, series: dict, backoffs: list) -> None:
    """A progress event's lr, grad norm and tokens/s (a recomputed step: the last value);
    a loss-scale back-off's step and new scale."""
    data = ev["data"]
    if ev["type"] == "progress" and "step" in data:
        for name in SERIES:
            value = _number(data.get(name))
            if value is not None:
                series[name][int(data["step"])] = value
    elif ev["type"] == "loss_scale_backoff":
        backoffs.append({"step": data.get("step"), "scale": data.get("scale")})


def _pairs(values: dict) -> list[list]:
    return [[step, values[step]] for step in sorted(values)]
