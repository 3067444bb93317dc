"""Dynamic batching: concurrent requests coalesce into one call of a synchronous batch function.

Requests arrive on the event loop (`submit`). One collector task forms batches: the oldest
waiting request waits at most `window_s` for company, and a batch closes early once it holds
`max_items` documents or `max_bytes` input bytes (one oversized request still runs, alone).
The batch function runs on a worker thread (the GPU thread), so the event loop keeps
accepting requests while the GPU works; those requests form the next batch. Requests that
were cancelled or whose deadline passed while they waited are dropped before the GPU call.

Eager closing (on by default): a batch also closes before its window ends when no other
request is on its way, that is when every announced request (an RPC that has arrived and
will submit; see `announce`) has already been submitted. A lone client then pays no window,
while concurrent clients still share GPU calls: whatever queues while the GPU is busy forms
the next batch.

`max_inflight` batches may run at once (default 1: the next batch forms while one runs and
starts when it ends). More than one pays when the batch function mostly waits, as a worker of
`serve --workers N` does for the shared GPU process (gpu_process.py): its next batch is already
there when the GPU process starts its next round. The executor needs as many threads.

The batch function receives a list of payloads and returns one result per payload, in order;
a result that is an exception instance fails only its own request. With `run_batch_async`
(a coroutine function of the same contract) batches run on the event loop instead: for a
batch function that mostly waits on sockets the loop serves (a worker of the shared GPU
process), which then needs no thread hand-off either way.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger(__name__)


class DeadlineExpired(Exception):
    """The request's deadline passed while it waited for a batch."""


class BatcherClosed(Exception):
    """submit() after close()."""


@dataclass
class _Pending:
    payload: Any
    items: int
    nbytes: int
    deadline: float | None  # time.monotonic() seconds
    future: asyncio.Future
    enqueued: float = field(default_factory=time.monotonic)


class BatchObserver:
    """What the batcher reports (ServiceMetrics implements it; the default ignores it)."""

    def batch_done(self, items: int, nbytes: int, requests: int, seconds: float) -> None: ...
    def request_waited(self, seconds: float) -> None: ...
    def dropped(self, reason: str) -> None: ...
    def queued_bytes(self, nbytes: int) -> None: ...


class DynamicBatcher:
    def __init__(self, run_batch: Callable[[list], list], executor: concurrent.futures.Executor,
                 *, window_s: float, max_items: int, max_bytes: int, max_queued_bytes: int,
                 reject_queue_full: Callable[[int, int], Exception],
                 observer: BatchObserver | None = None, eager: bool = True,
                 max_inflight: int = 1, run_batch_async: Callable | None = None):
        self._run_batch = run_batch
        self._run_batch_async = run_batch_async
        self._executor = executor
        self.window_s = window_s
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.max_queued_bytes = max_queued_bytes
        self._reject_queue_full = reject_queue_full
        self.eager = eager
        self._announced = 0        # requests that arrived and have not submitted yet
        self._observer = observer or BatchObserver()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._waiting_items = 0
        self._queued_bytes = 0     # waiting + running: what the server holds for callers
        self._waiting_bytes = 0    # waiting only: what decides whether a batch is full
        self._wakeup = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task | None = None
        self._slots = asyncio.Semaphore(max_inflight)
        self._running: set = set()   # batch tasks in progress
        self.batches_run = 0

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._collect(), name="batcher")

    async def close(self) -> None:
        """Stop accepting; finish everything already queued."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task
        if self._running:
            await asyncio.gather(*self._running)

    # ---- submitting -----------------------------------------------------------------------

    def announce(self) -> None:
        """A request has arrived and will submit (or `withdraw`) soon: eager closing waits."""
        self._announced += 1

    def withdraw(self) -> None:
        """An announced request will not submit after all (it failed validation)."""
        self._announced -= 1
        self._wakeup.set()

    def hold(self, nbytes: int) -> None:
        """Count `nbytes` of work run elsewhere (the long lane) as queued: the same
        max_queued_bytes limit, the same refusal. Give it back with `unhold`."""
        if self._closing:
            raise BatcherClosed("the server is shutting down")
        if self._queued_bytes and self._queued_bytes + nbytes > self.max_queued_bytes:
            self._observer.dropped("queue_full")
            raise self._reject_queue_full(self._queued_bytes, nbytes)
        self._queued_bytes += nbytes
        self._observer.queued_bytes(self._queued_bytes)

    def unhold(self, nbytes: int) -> None:
        self._queued_bytes -= nbytes
        self._observer.queued_bytes(self._queued_bytes)

    async def submit(self, payload, *, items: int, nbytes: int,
                     timeout: float | None = None, announced: bool = False) -> Any:
        """Queue `payload` (`items` documents, `nbytes` input bytes) and await its result.

        `announced`: this request was announced (it now counts as arrived). Cancelling the
        awaiting task cancels the request; it then leaves the batch.
        """
        if announced:
            self._announced -= 1
        if self._closing:
            raise BatcherClosed("the server is shutting down")
        if self._queued_bytes and self._queued_bytes + nbytes > self.max_queued_bytes:
            self._observer.dropped("queue_full")
            raise self._reject_queue_full(self._queued_bytes, nbytes)
        future = asyncio.get_running_loop().create_future()
        deadline = time.monotonic() + timeout if timeout is not None else None
        self._queue.append(_Pending(payload, items, nbytes, deadline, future))
        self._waiting_items += items
        self._queued_bytes += nbytes
        self._waiting_bytes += nbytes
        self._observer.queued_bytes(self._queued_bytes)
        self._wakeup.set()
        return await future

    # ---- forming and running batches ------------------------------------------------------

    def _full(self) -> bool:
        return self._waiting_items >= self.max_items or self._waiting_bytes >= self.max_bytes

    def _nobody_coming(self) -> bool:
        return self.eager and self._announced <= 0

    async def _collect(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self._slots.acquire()   # a batch forms once it can start
            try:
                await self._form()
            except BaseException:
                self._slots.release()
                raise

    async def _form(self) -> None:
        """Wait until the head's batch should close, then start it (holding a slot)."""
        # The oldest request waits out its window unless the batch fills first. Requests
        # that queued while the GPU was busy have usually waited long enough already.
        close_at = self._queue[0].enqueued + self.window_s
        while not (self._full() or self._closing or self._nobody_coming()):
            remaining = close_at - time.monotonic()
            if remaining <= 0:
                break
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except asyncio.TimeoutError:
                break
        task = asyncio.get_running_loop().create_task(self._run_and_release(self._take()))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run_and_release(self, taken: list) -> None:
        try:
            await self._run(taken)
        finally:
            self._slots.release()

    def _take(self) -> list[_Pending]:
        taken, items, nbytes = [], 0, 0
        while self._queue:
            head = self._queue[0]
            if taken and (items + head.items > self.max_items or nbytes + head.nbytes > self.max_bytes):
                break
            self._queue.popleft()
            taken.append(head)
            items += head.items
            nbytes += head.nbytes
        self._waiting_items -= items
        self._waiting_bytes -= nbytes
        return taken

    def _release(self, pending: _Pending) -> None:
        self._queued_bytes -= pending.nbytes
        self._observer.queued_bytes(self._queued_bytes)

    async def _run(self, taken: list[_Pending]) -> None:
        now = time.monotonic()
        live = []
        for p in taken:
            if p.future.done():  # cancelled by the caller (client cancel, deadline, disconnect)
                reason = "deadline" if p.deadline is not None and now >= p.deadline else "cancelled"
                self._observer.dropped(reason)
                self._release(p)
            elif p.deadline is not None and now >= p.deadline:
                self._observer.dropped("deadline")
                p.future.set_exception(DeadlineExpired("deadline passed while waiting for a batch"))
                self._release(p)
            else:
                self._observer.request_waited(now - p.enqueued)
                live.append(p)
        if not live:
            return
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        try:
            payloads = [p.payload for p in live]
            if self._run_batch_async is not None:
                results = await self._run_batch_async(payloads)
            else:
                results = await loop.run_in_executor(self._executor, self._run_batch, payloads)
            if len(results) != len(live):
                raise RuntimeError(f"batch function returned {len(results)} results for "
                                   f"{len(live)} requests")
        except Exception as exc:  # the whole batch failed (device lost, bug): fail each request
            log.exception("batch of %d requests failed", len(live))
            results = [exc] * len(live)
        seconds = time.perf_counter() - start
        self.batches_run += 1
        self._observer.batch_done(sum(p.items for p in live), sum(p.nbytes for p in live),
                                  len(live), seconds)
        for p, result in zip(live, results):
            self._release(p)
            if p.future.done():
                continue
            if isinstance(result, BaseException):
                p.future.set_exception(result)
            else:
                p.future.set_result(result)
