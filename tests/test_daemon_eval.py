"""Held-out loss in a daemon job: every eval_every steps in the job hash (status), the events,
the curve (`eval:STEP` fields beside the training loss) and the Prometheus gauge."""

from __future__ import annotations

from trainer_svc.jobs.daemon import Daemon, DaemonConfig
from trainer_svc.jobs.queue import JobQueue

from .daemon_helpers import make_dataset, submit, tiny_vocabulary


def test_eval_loss_reaches_status_events_curve_and_metrics(handle, device, tmp_path):
    _, voc = tiny_vocabulary(tmp_path / "vocab")
    make_dataset(handle, "evals", voc, shard_tokens=2048)
    job = submit(handle, "evals", steps=4, eval_every=2, eval_batches=1, eval_fraction=0.3)
    daemon = Daemon(handle, DaemonConfig(checkpoint_root=tmp_path / "ckpt", lease_ttl_s=5,
                                         poll_ms=100, exit_when_idle=True), device=device)
    seen = {}
    observe = daemon.metrics.observe_eval
    daemon.metrics.observe_eval = lambda job_id, loss: (seen.__setitem__(job_id, loss),
                                                        observe(job_id, loss))
    assert daemon.run() == 0
    queue = JobQueue(handle)
    rec = queue.get(job)
    assert rec.state == "done", rec.raw
    evals = queue.eval_curve(job)
    assert sorted(evals) == [2, 4] and all(0 < v < 20 for v in evals.values())
    assert sorted(queue.loss_curve(job)) == [1, 2, 3, 4]       # the training curve apart
    assert rec.get_float("eval_loss") == evals[4] == seen[job]
    events = [(kind, data) for _, kind, data in queue.events(job) if kind == "eval"]
    assert [d["step"] for _, d in events] == [2, 4]
