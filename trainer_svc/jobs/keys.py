"""The Redis layout, in one place (every key starts with `istanbul:`).

Datasets (written by `istanbul prepare`, read and never consumed by the daemon):
    istanbul:datasets                      set of dataset names
    istanbul:dataset:NAME                  hash: vocab_hash, n_vocab, eot_id, shards, tokens, ...
    istanbul:dataset:NAME:shard:I          string: one shard (trainer_svc.data.shards format)
    istanbul:dataset:NAME:vocab            hash: the vocabulary file(s), when prepare had --vocab

Jobs:
    istanbul:jobs                          stream of {job: ID}; consumer group `trainers`
    istanbul:jobs:index                    sorted set of job ids by submit time
    istanbul:jobs:dead                     dead-letter stream: {job, error, failures, ...}
    istanbul:job:ID                        hash: spec, state, step, loss, owner, error, ...
    istanbul:job:ID:events                 stream of events (state, progress, checkpoint, ...)
    istanbul:job:ID:curve                  hash: step -> loss, eval:step -> eval loss (last write wins)
    istanbul:lease:ID                      string: owner token, with a TTL the owner renews
"""

import re

PREFIX = "istanbul:"
# the names that go into keys (ID and NAME above)
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
DATASET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")

DATASETS = PREFIX + "datasets"
JOBS_STREAM = PREFIX + "jobs"
JOBS_GROUP = "trainers"
JOBS_INDEX = PREFIX + "jobs:index"
DEAD_LETTER = PREFIX + "jobs:dead"


def dataset(name: str) -> str:
    return f"{PREFIX}dataset:{name}"


def shard(name: str, index: int) -> str:
    return f"{PREFIX}dataset:{name}:shard:{index}"


def dataset_vocab(name: str) -> str:
    return f"{PREFIX}dataset:{name}:vocab"


def job(job_id: str) -> str:
    return f"{PREFIX}job:{job_id}"


def job_events(job_id: str) -> str:
    return f"{PREFIX}job:{job_id}:events"


def job_curve(job_id: str) -> str:
    return f"{PREFIX}job:{job_id}:curve"


def lease(job_id: str) -> str:
    return f"{PREFIX}lease:{job_id}"
