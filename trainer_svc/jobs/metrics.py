"""Prometheus metrics of a training daemon (served with `--metrics-port`).

Per daemon: tokens trained, steps, step seconds (histogram), the current loss, held-out loss
and tokens/s per running job, jobs finished by outcome, takeovers, lost leases, whether Redis
is reachable.
Cluster-wide, read from Redis when scraped (cached for a few seconds): the queue depth (jobs
waiting) and the number of jobs in each state.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from .queue import STATES

log = logging.getLogger(__name__)

STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class QueueCollector:
    """Queue depth and jobs by state, read from Redis at scrape time."""

    def __init__(self, queue, cache_s: float = 5.0):
        self.queue, self.cache_s = queue, cache_s
        self._cached: dict | None = None
        self._at = 0.0

    def _counts(self) -> dict | None:
        if self._cached is None or time.monotonic() - self._at > self.cache_s:
            try:
                self._cached = self.queue.counts_by_state()
                self._at = time.monotonic()
            except Exception as exc:  # Redis away: report nothing rather than fail the scrape
                log.debug("metrics: cannot read job counts: %s", exc)
                return None
        return self._cached

    def collect(self):
        counts = self._counts()
        if counts is None:
            return
        depth = GaugeMetricFamily("istanbul_trainer_queue_depth",
                                  "Jobs queued and waiting for a daemon")
        depth.add_metric([], counts.get("queued", 0))
        yield depth
        by_state = GaugeMetricFamily("istanbul_trainer_jobs", "Jobs by state", labels=["state"])
        for state in STATES:
            by_state.add_metric([state], counts.get(state, 0))
        yield by_state


class DaemonMetrics:
    def __init__(self, queue=None, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.tokens = Counter("istanbul_trainer_tokens", "Tokens trained by this daemon",
                              registry=r)
        self.steps = Counter("istanbul_trainer_steps", "Optimizer steps taken by this daemon",
                             registry=r)
        self.step_seconds = Histogram("istanbul_trainer_step_seconds",
                                      "Wall time of one optimizer step", buckets=STEP_BUCKETS,
                                      registry=r)
        self.loss = Gauge("istanbul_trainer_loss", "Training loss of the latest step",
                          ["job"], registry=r)
        self.eval_loss = Gauge("istanbul_trainer_eval_loss",
                               "Held-out loss of the latest evaluation", ["job"], registry=r)
        self.tokens_per_s = Gauge("istanbul_trainer_tokens_per_second",
                                  "Tokens per second of the latest step", ["job"], registry=r)
        self.finished = Counter("istanbul_trainer_job_attempts",
                                "Job attempts ended by this daemon, by outcome", ["outcome"],
                                registry=r)
        self.takeovers = Counter("istanbul_trainer_takeovers",
                                 "Jobs taken over from a worker whose lease expired", registry=r)
        self.lease_lost = Counter("istanbul_trainer_leases_lost",
                                  "Jobs abandoned because their lease was lost", registry=r)
        self.redis_up = Gauge("istanbul_trainer_redis_up", "1 when Redis answered last time",
                              registry=r)
        self.redis_up.set(1)
        self.adapter_info = Gauge("istanbul_trainer_adapter", "the GPU adapter in use (1); "
                                  "software=\"true\": software Vulkan, not a GPU",
                                  ["adapter", "type", "software"], registry=r)
        if queue is not None:
            r.register(QueueCollector(queue))

    def observe_step(self, job_id: str, metrics) -> None:
        self.tokens.inc(metrics.tokens)
        self.steps.inc()
        self.step_seconds.observe(metrics.seconds)
        self.loss.labels(job=job_id).set(metrics.loss)
        self.tokens_per_s.labels(job=job_id).set(metrics.tokens_per_s)

    def observe_eval(self, job_id: str, loss) -> None:
        if loss is not None:
            self.eval_loss.labels(job=job_id).set(loss)

    def forget_job(self, job_id: str) -> None:
        for gauge in (self.loss, self.eval_loss, self.tokens_per_s):
            try:
                gauge.remove(job_id)
            except KeyError:
                pass

    def serve(self, port: int, addr: str = "127.0.0.1", tokens: tuple = ()) -> int:
        """Serve /metrics over HTTP (with `tokens`: only to requests bearing one); returns the
        bound port (useful with port 0)."""
        from tokenizer_svc.exposure import serve_metrics
        server = serve_metrics(self.registry, addr, port, tokens)
        return server.server_port

    def adapter(self, name: str, kind: str, software: bool) -> None:
        """The GPU adapter this daemon trains on, as an info-style gauge (always 1)."""
        self.adapter_info.labels(adapter=name, type=kind,
                                 software="true" if software else "false").set(1)
