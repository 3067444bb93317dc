"""Recovering from what a crash leaves behind, and stopping promptly: the daemon resumes from
the newest checkpoint that loads (not only the newest that verifies), removes its own job's
debris (never another job's), and honours a cancel within a step and within an evaluation.
Real Redis, the real daemon loop (in this process), the real tiny model on lavapipe."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from trainer_svc.training.checkpoint import MANIFEST_FILE, MODEL_FILE, sha256_file, verify_checkpoint
from trainer_svc.jobs.daemon import Daemon, DaemonConfig
from trainer_svc.jobs.queue import JobQueue

from .daemon_helpers import make_dataset, submit, tiny_vocabulary, wait_for


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return tiny_vocabulary(tmp_path_factory.mktemp("vocab"))


def daemon_for(handle, root: Path, device, **config) -> Daemon:
    return Daemon(handle, DaemonConfig(checkpoint_root=root, lease_ttl_s=5, poll_ms=100,
                                       exit_when_idle=True, **config), device=device)


def in_thread(daemon: Daemon) -> threading.Thread:
    thread = threading.Thread(target=daemon.run, name="daemon-under-test", daemon=True)
    thread.start()
    return thread


def sign_again(checkpoint: Path) -> None:
    """Make a checkpoint whose files match its manifest but whose weights this build cannot
    load (the layout hash of another build)."""
    model = checkpoint / MODEL_FILE
    with safe_open(str(model), framework="numpy") as fh:
        meta = dict(fh.metadata())
    meta["layout_hash"] = "0123456789abcdef"
    save_file(load_file(str(model)), str(model), metadata=meta)
    manifest = json.loads((checkpoint / MANIFEST_FILE).read_text())
    manifest["files"][MODEL_FILE] = {"sha256": sha256_file(model),
                                     "bytes": model.stat().st_size}
    (checkpoint / MANIFEST_FILE).write_text(json.dumps(manifest))


def progress(queue: JobQueue, job: str) -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = {}
    for _, kind, data in queue.events(job):
        if kind == "progress":
            out.setdefault(data["attempt"], {})[data["step"]] = data["loss"]
    return out


def test_resume_skips_a_checkpoint_that_verifies_but_does_not_load(handle, vocab, device,
                                                                   tmp_path):
    _, voc = vocab
    queue = JobQueue(handle)
    make_dataset(handle, "text", voc)
    root = tmp_path / "ckpt"
    job = submit(handle, "text", job_id="fallback", steps=12, checkpoint_every=2)
    # First attempt: stopped (like SIGTERM) once past step 5; it checkpoints where it stops.
    first = daemon_for(handle, root, device)
    thread = in_thread(first)
    wait_for(lambda: queue.get(job).get_int("step") >= 5, 120, what="step 5")
    first.stop_event.set()
    thread.join(120)
    assert queue.get(job).state == "queued"
    steps = sorted(int(p.name[5:]) for p in (root / job).glob("step_*"))
    newest, previous = steps[-1], steps[-2]
    sign_again(root / job / f"step_{newest:08d}")
    verify_checkpoint(root / job / f"step_{newest:08d}")

    daemon_for(handle, root, device).run()
    rec = queue.get(job)
    assert rec.state == "done" and rec.get_int("step") == 12, rec.raw
    events = queue.events(job)
    [skipped] = [d for _, k, d in events if k == "checkpoint_skipped"]
    assert skipped["checkpoint"].endswith(f"step_{newest:08d}")
    assert "layout hash 0123456789abcdef does not match" in skipped["reason"]
    [resumed] = [d for _, k, d in events if k == "resumed" and d["attempt"] == 2]
    assert resumed["step"] == previous
    runs = progress(queue, job)
    assert sorted(runs[2]) == list(range(previous + 1, 13))
    for step in range(previous + 1, newest + 1):     # recomputed identically
        assert math.isclose(runs[1][step], runs[2][step], rel_tol=1e-6), step
    verify_checkpoint(root / job / "step_00000012")
    assert not list((root / job).glob("*superseded*"))


def test_a_job_removes_its_own_debris_and_never_another_jobs(handle, vocab, device, tmp_path):
    _, voc = vocab
    queue = JobQueue(handle)
    make_dataset(handle, "text", voc)
    root = tmp_path / "ckpt"
    own, other = root / "mine", root / "theirs"
    debris = [".tmp-step_00000004-4242-1", "step_00000002.superseded-17", ".latest.tmp-4242"]
    for folder in (own, other):
        (folder / debris[0]).mkdir(parents=True)
        (folder / debris[0] / MODEL_FILE).write_bytes(b"\0" * 4096)
        (folder / debris[1]).mkdir()
        (folder / debris[2]).symlink_to("step_00000002")
    submit(handle, "text", job_id="mine", steps=4, checkpoint_every=2, keep_last=1)
    daemon_for(handle, root, device).run()
    assert queue.get("mine").state == "done"
    assert sorted(p.name for p in own.iterdir()) == ["latest", "step_00000004"]
    assert sorted(p.name for p in other.iterdir()) == sorted(debris)   # not its job
    [removed] = [d for _, k, d in queue.events("mine") if k == "debris_removed"]
    assert sorted(removed["names"]) == sorted(debris)


def test_cancel_stops_a_long_evaluation_and_a_run_that_rarely_publishes(handle, vocab, device,
                                                                        tmp_path):
    _, voc = vocab
    queue = JobQueue(handle)
    make_dataset(handle, "text", voc)
    root = tmp_path / "ckpt"
    # ~2,000 evaluation batches after every step: tens of seconds per evaluation on lavapipe.
    evals = submit(handle, "text", job_id="evals", steps=50, eval_every=1, eval_batches=2000,
                   checkpoint_every=1000)
    thread = in_thread(daemon_for(handle, root, device))
    wait_for(lambda: queue.get(evals).get_int("step") >= 1, 120, what="step 1 of evals")
    time.sleep(0.5)                                          # inside the first evaluation
    asked = time.monotonic()
    assert queue.cancel(evals) == "cancel_requested"
    wait_for(lambda: queue.get(evals).state == "cancelled", 60, interval=0.05,
             what="the evaluating job to stop")
    assert time.monotonic() - asked < 5.0
    rec = queue.get(evals)
    assert rec.get_int("step") == 1 and "eval_loss" not in rec.raw
    assert Path(rec.raw["checkpoint"]).name == "step_00000001"     # progress kept
    thread.join(60)
    assert not thread.is_alive()

    # Progress reaches Redis only at checkpoints here (publish every 1000 s), yet a cancel
    # stops the job within a step or so.
    thread = in_thread(daemon_for(handle, root, device, publish_every_s=1000.0))
    quiet = submit(handle, "text", job_id="quiet", steps=5000, checkpoint_every=5000)
    wait_for(lambda: queue.get(quiet).state == "running", 120, what="quiet to start")
    time.sleep(1.0)
    asked = time.monotonic()
    queue.cancel(quiet)
    wait_for(lambda: queue.get(quiet).state == "cancelled", 60, interval=0.05,
             what="the quiet job to stop")
    assert time.monotonic() - asked < 5.0
    assert 0 < queue.get(quiet).get_int("step") < 5000
    thread.join(60)
    assert not thread.is_alive()
