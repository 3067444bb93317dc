"""A job whose configuration cannot fit the device fails at once (no retries), with what to
change; the daemon goes on with the next job. Real Redis, the real daemon and training core."""

from __future__ import annotations

from trainer_svc.jobs.daemon import Daemon, DaemonConfig
from trainer_svc.jobs.queue import JobQueue

from .daemon_helpers import make_dataset, submit, tiny_vocabulary


def test_a_job_that_cannot_fit_fails_at_once(handle, device, tmp_path):
    _, voc = tiny_vocabulary(tmp_path / "vocab")
    make_dataset(handle, "fit", voc, shard_tokens=2048)
    limit = int(device.limits["max-storage-buffer-binding-size"])
    batch = limit // (32 * 2 * 192 * 4) + 1        # tiny's FFN activations over one binding
    too_big = submit(handle, "fit", steps=3, batch=batch)
    good = submit(handle, "fit", steps=2)
    daemon = Daemon(handle, DaemonConfig(checkpoint_root=tmp_path / "ckpt", lease_ttl_s=5,
                                         poll_ms=100, exit_when_idle=True, max_failures=3),
                    device=device)
    assert daemon.run() == 0
    queue = JobQueue(handle)
    rec = queue.get(too_big)
    assert rec.state == "failed" and rec.get_int("failures") == 1, rec.raw
    assert "in one binding" in rec.raw["error"] and "smaller batch" in rec.raw["error"]
    assert queue.get(good).state == "done"
