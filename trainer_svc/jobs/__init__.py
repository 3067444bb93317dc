"""The training daemon and its Redis: jobs in, trained checkpoints out.

`queue.py` (JobSpec, JobQueue: the spec, the stream, states and events), `daemon.py` (claim,
train, report, repeat), `bridge.py` (the one place the daemon meets the training core),
`lease.py` (job ownership), `failures.py` (what is worth retrying), `metrics.py` (Prometheus),
`keys.py` (every Redis key), `redis_conn.py` and `embedded_redis.py` (connections; the embedded
server).
"""
