"""A tokenizer service's Prometheus /metrics (`istanbul serve --metrics-port`), summarised for
the dashboard (`--tokenizer-metrics URL`).

    scrape = TokenizerMetrics("http://127.0.0.1:9400/metrics")
    scrape.read()
    # {'url': ..., 'ok': True, 'requests_per_s': 812.0, 'errors_per_s': 0.0, 'tokens_per_s': ...,
    #  'latency_s': {'p50': 0.004, 'p95': 0.011, 'p99': 0.02}, 'batch_documents': {...}, ...}

The text is parsed with prometheus_client's parser. Rates and percentiles are over a sliding
WINDOW_S: the difference between this read and the oldest one inside the window (counters and
histogram buckets are cumulative), so they describe the last half minute, not the process's
life; the first read has no rate yet and its percentiles cover everything so far. A percentile
interpolates linearly inside its histogram bucket, as Prometheus' histogram_quantile does.
A service that cannot be read gives {'ok': False, 'error': why}; the dashboard carries on.
"""

from __future__ import annotations

import collections
import math
import time
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

WINDOW_S = 30.0
PREFIX = "istanbul_tokenizer_"
COUNTERS = {"requests": "requests_total", "errors": "errors_total", "tokens": "tokens_total",
            "input_bytes": "input_bytes_total"}
HISTOGRAMS = {"latency_s": "request_seconds", "batch_documents": "batch_documents",
              "batch_requests": "batch_requests", "queue_wait_s": "queue_wait_seconds"}
GAUGES = {"inflight": "inflight_requests", "ready": "ready", "queued_bytes": "queued_bytes"}
QUANTILES = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


def parse(text: str) -> dict:
    """Counter totals, histogram buckets (le -> cumulative count, summed over labels), sums
    and counts, gauges, and the adapter label, from a /metrics page."""
    out = {"counters": collections.Counter(), "buckets": {}, "sums": collections.Counter(),
           "counts": collections.Counter(), "gauges": {}, "adapter": None}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if not name.startswith(PREFIX):
                continue
            short = name[len(PREFIX):]
            if short in COUNTERS.values():
                out["counters"][short] += sample.value
            elif short.endswith("_bucket"):
                le = float(sample.labels["le"])
                buckets = out["buckets"].setdefault(short[:-7], collections.Counter())
                buckets[le] += sample.value
            elif short.endswith("_sum"):
                out["sums"][short[:-4]] += sample.value
            elif short.endswith("_count"):
                out["counts"][short[:-6]] += sample.value
            elif short in GAUGES.values():
                out["gauges"][short] = out["gauges"].get(short, 0.0) + sample.value
            elif short == "adapter" and sample.value == 1:
                out["adapter"] = sample.labels.get("adapter")
    return out


def quantile(q: float, buckets: dict) -> float | None:
    """The q-quantile of cumulative histogram buckets {upper bound: count}."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower          # above the last finite bound: report that bound
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


class TokenizerMetrics:
    def __init__(self, url: str, timeout_s: float = 2.0):
        self.url, self.timeout_s = url, timeout_s
        self._history: collections.deque = collections.deque()   # (monotonic time, parsed)

    def fetch(self) -> str:
        request = urllib.request.Request(self.url, headers={"Accept": "text/plain"})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
            return reply.read().decode("utf-8", errors="replace")

    def read(self) -> dict:
        try:
            parsed = parse(self.fetch())
        except urllib.error.HTTPError as exc:
            hint = (" (the service was started with --metrics-auth; the dashboard reads "
                    "/metrics without a token)" if exc.code == 401 else "")
            return {"url": self.url, "ok": False, "error": f"HTTP {exc.code}{hint}"}
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            return {"url": self.url, "ok": False, "error": f"cannot read it: {reason}"}
        now = time.monotonic()
        self._history.append((now, parsed))
        while len(self._history) > 2 and now - self._history[1][0] >= WINDOW_S:
            self._history.popleft()
        then, old = self._history[0]
        return summarise(parsed, old if then < now else None, now - then, self.url)


def summarise(new: dict, old: dict | None, seconds: float, url: str = "") -> dict:
    """Rates and percentiles between two parsed reads (`old` None: percentiles of `new`)."""
    out = {"url": url, "ok": True, "window_s": seconds if old else None,
           "adapter": new["adapter"]}
    for key, name in COUNTERS.items():
        out[f"{key}_per_s"] = ((new["counters"][name] - old["counters"][name]) / seconds
                               if old and seconds > 0 else None)
        out[f"{key}_total"] = new["counters"][name]
    for key, name in GAUGES.items():
        out[key] = new["gauges"].get(name)
    for key, name in HISTOGRAMS.items():
        buckets = dict(new["buckets"].get(name, {}))
        count, total = new["counts"][name], new["sums"][name]
        if old and old["counts"][name] < count:     # the window's observations only
            previous = old["buckets"].get(name, {})
            buckets = {le: c - previous.get(le, 0) for le, c in buckets.items()}
            count, total = count - old["counts"][name], total - old["sums"][name]
        out[key] = {"count": count, "mean": total / count if count else None,
                    **{label: quantile(q, buckets) for label, q in QUANTILES.items()}}
    return out
