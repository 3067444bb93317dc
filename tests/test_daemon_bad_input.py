"""Bad input fails that job with a clear error, goes to the dead-letter stream, and the daemon
goes on with the next job. Real Redis, the real daemon loop, the real training core."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainer_svc.jobs import keys
from trainer_svc.jobs.daemon import Daemon, DaemonConfig, resolve_job_dir
from trainer_svc.jobs.queue import JobInputError, JobQueue
from trainer_svc.data.shards import encode_shard

from .daemon_helpers import TINY_SPEC, make_dataset, submit, tiny_vocabulary


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
    return tiny_vocabulary(tmp_path_factory.mktemp("vocab"))


def run_daemon(handle, root: Path, device, **config) -> Daemon:
    daemon = Daemon(handle, DaemonConfig(checkpoint_root=root, lease_ttl_s=5, poll_ms=100,
                                         exit_when_idle=True, **config), device=device)
    assert daemon.run() == 0
    return daemon


def failed_with(queue: JobQueue, job_id: str, *fragments: str) -> dict:
    rec = queue.get(job_id)
    assert rec.state == "failed", (job_id, rec.raw)
    for fragment in fragments:
        assert fragment in rec.raw["error"], (fragment, rec.raw["error"])
    dead = {d["job"]: d for d in queue.dead_letters()}
    assert job_id in dead and dead[job_id]["error"] == rec.raw["error"]
    return rec.raw


def test_checkpoint_paths_stay_inside_the_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    assert resolve_job_dir(root, "job-1") == (root / "job-1").resolve()
    for bad in ("../up", "a/../../b", "/abs", ".", "..", "x/y"):
        with pytest.raises(JobInputError, match="escape the checkpoint root"):
            resolve_job_dir(root, bad)
    (tmp_path / "elsewhere").mkdir()
    (root / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(JobInputError, match="outside the checkpoint root"):
        resolve_job_dir(root, "linked")


def test_every_bad_input_fails_its_job_and_the_daemon_goes_on(handle, vocab, device, tmp_path):
    vocab_path, voc = vocab
    queue = JobQueue(handle)
    root = tmp_path / "ckpt"
    info = make_dataset(handle, "good", voc, shard_tokens=2048)
    jobs = {}

    # Ids outside the vocabulary (a shard written by a broken tool with the right header).
    make_dataset(handle, "bad-ids", voc, shard_tokens=2048)
    ids = np.arange(40, dtype=np.uint32)
    ids[17] = voc.n_vocab + 5
    handle.binary.set(keys.shard("bad-ids", 1), encode_shard(ids, voc.content_hash,
                                                             voc.n_vocab + 100))
    jobs["ids"] = submit(handle, "bad-ids", steps=3)

    # A truncated shard.
    make_dataset(handle, "truncated", voc, shard_tokens=2048)
    blob = handle.binary.get(keys.shard("truncated", 0))
    handle.binary.set(keys.shard("truncated", 0), blob[:-7])
    jobs["truncated"] = submit(handle, "truncated", steps=3)

    # The dataset was replaced by one from another vocabulary after the job was submitted.
    make_dataset(handle, "swapped", voc, shard_tokens=2048)
    jobs["vocab"] = submit(handle, "swapped", steps=3)
    handle.text.hset(keys.dataset("swapped"), "vocab_hash", "ab" * 32)

    # A spec that does not validate (put on the stream by another client, not the CLI).
    jobs["spec"] = queue.submit_raw("raw-spec", {"spec": json.dumps(
        {"dataset": "good", "steps": -4, "modle": "tiny"})})
    jobs["json"] = queue.submit_raw("raw-json", {"spec": "{oops"})

    # Checkpoint paths outside the root: an escaping id, and a link that points outside.
    jobs["escape"] = queue.submit_raw("../../escape", {"spec": json.dumps(
        {"dataset": "good", "steps": 2, **TINY_SPEC})})
    (tmp_path / "outside").mkdir()
    root.mkdir()
    (root / "linked").symlink_to(tmp_path / "outside")
    jobs["link"] = submit(handle, "good", job_id="linked", steps=2)

    # A dataset that does not exist (deleted after submit).
    make_dataset(handle, "gone", voc)
    jobs["missing"] = submit(handle, "gone", steps=2)
    handle.text.delete(keys.dataset("gone"))

    # A dataset that declares an absurd vocabulary size (it sizes the embedding and head).
    make_dataset(handle, "huge-vocab", voc, shard_tokens=2048)
    jobs["n_vocab"] = submit(handle, "huge-vocab", steps=2)
    handle.text.hset(keys.dataset("huge-vocab"), "n_vocab", str(10**9))

    # A dataset whose stored vocabulary file is garbage (every checkpoint would fail on it).
    garbage = tmp_path / "garbage.tiktoken"
    garbage.write_text("this is not a vocabulary\n")
    Path(str(garbage) + ".json").write_text("{}")
    make_dataset(handle, "bad-vocab", voc, vocab_path=garbage, shard_tokens=2048)
    jobs["vocab_file"] = submit(handle, "bad-vocab", steps=2)

    # A model config that cannot be built for this vocabulary.
    jobs["model"] = submit(handle, "good", steps=2, model_overrides={"n_heads": 3})

    # Diverging training: a NaN loss (fp32, absurd learning rate, no clipping), and steps
    # whose gradients stay non-finite (every update skipped).
    jobs["nan"] = submit(handle, "good", steps=6, lr=1e10, warmup=0, grad_clip=0.0,
                         precision="fp32")
    jobs["inf-grads"] = submit(handle, "good", steps=12, lr=1e30, warmup=0, grad_clip=0.0)

    # A queued job cancelled before any daemon saw it, and a good job last.
    jobs["cancelled"] = submit(handle, "good", steps=2)
    assert queue.cancel(jobs["cancelled"]) == "cancelled"
    jobs["good"] = submit(handle, "good", steps=4, checkpoint_every=2)

    daemon = run_daemon(handle, root, device)

    failed_with(queue, jobs["ids"], "dataset 'bad-ids' shard 1", f"token id {voc.n_vocab + 5}",
                "position 17", f"outside the vocabulary of {voc.n_vocab}")
    failed_with(queue, jobs["truncated"], "dataset 'truncated' shard 0", "truncated")
    failed_with(queue, jobs["vocab"], "tokenized with vocabulary abababab",
                f"job expects {voc.content_hash[:16]}")
    failed_with(queue, jobs["spec"], "spec is invalid", "steps: Input should be greater than 0",
                "modle: Extra inputs are not permitted")
    failed_with(queue, jobs["json"], "not valid JSON")
    failed_with(queue, jobs["escape"], "would escape the checkpoint root")
    failed_with(queue, jobs["link"], "outside the checkpoint root")
    failed_with(queue, jobs["missing"], "no dataset 'gone'", "istanbul prepare")
    failed_with(queue, jobs["n_vocab"], "declares a vocabulary of 1000000000 ids",
                "the limit is 1 to 1048576")
    vocab_file = failed_with(queue, jobs["vocab_file"], "dataset 'bad-vocab': its stored "
                             "vocabulary is unusable", "garbage.tiktoken")
    assert int(vocab_file["failures"]) == 1 and vocab_file["step"] == "0"   # before training
    failed_with(queue, jobs["model"], "d_model 64 is not divisible by n_heads 3")
    nan = failed_with(queue, jobs["nan"], "loss is nan (not finite) at step 2", "diverged",
                      "Lower lr")
    failed_with(queue, jobs["inf-grads"], "the run diverged", "non-finite gradients")
    assert queue.get(jobs["cancelled"]).state == "cancelled"
    assert not (tmp_path / "escape").exists() and not any((tmp_path / "outside").iterdir())
    assert int(nan["failures"]) == 1                      # bad input: no retries

    good = queue.get(jobs["good"])
    assert good.state == "done" and good.get_int("step") == 4
    assert [Path(p).name for p in good.checkpoints] == ["step_00000002", "step_00000004"]
    assert handle.text.xpending(keys.JOBS_STREAM, keys.JOBS_GROUP)["pending"] == 0
    assert daemon.jobs_run == len(jobs) - 1              # the cancelled one never ran
    assert info.tokens > 0


def test_a_checkpoint_of_another_spec_is_never_resumed(handle, vocab, device, tmp_path):
    _, voc = vocab
    queue = JobQueue(handle)
    make_dataset(handle, "good", voc)
    root = tmp_path / "ckpt"
    submit(handle, "good", job_id="reused", steps=2, checkpoint_every=1)
    run_daemon(handle, root, device)
    assert queue.get("reused").state == "done"
    # Redis forgot the job (flushed); someone submits a different job under the same id.
    for key in (keys.job("reused"), keys.job_events("reused"), keys.job_curve("reused")):
        handle.text.delete(key)
    submit(handle, "good", job_id="reused", steps=4, seed=99)
    run_daemon(handle, root, device)
    failed_with(queue, "reused", "was written by another job, vocabulary or spec",
                "submit under another job id")
    assert sorted(p.name for p in (root / "reused").glob("step_*")) == \
        ["step_00000001", "step_00000002"]          # nothing overwritten


def test_repeated_failures_go_to_the_dead_letter_stream(handle, vocab, device, tmp_path):
    _, voc = vocab
    queue = JobQueue(handle)
    make_dataset(handle, "good", voc)
    root = tmp_path / "ckpt"
    root.mkdir()
    job = submit(handle, "good", job_id="blocked", steps=2)
    (root / "blocked").write_text("a file where the job's checkpoint directory should be")
    run_daemon(handle, root, device, max_failures=3)
    rec = queue.get(job)
    assert rec.state == "failed" and rec.get_int("failures") == 3
    assert "failed 3 times in a row without progress (limit 3)" in rec.raw["error"]
    assert "FileExistsError" in rec.raw["error"]
    [dead] = queue.dead_letters()
    assert dead["job"] == job and dead["reason"] == "too many failures"
    kinds = [kind for _, kind, _ in queue.events(job)]
    assert kinds.count("requeued") == 2 and kinds.count("started") == 3
    assert kinds[-1] == "failed"


def test_a_worker_whose_disk_is_gone_stops_and_leaves_the_jobs(handle, vocab, device,
                                                                tmp_path):
    _, voc = vocab
    queue = JobQueue(handle)
    make_dataset(handle, "good", voc)
    root = tmp_path / "ckpt"
    for name in ("first", "second"):
        submit(handle, "good", job_id=name, steps=2)
    daemon = Daemon(handle, DaemonConfig(checkpoint_root=root, lease_ttl_s=5, poll_ms=100),
                    device=device)
    assert daemon.self_check() is None
    root.rmdir()
    root.write_text("the checkpoint volume is gone")
    assert daemon.run() == 3
    assert "is not writable" in daemon.sick
    first, second = queue.get("first"), queue.get("second")
    assert first.state == second.state == "queued"          # left for healthy workers
    assert first.get_int("failures") == 1 and second.get_int("failures") == 0
    assert queue.dead_letters() == []
