"""Prometheus metrics of the service and the interceptor that records every RPC.

Each server has its own registry (several servers may share a process in tests), served on
`--metrics-port` at /metrics. Names:

    istanbul_tokenizer_requests_total{method,code}      RPCs finished, by status code
    istanbul_tokenizer_errors_total{method,code}        the same, non-OK only
    istanbul_tokenizer_request_seconds{method}          RPC latency (histogram)
    istanbul_tokenizer_inflight_requests                RPCs in progress
    istanbul_tokenizer_input_bytes_total{method}        text/bytes received for tokenizing
    istanbul_tokenizer_tokens_total{direction}          ids produced (encode) or consumed (decode)
    istanbul_tokenizer_batch_documents                  documents per GPU batch (histogram)
    istanbul_tokenizer_batch_requests                   requests per GPU batch (histogram)
    istanbul_tokenizer_batch_bytes                      input bytes per GPU batch (histogram)
    istanbul_tokenizer_batch_seconds                    wall time of a whole batch (histogram)
    istanbul_tokenizer_gpu_seconds                      time inside Encoding.encode_batch_flat
                                                        (upload, kernels, download; histogram)
    istanbul_tokenizer_encoder_seconds_total{phase}     of that, the GPU encoder's own host
                                                        phases (upload; readback: mapping and
                                                        waiting for the GPU; own device only)
    istanbul_tokenizer_encoder_calls_total{path}        encoder calls, and chunks finished on
                                                        the slow path (path="slow")
    istanbul_tokenizer_queue_wait_seconds               time from arrival to batch start
    istanbul_tokenizer_dropped_total{reason}            requests dropped before the GPU call
                                                        (cancelled, deadline, queue_full)
    istanbul_tokenizer_queued_bytes                     input bytes accepted, not yet answered
    istanbul_tokenizer_ready                            1 once the device and vocabulary are ready
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .batcher import BatchObserver

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30)
COUNT_BUCKETS = tuple(float(1 << k) for k in range(0, 17))
BYTE_BUCKETS = tuple(float(1 << k) for k in range(6, 31, 2))

access_log = logging.getLogger("tokenizer_svc.access")


class Labelled(dict):
    """A labelled metric's children by label values, memoised: `labelled[value]` or
    `labelled[value, value]` is `metric.labels(...)`. prometheus_client's labels() takes a
    lock and builds tuples on every call, and the service asks for several children per
    request; the label values used here are bounded (method names, status codes, a few
    words), and no child is ever removed."""

    def __init__(self, metric):
        super().__init__()
        self.metric = metric

    def __missing__(self, key):
        child = self.metric.labels(*key) if isinstance(key, tuple) else self.metric.labels(key)
        self[key] = child
        return child


def method_name(full_method: str) -> str:
    """'/istanbul.tokenizer.v1.Tokenizer/Tokenize' -> 'Tokenize' (health/reflection keep service)."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    if service.startswith("istanbul."):
        return method
    return f"{service.rsplit('.', 1)[-1]}/{method}"


class EncoderMetrics:
    """The GPU encoder's Profile of each call (shaders/kernels/bpe/encode.py), as counters in
    `registry` under `prefix`: where an encode call's host time goes (upload, readback and
    the wait for the GPU) and how often a chunk took the slow path."""

    def __init__(self, registry, prefix: str):
        self.phase_seconds = Counter(f"{prefix}_seconds", "host time of the GPU encoder's "
                                     "calls by phase", ["phase"], registry=registry)
        self.calls = Counter(f"{prefix}_calls", "GPU encoder calls (all), and chunks "
                             "finished on the slow path (slow)", ["path"], registry=registry)
        self._seen = (None, 0.0, 0.0, 0, 0)   # the profile last read and its totals then

    def observe(self, profile) -> None:
        """Count what `profile` (an encoder's running totals; a new object when it was
        reset) gained since the last call."""
        if profile is None:
            return
        now = (profile.upload_s, profile.readback_s, profile.calls, profile.slow_paths)
        seen, *before = self._seen
        if seen is not profile:
            before = (0.0, 0.0, 0, 0)
        self._seen = (profile, *now)
        upload, readback, calls, slow = (a - b for a, b in zip(now, before))
        self.phase_seconds.labels("upload").inc(max(upload, 0.0))
        self.phase_seconds.labels("readback").inc(max(readback, 0.0))
        self.calls.labels("all").inc(max(calls, 0))
        self.calls.labels("slow").inc(max(slow, 0))


def last_encoder_profile(encoding):
    """The Profile of `encoding`'s last GPU encoder call, or None (no GPU encoder here, or a
    RemoteEncoding: its calls run in the GPU process, which reports them itself)."""
    if "local" in getattr(encoding, "__dict__", {}):
        return None
    encoder = getattr(getattr(encoding, "backend", None), "encoder", None)
    return getattr(encoder, "last_profile", None)


class ServiceMetrics(BatchObserver):
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("istanbul_tokenizer_requests", "RPCs finished, by method and "
                                "status code", ["method", "code"], registry=r)
        self.errors = Counter("istanbul_tokenizer_errors", "RPCs that ended with a non-OK status",
                              ["method", "code"], registry=r)
        self.latency = Histogram("istanbul_tokenizer_request_seconds", "RPC latency", ["method"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.inflight = Gauge("istanbul_tokenizer_inflight_requests", "RPCs in progress",
                              registry=r)
        self.input_bytes = Counter("istanbul_tokenizer_input_bytes", "bytes received for "
                                   "tokenizing", ["method"], registry=r)
        self.tokens = Counter("istanbul_tokenizer_tokens", "ids produced (encode) or consumed "
                              "(decode)", ["direction"], registry=r)
        self.batch_documents = Histogram("istanbul_tokenizer_batch_documents", "documents per "
                                         "GPU batch", buckets=COUNT_BUCKETS, registry=r)
        self.batch_requests = Histogram("istanbul_tokenizer_batch_requests", "requests per GPU "
                                        "batch", buckets=COUNT_BUCKETS, registry=r)
        self.batch_bytes = Histogram("istanbul_tokenizer_batch_bytes", "input bytes per GPU batch",
                                     buckets=BYTE_BUCKETS, registry=r)
        self.batch_seconds = Histogram("istanbul_tokenizer_batch_seconds", "wall time of one "
                                       "batch on the GPU thread", buckets=LATENCY_BUCKETS,
                                       registry=r)
        self.gpu_seconds = Histogram("istanbul_tokenizer_gpu_seconds", "time inside "
                                     "Encoding.encode_batch_flat (upload, kernels, download)",
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.encoder = EncoderMetrics(r, "istanbul_tokenizer_encoder")
        self.queue_wait = Histogram("istanbul_tokenizer_queue_wait_seconds", "time from arrival "
                                    "to the start of the request's batch",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.dropped_requests = Counter("istanbul_tokenizer_dropped", "requests dropped before "
                                        "the GPU call", ["reason"], registry=r)
        self.queued = Gauge("istanbul_tokenizer_queued_bytes", "input bytes accepted and not yet "
                            "answered", registry=r)
        self.ready = Gauge("istanbul_tokenizer_ready", "1 once the device and vocabulary are "
                           "ready, 0 while starting, draining or stalled", registry=r)
        self.adapter_info = Gauge("istanbul_tokenizer_adapter", "the GPU adapter in use (1); "
                                  "software=\"true\": software Vulkan, not a GPU",
                                  ["adapter", "type", "software"], registry=r)
        self.long_requests = Counter("istanbul_tokenizer_long_requests", "requests run in the "
                                     "long lane, by outcome", ["outcome"], registry=r)
        self.long_waiting = Gauge("istanbul_tokenizer_long_waiting", "requests queued or "
                                  "running in the long lane", registry=r)
        # per-request children, memoised (Labelled)
        self.requests_of, self.errors_of = Labelled(self.requests), Labelled(self.errors)
        self.latency_of, self.input_bytes_of = Labelled(self.latency), Labelled(self.input_bytes)
        self.tokens_of = Labelled(self.tokens)
        self.stalled = Gauge("istanbul_tokenizer_stalled", "1 while a GPU worker makes no "
                             "progress for the stall timeout (health NOT_SERVING)", registry=r)
        self._http = None

    # ---- BatchObserver --------------------------------------------------------------------

    def batch_done(self, items: int, nbytes: int, requests: int, seconds: float) -> None:
        self.batch_documents.observe(items)
        self.batch_requests.observe(requests)
        self.batch_bytes.observe(nbytes)
        self.batch_seconds.observe(seconds)

    def request_waited(self, seconds: float) -> None:
        self.queue_wait.observe(seconds)

    def dropped(self, reason: str) -> None:
        self.dropped_requests.labels(reason).inc()

    def queued_bytes(self, nbytes: int) -> None:
        self.queued.set(nbytes)

    def encode_seconds(self, seconds: float) -> None:
        self.gpu_seconds.observe(seconds)

    # ---- HTTP endpoint --------------------------------------------------------------------

    def serve_http(self, host: str, port: int, tokens: tuple = ()) -> int:
        """Start /metrics on host:port (0: any free port; with `tokens`, only for requests
        carrying one of them); returns the bound port."""
        from ..exposure import serve_metrics
        self._http = serve_metrics(self.registry, host, port, tokens)
        return self._http.server_port

    def adapter(self, name: str, kind: str, software: bool) -> None:
        """The GPU adapter in use, as an info-style gauge (always 1)."""
        self.adapter_info.labels(adapter=name, type=kind,
                                 software="true" if software else "false").set(1)

    def stop_http(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


def _status_of(context, exc: BaseException | None) -> grpc.StatusCode:
    # the client went away or its deadline passed (a closed stream sees GeneratorExit)
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        return grpc.StatusCode.CANCELLED
    code = context.code()
    if code is not None:
        return code if isinstance(code, grpc.StatusCode) else _CODES.get(code, grpc.StatusCode.UNKNOWN)
    return grpc.StatusCode.UNKNOWN if exc is not None else grpc.StatusCode.OK


_CODES = {c.value[0]: c for c in grpc.StatusCode}


class TelemetryInterceptor(grpc.aio.ServerInterceptor):
    """Counts, times and access-logs every RPC (including ones other interceptors refuse).

    The peer is read when the RPC starts: after a shutdown has cancelled a call, asking its
    context for the peer reaches into a freed call and crashes the process.
    """

    def __init__(self, metrics: ServiceMetrics):
        self.metrics = metrics
        # the wrapped handler of each (method, handler), built once instead of per call: the
        # service's handlers are fixed objects; the auth interceptor's refusals are made per
        # call, so the cache is emptied when it grows past a bound
        self._wrapped: dict = {}

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        key = (details.method, handler)
        wrapped = self._wrapped.get(key)
        if wrapped is None:
            wrapped = self._wrap(handler, method_name(details.method))
            if len(self._wrapped) >= 256:
                self._wrapped.clear()
            self._wrapped[key] = wrapped
        return wrapped

    def _wrap(self, handler, method: str):
        metrics = self.metrics

        def finish(context, start, peer, exc):
            code = _status_of(context, exc)
            seconds = time.perf_counter() - start
            metrics.inflight.dec()
            metrics.requests_of[method, code.name].inc()
            metrics.latency_of[method].observe(seconds)
            if code != grpc.StatusCode.OK:
                metrics.errors_of[method, code.name].inc()
            if access_log.isEnabledFor(logging.DEBUG) or code not in _QUIET_CODES:
                level = logging.DEBUG if code in _QUIET_CODES else logging.INFO
                access_log.log(level, "rpc", extra={"data": {
                    "method": method, "code": code.name, "ms": round(seconds * 1e3, 3),
                    "peer": peer, "details": context.details() or None}})

        kind = ("unary_unary" if handler.unary_unary else
                "stream_stream" if handler.stream_stream else
                "unary_stream" if handler.unary_stream else "stream_unary")
        inner = getattr(handler, kind)

        if kind in ("unary_unary", "stream_unary"):  # one response: await it
            async def wrapped(request, context):
                start, exc, peer = time.perf_counter(), None, context.peer()
                metrics.inflight.inc()
                try:
                    return await inner(request, context)
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    finish(context, start, peer, exc)
        else:
            async def wrapped(request, context):
                start, exc, peer = time.perf_counter(), None, context.peer()
                metrics.inflight.inc()
                try:
                    result = inner(request, context)
                    if hasattr(result, "__aiter__"):
                        async for response in result:
                            yield response
                    else:
                        await result
                except BaseException as e:
                    exc = e
                    raise
                finally:
                    finish(context, start, peer, exc)
        return handler._replace(**{kind: wrapped})


_QUIET_CODES = (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                grpc.StatusCode.NOT_FOUND)
