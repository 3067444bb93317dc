"""The drain's door: what a drain does before grpc's stop(), so no call ends CANCELLED.

Why: grpc's stop() cancels every call that has reached grpc's core but that core has not yet
handed to the application (grpc/grpc#41785): the client sees CANCELLED, neither an answer
nor a retryable refusal. Core hands a method's calls over one at a time, the next once the
event loop has taken the one before, so while the loop is busy (large replies, a batch's
bookkeeping) calls queue there: a drain that called stop() at once cancelled the calls that
arrived in the few milliseconds before SIGTERM and those that came after it, before the
GOAWAY reached their clients (an outside test under load: 4 to 17 in a round).

So `TokenizerServer.drain` settles first (`settle`):

    1. it serves every call that reaches the application, as before the signal, until none
       has arrived for QUIET_S while the loop kept up (then core holds none: the calls that
       arrived before the signal were all handed over and served), at most SERVE_S;
    2. if calls still come, the door closes: each new call is answered UNAVAILABLE at once
       without its request being read (retryable elsewhere; health checks still answer
       NOT_SERVING), until none has arrived for QUIET_S again, at most SETTLE_S in all;
    3. then grpc's stop() (GOAWAY: clients send no more) and the rest of the grace period.

A loop "kept up" when each QUIET_TICK_S sleep ended at most LATE_S late: a loop that was
blocked may have calls waiting in core that it has not taken yet, so such a tick restarts the
quiet period. Settling takes at most a quarter of the grace period, and counts against it.
"""

from __future__ import annotations

import asyncio

import grpc

from .auth import OPEN_METHODS
from .errors import refusing, shutting_down

QUIET_S = 0.05        # no call arrived for this long, the loop keeping up: core holds none
QUIET_TICK_S = 0.005  # how often the quiet is checked
LATE_S = 0.02         # a tick this late means the loop was blocked: the quiet starts again
SERVE_S = 0.5         # step 1 lasts at most this long
SETTLE_S = 2.0        # steps 1 and 2 together (and at most a quarter of the grace period)


class Door(grpc.aio.ServerInterceptor):
    """Counts every call grpc hands to the application (`arrived`); once `closed`, answers
    each new one (health checks excepted) UNAVAILABLE without reading its request."""

    def __init__(self):
        self.arrived = 0
        self.closed = False

    async def intercept_service(self, continuation, details):
        self.arrived += 1
        handler = await continuation(details)
        if not self.closed or handler is None or details.method in OPEN_METHODS:
            return handler
        return refusing(handler, shutting_down())

    async def quiet(self, until: float) -> bool:
        """Wait until no call has arrived for QUIET_S of a loop that kept up (True), or until
        the loop time `until` (False)."""
        loop = asyncio.get_running_loop()
        seen, since = self.arrived, loop.time()
        while (before := loop.time()) < until:
            await asyncio.sleep(QUIET_TICK_S)
            now = loop.time()
            if self.arrived != seen or now - before > QUIET_TICK_S + LATE_S:
                seen, since = self.arrived, now
            elif now - since >= QUIET_S:
                return True
        return False

    async def settle(self, grace_s: float) -> bool:
        """Steps 1 and 2 of the module doc; whether the door closed."""
        bound = min(SETTLE_S, grace_s / 4)
        if bound <= 0:
            return False
        start = asyncio.get_running_loop().time()
        if await self.quiet(start + min(SERVE_S, bound / 2)):
            return False
        self.closed = True
        await self.quiet(start + bound)
        return True
