"""Shared pieces of the daemon tests: a tiny real vocabulary, datasets of real text tokenized
with it, job submission, and daemons run in-process or as subprocesses (`python -m
trainer_svc`) against a real Redis server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from trainer_svc.data.datasets import DatasetWriter, get_dataset
from trainer_svc.jobs.queue import JobQueue, JobSpec

from .redis_helpers import REPO, istanbul_env
from .service_support import SAMPLE, write_tiny_vocabulary

SEEDS = Path(os.environ.get("ISTANBUL_SHARED_VOCAB", REPO.parent / "shared" / "vocab")
             ).parent / "seeds"

# A few steps of the tiny preset at a short sequence: seconds on lavapipe.
TINY_SPEC = dict(model="tiny", batch=4, seq=32, lr=3e-3, warmup=2)


def training_texts() -> list[str]:
    """Real text: the seed documents when present, the service tests' sample otherwise, and
    a Python source file (always present)."""
    texts = [p.read_text(encoding="utf-8") for p in sorted(SEEDS.glob("*.txt"))] \
        if SEEDS.is_dir() else [SAMPLE * 20]
    texts.append(Path(os.__file__).read_text(encoding="utf-8")[:20000])
    return texts


def tiny_vocabulary(directory: Path):
    from tokenizer_svc.vocab import load_vocabulary
    directory.mkdir(parents=True, exist_ok=True)
    path = write_tiny_vocabulary(directory)
    return path, load_vocabulary(str(path))


def tokenize(vocab, text: str) -> list[int]:
    """tiktoken with the same ranks and pattern (the service is tested to agree with it)."""
    import tiktoken
    enc = tiktoken.Encoding(vocab.name, pat_str=vocab.pattern, mergeable_ranks=vocab.ranks,
                            special_tokens=vocab.special_tokens)
    return enc.encode_ordinary(text)


def make_dataset(handle, name: str, vocab, vocab_path: Path | None = None,
                 shard_tokens: int = 4096, texts: list[str] | None = None, replace=False):
    writer = DatasetWriter(handle, name, vocab_hash=vocab.content_hash, n_vocab=vocab.n_vocab,
                           eot_id=vocab.eot_token, vocab_name=vocab.name, tokenizer="tiktoken",
                           shard_tokens=shard_tokens, replace=replace)
    for text in texts or training_texts():
        writer.add_document(np.asarray(tokenize(vocab, text)))
    if vocab_path is not None:
        writer.attach_vocabulary({vocab_path.name: vocab_path.read_bytes(),
                                  vocab_path.name + ".json":
                                      Path(str(vocab_path) + ".json").read_bytes()})
    return writer.close()


def submit(handle, dataset: str, job_id: str | None = None, **spec) -> str:
    fields = {**TINY_SPEC, **spec, "dataset": dataset}
    info = get_dataset(handle, dataset)
    return JobQueue(handle).submit(JobSpec(**fields), job_id, dataset_info=info)


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class DaemonProcess:
    """`python -m trainer_svc` in a subprocess, its log in a file."""

    def __init__(self, url: str, root: Path, log_path: Path, *args: str,
                 env: dict | None = None):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "trainer_svc", "--checkpoints", str(root), "--redis", url,
             *args], cwd=REPO, env=istanbul_env(env), stdout=self.log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.log.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.log.close()

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text()


def job_state(queue, job_id: str) -> dict:
    """The job hash, or {} while Redis is unreachable (tests that restart it poll through)."""
    import redis
    try:
        rec = queue.get(job_id)
    except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
        return {}
    return rec.raw if rec else {}


def debris_in(job_dir: Path) -> list[str]:
    """Names in a job's checkpoint folder that a killed writer left behind."""
    from trainer_svc.training.checkpoint import DEBRIS
    return sorted(p.name for p in job_dir.iterdir() if DEBRIS.match(p.name))
