"""`TokenizerServer`: the service's lifecycle on a grpc.aio server.

    start()   bind the port (health NOT_SERVING), start /metrics, then load the Encoding on the
              GPU thread; once it is ready the batcher starts and health turns SERVING
    drain()   health NOT_SERVING, wait drain_delay_s (load balancers notice), serve the calls
              grpc already holds (door.py: grpc's stop() would cancel them), stop accepting
              new RPCs, let in-flight ones finish (up to shutdown_grace_s), finish the batcher

Batches run on one worker thread, the GPU thread; documents that are expensive (long, or
holding a long piece) run on a second one, the long lane, with their own encoder and in
budgeted steps (long_lane.py), so they never hold up the batches. A watchdog turns health
NOT_SERVING while a worker is busy for `stall_timeout_s` without progress. drain() always
ends within the grace period plus the stall timeout: a worker still busy then is left
behind (`stuck_workers`; the CLI exits non-zero at once).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from typing import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from .rpc import tokenizer_pb2 as pb
from .auth import BearerAuthInterceptor
from .batcher import DynamicBatcher
from .config import ServerConfig
from .door import Door
from .event_loop import name_of
from .long_lane import LongJobControl, LongLane
from .health import HealthServicer
from .errors import RequestRejected, limit_reason
from .limits import queue_full
from .metrics import ServiceMetrics, TelemetryInterceptor, last_encoder_profile
from .ports import check_free, port_error
from .servicer import SERVICE_NAME, TokenizerServicer
from .tei import TEI_SERVICE_NAME, TeiTokenizeServicer
from .work import BatchRunner

log = logging.getLogger("tokenizer_svc.service")

SERVICES = ("", SERVICE_NAME, TEI_SERVICE_NAME)   # health entries (the server, each service)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def server_version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:    # not `istanbul.__version__`: the library must not import the top-level package
        return version("istanbul")
    except PackageNotFoundError:
        return "unknown"


def adapter_info(device) -> pb.Adapter:
    info = getattr(device, "info", None)
    if info is None:
        return pb.Adapter(name="unknown")
    return pb.Adapter(name=info.name, type=info.adapter_type, backend=info.backend,
                      driver=info.driver, software=info.is_software)


# batches a worker keeps at the shared GPU process at once (more served less:
# dev/service_throughput/README.md)
REMOTE_INFLIGHT = 2
IDLE_POOL_END_S = 0.5                # at drain, the least wait for a GPU thread pool to end
LONG_LANE_GPU_BUDGET = 1 << 16      # work units per long-lane dispatch on GPUs (a few ms)
LONG_LANE_ROUND_DISPATCHES = 8      # dispatches per long-lane submit


def _retrieve(future) -> None:
    """Mark a long-lane result retrieved (its caller may have gone: cancel, deadline)."""
    if not future.cancelled():
        future.exception()


class TokenizerServer:
    """The gRPC tokenizer service.

    Give either `encoding` (ready now) or `load` (a callable returning `(encoding, device)`,
    run on the GPU thread after the port is bound, so that health can say NOT_SERVING
    while it runs). `device` is the wgpu device of `encoding`, for GetInfo.
    """

    def __init__(self, config: ServerConfig, *, encoding=None, device=None,
                 load: Callable[[], tuple] | None = None):
        if (encoding is None) == (load is None):
            raise ValueError("give exactly one of encoding= and load=")
        self.config = config
        self._encoding, self._device, self._load = encoding, device, load
        self.metrics = ServiceMetrics()
        self.servicer = TokenizerServicer(config)
        self.tei = TeiTokenizeServicer(self.servicer)
        self.health = HealthServicer()
        # batches run here; two threads for the two batches a worker of the shared GPU
        # process keeps in flight (REMOTE_INFLIGHT), else one batch at a time uses one
        self.gpu_thread = concurrent.futures.ThreadPoolExecutor(REMOTE_INFLIGHT,
                                                                thread_name_prefix="gpu")
        self.long_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gpu-long")
        self.long_lane: LongLane | None = None
        self.runner: BatchRunner | None = None
        self._batch_starts: dict = {}   # running batch -> its monotonic start
        self.stalled = False
        self.stuck_workers: list[str] = []
        self._watchdog: asyncio.Task | None = None
        self._long_waiting = 0
        self.batcher: DynamicBatcher | None = None
        self.port: int | None = None
        self.metrics_port: int | None = None
        self.ready: asyncio.Event | None = None  # created in start(), on the server's loop
        self.load_error: BaseException | None = None
        self._server: grpc.aio.Server | None = None
        self._loader: asyncio.Task | None = None
        self._stopped: asyncio.Event | None = None
        self._draining = False
        self.door = Door()

    # ---- start ----------------------------------------------------------------------------

    def _grpc_options(self) -> list:
        limit = self.config.limits.max_message_bytes
        # grpc's own limit sits above ours, so our deserializer answers with the clearer
        # message; responses may be larger than requests (ids and offsets). Without
        # SO_REUSEPORT a second server on a taken port fails instead of sharing it silently;
        # workers of one `serve --workers N` share it on purpose (workers.py).
        wire = min(2 * limit + (1 << 20), 2**31 - 1)
        return [("grpc.max_receive_message_length", wire),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 1 if self.config.reuse_port else 0)]

    async def start(self) -> int:
        """Bind and start serving (NOT_SERVING until the Encoding is ready); returns the port."""
        cfg = self.config
        self.ready = asyncio.Event()
        self._stopped = asyncio.Event()
        interceptors = [TelemetryInterceptor(self.metrics), self.door]
        if cfg.auth_tokens:
            interceptors.append(BearerAuthInterceptor(cfg.auth_tokens))
        server = grpc.aio.server(interceptors=interceptors, options=self._grpc_options())
        for name, handlers in ((SERVICE_NAME, self.servicer.method_handlers()),
                               (TEI_SERVICE_NAME, self.tei.method_handlers())):
            server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name,
                                                                                  handlers),))
            server.add_registered_method_handlers(name, handlers)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, TEI_SERVICE_NAME,
             health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), server)
        for service in SERVICES:
            await self.health.set(service, NOT_SERVING)
        if not cfg.reuse_port:   # a worker's port is held by its supervisor
            check_free("gRPC port", "--port", cfg.host, cfg.port)
        if cfg.metrics_port is not None:
            check_free("metrics port", "--metrics-port", cfg.metrics_host, cfg.metrics_port)
        try:
            if cfg.tls_cert is not None:
                creds = grpc.ssl_server_credentials([(cfg.tls_key, cfg.tls_cert)])
                self.port = server.add_secure_port(cfg.address, creds)
            else:
                self.port = server.add_insecure_port(cfg.address)
        except RuntimeError as exc:   # grpc's "Failed to bind to address ..."
            raise port_error("gRPC port", "--port", cfg.host, cfg.port, exc) from None
        if not self.port:
            raise port_error("gRPC port", "--port", cfg.host, cfg.port)
        if cfg.metrics_port is not None:
            try:
                self.metrics_port = self.metrics.serve_http(
                    cfg.metrics_host, cfg.metrics_port,
                    tokens=cfg.auth_tokens if cfg.metrics_auth else ())
            except OSError as exc:
                await server.stop(0)
                raise port_error("metrics port", "--metrics-port", cfg.metrics_host,
                                 cfg.metrics_port, exc) from None
        await server.start()
        self._server = server
        log.info("listening", extra={"data": {
            "address": f"{cfg.host}:{self.port}", "tls": cfg.tls_cert is not None,
            "auth": bool(cfg.auth_tokens), "metrics_port": self.metrics_port}})
        self._loader = asyncio.get_running_loop().create_task(self._become_ready())
        return self.port

    async def _become_ready(self) -> None:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        try:
            if self._load is not None:
                self._encoding, self._device = await loop.run_in_executor(self.gpu_thread,
                                                                          self._load)
            runner = BatchRunner(self._encoding, on_encode_seconds=self.metrics.encode_seconds,
                                 max_call_bytes=self.config.batching.max_bytes,
                                 on_encoder_profile=lambda encoding: self.metrics.encoder.observe(
                                     last_encoder_profile(encoding)))
            long_encoding = await loop.run_in_executor(self.gpu_thread, self._long_encoding)
        except Exception as exc:
            self.load_error = exc
            log.error("loading the tokenizer failed", exc_info=True,
                      extra={"data": {"error": str(exc)}})
            self._stopped.set()
            return
        self.runner = runner
        self.long_lane = LongLane(long_encoding, runner.finish, self.config.long_lane)
        b = self.config.batching
        self.batcher = DynamicBatcher(
            self._timed_batch, self.gpu_thread, window_s=b.effective_window_s,
            max_items=b.effective_max_items, max_bytes=b.max_bytes,
            max_queued_bytes=self.config.limits.max_queued_bytes,
            reject_queue_full=lambda queued, nbytes: queue_full(self.config.limits, queued,
                                                                nbytes),
            observer=self.metrics, eager=b.eager,
            max_inflight=REMOTE_INFLIGHT if hasattr(self._encoding, "local") else 1,
            # a worker of the shared GPU process: its batches wait on the GPU process's
            # socket on this loop, not on a thread (gpu_worker.RemoteEncoding.call_async)
            run_batch_async=(self._timed_batch_async
                             if hasattr(self._encoding, "call_async") else None))
        self.batcher.start()
        self.servicer.attach(self._encoding, self.batcher, self._info(), self.metrics)
        self.servicer.long_lane, self.servicer.run_long = self.long_lane, self.run_long
        self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        if self._draining:
            return
        for service in SERVICES:
            await self.health.set(service, SERVING)
        self.metrics.ready.set(1)
        adapter = adapter_info(self._device or getattr(self._encoding, "device", None))
        self.metrics.adapter(adapter.name, adapter.type, adapter.software)
        self.ready.set()
        vocab = self._encoding.vocab
        log.info("serving", extra={"data": {
            "vocabulary": self._encoding.name, "vocabulary_hash": vocab.content_hash,
            "n_vocab": self._encoding.n_vocab, "adapter": adapter.name,
            "software_vulkan": adapter.software,
            "event_loop": name_of(asyncio.get_running_loop()),
            "load_seconds": round(time.perf_counter() - start, 3)}})

    def _long_encoding(self):
        """The long lane's own Encoding on its own device (same adapter): its own queue,
        encoder, buffers and lock, so a long call never holds the lock the batches' GPU calls
        take (tokenizer_svc/gpu_backend.py: one lock per device), and its budgeted dispatches
        stay short on GPUs too."""
        enc = self._encoding
        if getattr(getattr(enc, "backend", None), "kind", None) != "gpu":
            return getattr(enc, "local", enc)
        local = getattr(enc, "local", None)   # a RemoteEncoding: batches run elsewhere, so
        if local is not None:                 # the worker's own device is the long lane's
            long_enc = local
        else:
            from istanbul.shaders.engine import Device
            from ..encoding import Encoding
            shared = enc.backend.device
            long_enc = Encoding(enc.vocab, Device(shared.info.index, shared.info.webgpu,
                                                  robustness=shared.robustness))
        encoder = long_enc.backend.encoder
        if not encoder.device.info.is_software:
            encoder.budget = encoder.long_budget = LONG_LANE_GPU_BUDGET
        encoder.max_round_dispatches = LONG_LANE_ROUND_DISPATCHES
        return long_enc

    @property
    def batch_started(self) -> float | None:
        """Monotonic start of the oldest running batch (None: none runs)."""
        return min(self._batch_starts.values(), default=None)

    def _timed_batch(self, jobs: list) -> list:
        key = object()
        self._batch_starts[key] = time.monotonic()
        try:
            return self.runner(jobs)
        finally:
            del self._batch_starts[key]

    async def _timed_batch_async(self, jobs: list) -> list:
        key = object()
        self._batch_starts[key] = time.monotonic()
        try:
            return await self.runner.run_async(jobs)
        finally:
            del self._batch_starts[key]

    async def run_long(self, job, timeout: float | None):
        """Run one expensive EncodeJob (LongLane.admits) in the long lane."""
        lane = self.long_lane
        refusal = self.runner.refusal(job)
        if refusal is not None:
            raise refusal
        if self._long_waiting >= lane.cfg.max_waiting:
            raise RequestRejected(grpc.StatusCode.RESOURCE_EXHAUSTED, limit_reason("long_lane"),
                                  f"{self._long_waiting} long documents are already waiting for "
                                  "the long lane; retry with backoff, or add replicas")
        deadline = time.monotonic() + timeout if timeout is not None else None
        control = LongJobControl(deadline, lane.closing, lane.beat)
        future = asyncio.get_running_loop().run_in_executor(self.long_thread, lane.run, job,
                                                            control)
        future.add_done_callback(_retrieve)
        self._long_waiting += 1
        self.metrics.long_waiting.set(self._long_waiting)
        outcome = "error"
        try:
            result = await asyncio.shield(future)
            outcome = "ok"
            return result
        except asyncio.CancelledError:
            control.cancelled.set()   # the lane stops at its next check
            outcome = "cancelled"
            raise
        finally:
            self._long_waiting -= 1
            self.metrics.long_waiting.set(self._long_waiting)
            self.metrics.long_requests.labels(outcome).inc()

    async def _watch(self) -> None:
        """Health NOT_SERVING while a GPU worker makes no progress for stall_timeout_s, or
        while the group's GPU process does not answer (a RemoteEncoding's last call failed
        and reconnecting does not work yet)."""
        limit = self.config.stall_timeout_s
        remote = self._encoding if hasattr(self._encoding, "probe") else None
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(1.0, limit / 4))
            if remote is not None and not remote.reachable:
                await loop.run_in_executor(None, remote.probe)
            now = time.monotonic()
            lane = self.long_lane
            stuck = [name for name, since in (
                ("batch", self.batch_started),
                ("long lane", lane.last_beat if lane and lane.busy_since else None))
                if since is not None and now - since > limit]
            if remote is not None and not remote.reachable:
                stuck.append("GPU process")
            if bool(stuck) != self.stalled and not self._draining:
                self.stalled = bool(stuck)
                status = NOT_SERVING if stuck else SERVING
                for service in SERVICES:
                    await self.health.set(service, status)
                self.metrics.ready.set(0 if stuck else 1)
                self.metrics.stalled.set(1 if stuck else 0)
                if stuck:
                    log.error("GPU worker stalled", extra={"data": {
                        "workers": stuck, "stall_timeout_s": limit}})
                else:
                    log.warning("GPU worker recovered")

    def _info(self) -> pb.GetInfoResponse:
        enc, cfg = self._encoding, self.config
        limits, b = cfg.limits, cfg.batching
        info = pb.GetInfoResponse(
            vocabulary_name=enc.name, vocabulary_hash=enc.vocab.content_hash,
            n_vocab=enc.n_vocab, special_tokens=dict(enc.vocab.special_tokens),
            pattern=enc.vocab.pattern_name or "custom",
            limits=pb.Limits(max_message_bytes=limits.max_message_bytes,
                             max_text_bytes=limits.max_text_bytes,
                             max_batch_items=limits.max_batch_items,
                             max_decode_ids=limits.max_decode_ids,
                             max_queued_bytes=limits.max_queued_bytes,
                             max_stream_inflight=limits.max_stream_inflight),
            batching=pb.Batching(window_ms=b.effective_window_s * 1e3,
                                 max_items=b.effective_max_items, max_bytes=b.max_bytes),
            adapter=adapter_info(self._device or getattr(enc, "device", None)),
            server_version=server_version())
        if enc.eot_token is not None:
            info.eot_token = enc.eot_token
        return info

    # ---- stop -----------------------------------------------------------------------------

    async def drain(self, grace_s: float | None = None) -> None:
        """Graceful shutdown: NOT_SERVING, stop accepting, finish in-flight RPCs, stop."""
        if self._draining:
            await self._stopped.wait()
            return
        self._draining = True
        grace = self.config.shutdown_grace_s if grace_s is None else grace_s
        log.info("draining", extra={"data": {"grace_s": grace,
                                             "drain_delay_s": self.config.drain_delay_s}})
        self.metrics.ready.set(0)
        await self.health.enter_graceful_shutdown()
        if self.config.drain_delay_s > 0:
            await asyncio.sleep(self.config.drain_delay_s)
        if self._server is not None:
            loop = asyncio.get_running_loop()
            end = loop.time() + grace
            # near the end of the grace period, open streams and long-lane work end with
            # UNAVAILABLE (clients resume elsewhere) instead of being cut off by grpc
            cut = loop.call_at(end - min(1.0, grace / 10), self._cut_long_work)
            # grpc's stop() cancels the calls it holds that this loop has not taken yet: they
            # are served (or refused UNAVAILABLE) first, within the grace period (door.py)
            if await self.door.settle(grace):
                log.info("calls still arriving: new ones refused (UNAVAILABLE) until quiet")
            await self._server.stop(max(0.0, end - loop.time()))
            cut.cancel()
        if self._loader is not None and not self._loader.done():
            self._loader.cancel()
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self.long_lane is not None:
            self.long_lane.closing.set()
        give_up = time.monotonic() + self.config.stall_timeout_s   # one margin for all below
        if self.batcher is not None:
            try:
                await asyncio.wait_for(self.batcher.close(), self.config.stall_timeout_s)
            except asyncio.TimeoutError:
                pass
        self.metrics.stop_http()
        await self._stop_workers(give_up)
        log.info("stopped", extra={"data": {"batches": self.batcher.batches_run
                                            if self.batcher else 0}})
        self._stopped.set()

    def _cut_long_work(self) -> None:
        self.servicer.cut_streams()
        if self.long_lane is not None:
            self.long_lane.closing.set()

    async def _stop_workers(self, give_up: float) -> None:
        """Wait until `give_up` (monotonic) for the GPU threads; name the ones still busy."""
        loop = asyncio.get_running_loop()
        for name, pool in (("gpu", self.gpu_thread), ("gpu-long", self.long_thread)):
            pool.shutdown(wait=False, cancel_futures=True)
            done = loop.run_in_executor(None, pool.shutdown, True)
            try:   # an idle pool ends at once, even when the batches used up the margin
                await asyncio.wait_for(asyncio.shield(done),
                                       max(IDLE_POOL_END_S, give_up - time.monotonic()))
            except asyncio.TimeoutError:
                self.stuck_workers.append(name)
        if self.stuck_workers:
            log.error("GPU worker still busy after the grace period; leaving it behind",
                      extra={"data": {"workers": self.stuck_workers}})

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
