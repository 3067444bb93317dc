"""Training: a Llama-style decoder on WGSL kernels, trained from token shards, by a Redis daemon.

In the order the data flows:

    data/         text -> token shards (files or Redis datasets) -> batches (TokenStream)
    model/        the decoder: config, parameter layout, forward/backward on the GPU, generation
    training/     the Trainer (one optimizer step), precision, schedule, checkpoints, export
    distributed/  one job over several GPUs (data parallel)
    jobs/         the daemon: job specs and queue in Redis, leases, metrics, the bridge to training

jobs/ also holds what the rest borrows from the daemon's side: the Redis connection and keys
(data/datasets.py keeps shards in Redis) and the error classes (jobs/failures.py: what a retry
cannot fix), which distributed/ raises.

The command line: `cli_train.py` (train, generate, export), `cli_jobs.py` (prepare, datasets,
submit, jobs, trainer), `cli_tune.py` (kernels tune). `settings.py` alone reads the
environment.
"""
