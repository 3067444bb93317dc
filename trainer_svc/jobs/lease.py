"""Job ownership: a lease key holding the owner's token, with a TTL its heartbeat renews.

Only the holder of a job's lease may run it or write its progress and state. The lease is a
plain key `istanbul:lease:JOB` set with NX and a TTL; the owner's heartbeat thread extends the
TTL every third of it. Renewal and release are compare-and-act Lua scripts, so an owner whose
lease expired (a paused process, a network partition) can never extend or delete the lease of
the worker that took the job over. A worker that cannot confirm its lease for a whole TTL
(Redis unreachable) treats it as lost: someone else may own the job by then.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from . import keys
from .redis_conn import REDIS_DOWN, RedisHandle

log = logging.getLogger(__name__)

# Extend the TTL only while the key still holds our token.
RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# Delete the key only while it still holds our token.
RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def owner_token() -> str:
    """A token unique to this worker process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """The lease on one job, held (or not) by `owner`."""

    def __init__(self, handle: RedisHandle, job_id: str, owner: str, ttl_s: float):
        self.handle, self.job_id, self.owner = handle, job_id, owner
        self.key = keys.lease(job_id)
        self.ttl_ms = max(1, int(ttl_s * 1000))

    def acquire(self) -> bool:
        """Take the lease if nobody holds it. True when it is now ours."""
        return bool(self.handle.text.set(self.key, self.owner, nx=True, px=self.ttl_ms))

    def renew(self) -> bool:
        """Extend the TTL. False when the lease is no longer ours (expired or taken over)."""
        return bool(self.handle.script(RENEW_LUA)(keys=[self.key], args=[self.owner, self.ttl_ms]))

    def release(self) -> bool:
        """Give the lease up. False when it was not ours any more (nothing deleted)."""
        return bool(self.handle.script(RELEASE_LUA)(keys=[self.key], args=[self.owner]))

    def holder(self) -> str | None:
        return self.handle.text.get(self.key)


def lease_holder(handle: RedisHandle, job_id: str) -> str | None:
    return handle.text.get(keys.lease(job_id))


class Heartbeat:
    """A thread that renews a lease every ttl/3 and notices when it is lost.

    `lost` is set when Redis says the lease belongs to someone else (or expired), or when no
    renewal could be confirmed for 90% of the TTL. `on_beat` callables run after each
    successful renewal (the daemon uses them to keep its stream entry fresh and to look for
    a cancel request); their errors are logged, never fatal.
    """

    def __init__(self, lease: Lease, on_beat=(), interval_s: float | None = None):
        self.lease = lease
        self.on_beat = list(on_beat)
        self.interval = interval_s or lease.ttl_ms / 3000
        self.lost = threading.Event()
        self.lost_reason = ""
        self.redis_ok = True
        self._stop = threading.Event()
        self._last_confirmed = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{lease.job_id}",
                                        daemon=True)

    def start(self) -> "Heartbeat":
        self._last_confirmed = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def beat(self) -> bool:
        """One renewal (also called directly by the runner before risky writes)."""
        try:
            mine = self.lease.renew()
        except REDIS_DOWN as exc:
            self.redis_ok = False
            unconfirmed = time.monotonic() - self._last_confirmed
            if unconfirmed > 0.9 * self.lease.ttl_ms / 1000:
                self._lose(f"could not reach Redis to renew the lease for {unconfirmed:.1f} s "
                           f"({exc}); another worker may own the job now")
            return False
        self.redis_ok = True
        if not mine:
            holder = None
            try:
                holder = self.lease.holder()
            except REDIS_DOWN:
                pass
            self._lose("the lease expired" + (f" and {holder} took the job over" if holder else ""))
            return False
        self._last_confirmed = time.monotonic()
        for callback in self.on_beat:
            try:
                callback()
            except Exception:  # a heartbeat side job must never stop the heartbeat
                log.exception("heartbeat callback failed for job %s", self.lease.job_id)
        return True

    def _lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            log.warning("lost the lease on job %s: %s", self.lease.job_id, reason)
            self.lost.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval) and not self.lost.is_set():
            self.beat()
